// Collectives of the MPI communicator against closed-form references.
//
// Each rank fills its buffers from a formula of (rank, index), so every rank can compute the expected
// result of a collective locally. Values are small multiples of powers of two, so fp32 sums are exact
// and results are compared with ==. Every test issues the same collectives on every rank whatever it
// finds (checks come after the calls), so a failure on one rank never leaves the others waiting.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "distributed/comm/job_runtime.h"
#include "distributed/comm/inprocess_communicator.h"
#include "distributed/comm/mpi_communicator.h"
#include "tests/rounding_input.h"

namespace zero::dist {
namespace {

// Rank r's value at index i, and its sum / max over n ranks.
float value(int rank, std::size_t i) { return 0.5f * float(rank + 1) + float(i % 13); }
float value_sum(int n, std::size_t i) { return 0.25f * float(n * (n + 1)) + float(n) * float(i % 13); }
float max_source(int rank, std::size_t i) { return float((i * 31 + std::size_t(rank) * 17) % 101); }
float max_expected(int n, std::size_t i) {
  float m = max_source(0, i);
  for (int r = 1; r < n; ++r) m = std::max(m, max_source(r, i));
  return m;
}

std::vector<std::size_t> offsets_of(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> offsets(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}
std::size_t sum_of(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

class CommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = mpi_world();
    n_ = comm_->world_size();
    rank_ = comm_->rank();
    comm_->ledger().reset();
  }

  // Reduce-scatter of f32 `value` buffers with the given per-rank counts; checks this rank's slice.
  void check_reduce_scatter(const std::vector<std::size_t>& counts, bool in_place) {
    const auto offsets = offsets_of(counts);
    std::vector<float> send(sum_of(counts));
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(rank_, i);
    std::vector<float> recv(counts[rank_], -1.0f);
    float* out = in_place ? send.data() + offsets[rank_] : recv.data();
    comm_->reduce_scatter(send.data(), out, counts, DType::f32);
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < counts[rank_]; ++j)
      if (out[j] != value_sum(n_, offsets[rank_] + j)) ++wrong;
    EXPECT_EQ(wrong, 0u) << "rank " << rank_ << " of " << n_;
    if (!in_place) {  // the send buffer is input only
      for (std::size_t i = 0; i < send.size(); ++i) ASSERT_EQ(send[i], value(rank_, i)) << i;
    }
  }

  // All-gather of f32 slices rank r -> value(r, j); checks the whole result.
  void check_all_gather(const std::vector<std::size_t>& counts, bool in_place) {
    const auto offsets = offsets_of(counts);
    std::vector<float> recv(sum_of(counts), -1.0f);
    std::vector<float> send(counts[rank_]);
    for (std::size_t j = 0; j < counts[rank_]; ++j) send[j] = value(rank_, j);
    const float* in = send.data();
    if (in_place) {
      std::copy(send.begin(), send.end(), recv.begin() + std::ptrdiff_t(offsets[rank_]));
      in = recv.data() + offsets[rank_];
    }
    comm_->all_gather(in, recv.data(), counts, DType::f32);
    std::size_t wrong = 0;
    for (int r = 0; r < n_; ++r)
      for (std::size_t j = 0; j < counts[r]; ++j)
        if (recv[offsets[r] + j] != value(r, j)) ++wrong;
    EXPECT_EQ(wrong, 0u) << "rank " << rank_ << " of " << n_;
  }

  std::shared_ptr<Communicator> comm_;
  int n_ = 1;
  int rank_ = 0;
};

// ---- all-reduce ----------------------------------------------------------------------------------

TEST_F(CommunicatorTest, AllReduceSumF32) {
  // Includes counts smaller than the world (empty slices) and counts not divisible by any n.
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000},
                            std::size_t{100003}}) {
    std::vector<float> buf(count);
    for (std::size_t i = 0; i < count; ++i) buf[i] = value(rank_, i);
    comm_->all_reduce(buf.data(), count, DType::f32);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (buf[i] != value_sum(n_, i)) ++wrong;
    EXPECT_EQ(wrong, 0u) << "count " << count;
  }
}

TEST_F(CommunicatorTest, AllReduceMaxF32) {
  const std::size_t count = 12345;
  std::vector<float> buf(count);
  for (std::size_t i = 0; i < count; ++i) buf[i] = max_source(rank_, i);
  comm_->all_reduce(buf.data(), count, DType::f32, ReduceOp::max);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (buf[i] != max_expected(n_, i)) ++wrong;
  EXPECT_EQ(wrong, 0u);
}

// Data-parallel replicas must stay bit-identical, so an all-reduce of values whose sum rounds must give
// every rank the same bits (true of the ring: each slice is summed once, by its owner, then copied).
TEST_F(CommunicatorTest, AllReduceIsBitIdenticalOnEveryRank) {
  const std::size_t count = 10007;
  std::vector<float> buf(count);
  for (std::size_t i = 0; i < count; ++i)
    buf[i] = std::sin(float(i) * 0.37f + float(rank_)) * std::exp(float((i + 7 * rank_) % 11));
  comm_->all_reduce(buf.data(), count, DType::f32);
  std::vector<float> from_root = buf;
  comm_->broadcast(from_root.data(), count, DType::f32, 0);
  EXPECT_EQ(std::memcmp(buf.data(), from_root.data(), count * sizeof(float)), 0);
}

// ---- reduce-scatter ------------------------------------------------------------------------------

TEST_F(CommunicatorTest, ReduceScatterEqualCounts) {
  check_reduce_scatter(std::vector<std::size_t>(n_, 1000), false);
}

TEST_F(CommunicatorTest, ReduceScatterUnevenCounts) {
  std::vector<std::size_t> counts(n_);
  for (int r = 0; r < n_; ++r) counts[r] = 100 + 37 * std::size_t(r);
  check_reduce_scatter(counts, false);
}

TEST_F(CommunicatorTest, ReduceScatterZeroCountsOnSomeRanks) {
  std::vector<std::size_t> counts(n_);
  for (int r = 0; r < n_; ++r) counts[r] = r % 2 == 0 ? 0 : 1234;
  check_reduce_scatter(counts, false);
  std::fill(counts.begin(), counts.end(), 0);  // nothing at all
  check_reduce_scatter(counts, false);
  counts.back() = 777;  // everything on the last rank
  check_reduce_scatter(counts, false);
}

TEST_F(CommunicatorTest, ReduceScatterPrimeCounts) {
  std::vector<std::size_t> counts(n_, 9973);
  counts[0] = 10007;
  check_reduce_scatter(counts, false);
}

TEST_F(CommunicatorTest, ReduceScatterInPlace) {
  std::vector<std::size_t> counts(n_);
  for (int r = 0; r < n_; ++r) counts[r] = 501 + 3 * std::size_t(r);
  check_reduce_scatter(counts, true);
}

// Many small segments exercise the pipelining: slices of different lengths cut into different numbers
// of segments, and a broadcast chain several segments deep.
TEST_F(CommunicatorTest, SmallSegments) {
  auto mpi = std::dynamic_pointer_cast<MpiCommunicator>(comm_);
  ASSERT_NE(mpi, nullptr);
  const std::size_t saved = mpi->segment_bytes();
  mpi->set_segment_bytes(7 * sizeof(float));
  EXPECT_EQ(mpi->segment_bytes(), 7 * sizeof(float));

  std::vector<std::size_t> counts(n_);
  for (int r = 0; r < n_; ++r) counts[r] = 50 + 11 * std::size_t(r);
  check_reduce_scatter(counts, false);
  check_all_gather(counts, false);

  std::vector<float> buf(1001);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = value(rank_, i);
  comm_->all_reduce(buf.data(), buf.size(), DType::f32);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < buf.size(); ++i)
    if (buf[i] != value_sum(n_, i)) ++wrong;
  EXPECT_EQ(wrong, 0u) << "all_reduce";

  for (int root = 0; root < n_; ++root) {
    std::vector<float> b(333, -1.0f), red(333);
    if (rank_ == root)
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = value(root, i);
    for (std::size_t i = 0; i < red.size(); ++i) red[i] = value(rank_, i);
    comm_->broadcast(b.data(), b.size(), DType::f32, root);
    comm_->reduce(red.data(), red.size(), DType::f32, root);
    std::size_t wrong_b = 0, wrong_r = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (b[i] != value(root, i)) ++wrong_b;
      if (rank_ == root && red[i] != value_sum(n_, i)) ++wrong_r;
    }
    EXPECT_EQ(wrong_b, 0u) << "broadcast from " << root;
    EXPECT_EQ(wrong_r, 0u) << "reduce to " << root;
  }
  mpi->set_segment_bytes(saved);
}

// ---- all-gather ----------------------------------------------------------------------------------

TEST_F(CommunicatorTest, AllGatherOutOfPlace) {
  std::vector<std::size_t> counts(n_);
  for (int r = 0; r < n_; ++r) counts[r] = 200 + 13 * std::size_t(r);
  check_all_gather(counts, false);
  counts.assign(n_, 0);  // empty slices
  counts[0] = 5;
  check_all_gather(counts, false);
}

TEST_F(CommunicatorTest, AllGatherInPlace) {
  std::vector<std::size_t> counts(n_);
  for (int r = 0; r < n_; ++r) counts[r] = r % 2 == 1 ? 0 : 333 + std::size_t(r);
  check_all_gather(counts, true);
  check_all_gather(std::vector<std::size_t>(n_, 4096), true);
}

TEST_F(CommunicatorTest, AllGatherHalfMovesRawBits) {
  std::vector<std::size_t> counts(n_, 17);
  const auto offsets = offsets_of(counts);
  std::vector<half> recv(sum_of(counts));
  for (std::size_t j = 0; j < counts[rank_]; ++j) recv[offsets[rank_] + j] = half(value(rank_, j));
  comm_->all_gather(recv.data() + offsets[rank_], recv.data(), counts, DType::f16);
  for (int r = 0; r < n_; ++r)
    for (std::size_t j = 0; j < counts[r]; ++j)
      ASSERT_EQ(float(recv[offsets[r] + j]), float(half(value(r, j))));
}

// ---- reduce and broadcast ------------------------------------------------------------------------

TEST_F(CommunicatorTest, ReduceToEveryRoot) {
  const std::size_t count = 10001;
  for (int root = 0; root < n_; ++root) {
    std::vector<float> buf(count);
    for (std::size_t i = 0; i < count; ++i) buf[i] = value(rank_, i);
    comm_->reduce(buf.data(), count, DType::f32, root);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const float expected = rank_ == root ? value_sum(n_, i) : value(rank_, i);  // others untouched
      if (buf[i] != expected) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << "root " << root;
  }
}

TEST_F(CommunicatorTest, BroadcastFromEveryRoot) {
  const std::size_t count = 7777;
  for (int root = 0; root < n_; ++root) {
    std::vector<float> buf(count, -1.0f);
    if (rank_ == root)
      for (std::size_t i = 0; i < count; ++i) buf[i] = value(root, i);
    comm_->broadcast(buf.data(), count, DType::f32, root);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (buf[i] != value(root, i)) ++wrong;
    EXPECT_EQ(wrong, 0u) << "root " << root;
  }
}

// ---- fp16 / bf16 accumulate in fp32 --------------------------------------------------------------
//
// Rank r's element i is an integer k < 2^bits times 2^(-10 + r % 3): exactly representable in the
// half type (bits = its significand width), with sums exact in fp32. The sum of three or more such
// values usually needs more bits than the half type has, so accumulating in the half type (rounding
// after each partial sum) gives a different answer than rounding the exact sum once — the test
// asserts that it does for some elements, so it can tell the two apart.

template <typename T>
float low_precision_source(int rank, std::size_t i) {
  constexpr int bits = std::is_same_v<T, half> ? 11 : 8;
  const std::uint64_t k = (i * 2654435761u + std::uint64_t(rank) * 40503u) % (1u << bits);
  return std::ldexp(float(k), -10 + rank % 3);
}

template <typename T>
struct LowPrecisionExpectation {
  std::vector<T> single_rounding;  // the exact (= fp32) sum rounded once
  std::size_t naive_differs = 0;   // elements where rank-order accumulation in T would differ
};

template <typename T>
LowPrecisionExpectation<T> expected_low_precision_sums(int n, std::size_t count) {
  LowPrecisionExpectation<T> e;
  e.single_rounding.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    float exact = 0.0f;
    T naive = T(0.0f);
    for (int r = 0; r < n; ++r) {
      exact += low_precision_source<T>(r, i);
      naive = T(float(naive) + low_precision_source<T>(r, i));
    }
    e.single_rounding[i] = T(exact);
    if (float(naive) != float(e.single_rounding[i])) ++e.naive_differs;
  }
  return e;
}

template <typename T>
void check_low_precision_sums(Communicator& comm, DType dtype) {
  const int n = comm.world_size();
  const int rank = comm.rank();
  const std::size_t count = 4099;
  const auto expected = expected_low_precision_sums<T>(n, count);
  // (EXPECT, not ASSERT: every rank must go on to issue the collectives below.)
  if (n >= 3) {
    EXPECT_GT(expected.naive_differs, count / 100) << "values do not discriminate";
  }

  std::vector<T> source(count);
  for (std::size_t i = 0; i < count; ++i) source[i] = T(low_precision_source<T>(rank, i));

  std::vector<T> all_reduced = source;
  comm.all_reduce(all_reduced.data(), count, dtype);

  std::vector<std::size_t> counts(n, count / n);
  counts.back() += count % n;
  const auto offsets = offsets_of(counts);
  std::vector<T> scattered(counts[rank]);
  comm.reduce_scatter(source.data(), scattered.data(), counts, dtype);

  std::vector<T> reduced = source;
  comm.reduce(reduced.data(), count, dtype, n - 1);

  std::size_t wrong_ar = 0, wrong_rs = 0, wrong_reduce = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (float(all_reduced[i]) != float(expected.single_rounding[i])) ++wrong_ar;
    if (rank == n - 1 && float(reduced[i]) != float(expected.single_rounding[i])) ++wrong_reduce;
  }
  for (std::size_t j = 0; j < counts[rank]; ++j)
    if (float(scattered[j]) != float(expected.single_rounding[offsets[rank] + j])) ++wrong_rs;
  EXPECT_EQ(wrong_ar, 0u) << "all_reduce";
  EXPECT_EQ(wrong_rs, 0u) << "reduce_scatter";
  EXPECT_EQ(wrong_reduce, 0u) << "reduce";
}

// communication_data_type fp32 (set_reduce_in_fp32); the default, 16-bit partial sums rounded once per
// hop, is tested in test_wire_and_overlap.cpp.
TEST_F(CommunicatorTest, HalfSumsAccumulateInFp32) {
  comm_->set_reduce_in_fp32(true);
  check_low_precision_sums<half>(*comm_, DType::f16);
  comm_->set_reduce_in_fp32(false);
}

TEST_F(CommunicatorTest, Bfloat16SumsAccumulateInFp32) {
  comm_->set_reduce_in_fp32(true);
  check_low_precision_sums<bfloat16>(*comm_, DType::bf16);
  comm_->set_reduce_in_fp32(false);
}

// ---- async ---------------------------------------------------------------------------------------

TEST_F(CommunicatorTest, AsyncInFifoOrderMatchesBlocking) {
  std::vector<std::size_t> counts(n_);
  for (int r = 0; r < n_; ++r) counts[r] = 3000 + 101 * std::size_t(r);
  const auto offsets = offsets_of(counts);
  const std::size_t total = sum_of(counts);

  auto fill = [&](std::vector<float>& v, int salt) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(rank_ + salt, i);
  };
  // Blocking results first.
  std::vector<float> rs_send(total), ag_recv(total), ar_buf(20011), ar2_buf(999);
  fill(rs_send, 0);
  fill(ar_buf, 1);
  fill(ar2_buf, 2);
  std::vector<float> rs_blocking(counts[rank_]);
  comm_->reduce_scatter(rs_send.data(), rs_blocking.data(), counts, DType::f32);
  std::vector<float> ag_send(counts[rank_]);
  fill(ag_send, 3);
  std::vector<float> ag_blocking(total);
  comm_->all_gather(ag_send.data(), ag_blocking.data(), counts, DType::f32);
  std::vector<float> ar_blocking = ar_buf, ar2_blocking = ar2_buf;
  comm_->all_reduce(ar_blocking.data(), ar_blocking.size(), DType::f32);
  comm_->all_reduce(ar2_blocking.data(), ar2_blocking.size(), DType::f32, ReduceOp::max);

  // The same four, in flight together; the counts vector dies before the work runs (it is copied).
  std::vector<float> rs_async(counts[rank_]);
  std::shared_ptr<Work> w_rs, w_ag;
  {
    const std::vector<std::size_t> temporary_counts = counts;
    w_rs = comm_->reduce_scatter_async(rs_send.data(), rs_async.data(), temporary_counts, DType::f32);
    w_ag = comm_->all_gather_async(ag_send.data(), ag_recv.data(), temporary_counts, DType::f32);
  }
  auto w_ar = comm_->all_reduce_async(ar_buf.data(), ar_buf.size(), DType::f32);
  // A blocking call between async ones runs after them (FIFO) and before the next.
  comm_->all_reduce(ar2_buf.data(), ar2_buf.size(), DType::f32, ReduceOp::max);
  EXPECT_TRUE(w_rs->is_completed());
  EXPECT_TRUE(w_ag->is_completed());
  EXPECT_TRUE(w_ar->is_completed());
  w_ar->wait();  // waiting out of order is fine
  w_ag->wait();
  w_rs->wait();
  w_rs->wait();  // and more than once

  EXPECT_EQ(rs_async, rs_blocking);
  EXPECT_EQ(ag_recv, ag_blocking);
  EXPECT_EQ(ar_buf, ar_blocking);
  EXPECT_EQ(ar2_buf, ar2_blocking);
  for (std::size_t j = 0; j < counts[rank_]; ++j)
    ASSERT_EQ(rs_async[j], value_sum(n_, offsets[rank_] + j));
}

// An exception on the communication thread reaches the caller through wait(). The f16 all-reduce with
// fp32 reductions first sizes an fp32 scratch buffer; a count no vector can hold fails there, on every
// rank alike and before any message is sent. (With one rank all-reduce has nothing to do, and nothing
// is queued.)
TEST_F(CommunicatorTest, ErrorsOnTheCommunicationThreadReachWait) {
  if (n_ == 1) GTEST_SKIP() << "one rank: collectives run inline, and all-reduce is a no-op";
  half h(1.0f);
  comm_->set_reduce_in_fp32(true);
  auto work = comm_->all_reduce_async(&h, std::size_t{1} << 61, DType::f16);
  comm_->set_reduce_in_fp32(false);  // read when the task runs: wait first
  EXPECT_ANY_THROW(work->wait());
  EXPECT_ANY_THROW(work->wait());  // every time
  EXPECT_TRUE(work->is_completed());
  std::vector<float> f(10, 1.0f);  // and the queue goes on
  comm_->all_reduce(f.data(), f.size(), DType::f32);
  EXPECT_EQ(f[9], float(n_));
}

// ---- ledger --------------------------------------------------------------------------------------

TEST_F(CommunicatorTest, LedgerFollowsBusBytesFormula) {
  const double n = n_;
  Ledger& ledger = comm_->ledger();

  std::vector<float> buf(1000, 1.0f);
  comm_->all_reduce(buf.data(), buf.size(), DType::f32);
  comm_->all_reduce(buf.data(), 500, DType::f32);
  std::vector<half> hbuf(300, half(1.0f));
  comm_->all_reduce(hbuf.data(), hbuf.size(), DType::f16);
  const double ar_expected = 2 * (n - 1) / n * (1000 * 4 + 500 * 4 + 300 * 2);

  std::vector<std::size_t> counts(n_);
  for (int r = 0; r < n_; ++r) counts[r] = 10 + std::size_t(r);
  const std::size_t total = sum_of(counts);
  std::vector<float> send(total, 1.0f), recv(total, 0.0f);
  comm_->reduce_scatter(send.data(), recv.data(), counts, DType::f32);
  const double rs_expected = (n - 1) / n * double(total * 4);

  std::vector<bfloat16> bsend(counts[rank_], bfloat16(1.0f)), brecv(total);
  comm_->all_gather(bsend.data(), brecv.data(), counts, DType::bf16);
  const double ag_expected = (n - 1) / n * double(total * 2);

  comm_->reduce(buf.data(), 250, DType::f32, 0);
  const double reduce_expected = 250 * 4;
  comm_->broadcast(buf.data(), 125, DType::f32, n_ - 1);
  comm_->broadcast(hbuf.data(), 64, DType::f16, 0);
  const double broadcast_expected = 125 * 4 + 64 * 2;
  comm_->barrier();

  EXPECT_DOUBLE_EQ(ledger[Collective::all_reduce], ar_expected);
  EXPECT_DOUBLE_EQ(ledger[Collective::reduce_scatter], rs_expected);
  EXPECT_DOUBLE_EQ(ledger[Collective::all_gather], ag_expected);
  EXPECT_DOUBLE_EQ(ledger[Collective::reduce], reduce_expected);
  EXPECT_DOUBLE_EQ(ledger[Collective::broadcast], broadcast_expected);
  EXPECT_EQ(ledger.calls[int(Collective::all_reduce)], 3);
  EXPECT_EQ(ledger.calls[int(Collective::reduce_scatter)], 1);
  EXPECT_EQ(ledger.calls[int(Collective::all_gather)], 1);
  EXPECT_EQ(ledger.calls[int(Collective::reduce)], 1);
  EXPECT_EQ(ledger.calls[int(Collective::broadcast)], 2);
  const double total_expected =
      ar_expected + rs_expected + ag_expected + reduce_expected + broadcast_expected;
  EXPECT_DOUBLE_EQ(ledger.total(), total_expected);
  EXPECT_EQ(ledger.control_bytes, 0.0);

  const nlohmann::json j = ledger.to_json();
  EXPECT_DOUBLE_EQ(j.at("all_reduce").get<double>(), ar_expected);
  EXPECT_DOUBLE_EQ(j.at("reduce_scatter").get<double>(), rs_expected);
  EXPECT_DOUBLE_EQ(j.at("all_gather").get<double>(), ag_expected);
  EXPECT_DOUBLE_EQ(j.at("reduce").get<double>(), reduce_expected);
  EXPECT_DOUBLE_EQ(j.at("broadcast").get<double>(), broadcast_expected);
  EXPECT_DOUBLE_EQ(j.at("total").get<double>(), total_expected);

  ledger.reset();
  EXPECT_EQ(ledger.total(), 0.0);
  EXPECT_EQ(ledger.calls[int(Collective::all_reduce)], 0);
}

TEST_F(CommunicatorTest, AsyncCallsAreRecordedAtIssue) {
  std::vector<float> buf(4000, 1.0f);
  auto work = comm_->all_reduce_async(buf.data(), buf.size(), DType::f32);
  EXPECT_DOUBLE_EQ(comm_->ledger()[Collective::all_reduce],
                   Ledger::bus_bytes(Collective::all_reduce, 16000, n_));
  work->wait();
}

TEST_F(CommunicatorTest, ControlScalarsStayOutOfTheFiveCounters) {
  const double sum = comm_->all_reduce_sum(double(rank_ + 1));
  const double max = comm_->all_reduce_max(double(rank_ + 1));
  EXPECT_EQ(sum, 0.5 * n_ * (n_ + 1));
  EXPECT_EQ(max, double(n_));
  const Ledger& ledger = comm_->ledger();
  for (int c = 0; c < kNumCollectives; ++c) {
    EXPECT_EQ(ledger.bytes[c], 0.0) << collective_name(Collective(c));
    EXPECT_EQ(ledger.calls[c], 0) << collective_name(Collective(c));
  }
  EXPECT_EQ(ledger.total(), 0.0);
  EXPECT_EQ(ledger.control_calls, 2);
  EXPECT_DOUBLE_EQ(ledger.control_bytes, 2 * Ledger::bus_bytes(Collective::all_reduce, 8, n_));
}

// ---- the in-process backend gives the same bits ----------------------------------------------------
//
// Every MPI rank also runs an in-process world (distributed/comm/inprocess_communicator.h) of the same size
// on the same inputs, which are formulas of (rank, index), and keeps what its own rank computed there:
// it must equal this rank's MPI result bit for bit, for sums that round (Note [The ring's order] in
// inprocess_communicator.cpp).

using zero::testing::rounding_input;

// The results of one rank: a reduce-scatter with uneven counts (one rank's slice empty), an all-reduce,
// a reduce to the last rank.
template <typename T>
struct RoundingResults {
  std::vector<T> scattered, all_reduced, reduced;
};

template <typename T>
RoundingResults<T> run_rounding_collectives(Communicator& comm, DType dtype, bool fp32_wire, bool accumulate,
                                            std::size_t block) {
  const int n = comm.world_size(), rank = comm.rank();
  std::vector<std::size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : 1000 + 37 * std::size_t(r);
  std::vector<T> source(std::max<std::size_t>(sum_of(counts), 10007));
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = T(rounding_input(rank, i));
  comm.set_reduce_in_fp32(fp32_wire);
  comm.set_fp32_accumulation(accumulate);
  comm.set_quantized_gradients(block);
  RoundingResults<T> out;
  out.scattered.resize(counts[rank]);
  comm.reduce_scatter(source.data(), out.scattered.data(), counts, dtype);
  out.all_reduced.assign(source.begin(), source.begin() + 10007);
  comm.all_reduce(out.all_reduced.data(), out.all_reduced.size(), dtype);
  out.reduced.assign(source.begin(), source.begin() + 5003);
  comm.reduce(out.reduced.data(), out.reduced.size(), dtype, n - 1);
  comm.set_reduce_in_fp32(false);
  comm.set_fp32_accumulation(false);
  comm.set_quantized_gradients(0);
  return out;
}

template <typename T>
std::size_t bits_differ(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return differ;
}

template <typename T>
void check_inprocess_equals_mpi(Communicator& mpi, DType dtype, bool fp32_wire, bool accumulate = false,
                                std::size_t block = 0) {
  const RoundingResults<T> over_mpi = run_rounding_collectives<T>(mpi, dtype, fp32_wire, accumulate, block);
  RoundingResults<T> in_process;
  run_ranks(mpi.world_size(), [&](std::shared_ptr<Communicator> comm) {
    RoundingResults<T> mine = run_rounding_collectives<T>(*comm, dtype, fp32_wire, accumulate, block);  // every rank
    if (comm->rank() == mpi.rank()) in_process = std::move(mine);
  });
  const std::string what = fmt::format("{}, fp32 wire {}, fp32 accumulation {}, int8 block {}, rank {} of {}",
                                       dtype_name(dtype), fp32_wire, accumulate, block, mpi.rank(), mpi.world_size());
  EXPECT_EQ(bits_differ(in_process.scattered, over_mpi.scattered), 0u) << what << ": reduce_scatter";
  EXPECT_EQ(bits_differ(in_process.all_reduced, over_mpi.all_reduced), 0u) << what << ": all_reduce";
  EXPECT_EQ(bits_differ(in_process.reduced, over_mpi.reduced), 0u) << what << ": reduce";
  // The inputs tell summation orders apart: rank order 0, 1, .., n-1 gives other bits than the ring.
  if (dtype == DType::f32 && mpi.world_size() >= 3) {
    std::size_t order_shows = 0;
    for (std::size_t i = 0; i < over_mpi.all_reduced.size(); ++i) {
      float in_rank_order = 0;
      for (int r = 0; r < mpi.world_size(); ++r) in_rank_order += rounding_input(r, i);
      order_shows += in_rank_order != float(over_mpi.all_reduced[i]);
    }
    EXPECT_GT(order_shows, over_mpi.all_reduced.size() / 100) << what;
  }
}

TEST(InProcessWorld, BitwiseEqualToMpi) {
  auto mpi = mpi_world();
  for (bool fp32_wire : {false, true}) {
    check_inprocess_equals_mpi<float>(*mpi, DType::f32, fp32_wire);
    check_inprocess_equals_mpi<half>(*mpi, DType::f16, fp32_wire);
    check_inprocess_equals_mpi<bfloat16>(*mpi, DType::bf16, fp32_wire);
  }
  // Note [fp32-accumulating reduce-scatter]: the all-to-all over MPI messages against the in-process sums.
  check_inprocess_equals_mpi<half>(*mpi, DType::f16, false, true);
  check_inprocess_equals_mpi<bfloat16>(*mpi, DType::bf16, false, true);
  // Note [int8 quantized reduce-scatter]: int8 blocks over MPI messages against the in-process sums, in
  // one segment and in segments of 3 blocks (a block of 100 elements, 300-byte segments).
  auto* backend = dynamic_cast<MpiCommunicator*>(mpi.get());
  ASSERT_NE(backend, nullptr);
  const std::size_t segment = backend->segment_bytes();
  for (std::size_t bytes : {segment, std::size_t{300}}) {
    backend->set_segment_bytes(bytes);
    check_inprocess_equals_mpi<float>(*mpi, DType::f32, false, false, 100);
    check_inprocess_equals_mpi<bfloat16>(*mpi, DType::bf16, false, false, 256);
    check_inprocess_equals_mpi<half>(*mpi, DType::f16, false, false, 7);
  }
  backend->set_segment_bytes(segment);
}

// ---- identities (Note [Collective identity]) ---------------------------------------------------------

// Rank 1 issues a reduce-scatter where the others all-gather, with equal counts: on a second channel
// (so the job's own communicator stays in step for the tests after this one), every rank throws the
// same line naming both sides (found from the identities, not waited out as a timeout).
TEST_F(CommunicatorTest, MismatchedCollectiveIsOneLineOnEveryRank) {
  if (n_ == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  std::shared_ptr<Communicator> channel = comm_->duplicate();
  channel->set_timeout(60);  // a missed mismatch would end as CollectiveTimeout, which this test does not catch
  const std::vector<std::size_t> counts(std::size_t(n_), 4);
  std::vector<float> send(std::size_t(n_) * 4, 1.0f), recv(send.size(), -1.0f);
  std::string line;
  try {
    if (rank_ == 1)
      channel->with_purpose("reduce-scatter of bucket 3").reduce_scatter(send.data(), recv.data(), counts, DType::f32);
    else
      channel->with_purpose("gather of blocks.2")
          .all_gather(send.data() + 4 * std::size_t(rank_), recv.data(), counts, DType::f32);
    ADD_FAILURE() << "the mismatch went through";
  } catch (const CollectiveMismatch& e) {
    line = e.what();
  }
  std::string c = "4";
  for (int r = 1; r < n_; ++r) c += ",4";
  EXPECT_EQ(line, "collective #1 at step 0: rank 0 issued all_gather 'gather of blocks.2' (counts " + c +
                      "; f32) but rank 1 issued reduce_scatter 'reduce-scatter of bucket 3' (counts " + c +
                      "; f32) (every rank must issue the same collectives in the same order)");
  // The job's communicator is untouched.
  std::vector<float> f(4, 1.0f);
  comm_->all_reduce(f.data(), f.size(), DType::f32);
  EXPECT_EQ(f[0], float(n_));
}

// ---- errors --------------------------------------------------------------------------------------

TEST_F(CommunicatorTest, BadArgumentsThrowBeforeAnyTraffic) {
  std::vector<std::int32_t> ints(8, 1);
  std::vector<std::size_t> counts(n_, 2);
  try {
    comm_->all_reduce(ints.data(), ints.size(), DType::i32);
    ADD_FAILURE() << "i32 all_reduce did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm_->reduce_scatter(ints.data(), ints.data(), counts, DType::i64), Error);
  EXPECT_THROW(comm_->all_gather_async(ints.data(), ints.data(), counts, DType::i32), Error);
  EXPECT_THROW(comm_->broadcast(ints.data(), 1, DType::i32, 0), Error);
  EXPECT_THROW(comm_->reduce(ints.data(), 1, DType::i64, 0), Error);

  std::vector<float> f(64, 1.0f);
  std::vector<std::size_t> wrong_length(n_ + 1, 1);
  EXPECT_THROW(comm_->reduce_scatter(f.data(), f.data(), wrong_length, DType::f32), Error);
  EXPECT_THROW(comm_->all_gather(f.data(), f.data(), wrong_length, DType::f32), Error);
  EXPECT_THROW(comm_->broadcast(f.data(), 4, DType::f32, n_), Error);
  EXPECT_THROW(comm_->reduce(f.data(), 4, DType::f32, -1), Error);
  EXPECT_THROW(comm_->all_reduce(nullptr, 4, DType::f32), Error);
  EXPECT_EQ(comm_->ledger().total(), 0.0);  // nothing was issued

  // The communicator is still usable (and still in step across ranks) afterwards.
  comm_->all_reduce(f.data(), f.size(), DType::f32);
  EXPECT_EQ(f[0], float(n_));
}

}  // namespace
}  // namespace zero::dist
