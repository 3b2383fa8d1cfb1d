// Times the communicator's collectives on N ranks (fp32), beside a plain ring baseline and MPI's own.
//
//   mpirun --allow-run-as-root --oversubscribe -np 4 build/bin/bench_collectives [--mb 100] [--iters 5]
//          [--bandwidth B --latency L]   (adds the alpha-beta ring model's prediction, zero_explain's model)
//          [--bf16]   (adds bf16 reduce-scatters of the same element count: the ring, and the all-to-all
//                      with fp32 accumulation, Note [fp32-accumulating reduce-scatter])
//
// Every timed call starts after a barrier; its time is the slowest rank's. Rows run round-robin, one
// call each per round; each row reports the best and the median over --iters rounds (after one
// untimed warm-up round) and the bus bandwidth
// (nccl-tests convention, the ledger's bytes / time). The baseline is a ring reduce-scatter over
// MPI_Sendrecv written inline, accumulating in place. The
// goal on 4 ranks × 100 MB: our reduce_scatter ≤ 0.6× our all_reduce and ≤ 1.5× the baseline.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "distributed/comm/job_runtime.h"
#include "distributed/comm/mpi_communicator.h"
#include "distributed/zero/zero_plan.h"

using zero::DType;
using namespace zero::dist;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

// Runs `prepare` (untimed), a barrier, then `fn`; returns the slowest rank's time of `fn` in ms.
double time_once(const std::function<void()>& prepare, const std::function<void()>& fn) {
  prepare();
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  fn();
  double elapsed = MPI_Wtime() - start;
  MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return elapsed * 1e3;
}

// Plain ring reduce-scatter over MPI_Sendrecv, equal chunks of `chunk` floats, accumulating in place in
// `buf` (n·chunk floats); rank r ends with its sum in buf[r·chunk, (r+1)·chunk). tmp: chunk floats.
void baseline_ring_reduce_scatter(float* buf, float* tmp, long chunk, int rank, int n) {
  const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
  for (int step = 0; step < n - 1; ++step) {
    const int send = (rank - step - 1 + 2 * n) % n, recv = (rank - step - 2 + 2 * n) % n;
    MPI_Sendrecv(buf + send * chunk, int(chunk), MPI_FLOAT, right, 0, tmp, int(chunk), MPI_FLOAT, left, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    float* dst = buf + recv * chunk;
    for (long i = 0; i < chunk; ++i) dst[i] += tmp[i];
  }
}

// One collective of the table. Rows run round-robin (every row once per round) so a burst of load on
// this shared machine hits all of them alike; the ratios are also taken per round, then the median.
struct Row {
  std::string name;
  Collective kind;
  std::function<void()> prepare, fn;
  std::vector<double> ms;
  double bytes;  // S of this row
};

// One warm-up round, then `iters` timed ones; each round starts at a different row, so no row always
// follows the same neighbour.
void run_rounds(std::vector<Row>& rows, int iters) {
  for (int round = 0; round <= iters; ++round)
    for (std::size_t i = 0; i < rows.size(); ++i) {
      Row& row = rows[(i + std::size_t(round)) % rows.size()];
      const double ms = time_once(row.prepare, row.fn);
      if (round > 0) row.ms.push_back(ms);  // round 0 is the warm-up
    }
}

// The table (best and median ms, bus bandwidth, and with a link model the ring model's time) and the
// two ratios the goals are stated in.
void print_report(const std::vector<Row>& rows, int n, double full_bytes, int iters, std::size_t segment_bytes,
                  double bandwidth, double latency) {
  fmt::print("{} ranks, fp32, S = {:.1f} MB, {} timed rounds (+1 warm-up), segment {} KiB\n", n,
             full_bytes / 1e6, iters, segment_bytes / 1024);
  fmt::print("{:<30} {:>10} {:>10} {:>12}{}\n", "collective", "best ms", "median ms", "busbw GB/s",
             bandwidth > 0 ? fmt::format(" {:>10} {:>14}", "model ms", "median/model") : "");
  for (const Row& row : rows) {
    const double best = *std::min_element(row.ms.begin(), row.ms.end());
    const double bus = Ledger::bus_bytes(row.kind, row.bytes, n);
    std::string model;
    // The ring model applies to our ring collectives; reduce and broadcast use other algorithms.
    const bool ring = row.kind == Collective::all_reduce || row.kind == Collective::reduce_scatter ||
                      row.kind == Collective::all_gather;
    if (bandwidth > 0 && ring && row.name.rfind("ours", 0) == 0) {
      const double predicted = 1e3 * ring_time_s(row.kind, bus, n, bandwidth, latency);
      model = fmt::format(" {:>10.3f} {:>14.2f}", predicted, median(row.ms) / predicted);
    }
    fmt::print("{:<30} {:>10.3f} {:>10.3f} {:>12.2f}{}\n", row.name, best, median(row.ms), bus / (best * 1e-3) / 1e9,
               model);
  }
  auto find = [&](const std::string& name) -> const std::vector<double>& {
    return std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.name == name; })->ms;
  };
  auto ratios = [&](const std::string& a, const std::string& b, const char* goal) {
    const auto& x = find(a);
    const auto& y = find(b);
    std::vector<double> per_round(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) per_round[i] = x[i] / y[i];
    fmt::print("{:<7} best/best {:.2f}  median of per-round ratios {:.2f}  ({})\n",
               a == "ours reduce_scatter" && b == "ours all_reduce" ? "rs/ar" : "rs/ring",
               *std::min_element(x.begin(), x.end()) / *std::min_element(y.begin(), y.end()),
               median(per_round), goal);
  };
  ratios("ours reduce_scatter", "ours all_reduce", "goal <= 0.6");
  ratios("ours reduce_scatter", "baseline ring reduce_scatter", "goal <= 1.5");
}

// The command line: sizes, rounds, and what to add to the table.
struct Options {
  double mb = 100;
  int iters = 5;
  std::size_t segment_kb = 0;
  bool skip_mpi = false, bf16 = false;
  double bandwidth = 0, latency = 0;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--mb", o.mb, "full buffer size S in MB (10^6 bytes), fp32")->check(CLI::PositiveNumber);
  app.add_option("--iters", o.iters, "timed rounds, one call of each collective per round (after a warm-up)")
      ->check(CLI::PositiveNumber);
  app.add_option("--segment-kb", o.segment_kb, "ring pipelining segment in KiB (0: the default)");
  app.add_flag("--skip-mpi", o.skip_mpi, "skip MPI_Allreduce / MPI_Reduce_scatter_block (slow)");
  app.add_flag("--bf16", o.bf16, "add bf16 reduce-scatters (S/2 bytes): ring, and all-to-all with fp32 accumulation");
  app.add_option("--bandwidth", o.bandwidth,
                 "bytes/s per rank's link: adds the alpha-beta ring model's time beside each of our collectives "
                 "(distributed/zero/zero_plan.h)")
      ->check(CLI::PositiveNumber);
  app.add_option("--latency", o.latency, "seconds per message for the model (with --bandwidth)")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Collective timings: zero.cpp's MPI communicator vs a plain ring vs MPI's own"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);

  auto comm = mpi_world();
  auto mpi = std::dynamic_pointer_cast<MpiCommunicator>(comm);
  if (o.segment_kb > 0) mpi->set_segment_bytes(o.segment_kb * 1024);
  const int n = comm->world_size();
  const int rank = comm->rank();
  const long chunk = std::max(1L, long(o.mb * 1e6 / sizeof(float)) / n);
  const long count = chunk * n;
  const double full_bytes = double(count) * sizeof(float);

  // Every row first rewrites its input from `source` (untimed), so each collective starts from freshly
  // written data, as gradients fresh from backward would be; with a 260 MiB L3 here, an input left
  // cold by earlier rounds would otherwise cost a row up to 2x against one whose input is hot.
  std::vector<float> source(count), work(count), result(count), slice(chunk), tmp(chunk);
  for (long i = 0; i < count; ++i) source[i] = float(rank + 1) + float(i % 7);
  const std::vector<std::size_t> counts(n, std::size_t(chunk));
  auto refill = [&] { std::memcpy(work.data(), source.data(), full_bytes); };
  auto refill_slice = [&] { std::memcpy(slice.data(), source.data(), chunk * sizeof(float)); };

  std::vector<Row> rows;
  auto add = [&](std::string name, Collective kind, const std::function<void()>& prepare,
                 const std::function<void()>& fn, double bytes = 0) {
    rows.push_back({std::move(name), kind, prepare, fn, {}, bytes > 0 ? bytes : full_bytes});
  };

  add("ours reduce_scatter", Collective::reduce_scatter, refill,
      [&] { comm->reduce_scatter(work.data(), slice.data(), counts, DType::f32); });
  add("ours all_reduce", Collective::all_reduce, refill,
      [&] { comm->all_reduce(work.data(), count, DType::f32); });
  add("ours all_gather", Collective::all_gather, refill_slice,
      [&] { comm->all_gather(slice.data(), work.data(), counts, DType::f32); });
  add("ours reduce (root 0)", Collective::reduce, refill,
      [&] { comm->reduce(work.data(), count, DType::f32, 0); });
  add("ours broadcast (root 0)", Collective::broadcast, refill,
      [&] { comm->broadcast(work.data(), count, DType::f32, 0); });
  add("baseline ring reduce_scatter", Collective::reduce_scatter, refill,
      [&] { baseline_ring_reduce_scatter(work.data(), tmp.data(), chunk, rank, n); });
  add("MPI_Bcast", Collective::broadcast, refill,
      [&] { MPI_Bcast(work.data(), int(count), MPI_FLOAT, 0, MPI_COMM_WORLD); });
  add("MPI_Reduce", Collective::reduce, refill, [&] {
    MPI_Reduce(work.data(), result.data(), int(count), MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  });
  std::vector<zero::bfloat16> source16, work16, slice16;
  if (o.bf16) {
    source16.resize(std::size_t(count));
    work16.resize(std::size_t(count));
    slice16.resize(std::size_t(chunk));
    for (long i = 0; i < count; ++i) source16[i] = zero::bfloat16(source[i] / 64.0f);
    auto refill16 = [&] { std::memcpy(work16.data(), source16.data(), count * sizeof(zero::bfloat16)); };
    for (bool accumulate : {false, true})
      add(accumulate ? "ours rs bf16 all-to-all fp32acc" : "ours rs bf16 ring", Collective::reduce_scatter, refill16,
          [&, accumulate] {
            comm->set_fp32_accumulation(accumulate);
            comm->reduce_scatter(work16.data(), slice16.data(), counts, DType::bf16);
          },
          full_bytes / 2);
  }
  if (!o.skip_mpi) {
    add("MPI_Reduce_scatter_block", Collective::reduce_scatter, refill, [&] {
      MPI_Reduce_scatter_block(work.data(), slice.data(), int(chunk), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
    });
    add("MPI_Allreduce", Collective::all_reduce, refill, [&] {
      MPI_Allreduce(work.data(), result.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
  }

  run_rounds(rows, o.iters);
  if (rank == 0) print_report(rows, n, full_bytes, o.iters, mpi->segment_bytes(), o.bandwidth, o.latency);
  return 0;
}
