// An MPI profiling-interface (PMPI) interposer that counts the bytes this process hands to MPI's
// point-to-point send calls: an independent measure of what goes on the wire, to check the
// communicator's ledger against (tests/distributed/test_wire_bytes.cpp).
//
// Load it in front of the MPI library:
//   mpirun -np 4 -x LD_PRELOAD=build/lib/libzero_count_sent_bytes.so build/bin/zero_dist_tests ...
// Every MPI_Send / Isend / Ssend / Issend / Rsend / Irsend / Bsend / Ibsend / Sendrecv /
// Sendrecv_replace then adds count × MPI_Type_size(datatype) to a counter before calling the real
// PMPI_ function (the MPI standard's profiling interface, MPI-3.1 §14.2). Collectives such as
// MPI_Iallreduce are not counted (Open MPI runs them inside the library, below this interface); the
// communicator uses them only for control scalars, which its ledger keeps apart too.
//
// A program reads the counter through zero_pmpi_sent_bytes(), found with dlsym(RTLD_DEFAULT, ...) so
// that it runs (and its test skips) without the interposer. A program that does not (train_gpt) can be
// run with ZERO_PMPI_REPORT=1 in its environment: MPI_Finalize then prints one line per rank to stderr,
//   pmpi: rank R sent B bytes in C calls
// (the whole run: the initial broadcast included; the difference of two runs of different lengths is
// the traffic of the extra steps, docs/collectives.md "int8 quantized gradients").
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {
std::atomic<std::int64_t> g_sent_bytes{0};
std::atomic<std::int64_t> g_sent_calls{0};

void count(int n, MPI_Datatype type) {
  int size = 0;
  if (n <= 0 || PMPI_Type_size(type, &size) != MPI_SUCCESS) return;
  g_sent_bytes += static_cast<std::int64_t>(n) * size;
  g_sent_calls += 1;
}
}  // namespace

extern "C" {

/// Bytes passed to the send calls above since the process started (or the last reset).
std::int64_t zero_pmpi_sent_bytes() { return g_sent_bytes.load(); }
/// Number of counted send calls.
std::int64_t zero_pmpi_sent_calls() { return g_sent_calls.load(); }
void zero_pmpi_reset() {
  g_sent_bytes = 0;
  g_sent_calls = 0;
}

int MPI_Send(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
  count(n, t);
  return PMPI_Send(buf, n, t, dest, tag, comm);
}
int MPI_Ssend(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
  count(n, t);
  return PMPI_Ssend(buf, n, t, dest, tag, comm);
}
int MPI_Rsend(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
  count(n, t);
  return PMPI_Rsend(buf, n, t, dest, tag, comm);
}
int MPI_Bsend(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
  count(n, t);
  return PMPI_Bsend(buf, n, t, dest, tag, comm);
}
int MPI_Isend(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request* r) {
  count(n, t);
  return PMPI_Isend(buf, n, t, dest, tag, comm, r);
}
int MPI_Issend(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request* r) {
  count(n, t);
  return PMPI_Issend(buf, n, t, dest, tag, comm, r);
}
int MPI_Irsend(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request* r) {
  count(n, t);
  return PMPI_Irsend(buf, n, t, dest, tag, comm, r);
}
int MPI_Ibsend(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request* r) {
  count(n, t);
  return PMPI_Ibsend(buf, n, t, dest, tag, comm, r);
}
int MPI_Sendrecv(const void* sbuf, int sn, MPI_Datatype st, int dest, int stag, void* rbuf, int rn, MPI_Datatype rt,
                 int source, int rtag, MPI_Comm comm, MPI_Status* status) {
  count(sn, st);
  return PMPI_Sendrecv(sbuf, sn, st, dest, stag, rbuf, rn, rt, source, rtag, comm, status);
}
int MPI_Sendrecv_replace(void* buf, int n, MPI_Datatype t, int dest, int stag, int source, int rtag, MPI_Comm comm,
                         MPI_Status* status) {
  count(n, t);
  return PMPI_Sendrecv_replace(buf, n, t, dest, stag, source, rtag, comm, status);
}

int MPI_Finalize() {
  if (const char* report = std::getenv("ZERO_PMPI_REPORT"); report != nullptr && *report != '\0') {
    int rank = -1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "pmpi: rank %d sent %lld bytes in %lld calls\n", rank,
                 static_cast<long long>(g_sent_bytes.load()), static_cast<long long>(g_sent_calls.load()));
  }
  return PMPI_Finalize();
}

}  // extern "C"
