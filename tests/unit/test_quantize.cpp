// int8 quantized gradients (DeepSpeed's zero_quantized_gradients; Note [int8 quantized reduce-scatter] in
// distributed/comm/quantize.cpp) against references written out here:
//   - the block quantizer against its closed form: scale = absmax/127, q = round-half-even(x/scale), and
//     every dequantized value within scale/2 of its input;
//   - the in-process quantized reduce-scatter against an fp64 sum of the dequantized contributions, and
//     its ledger against the byte count of the int8 values and fp32 scales;
//   - error feedback (Note [Error feedback] in distributed/zero/gradient_reducer.cpp): over K reductions the
//     sum of the reduced gradients stays within a closed-form bound of the sum of the exact averages,
//     while without feedback small gradients in a block with a large one are lost every step.
// That the MPI backend gives the same bits is tested under mpirun (InProcessWorld.BitwiseEqualToMpi).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "distributed/zero/gradient_reducer.h"
#include "distributed/comm/inprocess_communicator.h"
#include "distributed/comm/quantize.h"
#include "tests/rounding_input.h"

namespace zero::dist {
namespace {

// The closed form of one block: scale absmax/127 and the values x/scale rounded half to even.
struct Reference {
  std::vector<float> scales;
  std::vector<int> values;
};

Reference reference_quantize(const std::vector<float>& x, std::size_t block) {
  Reference r;
  for (std::size_t begin = 0; begin < x.size(); begin += block) {
    const std::size_t end = std::min(x.size(), begin + block);
    float absmax = 0;
    for (std::size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(x[i]));
    const float s = absmax / 127.0f;
    r.scales.push_back(s);
    for (std::size_t i = begin; i < end; ++i) {
      const double t = s == 0 ? 0.0 : double(x[i] / s);
      double q = std::floor(t);
      const double frac = t - q;
      if (frac > 0.5 || (frac == 0.5 && std::fmod(q, 2.0) != 0)) q += 1;  // half to even
      r.values.push_back(int(q));
    }
  }
  return r;
}

TEST(Quantize, BlocksMatchTheClosedForm) {
  for (std::size_t block : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{256}}) {
    const std::size_t n = 1000;  // a partial last block for 7, 64 and 256
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = testing::rounding_input(int(i % 5), i) * float(1 + i % 11);
    std::fill(x.begin() + 64, x.begin() + 128, 0.0f);  // an all-zero block (block 64): scale 0
    std::vector<float> scales(quantized_blocks(n, block));
    std::vector<std::int8_t> values(n);
    quantize_blocks(x.data(), DType::f32, n, block, scales.data(), values.data());
    const Reference ref = reference_quantize(x, block);
    ASSERT_EQ(scales.size(), ref.scales.size());
    for (std::size_t b = 0; b < scales.size(); ++b) EXPECT_EQ(scales[b], ref.scales[b]) << "block " << b;
    std::vector<float> back(n);
    dequantize_accumulate(scales.data(), values.data(), n, block, back.data(), true);
    std::size_t wrong = 0, too_far = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += int(values[i]) != ref.values[i];
      const double s = ref.scales[i / block];
      too_far += std::abs(double(back[i]) - double(x[i])) > s / 2 * (1 + 1e-6);
      EXPECT_LE(std::abs(int(values[i])), 127);
    }
    EXPECT_EQ(wrong, 0u) << "block " << block;
    EXPECT_EQ(too_far, 0u) << "block " << block << ": |dequantized - x| > scale/2";
    EXPECT_EQ(quantized_bytes(n, block), n + 4 * ((n + block - 1) / block));
  }
}

TEST(Quantize, RoundsHalfToEvenAndKeepsNonFiniteBlocksNonFinite) {
  // absmax 127: scale 1, so each value is its own quotient; halves go to the even neighbour.
  const std::vector<float> x = {127.0f, 0.5f, 1.5f, 2.5f, -2.5f, -0.5f, 3.49f, -126.5f};
  float scale = 0;
  std::vector<std::int8_t> q(x.size());
  quantize_blocks(x.data(), DType::f32, x.size(), x.size(), &scale, q.data());
  EXPECT_EQ(scale, 1.0f);
  const std::vector<int> expect = {127, 0, 2, 2, -2, 0, 3, -126};
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(int(q[i]), expect[i]) << "x = " << x[i];
  // An inf in one block: that block dequantizes to NaN (an overflow stays visible), the next is untouched.
  const std::vector<float> y = {1.0f, std::numeric_limits<float>::infinity(), 2.0f, 4.0f};
  float scales[2];
  std::vector<std::int8_t> v(y.size());
  quantize_blocks(y.data(), DType::f32, y.size(), 2, scales, v.data());
  std::vector<float> back(y.size());
  dequantize_accumulate(scales, v.data(), y.size(), 2, back.data(), true);
  EXPECT_TRUE(std::isnan(back[0]) && std::isnan(back[1]));
  EXPECT_EQ(back[3], 4.0f);
  // bf16 input: the same closed form over the widened values.
  std::vector<bfloat16> b(x.begin(), x.end());
  quantize_blocks(b.data(), DType::bf16, b.size(), b.size(), &scale, q.data());
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(int(q[3]), 2);
  EXPECT_THROW(quantize_blocks(x.data(), DType::f32, x.size(), 0, &scale, q.data()), Error);
}

// ---- the reduce-scatter --------------------------------------------------------------------------------

template <typename T>
void check_quantized_reduce_scatter(DType dtype, std::size_t block) {
  for (int n = 1; n <= 4; ++n) {
    std::vector<std::size_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : 900 + 37 * std::size_t(r);  // uneven, one empty
    std::vector<std::size_t> offsets(n, 0);
    for (int r = 1; r < n; ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    auto input = [](int rank, std::size_t i) { return T(testing::rounding_input(rank, i) * float(1 + (i * 7) % 13)); };
    std::vector<std::vector<T>> results(n);
    std::vector<double> ledger(n);
    run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
      const int rank = comm->rank();
      std::vector<T> send(total);
      for (std::size_t i = 0; i < total; ++i) send[i] = input(rank, i);
      comm->set_quantized_gradients(block);
      results[rank].resize(counts[rank]);
      comm->ledger().reset();
      comm->reduce_scatter(send.data(), results[rank].data(), counts, dtype);
      ledger[rank] = comm->ledger()[Collective::reduce_scatter];
    });
    double expect_bytes = 0;
    for (std::size_t c : counts) expect_bytes += double(c + 4 * ((c + block - 1) / block));
    for (int d = 0; d < n; ++d) {
      // fp64 sum of each rank's slice d quantized on its own (blocks from the slice's start).
      std::vector<double> ref(counts[d], 0.0), magnitude(counts[d], 0.0);
      for (int r = 0; r < n; ++r) {
        std::vector<float> x(counts[d]);
        for (std::size_t j = 0; j < counts[d]; ++j) x[j] = float(input(r, offsets[d] + j));
        const Reference q = reference_quantize(x, block);
        for (std::size_t j = 0; j < counts[d]; ++j) {
          const double v = double(q.values[j]) * double(q.scales[j / block]);
          ref[j] += v;
          magnitude[j] += std::abs(v);
        }
      }
      const double unit = dtype == DType::f32 ? 0.0 : dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      std::size_t wrong = 0;
      for (std::size_t j = 0; j < counts[d]; ++j) {
        // fp32 additions in rank order, then one rounding to T.
        const double bound = n * std::ldexp(1.0, -24) * magnitude[j] + unit * std::abs(ref[j]) + 1e-30;
        wrong += std::abs(double(float(results[d][j])) - ref[j]) > bound;
      }
      EXPECT_EQ(wrong, 0u) << dtype_name(dtype) << ", block " << block << ", rank " << d << " of " << n;
      EXPECT_DOUBLE_EQ(ledger[d], (n - 1.0) / n * expect_bytes) << "rank " << d << " of " << n;
    }
  }
}

TEST(QuantizedReduceScatter, EqualsTheFp64SumOfTheDequantizedContributions) {
  check_quantized_reduce_scatter<float>(DType::f32, 256);
  check_quantized_reduce_scatter<float>(DType::f32, 10);
  check_quantized_reduce_scatter<bfloat16>(DType::bf16, 256);
  check_quantized_reduce_scatter<half>(DType::f16, 64);
}

// ---- error feedback ----------------------------------------------------------------------------------

// One parameter of M elements whose gradient on rank r at step t is c(t, r, i): one element of each
// 16 is 1 (the block's absmax), the others are small (0.003 .. 0.009), so quantized alone they round to
// zero every step. loss = sum(p * c) gives exactly that gradient. Returns, per rank, the sum over K
// reductions of its reduced gradient (its region) and of the exact average over ranks, in fp64.
struct FeedbackRun {
  std::vector<double> applied, exact;
};

float coefficient(int t, int r, std::int64_t i) {
  if ((i + t) % 16 == 0) return 1.0f;
  return 0.003f * float(1 + (i + r + t) % 3) * ((i % 5 == 0) ? -1.0f : 1.0f);
}

std::vector<FeedbackRun> run_feedback(int n, int stage, bool feedback, int steps) {
  constexpr std::int64_t M = 1000;
  std::vector<FeedbackRun> out(n);
  run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
    const int rank = comm->rank();
    ZeroOptions o;
    o.stage = stage;
    o.reduce_bucket_size = 300;  // buckets whose per-rank slices do not start on block boundaries
    o.quantized_gradients_block = 64;
    o.quantized_gradients_error_feedback = feedback;
    const ZeroPlan plan = plan_zero({{"p", {M}, true}}, n, o);
    comm->set_quantized_gradients(64);
    Tensor p = Tensor::zeros({M});
    p.set_requires_grad(true);
    GradientReducer reducer(plan, rank, comm, {p}, Device::cpu);
    EXPECT_EQ(reducer.residual_bytes(), feedback ? plan.memory().residual : 0.0);
    const std::int64_t begin = plan.region_begin(rank), size = plan.region_size(rank);
    FeedbackRun& mine = out[rank];
    mine.applied.assign(std::size_t(size), 0.0);
    mine.exact.assign(std::size_t(size), 0.0);
    for (int t = 0; t < steps; ++t) {
      std::vector<float> c(M);
      for (std::int64_t i = 0; i < M; ++i) c[std::size_t(i)] = coefficient(t, rank, i);
      reducer.begin_backward(true);
      autograd::backward(zero::sum(zero::mul(p, Tensor::from_vector(c, {M}))));
      reducer.end_backward();
      const std::vector<float> g = reducer.gradient().to_vector();
      for (std::int64_t j = 0; j < size; ++j) {
        const std::int64_t i = begin + j;
        mine.applied[std::size_t(j)] += g[std::size_t(j)];
        if (i < M)
          for (int r = 0; r < n; ++r) mine.exact[std::size_t(j)] += double(coefficient(t, r, i)) / n;
      }
      reducer.zero_grad();
    }
  });
  return out;
}

TEST(ErrorFeedback, SumOfAppliedGradientsTracksTheExactSum) {
  const int steps = 100;
  // Note [Error feedback]: sum of what was sent = sum of x_t - e_K + the residual's own quantization
  // errors. Every contribution here is pre-divided by n with absmax 1/n, so its block scale is at most
  // s = 1/(127 n) (2% more for the residual it carries); |e_K| <= s/2 and each stored residual is off by
  // at most half of its own scale, (s/2)/127. Over n contributions: n·s·(1/2 + K/254/2) per element.
  const double bound = 1.02 * (0.5 + steps / 508.0) / 127.0 + 1e-6;
  for (int stage : {1, 2}) {
    for (int n : {1, 2, 4}) {
      double with_max = 0, without_max = 0;
      for (bool feedback : {true, false}) {
        for (const FeedbackRun& r : run_feedback(n, stage, feedback, steps))
          for (std::size_t j = 0; j < r.applied.size(); ++j) {
            const double drift = std::abs(r.applied[j] - r.exact[j]);
            (feedback ? with_max : without_max) = std::max(feedback ? with_max : without_max, drift);
          }
      }
      EXPECT_LE(with_max, bound) << "stage " << stage << ", " << n << " ranks";
      EXPECT_GT(without_max, 5 * bound) << "stage " << stage << ", " << n << " ranks: no drift to correct";
    }
  }
}

}  // namespace
}  // namespace zero::dist
