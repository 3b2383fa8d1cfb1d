// Every core/cuda kernel on random inputs against a reference: the nn kernels against double-precision
// formulas within the bound of their f32 evaluation (kernel_bounds.h, Note [Kernel error bounds]), the
// rest against the CPU backend (kernels(Device::cpu), optim/) or host arithmetic with the tolerance each
// comparison justifies (Note [CUDA test tolerances], cuda_test_util.h). One case per kernel has at
// least 2^24 elements. Skipped without a GPU. GEMM is in test_cuda_gemm.cpp.
#include <gtest/gtest.h>

#ifdef ZERO_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#include "core/kernels.h"
#include "core/tensor.h"
#include "cuda_test_util.h"
#include "kernel_bounds.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"

namespace zero {
namespace {

using cuda_test::all_close;
using cuda_test::CudaTest;
using cuda_test::DeviceArray;
using cuda_test::random_floats;
using cuda_test::random_indices;
using CudaKernels = CudaTest;
namespace kb = kernel_bounds;

Kernels& gpu() { return kernels(Device::cuda); }

// CUDA's tanhf and expf: at most 2 ulp from the exact value (CUDA C Programming Guide, "Mathematical
// Functions"). Note [Kernel error bounds] (kernel_bounds.h).
constexpr double kDeviceUlps = 2.0;

// The values of `v` after rounding to `t` (and back to f32), as the host rounds them.
std::vector<float> rounded(const std::vector<float>& v, DType t) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(t).to(DType::f32).to_vector();
}

// A cuda tensor of dtype t holding v (rounded to t).
Tensor on_device(const std::vector<float>& v, DType t) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(t).to(Device::cuda);
}

// Rows of `rows` x C, row r of x starting at x + r * C.
template <class F>
void for_rows(std::int64_t rows, F f) {
  for (std::int64_t r = 0; r < rows; ++r) f(r);
}

// Against double-precision references, each element within the bound of the kernel's f32 evaluation
// (kernel_bounds.h; the host stand-ins in test_cuda_kernel_math.cpp show a correct kernel inside it).
// N > 128 uses several row groups in the parameter reduction (40000: the 256-group cap); the last case
// has 2^24 elements.
TEST_F(CudaKernels, LayerNormForwardBackward) {
  for (auto [N, C] : {std::pair<std::int64_t, std::int64_t>{37, 100},
                      {64, 768},
                      {5, 1},
                      {3, 33},
                      {1000, 96},
                      {40000, 77},
                      {32768, 512}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " G=" << cuda::detail::layernorm_param_groups(N));
    const auto x = random_floats(N * C, 1, -2.0f, 2.0f);
    const auto w = random_floats(C, 2, 0.5f, 1.5f);
    const auto b = random_floats(C, 3);
    DeviceArray<float> dx(x), dw(w), db(b), dout_(N * C), dmean(N), drstd(N);
    gpu().layernorm_forward(dout_.get(), dmean.get(), drstd.get(), dx.get(), dw.get(), db.get(), N, C, 1e-5f);
    std::vector<double> y_ref(N * C), y_bound(N * C), m_ref(N), m_bound(N), s_ref(N), s_bound(N);
    for_rows(N, [&](std::int64_t r) {
      const auto ref = kb::layernorm_row_ref(x.data() + r * C, w.data(), b.data(), C, 1e-5f);
      std::copy(ref.y.begin(), ref.y.end(), y_ref.begin() + r * C);
      std::copy(ref.y_bound.begin(), ref.y_bound.end(), y_bound.begin() + r * C);
      m_ref[r] = ref.mean, m_bound[r] = ref.mean_bound, s_ref[r] = ref.rstd, s_bound[r] = ref.rstd_bound;
    });
    EXPECT_TRUE(kb::within_bounds(dout_.to_host(), y_ref, y_bound));
    const auto mean = dmean.to_host(), rstd = drstd.to_host();  // the backward's inputs, taken as exact
    EXPECT_TRUE(kb::within_bounds(mean, m_ref, m_bound));
    EXPECT_TRUE(kb::within_bounds(rstd, s_ref, s_bound));

    const auto dy = random_floats(N * C, 4);
    const auto gw0 = random_floats(C, 5), gb0 = random_floats(C, 6);  // backward accumulates into these
    DeviceArray<float> ddy(dy), dgx(N * C), dgw(gw0), dgb(gb0);
    gpu().layernorm_backward(dgx.get(), dgw.get(), dgb.get(), ddy.get(), dx.get(), dw.get(), dmean.get(), drstd.get(),
                             N, C);
    std::vector<double> gx_ref(N * C), gx_bound(N * C), row, row_bound;
    for_rows(N, [&](std::int64_t r) {
      kb::layernorm_backward_row_ref(row, row_bound, dy.data() + r * C, x.data() + r * C, w.data(), mean[r], rstd[r],
                                     C);
      std::copy(row.begin(), row.end(), gx_ref.begin() + r * C);
      std::copy(row_bound.begin(), row_bound.end(), gx_bound.begin() + r * C);
    });
    EXPECT_TRUE(kb::within_bounds(dgx.to_host(), gx_ref, gx_bound));
    const auto params = kb::layernorm_params_ref(dy, x, mean, rstd, gw0, gb0, N, C);
    EXPECT_TRUE(kb::within_bounds(dgw.to_host(), params.dweight, params.dweight_bound));
    EXPECT_TRUE(kb::within_bounds(dgb.to_host(), params.dbias, params.dbias_bound));
  }
}

// Against the double-precision formula (Note [GELU backward error]), not against the CPU kernel: Eigen's
// vectorised tanh saturates to exactly ±1 near |x| ≈ 4.9, where 1 - t^2 is still 5e-7, so the CPU kernel
// is itself a few times 1e-6 off there (test_cuda_kernel_math.cpp measures it) and any fixed tolerance
// between the two is either too tight or hides real errors. The second case has 2^24 elements.
TEST_F(CudaKernels, GeluForwardBackward) {
  for (std::int64_t n : {std::int64_t{10007}, std::int64_t{1} << 24}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const auto x = random_floats(n, 7, -10.0f, 10.0f);
    const auto dy = random_floats(n, 8);
    DeviceArray<float> d_x(x), d_dy(dy), d_y(n), d_dx(n);
    gpu().gelu_forward(d_y.get(), d_x.get(), n);
    gpu().gelu_backward(d_dx.get(), d_x.get(), d_dy.get(), n);
    std::vector<double> y(n), yb(n), g(n), gb(n);
    for (std::int64_t i = 0; i < n; ++i) {
      y[i] = kb::gelu_ref(x[i]);
      yb[i] = kb::gelu_bound(x[i], kDeviceUlps);
      g[i] = kb::gelu_backward_ref(x[i], dy[i]);
      gb[i] = kb::gelu_backward_bound(x[i], dy[i], kDeviceUlps);
    }
    EXPECT_TRUE(kb::within_bounds(d_y.to_host(), y, yb));
    EXPECT_TRUE(kb::within_bounds(d_dx.to_host(), g, gb));
  }
}

// Against double-precision references within the block-per-row kernels' bounds (kernel_bounds.h); the
// backward from the device's own forward output. The last case has 2^24 elements.
TEST_F(CudaKernels, SoftmaxForwardBackward) {
  for (auto [N, C] : {std::pair<std::int64_t, std::int64_t>{33, 65}, {7, 1000}, {4, 1}, {2, 3000}, {16384, 1024}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
    const auto x = random_floats(N * C, 9, -10.0f, 10.0f);
    const auto dy = random_floats(N * C, 10);
    DeviceArray<float> d_x(x), d_dy(dy), d_y(N * C), d_dx(N * C);
    gpu().softmax_forward(d_y.get(), d_x.get(), N, C);
    gpu().softmax_backward(d_dx.get(), d_y.get(), d_dy.get(), N, C);
    const auto y = d_y.to_host();
    std::vector<double> p(N * C), pb(N * C), g(N * C), gb(N * C), row, row_bound;
    for_rows(N, [&](std::int64_t r) {
      kb::softmax_row_ref(row, row_bound, x.data() + r * C, C, C, kb::block_chain(C), kDeviceUlps);
      std::copy(row.begin(), row.end(), p.begin() + r * C);
      std::copy(row_bound.begin(), row_bound.end(), pb.begin() + r * C);
      kb::softmax_backward_row_ref(row, row_bound, y.data() + r * C, dy.data() + r * C, C, C, 1.0, kb::block_chain(C));
      std::copy(row.begin(), row.end(), g.begin() + r * C);
      std::copy(row_bound.begin(), row_bound.end(), gb.begin() + r * C);
    });
    EXPECT_TRUE(kb::within_bounds(y, p, pb));
    EXPECT_TRUE(kb::within_bounds(d_dx.to_host(), g, gb));
  }
}

// T = 200 > 64: each lane of the causal softmax holds several positions of a row. The last case has
// B·H·T² = 2^24 attention weights.
TEST_F(CudaKernels, CausalAttentionForwardBackward) {
  struct Case {
    std::int64_t B, T, C, H;
  };
  for (Case c : {Case{2, 17, 48, 4}, Case{3, 64, 96, 3}, Case{1, 1, 8, 2}, Case{2, 40, 64, 1}, Case{2, 200, 64, 2},
                 Case{1, 2048, 64, 4}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " C=" << c.C << " H=" << c.H);
    const std::int64_t n_qkv = c.B * c.T * 3 * c.C, n_out = c.B * c.T * c.C, n_att = c.B * c.H * c.T * c.T;
    const auto qkv = random_floats(n_qkv, 11);
    DeviceArray<float> d_qkv(qkv), d_out(n_out), d_att(n_att);
    gpu().attention_forward(d_out.get(), d_att.get(), d_qkv.get(), c.B, c.T, c.C, c.H);
    const auto att = d_att.to_host();
    const auto dout = random_floats(n_out, 12);
    DeviceArray<float> d_dout(dout), d_dqkv(n_qkv);
    gpu().attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), c.B, c.T, c.C, c.H);
    const auto ref = kb::attention_ref(qkv, att, dout, c.B, c.T, c.C, c.H, kDeviceUlps);
    EXPECT_TRUE(kb::within_bounds(att, ref.att, ref.att_bound));  // zeros above the diagonal too (bound 0)
    EXPECT_TRUE(kb::within_bounds(d_out.to_host(), ref.out, ref.out_bound));
    EXPECT_TRUE(kb::within_bounds(d_dqkv.to_host(), ref.dqkv, ref.dqkv_bound));
  }
}

// probs within the softmax bound (block per row over V), the mean loss within the mean of the rows' loss
// bounds (logf: 1 ulp) plus its rounding to f32 (the mean itself is summed in double); dlogits =
// (p - onehot) s, s = dloss / N: from the device's probs, 3 roundings (s, the product, the subtraction).
// The last case has 2^24 logits.
TEST_F(CudaKernels, CrossEntropyForwardBackward) {
  for (auto [N, V] : {std::pair<std::int64_t, std::int64_t>{50, 65}, {9, 5000}, {1, 2}, {4096, 4096}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " V=" << V);
    const auto logits = random_floats(N * V, 13, -4.0f, 4.0f);
    const auto targets = random_indices(N, V, 14);
    DeviceArray<float> d_logits(logits), d_probs(N * V), d_dlogits(N * V), d_loss(1), d_dloss(std::vector<float>{0.7f});
    DeviceArray<std::int64_t> d_targets(targets);
    gpu().cross_entropy_forward(d_loss.get(), d_probs.get(), d_logits.get(), d_targets.get(), N, V);
    const float got = d_loss.to_host()[0];
    const auto probs = d_probs.to_host();
    std::vector<double> p(N * V), pb(N * V), row, row_bound;
    double loss = 0.0, loss_bound = 0.0;
    for_rows(N, [&](std::int64_t r) {
      kb::softmax_row_ref(row, row_bound, logits.data() + r * V, V, V, kb::block_chain(V), kDeviceUlps);
      std::copy(row.begin(), row.end(), p.begin() + r * V);
      std::copy(row_bound.begin(), row_bound.end(), pb.begin() + r * V);
      const auto ce = kb::cross_entropy_row_ref(logits.data() + r * V, V, targets[r], kb::block_chain(V), kDeviceUlps,
                                                1.0);
      loss += ce.loss / N;
      loss_bound += ce.bound / N;
    });
    loss_bound += kb::ulp_f32(loss);  // the rounding of the double mean to f32: half an ulp, with margin
    EXPECT_NEAR(got, loss, loss_bound);
    EXPECT_TRUE(kb::within_bounds(probs, p, pb));
    std::vector<double> g(N * V), gb(N * V);
    for (std::int64_t i = 0; i < N * V; ++i) {
      const double sd = 0.7 / N;
      const bool hit = targets[i / V] == i % V;
      g[i] = probs[i] * sd - (hit ? sd : 0.0);
      gb[i] = kb::kSecondOrder * kb::kU * (std::abs(probs[i] * sd) * 2 + std::abs(g[i]) + (hit ? sd : 0.0));
    }
    gpu().cross_entropy_backward(d_dlogits.get(), d_probs.get(), d_targets.get(), d_dloss.get(), N, V);
    EXPECT_TRUE(kb::within_bounds(d_dlogits.to_host(), g, gb));
  }
  // A target far below the row's maximum: its probability underflows f32 (e^-120 < 1e-52), yet the
  // log-softmax loss is exact to its bound, 120 + log(2 + e^-120), not a clamp's 69.
  {
    const std::vector<float> far{0.0f, 0.0f, -120.0f};
    DeviceArray<float> d_far(far), d_p(3), d_l(1);
    DeviceArray<std::int64_t> d_t(std::vector<std::int64_t>{2});
    gpu().cross_entropy_forward(d_l.get(), d_p.get(), d_far.get(), d_t.get(), 1, 3);
    const float got = d_l.to_host()[0];
    const auto ce = kb::cross_entropy_row_ref(far.data(), 3, 2, kb::block_chain(3), kDeviceUlps, 1.0);
    EXPECT_NEAR(got, ce.loss, ce.bound + kb::ulp_f32(ce.loss));
    EXPECT_GT(got, 120.0f);
  }
  // A target outside [0, V) raises a deferred error: the next synchronize throws, and leaves no error
  // behind.
  DeviceArray<float> logits(random_floats(2 * 3, 15)), probs(6), loss(1);
  DeviceArray<std::int64_t> bad(std::vector<std::int64_t>{1, 3});
  gpu().cross_entropy_forward(loss.get(), probs.get(), logits.get(), bad.get(), 2, 3);
  EXPECT_THROW(gpu().synchronize(), Error);
  EXPECT_NO_THROW(cuda::synchronize());
}

// Forward is a gather: bit-exact. Backward adds each dout row into its weight row with atomics, in any
// order: element (v, c) is w0 + the k rows with index v, k f32 additions, so within k u (|w0| + sum |dout|)
// of the double sum (Note [CUDA test tolerances]). The second case has 2^24 output elements.
TEST_F(CudaKernels, EmbeddingForwardBackward) {
  for (auto [N, V, C] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{40, 10, 7}, {32768, 1000, 512}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " V=" << V << " C=" << C);
    const auto weight = random_floats(V * C, 16);
    const auto idx = random_indices(N, V, 17);  // N draws from V rows: repeats, so backward adds
    std::vector<float> out(N * C);
    kernels(Device::cpu).embedding_forward(out.data(), weight.data(), idx.data(), N, V, C);
    DeviceArray<float> d_weight(weight), d_out(N * C);
    DeviceArray<std::int64_t> d_idx(idx);
    gpu().embedding_forward(d_out.get(), d_weight.get(), d_idx.get(), N, V, C);
    EXPECT_EQ(d_out.to_host(), out);

    const auto dout = random_floats(N * C, 18);
    const std::vector<float> dweight0 = random_floats(V * C, 19);
    DeviceArray<float> d_dweight(dweight0), d_dout(dout);
    std::vector<double> want(dweight0.begin(), dweight0.end()), abs_sum(V * C), bound(V * C);
    std::vector<std::int64_t> hits(V, 0);
    for (std::int64_t i = 0; i < V * C; ++i) abs_sum[i] = std::abs(dweight0[i]);
    for (std::int64_t r = 0; r < N; ++r) {
      ++hits[idx[r]];
      for (std::int64_t c = 0; c < C; ++c) {
        want[idx[r] * C + c] += dout[r * C + c];
        abs_sum[idx[r] * C + c] += std::abs(dout[r * C + c]);
      }
    }
    for (std::int64_t i = 0; i < V * C; ++i) bound[i] = kb::kSecondOrder * hits[i / C] * kb::kU * abs_sum[i];
    gpu().embedding_backward(d_dweight.get(), d_dout.get(), d_idx.get(), N, V, C);
    EXPECT_TRUE(kb::within_bounds(d_dweight.to_host(), want, bound));
  }
}

// One IEEE operation per element, correctly rounded on both sides (nothing to contract): bit-exact.
TEST_F(CudaKernels, BinaryWithTrailingSuffix) {
  const std::int64_t N = 6, C = 10;
  const auto a = random_floats(N * C, 20);
  const auto full = random_floats(N * C, 21);
  const auto row = random_floats(C, 22);
  DeviceArray<float> d_a(a), d_full(full), d_row(row), d_out(N * C);
  for (auto op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul}) {
    auto apply = [op](float x, float y) { return op == BinaryOp::add ? x + y : (op == BinaryOp::sub ? x - y : x * y); };
    std::vector<float> want_full(N * C), want_row(N * C);
    for (std::int64_t i = 0; i < N * C; ++i) {
      want_full[i] = apply(a[i], full[i]);
      want_row[i] = apply(a[i], row[i % C]);
    }
    gpu().binary(d_out.get(), d_a.get(), d_full.get(), N * C, N * C, op);
    EXPECT_EQ(d_out.to_host(), want_full);
    gpu().binary(d_out.get(), d_a.get(), d_row.get(), N * C, C, op);
    EXPECT_EQ(d_out.to_host(), want_row);
  }
  EXPECT_THROW(gpu().binary(d_out.get(), d_a.get(), d_row.get(), N * C, 7, BinaryOp::add), Error);

  cuda::copy_rows(d_out.get(), d_row.get(), N, C);
  std::vector<float> rows(N * C);
  for (std::int64_t i = 0; i < N * C; ++i) rows[i] = row[i % C];
  EXPECT_EQ(d_out.to_host(), rows);
}

// A gemv against ones (cuBLAS, any summation order): column c is within (N + 1) u (sum |x| + |init|) of
// the double sum (N terms, the += into out). The second case has 2^24 elements.
TEST_F(CudaKernels, SumRowsIsTheBiasGradient) {
  for (auto [N, C] : {std::pair<std::int64_t, std::int64_t>{300, 17}, {65536, 256}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
    const auto x = random_floats(N * C, 23);
    const auto init = random_floats(C, 24);
    std::vector<double> want(C, 0.0), want_acc(C), bound(C), bound_acc(C), abs_sum(C, 0.0);
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t c = 0; c < C; ++c) {
        want[c] += x[r * C + c];
        abs_sum[c] += std::abs(x[r * C + c]);
      }
    for (std::int64_t c = 0; c < C; ++c) {
      want_acc[c] = want[c] + init[c];
      bound[c] = kb::kSecondOrder * N * kb::kU * abs_sum[c];
      bound_acc[c] = kb::kSecondOrder * (N + 1) * kb::kU * (abs_sum[c] + std::abs(init[c]));
    }
    DeviceArray<float> d_x(x), d_out(init);
    cuda::sum_rows(d_out.get(), d_x.get(), N, C, true);
    EXPECT_TRUE(kb::within_bounds(d_out.to_host(), want_acc, bound_acc));
    cuda::sum_rows(d_out.get(), d_x.get(), N, C, false);
    EXPECT_TRUE(kb::within_bounds(d_out.to_host(), want, bound));
  }
}

// fill, cast and scale are one correctly rounded operation per element on both sides: bit-exact.
TEST_F(CudaKernels, FillCastScaleAccumulateEveryFloatType) {
  const std::int64_t n = 1234;
  const auto x = random_floats(n, 25, -100.0f, 100.0f);
  const auto y = random_floats(n, 26, -100.0f, 100.0f);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    // fill
    Tensor filled = Tensor::empty({n}, t, Device::cuda);
    gpu().fill(filled.raw_data(), t, 3.0f, n);
    EXPECT_EQ(filled.to_vector(), std::vector<float>(n, 3.0f));
    // cast f32 -> t -> f32 rounds exactly like the host
    Tensor src = on_device(x, DType::f32);
    Tensor narrow = Tensor::empty({n}, t, Device::cuda);
    cuda::cast(narrow.raw_data(), t, src.raw_data(), DType::f32, n);
    EXPECT_EQ(narrow.to_vector(), rounded(x, t));
    for (DType u : {DType::f32, DType::f16, DType::bf16}) {
      Tensor other = Tensor::empty({n}, u, Device::cuda);
      cuda::cast(other.raw_data(), u, narrow.raw_data(), t, n);
      EXPECT_EQ(other.to_vector(), rounded(rounded(x, t), u)) << "to " << dtype_name(u);
    }
    // scale, in place
    Tensor scaled = on_device(x, t);
    gpu().scale(scaled.raw_data(), scaled.raw_data(), t, n, 0.375f);
    std::vector<float> want(n);
    const auto xt = rounded(x, t);
    for (std::int64_t i = 0; i < n; ++i) want[i] = xt[i] * 0.375f;
    EXPECT_EQ(scaled.to_vector(), rounded(want, t));
    // accumulate dst (t) += src (f32): one f32 addition, then one rounding to t, on both sides:
    // bit-exact.
    Tensor acc = on_device(x, t);
    Tensor addend = on_device(y, DType::f32);
    gpu().accumulate(acc.raw_data(), t, addend.raw_data(), DType::f32, n);
    for (std::int64_t i = 0; i < n; ++i) want[i] = xt[i] + y[i];
    EXPECT_EQ(acc.to_vector(), rounded(want, t));
  }
  // fill on integer types truncates like the host
  Tensor ints = Tensor::empty({5}, DType::i64, Device::cuda);
  gpu().fill(ints.raw_data(), DType::i64, 7.0f, 5);
  EXPECT_EQ(ints.to_vector(), std::vector<float>(5, 7.0f));
}

// Both sides sum in double: each within (n + 1) 2^-53 sum |terms| of exact (the squares: one more
// rounding each), so they agree to twice that. The second size is 2^24.
TEST_F(CudaKernels, ReductionsAreExactEnoughAndDeterministic) {
  for (std::int64_t n : {std::int64_t{100003}, std::int64_t{1} << 24}) {
    const auto x = random_floats(n, 27, -3.0f, 3.0f);
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n=" << n);
      const auto xt = rounded(x, t);
      double want_sum = 0, want_sq = 0, abs_sum = 0;
      for (float v : xt) {
        want_sum += v;
        abs_sum += std::abs(v);
        want_sq += static_cast<double>(v) * v;
      }
      const double eps_d = std::ldexp(1.0, -53);
      const double tol_sum = 2 * (n + 1) * eps_d * abs_sum, tol_sq = 2 * (n + 2) * eps_d * want_sq;
      Tensor d = on_device(x, t);
      const double got_sum = cuda::sum(d.raw_data(), t, n);
      const double got_sq = gpu().sum_squares(d.raw_data(), t, n);
      EXPECT_NEAR(got_sum, want_sum, tol_sum);
      EXPECT_NEAR(got_sq, want_sq, tol_sq);
      EXPECT_EQ(gpu().sum_squares(d.raw_data(), t, n), got_sq);  // bit-identical on a rerun
      DeviceArray<double> acc(std::vector<double>{1.5});
      cuda::sum_squares_async(acc.get(), d.raw_data(), t, n);
      cuda::sum_squares_async(acc.get(), d.raw_data(), t, n);
      EXPECT_NEAR(acc.to_host()[0], 1.5 + 2 * want_sq, 2 * tol_sq + 4 * eps_d * want_sq);
    }
  }
  EXPECT_EQ(cuda::sum(nullptr, DType::f32, 0), 0.0);
}

// A yes/no answer: exact. 2^24 + 3 elements with the bad value near the end as the large case.
TEST_F(CudaKernels, InfAndNanCheckMatchesHost) {
  for (std::int64_t n : {std::int64_t{5000}, (std::int64_t{1} << 24) + 3}) {
    const std::int64_t bad_at = n - 679;
    const auto base = random_floats(n, 28, -60000.0f, 60000.0f);  // large but finite in f16
    const float inf = std::numeric_limits<float>::infinity();
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      for (float bad : {0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
        auto values = base;
        if (bad != 0.0f || std::isnan(bad)) values[bad_at] = bad;
        Tensor host = Tensor::from_vector(values, {n}).to(t);
        Tensor dev = host.to(Device::cuda);
        const bool want = optim::has_inf_or_nan(host);
        EXPECT_EQ(want, bad != 0.0f || std::isnan(bad));
        EXPECT_EQ(gpu().has_inf_or_nan(dev.raw_data(), t, n), want) << dtype_name(t) << " " << bad;
        DeviceArray<int> flag(std::vector<int>{0});
        cuda::has_inf_or_nan_async(flag.get(), dev.raw_data(), t, n);
        EXPECT_EQ(flag.to_host()[0] != 0, want);
      }
    }
  }
}

// Against optim::adamw_update on the host (the CPU kernel), the same adamw_step in the same order. Per step and element
// each side rounds m = b1 m + (1 - b1) g 3 times, v = b2 v + (1 - b2) g^2 4 times (all terms >= 0),
// and p = p decay - step_size m / (sqrt(v) / bc2 + eps) about 8 times; the device may fuse some into
// FMAs. So over 3 steps the two agree within 2·3·3 u (|b1 m| + |(1 - b1) g|) <= 18 u · 0.11 < 2e-7
// absolute for m (it can cancel), 2·3·4 u < 1e-5 relative for v, and 2·3·8 u (|p| + |update|) <
// 3e-6 · 1.01 absolute for p (the update, lr · m̂ / sqrt(v̂) <= 1e-2 here, can cancel p). The large case
// has 2^24 elements.
TEST_F(CudaKernels, AdamWMatchesOptim) {
  for (std::int64_t n : {std::int64_t{1000}, std::int64_t{1} << 24}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const optim::AdamWHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f};
    auto param = random_floats(n, 29);
    auto m = random_floats(n, 30, -0.01f, 0.01f);
    auto v = random_floats(n, 31, 0.0f, 0.001f);
    DeviceArray<float> d_param(param), d_m(m), d_v(v);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const auto grad = random_floats(n, 100 + step);
      optim::adamw_update(Device::cpu, param.data(), grad.data(), DType::f32, 1.0f, m.data(), v.data(), nullptr,
                          DType::f32, n, h, step);
      DeviceArray<float> d_grad(grad);
      optim::adamw_update(Device::cuda, d_param.get(), d_grad.get(), DType::f32, 1.0f, d_m.get(), d_v.get(), nullptr,
                          DType::f32, n, h, step);
    }
    EXPECT_TRUE(all_close(d_param.to_host(), param, 0.0f, 3.1e-6f));
    EXPECT_TRUE(all_close(d_m.to_host(), m, 0.0f, 2e-7f));
    EXPECT_TRUE(all_close(d_v.to_host(), v, 1e-5f, 1e-11f));
  }
  const std::int64_t n = 1000;
  const optim::AdamWHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f};
  EXPECT_THROW(optim::adamw_scalars(h, 0), Error);

  // The fused 16-bit partition step: f16 gradient times 1/scale, fp32 master, bf16 copy out.
  const auto grad = random_floats(n, 200, -512.0f, 512.0f);
  const float grad_mul = 1.0f / 256.0f;
  auto master = random_floats(n, 201);
  auto m2 = std::vector<float>(n, 0.0f), v2 = std::vector<float>(n, 0.0f);
  DeviceArray<float> d_master(master), d_m2(m2), d_v2(v2);
  Tensor g16 = on_device(grad, DType::f16);
  Tensor p16 = Tensor::empty({n}, DType::bf16, Device::cuda);
  const optim::AdamWHyper h0{h.lr, h.beta1, h.beta2, h.eps, 0.0f};
  optim::adamw_update(Device::cuda, d_master.get(), g16.raw_data(), DType::f16, grad_mul, d_m2.get(), d_v2.get(),
                      p16.raw_data(), DType::bf16, n, h0, 1);
  auto g32 = rounded(grad, DType::f16);
  for (float& g : g32) g *= grad_mul;
  optim::adamw_update(Device::cpu, master.data(), g32.data(), DType::f32, 1.0f, m2.data(), v2.data(), nullptr,
                      DType::f32, n, h0, 1);
  // One step from m = v = 0 (g times a power of two is exact on both sides): the master within 2·8 u
  // (|p| + |update|) <= 16 u · 1.001 < 1e-6 (the first update is about lr); its bf16 copy is the master
  // rounded once, so the masters' difference can move it across one bf16 rounding boundary: one bf16
  // ulp, 2 u_bf16 < 8e-3 relative.
  EXPECT_TRUE(all_close(d_master.to_host(), master, 0.0f, 1e-6f));
  EXPECT_TRUE(all_close(p16.to_vector(), rounded(master, DType::bf16), 8e-3f, 1e-6f));
}

}  // namespace
}  // namespace zero

#else  // built without CUDA

TEST(CudaKernels, NotBuilt) { GTEST_SKIP() << "built without CUDA (ZERO_CUDA=OFF or no toolkit)"; }

#endif
