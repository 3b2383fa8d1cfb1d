// Every core/cuda kernel against its CPU reference (core/cpu/kernels.h, optim/) on random inputs, with
// tolerances per dtype. Skipped without a GPU. GEMM is in test_cuda_gemm.cpp.
#include <gtest/gtest.h>

#ifdef ZERO_HAS_CUDA

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#include "core/tensor.h"
#include "cuda_test_util.h"
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

// The values of `v` after rounding to `t` (and back to f32), as the host rounds them.
std::vector<float> rounded(const std::vector<float>& v, DType t) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(t).to(DType::f32).to_vector();
}

// A cuda tensor of dtype t holding v (rounded to t).
Tensor on_device(const std::vector<float>& v, DType t) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(t).to(Device::cuda);
}

TEST_F(CudaKernels, LayerNormForwardBackward) {
  for (auto [N, C] : {std::pair<std::int64_t, std::int64_t>{37, 100}, {64, 768}, {5, 1}, {3, 33}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
    const auto x = random_floats(N * C, 1, -2.0f, 2.0f);
    const auto w = random_floats(C, 2, 0.5f, 1.5f);
    const auto b = random_floats(C, 3);
    std::vector<float> out(N * C), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    DeviceArray<float> dx(x), dw(w), db(b), dout_(N * C), dmean(N), drstd(N);
    cuda::layernorm_forward(dout_.get(), dmean.get(), drstd.get(), dx.get(), dw.get(), db.get(), N, C, 1e-5f);
    EXPECT_TRUE(all_close(dout_.to_host(), out, 1e-4f, 1e-5f));
    EXPECT_TRUE(all_close(dmean.to_host(), mean, 1e-5f, 1e-6f));
    EXPECT_TRUE(all_close(drstd.to_host(), rstd, 1e-4f, 1e-5f));

    const auto dy = random_floats(N * C, 4);
    const auto gw0 = random_floats(C, 5), gb0 = random_floats(C, 6);  // backward accumulates into these
    std::vector<float> gx(N * C, -7.0f), gw = gw0, gb = gb0;
    cpu::layernorm_backward(gx.data(), gw.data(), gb.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                            N, C);
    DeviceArray<float> ddy(dy), dgx(N * C), dgw(gw0), dgb(gb0);
    cuda::layernorm_backward(dgx.get(), dgw.get(), dgb.get(), ddy.get(), dx.get(), dw.get(), dmean.get(), drstd.get(),
                             N, C);
    EXPECT_TRUE(all_close(dgx.to_host(), gx, 1e-3f, 1e-4f));
    EXPECT_TRUE(all_close(dgw.to_host(), gw, 1e-4f, 1e-4f));
    EXPECT_TRUE(all_close(dgb.to_host(), gb, 1e-4f, 1e-4f));
  }
}

TEST_F(CudaKernels, GeluForwardBackward) {
  const std::int64_t n = 10007;
  const auto x = random_floats(n, 7, -6.0f, 6.0f);
  const auto dy = random_floats(n, 8);
  std::vector<float> y(n), dx(n);
  cpu::gelu_forward(y.data(), x.data(), n);
  cpu::gelu_backward(dx.data(), x.data(), dy.data(), n);
  DeviceArray<float> d_x(x), d_dy(dy), d_y(n), d_dx(n);
  cuda::gelu_forward(d_y.get(), d_x.get(), n);
  cuda::gelu_backward(d_dx.get(), d_x.get(), d_dy.get(), n);
  EXPECT_TRUE(all_close(d_y.to_host(), y, 1e-5f, 1e-6f));
  EXPECT_TRUE(all_close(d_dx.to_host(), dx, 1e-5f, 1e-6f));
}

TEST_F(CudaKernels, SoftmaxForwardBackward) {
  for (auto [N, C] : {std::pair<std::int64_t, std::int64_t>{33, 65}, {7, 1000}, {4, 1}, {2, 3000}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
    const auto x = random_floats(N * C, 9, -10.0f, 10.0f);
    const auto dy = random_floats(N * C, 10);
    std::vector<float> y(N * C), dx(N * C);
    cpu::softmax_forward(y.data(), x.data(), N, C);
    cpu::softmax_backward(dx.data(), y.data(), dy.data(), N, C);
    DeviceArray<float> d_x(x), d_dy(dy), d_y(N * C), d_dx(N * C);
    cuda::softmax_forward(d_y.get(), d_x.get(), N, C);
    cuda::softmax_backward(d_dx.get(), d_y.get(), d_dy.get(), N, C);
    EXPECT_TRUE(all_close(d_y.to_host(), y, 1e-4f, 1e-7f));
    EXPECT_TRUE(all_close(d_dx.to_host(), dx, 1e-4f, 1e-6f));
  }
}

TEST_F(CudaKernels, CausalAttentionForwardBackward) {
  struct Case {
    std::int64_t B, T, C, H;
  };
  for (Case c : {Case{2, 17, 48, 4}, Case{3, 64, 96, 3}, Case{1, 1, 8, 2}, Case{2, 40, 64, 1}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " C=" << c.C << " H=" << c.H);
    const std::int64_t n_qkv = c.B * c.T * 3 * c.C, n_out = c.B * c.T * c.C, n_att = c.B * c.H * c.T * c.T;
    const auto qkv = random_floats(n_qkv, 11);
    std::vector<float> out(n_out), att(n_att);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), c.B, c.T, c.C, c.H);
    DeviceArray<float> d_qkv(qkv), d_out(n_out), d_att(n_att);
    cuda::attention_forward(d_out.get(), d_att.get(), d_qkv.get(), c.B, c.T, c.C, c.H);
    EXPECT_TRUE(all_close(d_out.to_host(), out, 1e-4f, 1e-5f));
    EXPECT_TRUE(all_close(d_att.to_host(), att, 1e-4f, 1e-6f));  // zeros above the diagonal too

    const auto dout = random_floats(n_out, 12);
    std::vector<float> dqkv(n_qkv, -3.0f);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), c.B, c.T, c.C, c.H);
    DeviceArray<float> d_dout(dout), d_dqkv(n_qkv);
    cuda::attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), c.B, c.T, c.C, c.H);
    EXPECT_TRUE(all_close(d_dqkv.to_host(), dqkv, 1e-3f, 1e-4f));
  }
}

TEST_F(CudaKernels, CrossEntropyForwardBackward) {
  for (auto [N, V] : {std::pair<std::int64_t, std::int64_t>{50, 65}, {9, 5000}, {1, 2}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " V=" << V);
    const auto logits = random_floats(N * V, 13, -4.0f, 4.0f);
    const auto targets = random_indices(N, V, 14);
    std::vector<float> probs(N * V), dlogits(N * V);
    const float loss = cpu::cross_entropy_forward(probs.data(), logits.data(), targets.data(), N, V);
    cpu::cross_entropy_backward(dlogits.data(), probs.data(), targets.data(), 0.7f, N, V);

    DeviceArray<float> d_logits(logits), d_probs(N * V), d_dlogits(N * V), d_loss(1), d_dloss(std::vector<float>{0.7f});
    DeviceArray<std::int64_t> d_targets(targets);
    const float got = cuda::cross_entropy_forward(d_probs.get(), d_logits.get(), d_targets.get(), N, V);
    EXPECT_NEAR(got, loss, 1e-5 * std::abs(loss) + 1e-6);
    EXPECT_TRUE(all_close(d_probs.to_host(), probs, 1e-4f, 1e-7f));
    cuda::cross_entropy_backward(d_dlogits.get(), d_probs.get(), d_targets.get(), 0.7f, N, V);
    EXPECT_TRUE(all_close(d_dlogits.to_host(), dlogits, 1e-4f, 1e-7f));

    // The device-resident variants give the same numbers without a host round trip.
    cuda::cross_entropy_forward_async(d_loss.get(), d_probs.get(), d_logits.get(), d_targets.get(), N, V);
    EXPECT_NEAR(d_loss.to_host()[0], loss, 1e-5 * std::abs(loss) + 1e-6);
    cuda::cross_entropy_backward(d_dlogits.get(), d_probs.get(), d_targets.get(), d_dloss.get(), N, V);
    EXPECT_TRUE(all_close(d_dlogits.to_host(), dlogits, 1e-4f, 1e-7f));
  }
  // A target outside [0, V) throws, like the CPU kernel, and leaves no error behind.
  DeviceArray<float> logits(random_floats(2 * 3, 15)), probs(6);
  DeviceArray<std::int64_t> bad(std::vector<std::int64_t>{1, 3});
  EXPECT_THROW(cuda::cross_entropy_forward(probs.get(), logits.get(), bad.get(), 2, 3), Error);
  EXPECT_NO_THROW(cuda::synchronize());
}

TEST_F(CudaKernels, EmbeddingForwardBackward) {
  const std::int64_t N = 40, V = 10, C = 7;
  const auto weight = random_floats(V * C, 16);
  const auto idx = random_indices(N, V, 17);  // 40 draws from 10 rows: repeats, so backward adds
  std::vector<float> out(N * C);
  cpu::embedding_forward(out.data(), weight.data(), idx.data(), N, V, C);
  DeviceArray<float> d_weight(weight), d_out(N * C);
  DeviceArray<std::int64_t> d_idx(idx);
  cuda::embedding_forward(d_out.get(), d_weight.get(), d_idx.get(), N, V, C);
  EXPECT_EQ(d_out.to_host(), out);

  const auto dout = random_floats(N * C, 18);
  std::vector<float> dweight = random_floats(V * C, 19);
  DeviceArray<float> d_dweight(dweight), d_dweight2(dweight), d_dout(dout);
  cpu::embedding_backward(dweight.data(), dout.data(), idx.data(), N, C);
  cuda::embedding_backward(d_dweight.get(), d_dout.get(), d_idx.get(), N, C, V);
  cuda::embedding_backward(d_dweight2.get(), d_dout.get(), d_idx.get(), N, C);
  EXPECT_TRUE(all_close(d_dweight.to_host(), dweight, 1e-5f, 1e-6f));
  EXPECT_TRUE(all_close(d_dweight2.to_host(), dweight, 1e-5f, 1e-6f));
}

TEST_F(CudaKernels, BinaryWithTrailingSuffix) {
  const std::int64_t N = 6, C = 10;
  const auto a = random_floats(N * C, 20);
  const auto full = random_floats(N * C, 21);
  const auto row = random_floats(C, 22);
  DeviceArray<float> d_a(a), d_full(full), d_row(row), d_out(N * C);
  for (auto op : {cuda::BinaryOp::add, cuda::BinaryOp::sub, cuda::BinaryOp::mul}) {
    auto apply = [op](float x, float y) {
      return op == cuda::BinaryOp::add ? x + y : (op == cuda::BinaryOp::sub ? x - y : x * y);
    };
    std::vector<float> want_full(N * C), want_row(N * C);
    for (std::int64_t i = 0; i < N * C; ++i) {
      want_full[i] = apply(a[i], full[i]);
      want_row[i] = apply(a[i], row[i % C]);
    }
    cuda::binary(d_out.get(), d_a.get(), d_full.get(), N * C, N * C, op);
    EXPECT_EQ(d_out.to_host(), want_full);
    cuda::binary(d_out.get(), d_a.get(), d_row.get(), N * C, C, op);
    EXPECT_EQ(d_out.to_host(), want_row);
  }
  EXPECT_THROW(cuda::binary(d_out.get(), d_a.get(), d_row.get(), N * C, 7, cuda::BinaryOp::add), Error);

  cuda::copy_rows(d_out.get(), d_row.get(), N, C);
  std::vector<float> rows(N * C);
  for (std::int64_t i = 0; i < N * C; ++i) rows[i] = row[i % C];
  EXPECT_EQ(d_out.to_host(), rows);
}

TEST_F(CudaKernels, SumRowsIsTheBiasGradient) {
  const std::int64_t N = 300, C = 17;
  const auto x = random_floats(N * C, 23);
  const auto init = random_floats(C, 24);
  std::vector<float> want(C), want_acc(C);
  for (std::int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (std::int64_t r = 0; r < N; ++r) s += x[r * C + c];
    want[c] = static_cast<float>(s);
    want_acc[c] = static_cast<float>(s + init[c]);
  }
  DeviceArray<float> d_x(x), d_out(init);
  cuda::sum_rows(d_out.get(), d_x.get(), N, C, true);
  EXPECT_TRUE(all_close(d_out.to_host(), want_acc, 1e-5f, 1e-5f));
  cuda::sum_rows(d_out.get(), d_x.get(), N, C, false);
  EXPECT_TRUE(all_close(d_out.to_host(), want, 1e-5f, 1e-5f));
}

TEST_F(CudaKernels, FillCastScaleAccumulateEveryFloatType) {
  const std::int64_t n = 1234;
  const auto x = random_floats(n, 25, -100.0f, 100.0f);
  const auto y = random_floats(n, 26, -100.0f, 100.0f);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    // fill
    Tensor filled = Tensor::empty({n}, t, Device::cuda);
    cuda::fill(filled.raw_data(), t, 3.0f, n);
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
    cuda::scale(scaled.raw_data(), scaled.raw_data(), t, 0.375f, n);
    std::vector<float> want(n);
    const auto xt = rounded(x, t);
    for (std::int64_t i = 0; i < n; ++i) want[i] = xt[i] * 0.375f;
    EXPECT_EQ(scaled.to_vector(), rounded(want, t));
    // accumulate dst (t) += alpha * src (f32): f32 arithmetic, one rounding (up to an FMA's difference)
    Tensor acc = on_device(x, t);
    Tensor addend = on_device(y, DType::f32);
    cuda::accumulate(acc.raw_data(), t, addend.raw_data(), DType::f32, 0.5f, n);
    for (std::int64_t i = 0; i < n; ++i) want[i] = xt[i] + 0.5f * y[i];
    const float rtol = t == DType::f32 ? 1e-6f : (t == DType::f16 ? 1e-3f : 8e-3f);
    EXPECT_TRUE(all_close(acc.to_vector(), rounded(want, t), rtol, 1e-5f));
  }
  // fill on integer types truncates like the host
  Tensor ints = Tensor::empty({5}, DType::i64, Device::cuda);
  cuda::fill(ints.raw_data(), DType::i64, 7.0f, 5);
  EXPECT_EQ(ints.to_vector(), std::vector<float>(5, 7.0f));
}

TEST_F(CudaKernels, ReductionsAreExactEnoughAndDeterministic) {
  const std::int64_t n = 100003;
  const auto x = random_floats(n, 27, -3.0f, 3.0f);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto xt = rounded(x, t);
    double want_sum = 0, want_sq = 0;
    for (float v : xt) {
      want_sum += v;
      want_sq += static_cast<double>(v) * v;
    }
    Tensor d = on_device(x, t);
    const double got_sum = cuda::sum(d.raw_data(), t, n);
    const double got_sq = cuda::sum_squares(d.raw_data(), t, n);
    EXPECT_NEAR(got_sum, want_sum, 1e-9 * n);
    EXPECT_NEAR(got_sq, want_sq, 1e-12 * want_sq + 1e-9);
    EXPECT_EQ(cuda::sum_squares(d.raw_data(), t, n), got_sq);  // bit-identical on a rerun
    DeviceArray<double> acc(std::vector<double>{1.5});
    cuda::sum_squares_async(acc.get(), d.raw_data(), t, n);
    cuda::sum_squares_async(acc.get(), d.raw_data(), t, n);
    EXPECT_NEAR(acc.to_host()[0], 1.5 + 2 * want_sq, 1e-12 * want_sq + 1e-9);
  }
  EXPECT_EQ(cuda::sum(nullptr, DType::f32, 0), 0.0);
}

TEST_F(CudaKernels, InfAndNanCheckMatchesHost) {
  const std::int64_t n = 5000;
  const float inf = std::numeric_limits<float>::infinity();
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (float bad : {0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
      auto values = random_floats(n, 28, -60000.0f, 60000.0f);  // large but finite in f16
      if (bad != 0.0f || std::isnan(bad)) values[4321] = bad;
      Tensor host = Tensor::from_vector(values, {n}).to(t);
      Tensor dev = host.to(Device::cuda);
      const bool want = optim::has_inf_or_nan(host);
      EXPECT_EQ(want, bad != 0.0f || std::isnan(bad));
      EXPECT_EQ(cuda::has_inf_or_nan(dev.raw_data(), t, n), want) << dtype_name(t) << " " << bad;
      DeviceArray<int> flag(std::vector<int>{0});
      cuda::has_inf_or_nan_async(flag.get(), dev.raw_data(), t, n);
      EXPECT_EQ(flag.to_host()[0] != 0, want);
    }
  }
}

TEST_F(CudaKernels, AdamWMatchesOptim) {
  const std::int64_t n = 1000;
  const optim::AdamWHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f};
  auto param = random_floats(n, 29);
  auto m = random_floats(n, 30, -0.01f, 0.01f);
  auto v = random_floats(n, 31, 0.0f, 0.001f);
  DeviceArray<float> d_param(param), d_m(m), d_v(v);
  for (std::int64_t step = 1; step <= 3; ++step) {
    const auto grad = random_floats(n, 100 + step);
    optim::adamw_update(param.data(), grad.data(), m.data(), v.data(), n, h, step);
    DeviceArray<float> d_grad(grad);
    cuda::adamw_update(d_param.get(), d_grad.get(), d_m.get(), d_v.get(), n,
                       cuda::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step));
  }
  EXPECT_TRUE(all_close(d_param.to_host(), param, 1e-6f, 1e-7f));
  EXPECT_TRUE(all_close(d_m.to_host(), m, 1e-5f, 1e-9f));
  EXPECT_TRUE(all_close(d_v.to_host(), v, 1e-5f, 1e-11f));
  EXPECT_THROW(cuda::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 0), Error);

  // The fused 16-bit partition step: f16 gradient times 1/scale, fp32 master, bf16 copy out.
  const auto grad = random_floats(n, 200, -512.0f, 512.0f);
  const float grad_mul = 1.0f / 256.0f;
  auto master = random_floats(n, 201);
  auto m2 = std::vector<float>(n, 0.0f), v2 = std::vector<float>(n, 0.0f);
  DeviceArray<float> d_master(master), d_m2(m2), d_v2(v2);
  Tensor g16 = on_device(grad, DType::f16);
  Tensor p16 = Tensor::empty({n}, DType::bf16, Device::cuda);
  cuda::adamw_update_mixed(d_master.get(), g16.raw_data(), DType::f16, grad_mul, d_m2.get(), d_v2.get(),
                           p16.raw_data(), DType::bf16, n, cuda::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, 0.0f, 1));
  auto g32 = rounded(grad, DType::f16);
  for (float& g : g32) g *= grad_mul;
  const optim::AdamWHyper h0{h.lr, h.beta1, h.beta2, h.eps, 0.0f};
  optim::adamw_update(master.data(), g32.data(), m2.data(), v2.data(), n, h0, 1);
  EXPECT_TRUE(all_close(d_master.to_host(), master, 1e-6f, 1e-7f));
  EXPECT_TRUE(all_close(p16.to_vector(), rounded(master, DType::bf16), 8e-3f, 1e-6f));
}

}  // namespace
}  // namespace zero

#else  // built without CUDA

TEST(CudaKernels, NotBuilt) { GTEST_SKIP() << "built without CUDA (ZERO_CUDA=OFF or no toolkit)"; }

#endif
