// InProcessCommunicator (N ranks as N threads of this process) against references computed here:
// closed forms for exact sums, the ring's order of Note [The ring's order] written out element by
// element for sums that round, byte copies for gathers, the bus-bytes formulas for the ledger. Then the
// "no hang" guarantees: a rank that returns or throws early, a deadline, collectives that do not match,
// an allocation that fails on the communication thread. (That the results are bit for bit those of the
// MPI backend is tested under mpirun: InProcessWorld.BitwiseEqualToMpi in tests/distributed.)
//
// Every body runs on N threads (run_ranks); EXPECT_* is thread-safe, and each message names N and the
// rank because SCOPED_TRACE does not reach other threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "distributed/comm/inprocess_communicator.h"
#include "tests/rounding_input.h"

namespace zero::dist {
namespace {

constexpr int kMaxRanks = 4;

// ---- inputs and references ---------------------------------------------------------------------------

using zero::testing::rounding_input;

template <typename T>
T input(int rank, std::size_t i) {
  return T(rounding_input(rank, i));
}

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Element i of the slice owned by `owner`, reduced the way the ring does (Note [The ring's order] in
// distributed/comm/inprocess_communicator.cpp), one scalar at a time: the partial result starts at rank
// owner+1, each following rank combines it with its own value in fp32, rank `owner` last; a 16-bit
// partial result is rounded at every hop, or (fp32 wire) once at the end.
template <typename T>
T ring_reference(int n, int owner, std::size_t i, bool fp32_wire, ReduceOp op) {
  auto x = [&](int k) { return float(input<T>((owner + k) % n, i)); };
  auto hop = [&](float a, float b) { return op == ReduceOp::sum ? a + b : std::max(a, b); };
  if (n == 1) return input<T>(0, i);
  if (fp32_wire || std::is_same_v<T, float>) {
    float acc = x(1);
    for (int k = 2; k <= n; ++k) acc = hop(acc, x(k));
    return T(acc);
  }
  T acc = input<T>((owner + 1) % n, i);
  for (int k = 2; k <= n; ++k) acc = T(hop(float(acc), x(k)));
  return acc;
}

// The owner of each element when `count` is split evenly over n ranks (the first count % n get one more).
std::vector<int> even_owners(std::size_t count, int n) {
  std::vector<int> owner;
  for (int r = 0; r < n; ++r) owner.insert(owner.end(), count / n + (std::size_t(r) < count % n ? 1 : 0), r);
  return owner;
}

std::vector<std::size_t> offsets_of(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> offsets(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}

// Runs `body(comm)` on every world of 1..kMaxRanks ranks.
void for_each_world(const std::function<void(Communicator&)>& body) {
  for (int n = 1; n <= kMaxRanks; ++n) run_ranks(n, [&](std::shared_ptr<Communicator> comm) { body(*comm); });
}

std::string where(const Communicator& comm) {
  return "rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.world_size());
}

// ---- reductions: the ring's order, per dtype and wire dtype -----------------------------------------------

template <typename T>
void check_all_reduce(Communicator& comm, DType dtype, bool fp32_wire) {
  const int n = comm.world_size(), rank = comm.rank();
  comm.set_reduce_in_fp32(fp32_wire);
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{4099}}) {
    std::vector<T> buf(count);
    for (std::size_t i = 0; i < count; ++i) buf[i] = input<T>(rank, i);
    comm.all_reduce(buf.data(), count, dtype);
    const auto owner = even_owners(count, n);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (!same_bits(buf[i], ring_reference<T>(n, owner[i], i, fp32_wire, ReduceOp::sum))) ++wrong;
    EXPECT_EQ(wrong, 0u) << where(comm) << ", " << dtype_name(dtype) << ", fp32 wire " << fp32_wire << ", count "
                         << count;
  }
  comm.set_reduce_in_fp32(false);
}

TEST(InProcessCommunicator, AllReduceSumsInTheRingsOrder) {
  for_each_world([](Communicator& comm) {
    for (bool fp32_wire : {false, true}) {
      check_all_reduce<float>(comm, DType::f32, fp32_wire);
      check_all_reduce<half>(comm, DType::f16, fp32_wire);
      check_all_reduce<bfloat16>(comm, DType::bf16, fp32_wire);
    }
  });
}

TEST(InProcessCommunicator, AllReduceMax) {
  for_each_world([](Communicator& comm) {
    const std::size_t count = 1001;
    std::vector<float> buf(count);
    for (std::size_t i = 0; i < count; ++i) buf[i] = input<float>(comm.rank(), i);
    comm.all_reduce(buf.data(), count, DType::f32, ReduceOp::max);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      float m = input<float>(0, i);
      for (int r = 1; r < comm.world_size(); ++r) m = std::max(m, input<float>(r, i));
      if (buf[i] != m) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << where(comm);
  });
}

// Each rank keeps only its own slice (a different count per rank, some zero); recv out of place or
// aliasing this rank's slice of send.
template <typename T>
void check_reduce_scatter(Communicator& comm, DType dtype, bool fp32_wire, const std::vector<std::size_t>& counts,
                          bool in_place) {
  const int n = comm.world_size(), rank = comm.rank();
  comm.set_reduce_in_fp32(fp32_wire);
  const auto offsets = offsets_of(counts);
  std::vector<T> send(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = input<T>(rank, i);
  std::vector<T> recv(counts[rank], T(-1.0f));
  T* out = in_place ? send.data() + offsets[rank] : recv.data();
  comm.reduce_scatter(send.data(), out, counts, dtype);
  std::size_t wrong = 0, send_changed = 0;
  for (std::size_t j = 0; j < counts[rank]; ++j)
    if (!same_bits(out[j], ring_reference<T>(n, rank, offsets[rank] + j, fp32_wire, ReduceOp::sum))) ++wrong;
  for (std::size_t i = 0; i < send.size(); ++i) {
    const bool mine = i >= offsets[rank] && i < offsets[rank] + counts[rank];
    if (!(in_place && mine) && !same_bits(send[i], input<T>(rank, i))) ++send_changed;
  }
  const std::string what = where(comm) + ", " + std::string(dtype_name(dtype)) + ", fp32 wire " +
                           std::to_string(fp32_wire) + ", in place " + std::to_string(in_place);
  EXPECT_EQ(wrong, 0u) << what;
  EXPECT_EQ(send_changed, 0u) << what << ": the send buffer is input only";
  comm.set_reduce_in_fp32(false);
}

TEST(InProcessCommunicator, ReduceScatterSumsInTheRingsOrder) {
  for_each_world([](Communicator& comm) {
    const int n = comm.world_size();
    std::vector<std::vector<std::size_t>> layouts;
    layouts.emplace_back(n, 1000);                              // equal
    layouts.emplace_back(n);                                    // uneven: 100, 137, 174, ...
    for (int r = 0; r < n; ++r) layouts.back()[r] = 100 + 37 * std::size_t(r);
    layouts.emplace_back(n);                                    // every other rank empty
    for (int r = 0; r < n; ++r) layouts.back()[r] = r % 2 == 0 ? 0 : 1234;
    layouts.emplace_back(n, 0);                                 // nothing at all
    layouts.emplace_back(n, 0);                                 // everything on the last rank
    layouts.back().back() = 777;
    for (const auto& counts : layouts)
      for (bool in_place : {false, true})
        for (bool fp32_wire : {false, true}) {
          check_reduce_scatter<float>(comm, DType::f32, fp32_wire, counts, in_place);
          check_reduce_scatter<half>(comm, DType::f16, fp32_wire, counts, in_place);
          check_reduce_scatter<bfloat16>(comm, DType::bf16, fp32_wire, counts, in_place);
        }
  });
}

template <typename T>
void check_reduce(Communicator& comm, DType dtype, bool fp32_wire) {
  const int n = comm.world_size(), rank = comm.rank();
  const std::size_t count = 2001;
  const auto owner = even_owners(count, n);
  comm.set_reduce_in_fp32(fp32_wire);
  for (int root = 0; root < n; ++root) {
    std::vector<T> buf(count);
    for (std::size_t i = 0; i < count; ++i) buf[i] = input<T>(rank, i);
    comm.reduce(buf.data(), count, dtype, root);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const T want = rank == root ? ring_reference<T>(n, owner[i], i, fp32_wire, ReduceOp::sum) : input<T>(rank, i);
      if (!same_bits(buf[i], want)) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << where(comm) << ", " << dtype_name(dtype) << ", fp32 wire " << fp32_wire << ", root "
                         << root << " (other ranks' buffers stay unchanged)";
  }
  comm.set_reduce_in_fp32(false);
}

TEST(InProcessCommunicator, ReduceToEveryRoot) {
  for_each_world([](Communicator& comm) {
    for (bool fp32_wire : {false, true}) {
      check_reduce<float>(comm, DType::f32, fp32_wire);
      check_reduce<half>(comm, DType::f16, fp32_wire);
      check_reduce<bfloat16>(comm, DType::bf16, fp32_wire);
    }
  });
}

// ---- fp32 accumulation (Note [fp32-accumulating reduce-scatter] in distributed/comm/communicator.cpp) ---------

// Element i of a 16-bit sum with fp32 accumulation: every rank's value widened, added in fp32 in rank order
// 0, 1, ..., n-1, rounded to T once. The same for every owner.
template <typename T>
T rank_order_reference(int n, std::size_t i) {
  float acc = float(input<T>(0, i));
  for (int r = 1; r < n; ++r) acc += float(input<T>(r, i));
  return T(acc);
}

template <typename T>
void check_fp32_accumulation(Communicator& comm, DType dtype) {
  const int n = comm.world_size(), rank = comm.rank();
  comm.set_fp32_accumulation(true);
  std::vector<std::size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : 1000 + 37 * std::size_t(r);  // uneven, one empty
  const auto offsets = offsets_of(counts);
  std::vector<T> send(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = input<T>(rank, i);
  std::vector<T> recv(counts[rank]);
  comm.reduce_scatter(send.data(), recv.data(), counts, dtype);
  std::size_t wrong_rs = 0, wrong_ar = 0, differs_from_ring = 0;
  for (std::size_t j = 0; j < counts[rank]; ++j)
    if (!same_bits(recv[j], rank_order_reference<T>(n, offsets[rank] + j))) ++wrong_rs;
  const std::size_t count = 4099;
  std::vector<T> buf(count);
  for (std::size_t i = 0; i < count; ++i) buf[i] = input<T>(rank, i);
  comm.all_reduce(buf.data(), count, dtype);
  const auto owner = even_owners(count, n);
  for (std::size_t i = 0; i < count; ++i) {
    if (!same_bits(buf[i], rank_order_reference<T>(n, i))) ++wrong_ar;
    if (!same_bits(buf[i], ring_reference<T>(n, owner[i], i, false, ReduceOp::sum))) ++differs_from_ring;
  }
  const std::string what = where(comm) + ", " + std::string(dtype_name(dtype));
  EXPECT_EQ(wrong_rs, 0u) << what << ": reduce_scatter";
  EXPECT_EQ(wrong_ar, 0u) << what << ": all_reduce";
  if (n >= 3) {
    EXPECT_GT(differs_from_ring, count / 100) << what << ": the inputs do not tell one rounding from the ring's";
  }
  // The ledger: the same 16-bit bytes as the ring.
  comm.ledger().reset();
  comm.reduce_scatter(send.data(), recv.data(), counts, dtype);
  EXPECT_DOUBLE_EQ(comm.ledger()[Collective::reduce_scatter], (n - 1.0) / n * double(send.size()) * sizeof(T)) << what;
  comm.set_fp32_accumulation(false);
}

TEST(InProcessCommunicator, Fp32AccumulationSumsInRankOrderAndRoundsOnce) {
  for_each_world([](Communicator& comm) {
    check_fp32_accumulation<half>(comm, DType::f16);
    check_fp32_accumulation<bfloat16>(comm, DType::bf16);
  });
}

// Reduction error against an fp64 sum of the same bf16 contributions (bench/bench_reduction_error.cpp
// prints the table): values whose magnitudes span 2^-20 .. 2^-4 and half of whose sums cancel. With fp32
// accumulation every exact-in-fp32 sum is rounded once, so no element is off by more than bf16's unit
// roundoff 2^-8 whatever N is; the ring rounds N-1 times and, where a sum cancels, loses far more, more
// so as N grows.
TEST(InProcessCommunicator, Fp32AccumulationErrorDoesNotGrowWithN) {
  const std::size_t count = 1 << 14;
  // An 8-bit integer with a sign, times 2^(e_i + k) with e_i set by the element and k in 0..7 by the rank:
  // exact in bf16, and any sum of 16 of them is exact in fp32 (< 2^20 units of 2^e_i).
  auto value = [](int rank, std::size_t i) {
    const std::uint64_t h = (std::uint64_t(i) * 2654435761u + std::uint64_t(rank) * 97u + 7) * 0x9E3779B97F4A7C15ull;
    const float mantissa = float((h >> 20) % 255 + 1) * ((h >> 40) & 1 ? -1.0f : 1.0f);
    return std::ldexp(mantissa, -28 + int(i % 9) + int((h >> 50) % 8));
  };
  double ring_max[17] = {}, alltoall_max[17] = {}, alltoall_rms[17] = {};
  for (int n : {2, 4, 8, 16}) {
    std::vector<double> ring(count), alltoall(count);
    run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
      const int rank = comm->rank();
      const std::vector<std::size_t> counts(std::size_t(n), count / std::size_t(n));
      std::vector<bfloat16> send(count), recv(count / std::size_t(n));
      for (std::size_t i = 0; i < count; ++i) send[i] = bfloat16(value(rank, i));
      for (bool accumulate : {false, true}) {
        comm->set_fp32_accumulation(accumulate);
        comm->reduce_scatter(send.data(), recv.data(), counts, DType::bf16);
        for (std::size_t j = 0; j < recv.size(); ++j) (accumulate ? alltoall : ring)[rank * recv.size() + j] = float(recv[j]);
      }
      comm->set_fp32_accumulation(false);
    });
    double sum_sq = 0;
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double ref = 0;
      for (int r = 0; r < n; ++r) ref += double(float(bfloat16(value(r, i))));  // exact
      if (ref == 0) continue;
      const double a = std::abs(alltoall[i] - ref) / std::abs(ref), b = std::abs(ring[i] - ref) / std::abs(ref);
      alltoall_max[n] = std::max(alltoall_max[n], a);
      ring_max[n] = std::max(ring_max[n], b);
      sum_sq += a * a;
      ++nonzero;
    }
    alltoall_rms[n] = std::sqrt(sum_sq / double(nonzero));
    EXPECT_LE(alltoall_max[n], std::ldexp(1.0, -8)) << n << " ranks: one rounding to bf16";
    if (n > 2) {  // two contributions: the ring's one hop is the same single rounding
      EXPECT_GT(ring_max[n], 4 * alltoall_max[n]) << n << " ranks: the ring's per-hop rounding should show";
    }
  }
  EXPECT_GT(ring_max[16], 4 * ring_max[2]) << "the ring's error grows with N";
  EXPECT_LT(alltoall_rms[16], 1.5 * alltoall_rms[2]) << "fp32 accumulation: the error does not grow with N";
}

// fp32 buffers, and 16-bit ones already widened by reduce_in_fp32, keep their ring: the option is for
// 16-bit wires only.
TEST(InProcessCommunicator, Fp32AccumulationLeavesFp32WiresAlone) {
  for_each_world([](Communicator& comm) {
    comm.set_fp32_accumulation(true);
    EXPECT_FALSE(comm.accumulates_in_fp32(DType::f32));
    EXPECT_TRUE(comm.accumulates_in_fp32(DType::bf16));
    check_all_reduce<float>(comm, DType::f32, false);
    check_all_reduce<bfloat16>(comm, DType::bf16, true);  // sets and clears reduce_in_fp32 itself
    comm.set_fp32_accumulation(false);
  });
}

// With exact values (small multiples of 1/2) the ring's order does not matter: a closed form.
TEST(InProcessCommunicator, ExactSumsEqualTheClosedForm) {
  for_each_world([](Communicator& comm) {
    const int n = comm.world_size();
    const std::size_t count = 100003;
    std::vector<float> buf(count);
    for (std::size_t i = 0; i < count; ++i) buf[i] = 0.5f * float(comm.rank() + 1) + float(i % 13);
    comm.all_reduce(buf.data(), count, DType::f32);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (buf[i] != 0.25f * float(n * (n + 1)) + float(n) * float(i % 13)) ++wrong;
    EXPECT_EQ(wrong, 0u) << where(comm);
  });
}

// ---- all-gather and broadcast move bytes ---------------------------------------------------------------

TEST(InProcessCommunicator, AllGatherMovesRawBytes) {
  for_each_world([](Communicator& comm) {
    const int n = comm.world_size(), rank = comm.rank();
    // 16-bit patterns no arithmetic would keep: NaN payloads, -0, subnormals.
    auto bits = [](int r, std::size_t j) { return std::uint16_t(0x7C01 + 977 * r + 31 * j); };
    for (bool in_place : {false, true}) {
      std::vector<std::size_t> counts(n);
      for (int r = 0; r < n; ++r) counts[r] = r % 2 == 1 ? 0 : 333 + std::size_t(r);
      const auto offsets = offsets_of(counts);
      std::vector<std::uint16_t> recv(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), 0xFFFF);
      std::vector<std::uint16_t> send(counts[rank]);
      for (std::size_t j = 0; j < send.size(); ++j) send[j] = bits(rank, j);
      const std::uint16_t* in = send.data();
      if (in_place) {
        std::copy(send.begin(), send.end(), recv.begin() + std::ptrdiff_t(offsets[rank]));
        in = recv.data() + offsets[rank];
      }
      comm.all_gather(in, recv.data(), counts, DType::f16);
      std::size_t wrong = 0;
      for (int r = 0; r < n; ++r)
        for (std::size_t j = 0; j < counts[r]; ++j)
          if (recv[offsets[r] + j] != bits(r, j)) ++wrong;
      EXPECT_EQ(wrong, 0u) << where(comm) << ", in place " << in_place;
    }
  });
}

TEST(InProcessCommunicator, BroadcastFromEveryRoot) {
  for_each_world([](Communicator& comm) {
    const std::size_t count = 7777;
    for (int root = 0; root < comm.world_size(); ++root) {
      std::vector<float> buf(count, -1.0f);
      if (comm.rank() == root)
        for (std::size_t i = 0; i < count; ++i) buf[i] = rounding_input(root, i);
      comm.broadcast(buf.data(), count, DType::f32, root);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i)
        if (!same_bits(buf[i], rounding_input(root, i))) ++wrong;
      EXPECT_EQ(wrong, 0u) << where(comm) << ", root " << root;
    }
  });
}

// ---- control scalars, barrier, ledger -------------------------------------------------------------------

TEST(InProcessCommunicator, ControlScalarsAndBarrier) {
  for_each_world([](Communicator& comm) {
    const int n = comm.world_size(), rank = comm.rank();
    comm.ledger().reset();
    EXPECT_EQ(comm.all_reduce_sum(double(rank + 1)), 0.5 * n * (n + 1)) << where(comm);
    EXPECT_EQ(comm.all_reduce_max(double(rank + 1)), double(n)) << where(comm);
    std::vector<double> values = {double(rank), 1.0, -0.5 * rank};
    comm.all_reduce_sum(values);
    EXPECT_EQ(values, (std::vector<double>{0.5 * n * (n - 1), double(n), -0.25 * n * (n - 1)})) << where(comm);
    comm.barrier();
    const Ledger& l = comm.ledger();
    EXPECT_EQ(l.total(), 0.0) << where(comm) << ": control scalars and barriers stay out of the five counters";
    EXPECT_EQ(l.control_calls, 3) << where(comm);
    EXPECT_DOUBLE_EQ(l.control_bytes, Ledger::bus_bytes(Collective::all_reduce, 8 + 8 + 24, n)) << where(comm);
  });
}

// A barrier holds every rank until the last one arrives.
TEST(InProcessCommunicator, BarrierWaitsForTheLastRank) {
  for (int n = 2; n <= kMaxRanks; ++n) {
    std::atomic<int> before{0};
    run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
      if (comm->rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      before += 1;
      comm->barrier();
      EXPECT_EQ(before.load(), n) << where(*comm) << " left the barrier before every rank had arrived";
    });
  }
}

TEST(InProcessCommunicator, LedgerCountsWhatTheRingSends) {
  for_each_world([](Communicator& comm) {
    const int n = comm.world_size();
    const double ring = double(n - 1) / n;
    for (bool fp32_wire : {false, true}) {
      comm.set_reduce_in_fp32(fp32_wire);
      comm.ledger().reset();
      std::vector<half> h(1000, half(1.0f)), out(1000);
      std::vector<std::size_t> counts(n, 1000 / n);
      counts.back() += 1000 % n;
      comm.reduce_scatter(h.data(), out.data(), counts, DType::f16);
      comm.all_gather(out.data(), h.data(), counts, DType::f16);
      comm.all_reduce(h.data(), 1000, DType::f16);
      comm.reduce(h.data(), 300, DType::f16, 0);
      comm.broadcast(h.data(), 200, DType::f16, n - 1);
      const Ledger& l = comm.ledger();  // (collects the communication thread's timers)
      const double wire = fp32_wire ? 4 : 2;
      const std::string what = where(comm) + ", fp32 wire " + std::to_string(fp32_wire);
      EXPECT_DOUBLE_EQ(l[Collective::reduce_scatter], ring * 1000 * wire) << what;
      EXPECT_DOUBLE_EQ(l[Collective::all_gather], ring * 1000 * 2) << what;
      // MpiCommunicator's fp32 all-reduce reduces in fp32 and gathers the narrowed 16-bit slices.
      EXPECT_DOUBLE_EQ(l[Collective::all_reduce], ring * 1000 * (fp32_wire ? 6 : 4)) << what;
      EXPECT_DOUBLE_EQ(l[Collective::reduce], 300 * wire) << what;
      EXPECT_DOUBLE_EQ(l[Collective::broadcast], 200 * 2) << what;
      for (int c = 0; c < kNumCollectives; ++c) EXPECT_EQ(l.calls[c], 1) << what << " " << collective_name(Collective(c));
      EXPECT_TRUE(comm.times_collectives()) << what;
      if (n > 1) {
        EXPECT_GT(l.seconds[int(Collective::reduce_scatter)], 0.0) << what << ": the communication thread's timer";
        EXPECT_GT(l.cpu_seconds, 0.0) << what;
        EXPECT_LE(l.cpu_seconds, l.total_seconds() + 1e-6) << what << ": one thread's CPU time within its wall time";
      }
    }
    comm.set_reduce_in_fp32(false);
  });
}

// ---- asynchronous calls ----------------------------------------------------------------------------------

// An async call returns before its peers have even issued theirs (so backward can overlap it), and
// queued calls run in issue order, interleaved with blocking ones.
TEST(InProcessCommunicator, AsyncCallsReturnAtOnceAndRunInIssueOrder) {
  for (int n = 2; n <= kMaxRanks; ++n) {
    std::atomic<bool> rank0_issued{false};
    run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
      comm->set_timeout(20);  // a blocking issue would end in CollectiveTimeout, not hang
      const int rank = comm->rank();
      for (int ms = 0; rank != 0 && !rank0_issued && ms < 30'000; ++ms)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::vector<float> a(5000), b(1000 * std::size_t(n)), c(7);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(rank + 1);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(2 * rank);
      std::vector<std::size_t> counts(n, 1000);
      std::vector<float> scattered(1000);
      auto w1 = comm->all_reduce_async(a.data(), a.size(), DType::f32);
      if (rank == 0) {
        EXPECT_FALSE(w1->is_completed()) << "completed before the other ranks issued it";
        rank0_issued = true;
      }
      std::shared_ptr<Work> w2;
      {
        const std::vector<std::size_t> temporary = counts;  // copied at issue
        w2 = comm->reduce_scatter_async(b.data(), scattered.data(), temporary, DType::f32);
      }
      c.assign(7, float(rank));
      comm->all_reduce(c.data(), c.size(), DType::f32, ReduceOp::max);  // runs after w1 and w2
      EXPECT_TRUE(w1->is_completed()) << where(*comm);
      EXPECT_TRUE(w2->is_completed()) << where(*comm);
      w2->wait();  // out of order, and twice
      w1->wait();
      w1->wait();
      EXPECT_EQ(a[4999], 0.5f * float(n * (n + 1))) << where(*comm);
      EXPECT_EQ(scattered[999], float(n * (n - 1))) << where(*comm);
      EXPECT_EQ(c[0], float(n - 1)) << where(*comm);
    });
  }
}

// ---- no hang: leaving, failing, deadlines, mismatches ------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(InProcessCommunicator, ARankThatReturnsEarlyMakesTheOthersFailAtOnce) {
  for (int n = 2; n <= kMaxRanks; ++n) {
    std::vector<int> gone_rank(n, -2);
    std::vector<double> waited(n, 0);
    try {
      run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
        comm->set_timeout(120);
        if (comm->rank() == n - 1) return;  // leaves without taking part
        std::vector<float> buf(100, 1.0f);
        const auto start = std::chrono::steady_clock::now();
        try {
          comm->all_reduce(buf.data(), buf.size(), DType::f32);
        } catch (const PeerGone& e) {
          gone_rank[comm->rank()] = e.rank();
          waited[comm->rank()] = seconds_since(start);
          EXPECT_TRUE(e.departed()) << e.what();
          EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
          throw;
        }
      });
      ADD_FAILURE() << "run_ranks did not rethrow";
    } catch (const PeerGone& e) {
      EXPECT_EQ(e.rank(), n - 1) << e.what();
    }
    for (int r = 0; r < n - 1; ++r) {
      EXPECT_EQ(gone_rank[r], n - 1) << "rank " << r << " of " << n;
      EXPECT_LT(waited[r], 30.0) << "rank " << r << " of " << n << " waited for a rank that had left";
    }
  }
}

TEST(InProcessCommunicator, TheRankThatFailedIsTheErrorReported) {
  for (int n = 1; n <= kMaxRanks; ++n) {
    const int culprit = n / 2;
    std::atomic<int> peers_gone{0};
    try {
      run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
        if (comm->rank() == culprit) throw std::runtime_error("rank " + std::to_string(culprit) + " broke");
        try {
          comm->barrier();
        } catch (const PeerGone& e) {
          EXPECT_FALSE(e.departed()) << e.what();
          EXPECT_EQ(e.rank(), culprit) << e.what();
          ++peers_gone;
          throw;
        }
      });
      ADD_FAILURE() << "run_ranks did not rethrow";
    } catch (const std::runtime_error& e) {
      // Not the lower ranks' PeerGone: the culprit's own error.
      EXPECT_EQ(std::string(e.what()), "rank " + std::to_string(culprit) + " broke");
    }
    EXPECT_EQ(peers_gone.load(), n - 1);
  }
}

TEST(InProcessCommunicator, QueuedWorkOfALeavingRankStillRuns) {
  for (int n = 2; n <= kMaxRanks; ++n) {
    std::vector<float> last_buf(10, 1.0f);  // outlives the body: the queued all-reduce writes it
    run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
      if (comm->rank() == n - 1) {
        comm->all_reduce_async(last_buf.data(), last_buf.size(), DType::f32);
        return;  // without waiting: leaving runs it first
      }
      std::vector<float> buf(10, 1.0f);
      comm->all_reduce(buf.data(), buf.size(), DType::f32);
      EXPECT_EQ(buf[9], float(n)) << where(*comm);
    });
    EXPECT_EQ(last_buf[0], float(n));
  }
}

TEST(InProcessCommunicator, ACollectivePastItsDeadlineNamesTheMissingRanks) {
  for (int n = 2; n <= kMaxRanks; ++n) {
    std::atomic<bool> timed_out{false};
    std::string message;
    int later_gone = -2;
    try {
      run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
        std::vector<float> buf(10, 1.0f);
        if (comm->rank() == 0) {
          comm->set_timeout(0.2);
          comm->set_step(7);
          try {
            comm->all_reduce(buf.data(), buf.size(), DType::f32);
          } catch (const CollectiveTimeout& e) {
            message = e.what();
            timed_out = true;
            // Later collectives fail at once with the same error: the ranks are out of step.
            EXPECT_THROW(comm->barrier(), CollectiveTimeout);
            throw;
          }
          return;
        }
        while (!timed_out) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // arrive too late
        try {
          comm->all_reduce(buf.data(), buf.size(), DType::f32);
        } catch (const PeerGone& e) {
          if (comm->rank() == 1) later_gone = e.rank();
          throw;
        }
      });
      ADD_FAILURE() << "run_ranks did not rethrow";
    } catch (const CollectiveTimeout& e) {
      EXPECT_EQ(e.step(), 7);
      EXPECT_EQ(e.seconds(), 0.2);
    }
    std::string missing;
    for (int r = 1; r < n; ++r) missing += (r > 1 ? ", " : "") + std::to_string(r);
    EXPECT_EQ(message, "all_reduce at step 7 timed out after 0.2 s waiting for rank(s) " + missing);
    EXPECT_EQ(later_gone, 0) << "a late rank must fail at once: rank 0 has given up";
  }
}

TEST(InProcessCommunicator, MismatchedCollectivesFailOnEveryRank) {
  for (int n = 2; n <= kMaxRanks; ++n) {
    std::atomic<int> failed{0};
    EXPECT_THROW(run_ranks(n,
                           [&](std::shared_ptr<Communicator> comm) {
                             std::vector<float> buf(8, 1.0f);
                             try {
                               if (comm->rank() == 1)
                                 comm->broadcast(buf.data(), buf.size(), DType::f32, 0);
                               else
                                 comm->all_reduce(buf.data(), buf.size(), DType::f32);
                             } catch (const Error& e) {
                               EXPECT_NE(std::string(e.what()).find("issued"), std::string::npos) << e.what();
                               ++failed;
                               throw;
                             }
                           }),
                 Error);
    EXPECT_EQ(failed.load(), n);
  }
}

// Equal counts, different purposes (Note [Collective identity]): rank 1 gathers what the others reduce.
// Without identities the exchange would go through and mix the buffers up; with them every rank throws
// the same line, naming both sides, before any data moves.
TEST(InProcessCommunicator, SameCountsDifferentPurposeIsOneLineNamingBothSides) {
  for (int n = 2; n <= kMaxRanks; ++n) {
    std::mutex mutex;
    std::vector<std::string> lines;
    EXPECT_THROW(run_ranks(n,
                           [&](std::shared_ptr<Communicator> comm) {
                             std::vector<float> send(std::size_t(n) * 4, 1.0f), recv(send.size(), 0.0f);
                             const std::vector<std::size_t> counts(std::size_t(n), 4);
                             comm->set_timeout(60);     // a missed mismatch ends as a timeout, not a hang
                             comm->all_reduce_sum(1.0);  // collective #1 agrees
                             try {
                               if (comm->rank() == 1)
                                 comm->with_purpose("gather of blocks.2")
                                     .all_gather(send.data() + 4, recv.data(), counts, DType::f32);
                               else
                                 comm->with_purpose("gather of blocks.3")
                                     .all_gather(send.data() + 4 * std::size_t(comm->rank()), recv.data(), counts,
                                                 DType::f32);
                             } catch (const CollectiveMismatch& e) {
                               std::lock_guard lock(mutex);
                               lines.push_back(e.what());
                               throw;
                             }
                           }),
                 CollectiveMismatch);  // not CollectiveTimeout: found at once, not waited out
    ASSERT_EQ(lines.size(), std::size_t(n));
    const std::string counts = n == 2 ? "4,4" : n == 3 ? "4,4,4" : "4,4,4,4";
    for (const std::string& line : lines)
      EXPECT_EQ(line, "collective #2 at step 0: rank 0 issued all_gather 'gather of blocks.3' (counts " + counts +
                          "; f32) but rank 1 issued all_gather 'gather of blocks.2' (counts " + counts +
                          "; f32) (every rank must issue the same collectives in the same order)");
  }
}

// A second channel (duplicate) orders its collectives on its own: rank 0 waits on channel B while rank 1
// first waits on channel A, which one channel in issue order would deadlock; its bytes count in the
// first channel's ledger.
TEST(InProcessCommunicator, ADuplicateIsAnIndependentChannelCountedInTheSameLedger) {
  run_ranks(2, [](std::shared_ptr<Communicator> comm) {
    std::shared_ptr<Communicator> other = comm->duplicate();
    std::vector<float> a(4, 1.0f), b(4, 2.0f);
    if (comm->rank() == 0) {
      other->all_reduce(b.data(), b.size(), DType::f32);
      comm->all_reduce(a.data(), a.size(), DType::f32);
    } else {
      auto first = comm->all_reduce_async(a.data(), a.size(), DType::f32);
      other->all_reduce(b.data(), b.size(), DType::f32);
      first->wait();
    }
    EXPECT_EQ(a[0], 2.0f);
    EXPECT_EQ(b[0], 4.0f);
    EXPECT_EQ(comm->ledger().calls[static_cast<int>(Collective::all_reduce)], 2);
    EXPECT_EQ(comm->ledger()[Collective::all_reduce], 2 * Ledger::bus_bytes(Collective::all_reduce, 16, 2));
  });
}

// A collective too large for this process's memory fails on this rank before it is posted; done alike
// on every rank, the ranks stay in step and the next collective works.
TEST(InProcessCommunicator, ACollectiveTooLargeFailsBeforePostingAndKeepsTheRanksInStep) {
  for_each_world([](Communicator& comm) {
    half h(1.0f);
    auto work = comm.all_reduce_async(&h, std::size_t{1} << 61, DType::f16);
    EXPECT_THROW(work->wait(), Error) << where(comm);
    EXPECT_THROW(work->wait(), Error) << where(comm) << ": every wait() rethrows";
    EXPECT_TRUE(work->is_completed());
    std::vector<float> f(10, 1.0f);
    comm.all_reduce(f.data(), f.size(), DType::f32);
    EXPECT_EQ(f[9], float(comm.world_size())) << where(comm);
  });
}

TEST(InProcessCommunicator, BadUse) {
  EXPECT_THROW(run_ranks(0, [](std::shared_ptr<Communicator>) {}), Error);
  EXPECT_THROW(make_inprocess_world(-1), Error);
  auto world = make_inprocess_world(2);
  EXPECT_EQ(world[1]->rank(), 1);
  EXPECT_EQ(world[1]->world_size(), 2);
  EXPECT_EQ(world[0]->backend_name(), "inprocess");
  auto& rank0 = static_cast<InProcessCommunicator&>(*world[0]);
  rank0.leave();
  std::vector<float> f(4, 1.0f);
  EXPECT_THROW(rank0.all_reduce(f.data(), f.size(), DType::f32), Error);
  // Rank 1 finds rank 0 gone instead of waiting for it.
  EXPECT_THROW(world[1]->all_reduce(f.data(), f.size(), DType::f32), PeerGone);
}

}  // namespace
}  // namespace zero::dist
