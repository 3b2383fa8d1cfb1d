// cuBLAS GEMMs (core/cuda/blas.cpp) against the CPU GEMM: all four transpose combinations with padded
// leading dimensions, alpha and beta; TF32; fp16/bf16 inputs with fp32 accumulation; strided batches.
// Skipped without a GPU.
#include <gtest/gtest.h>

#ifdef ZERO_HAS_CUDA

#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "core/cuda/kernels.h"
#include "core/kernels.h"
#include "core/tensor.h"
#include "cuda_test_util.h"

namespace zero {
namespace {

Kernels& host() { return kernels(Device::cpu); }
Kernels& gpu() { return kernels(Device::cuda); }

using cuda_test::abs_of;
using cuda_test::all_close;
using cuda_test::CudaTest;
using cuda_test::DeviceArray;
using cuda_test::random_floats;
using CudaGemm = CudaTest;

struct Layout {
  std::int64_t M, N, K, lda, ldb, ldc;
  std::int64_t a_size, b_size, c_size;
};

// Row-major operands with each leading dimension padded by a few elements beyond the minimum, so a
// mixed-up leading dimension or transpose shows.
Layout layout_for(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K) {
  Layout l{M, N, K, (ta ? M : K) + 3, (tb ? K : N) + 2, N + 5, 0, 0, 0};
  l.a_size = (ta ? K : M) * l.lda;
  l.b_size = (tb ? N : K) * l.ldb;
  l.c_size = M * l.ldc;
  return l;
}

// values rounded through dtype t (as the host rounds them)
std::vector<float> rounded(const std::vector<float>& v, DType t) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(t).to(DType::f32).to_vector();
}

TEST_F(CudaGemm, F32AllTransposesMatchCpu) {
  for (auto [M, N, K] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{37, 53, 29}, {256, 256, 256}, {1, 7, 1}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb);
        const Layout l = layout_for(ta, tb, M, N, K);
        const auto a = random_floats(l.a_size, 1), b = random_floats(l.b_size, 2), c0 = random_floats(l.c_size, 3);
        std::vector<float> c = c0;
        host().gemm(ta, tb, M, N, K, 0.7f, a.data(), l.lda, b.data(), l.ldb, 0.3f, c.data(), l.ldc, nullptr);
        DeviceArray<float> da(a), db(b), dc(c0);
        gpu().gemm(ta, tb, M, N, K, 0.7f, da.get(), l.lda, db.get(), l.ldb, 0.3f, dc.get(), l.ldc, nullptr);
        // Note [CUDA test tolerances]: within the two GEMMs' bounds; the padding columns of C must be
        // untouched (c0 there on both sides, and |A||B| = 0: bound |beta c0|, err 0 expected).
        std::vector<float> abs_prod(l.c_size, 0.0f);
        host().gemm(ta, tb, M, N, K, 1.0f, abs_of(a).data(), l.lda, abs_of(b).data(), l.ldb, 0.0f, abs_prod.data(),
                    l.ldc, nullptr);
        const auto got = dc.to_host();
        EXPECT_TRUE(cuda_test::within(got, c, cuda_test::gemm_bound(K, 0.7f, 0.3f, c0, abs_prod)));
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = N; j < l.ldc; ++j) ASSERT_EQ(got[i * l.ldc + j], c0[i * l.ldc + j]);
        // With a bias row, and beta = 0 (C's old values must not matter).
        const auto bias = random_floats(N, 4);
        std::vector<float> cb = c0;
        host().gemm(ta, tb, M, N, K, 1.0f, a.data(), l.lda, b.data(), l.ldb, 0.0f, cb.data(), l.ldc, bias.data());
        DeviceArray<float> dbias(bias), dcb(c0);
        gpu().gemm(ta, tb, M, N, K, 1.0f, da.get(), l.lda, db.get(), l.ldb, 0.0f, dcb.get(), l.ldc, dbias.get());
        // The bias is one more addition (the second pass over C): + 2u |C| each side, covered by K + 2.
        auto abs_bias = abs_prod;
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) abs_bias[i * l.ldc + j] += std::abs(bias[j]);
        EXPECT_TRUE(cuda_test::within(dcb.to_host(), cb, cuda_test::gemm_bound(K, 1.0f, 0.0f, c0, abs_bias)));
      }
    }
  }
}

TEST_F(CudaGemm, Tf32IsCloseToF32) {
  const std::int64_t M = 128, N = 96, K = 256;
  const Layout l = layout_for(false, true, M, N, K);
  const auto a = random_floats(l.a_size, 4), b = random_floats(l.b_size, 5);
  std::vector<float> c(l.c_size, 0.0f);
  host().gemm(false, true, M, N, K, 1.0f, a.data(), l.lda, b.data(), l.ldb, 0.0f, c.data(), l.ldc, nullptr);
  DeviceArray<float> da(a), db(b), dc(std::vector<float>(l.c_size, 0.0f));
  const bool before = cuda::allow_tf32();
  {
    const cuda_test::ScopedAllowTf32 tf32(true);
    EXPECT_TRUE(cuda::allow_tf32());
    gpu().gemm(false, true, M, N, K, 1.0f, da.get(), l.lda, db.get(), l.ldb, 0.0f, dc.get(), l.ldc, nullptr);
  }
  EXPECT_EQ(cuda::allow_tf32(), before);  // restored
  // TF32 keeps 10 explicit mantissa bits of each input: within 2^-10 relative even if truncated, so
  // each product errs by at most 2 · 2^-10 |a b| (· 1.01 for the second-order term), on top of the
  // two f32 GEMMs' bound (Note [CUDA test tolerances]).
  std::vector<float> abs_prod(l.c_size, 0.0f);
  host().gemm(false, true, M, N, K, 1.0f, abs_of(a).data(), l.lda, abs_of(b).data(), l.ldb, 0.0f, abs_prod.data(),
              l.ldc, nullptr);
  auto bound = cuda_test::gemm_bound(K, 1.0f, 0.0f, c, abs_prod);
  for (std::size_t i = 0; i < bound.size(); ++i) bound[i] += 2.0 / 1024 * 1.01 * abs_prod[i];
  EXPECT_TRUE(cuda_test::within(dc.to_host(), c, bound));
}

TEST_F(CudaGemm, HalfAndBfloat16InputsAccumulateInF32) {
  const std::int64_t M = 64, N = 80, K = 96;
  for (DType t : {DType::f16, DType::bf16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " ta=" << ta << " tb=" << tb);
        const Layout l = layout_for(ta, tb, M, N, K);
        const auto a = random_floats(l.a_size, 6), b = random_floats(l.b_size, 7);
        const auto ar = rounded(a, t), br = rounded(b, t);
        // Reference 1: the same (rounded) inputs in f32 — only the summation order differs.
        std::vector<float> exact(l.c_size, 0.0f), full(l.c_size, 0.0f);
        host().gemm(ta, tb, M, N, K, 1.0f, ar.data(), l.lda, br.data(), l.ldb, 0.0f, exact.data(), l.ldc, nullptr);
        // Reference 2: the unrounded f32 product — within the 16-bit input tolerance.
        host().gemm(ta, tb, M, N, K, 1.0f, a.data(), l.lda, b.data(), l.ldb, 0.0f, full.data(), l.ldc, nullptr);
        Tensor da = Tensor::from_vector(a, {l.a_size}).to(t).to(Device::cuda);
        Tensor db = Tensor::from_vector(b, {l.b_size}).to(t).to(Device::cuda);
        Tensor dc = Tensor::zeros({l.c_size}, DType::f32, Device::cuda);
        gpu().gemm_ex(ta, tb, M, N, K, 1.0f, da.raw_data(), t, l.lda, db.raw_data(), t, l.ldb, 0.0f, dc.raw_data(),
                      DType::f32, l.ldc, nullptr);
        const auto got = dc.to_vector();
        // Note [CUDA test tolerances]: against the same rounded inputs, the two f32 GEMMs' bound; against
        // the unrounded product, also the inputs' rounding to t (unit roundoff u_t = 2^-11 for f16, 2^-8
        // for bf16): each product a b moves by at most 2 u_t |a b|.
        std::vector<float> abs_prod(l.c_size, 0.0f);
        host().gemm(ta, tb, M, N, K, 1.0f, abs_of(a).data(), l.lda, abs_of(b).data(), l.ldb, 0.0f, abs_prod.data(),
                    l.ldc, nullptr);
        const auto f32_bound = cuda_test::gemm_bound(K, 1.0f, 0.0f, exact, abs_prod);
        const double u_t = t == DType::f16 ? 1.0 / 2048 : 1.0 / 256;
        auto input_bound = f32_bound;
        for (std::size_t i = 0; i < input_bound.size(); ++i) input_bound[i] += 2.0 * u_t * 1.01 * abs_prod[i];
        EXPECT_TRUE(cuda_test::within(got, exact, f32_bound));
        EXPECT_TRUE(cuda_test::within(got, full, input_bound));
        // 16-bit output: the f32 result rounded once.
        Tensor dc16 = Tensor::zeros({l.c_size}, t, Device::cuda);
        gpu().gemm_ex(ta, tb, M, N, K, 1.0f, da.raw_data(), t, l.lda, db.raw_data(), t, l.ldb, 0.0f, dc16.raw_data(), t,
                      l.ldc, nullptr);
        // ... then rounded once to t: + u_t |C| (round to nearest), with |C| <= |exact| + its bound.
        auto out_bound = f32_bound;
        for (std::size_t i = 0; i < out_bound.size(); ++i) out_bound[i] += u_t * (std::abs(exact[i]) + f32_bound[i]);
        EXPECT_TRUE(cuda_test::within(dc16.to_vector(), exact, out_bound));
      }
    }
  }
  DeviceArray<float> x(std::size_t{16});
  Tensor h = Tensor::zeros({16}, DType::f16, Device::cuda);
  EXPECT_THROW(gpu().gemm_ex(false, false, 4, 4, 4, 1.0f, x.get(), DType::f32, 4, h.raw_data(), DType::f16, 4, 0.0f,
                             x.get(), DType::f32, 4, nullptr),
               Error);
}

TEST_F(CudaGemm, StridedBatchedMatchesLoop) {
  const std::int64_t batch = 5, M = 16, N = 24, K = 8;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      const Layout l = layout_for(ta, tb, M, N, K);
      const std::int64_t sa = l.a_size + 11, sb = l.b_size + 13, sc = l.c_size + 17;  // gaps between matrices
      const auto a = random_floats(sa * batch, 8), b = random_floats(sb * batch, 9), c0 = random_floats(sc * batch, 10);
      std::vector<float> c = c0;
      for (std::int64_t i = 0; i < batch; ++i)
        host().gemm(ta, tb, M, N, K, 1.25f, a.data() + i * sa, l.lda, b.data() + i * sb, l.ldb, -0.5f,
                    c.data() + i * sc, l.ldc, nullptr);
      DeviceArray<float> da(a), db(b), dc(c0);
      gpu().gemm_batched(ta, tb, M, N, K, 1.25f, da.get(), l.lda, sa, db.get(), l.ldb, sb, -0.5f, dc.get(), l.ldc, sc,
                         batch);
      // Note [CUDA test tolerances]: each matrix within the two GEMMs' bounds.
      std::vector<float> abs_prod(sc * batch, 0.0f);
      for (std::int64_t i = 0; i < batch; ++i)
        host().gemm(ta, tb, M, N, K, 1.0f, abs_of(a).data() + i * sa, l.lda, abs_of(b).data() + i * sb, l.ldb, 0.0f,
                    abs_prod.data() + i * sc, l.ldc, nullptr);
      EXPECT_TRUE(cuda_test::within(dc.to_host(), c, cuda_test::gemm_bound(K, 1.25f, -0.5f, c0, abs_prod)));
    }
  }
}

TEST_F(CudaGemm, EmptyDimensions) {
  const auto c0 = random_floats(12, 11);
  DeviceArray<float> a(std::size_t{12}), b(std::size_t{12}), c(c0);
  // M = 0: nothing happens.
  gpu().gemm(false, false, 0, 4, 3, 1.0f, a.get(), 3, b.get(), 4, 0.0f, c.get(), 4, nullptr);
  EXPECT_EQ(c.to_host(), c0);
  // K = 0 is handled without cuBLAS (core/cuda/blas.cpp): C = beta C, one correctly rounded multiply per
  // element, so bit for bit; rows of 3 with ldc 4 leave the padding column alone.
  std::vector<float> want = c0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (i % 4 != 3) want[i] = 0.7f * c0[i];
  gpu().gemm(false, false, 3, 3, 0, 1.0f, a.get(), 1, b.get(), 3, 0.7f, c.get(), 4, nullptr);
  EXPECT_EQ(c.to_host(), want);
  // beta = 0: zeros, C is not read (a NaN there does not survive), padding untouched.
  auto nan_c = c0;
  for (std::size_t i = 0; i < nan_c.size(); i += 4) nan_c[i] = std::numeric_limits<float>::quiet_NaN();
  DeviceArray<float> cn(nan_c);
  gpu().gemm(true, true, 3, 3, 0, 1.0f, a.get(), 3, b.get(), 1, 0.0f, cn.get(), 4, nullptr);
  const auto got = cn.to_host();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (i % 4 == 3) EXPECT_EQ(got[i], c0[i]) << i;
    else EXPECT_EQ(got[i], 0.0f) << i;
  }
  // Strided batches of bf16 (inputs and output): every matrix scaled, the gaps between them untouched.
  const std::int64_t batch = 3, M = 2, N = 3, ldc = 4, stride = 11;
  const auto cb0 = rounded(random_floats(batch * stride, 12), DType::bf16);
  Tensor cb = Tensor::from_vector(cb0, {batch * stride}).to(DType::bf16).to(Device::cuda);
  gpu().gemm_batched_ex(false, false, M, N, 0, 1.0f, a.get(), DType::bf16, 1, 0, b.get(), DType::bf16, N, 0, -0.5f,
                        cb.raw_data(), DType::bf16, ldc, stride, batch);
  auto want_b = cb0;  // times -0.5: exact in bf16
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t r = 0; r < M; ++r)
      for (std::int64_t j = 0; j < N; ++j) want_b[i * stride + r * ldc + j] *= -0.5f;
  EXPECT_EQ(cb.to_vector(), want_b);
}

}  // namespace
}  // namespace zero

#else  // built without CUDA

TEST(CudaGemm, NotBuilt) { GTEST_SKIP() << "built without CUDA (ZERO_CUDA=OFF or no toolkit)"; }

#endif
