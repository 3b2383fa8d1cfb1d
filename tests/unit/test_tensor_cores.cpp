// 16-bit GEMMs on cuda (Note [Tensor cores for 16-bit models] in core/gemm_precision.h) against a
// double-precision reference computed here on the host: linear with an f16/bf16 weight (forward, dx,
// dW, db), matmul of 16-bit operands, causal self-attention with 16-bit GEMM operands, and a bf16 GPT
// whose layers hand the 16-bit parameter itself to the GEMM. The cuda rows skip without a GPU; the cpu
// rows of the same checks run everywhere.
//
// Note [16-bit GEMM tolerances]
// The inputs are made exactly representable in the 16-bit dtype, so the operand rounding a GEMM op
// does (x, the incoming gradient) is exact and the reference sees the same values. A product of two
// 16-bit values (at most 11 significant bits each) is exact in fp32, so the only errors are the fp32
// accumulation over K terms and the output rounding. For recursive summation in any order the
// accumulation error is at most (K - 1) u sum_k |a_k b_k| with u = 2^-24 (Higham, Accuracy and Stability
// of Numerical Algorithms, 2nd ed., sec. 4.2); tensor-core adders may truncate instead of rounding
// (Fasi et al., "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021), up to 2u per addition, so
// the bound used is 2 (K + 2) u sum |a b| (the +2 covers the bias add and the stored result). A 16-bit
// output (dW) adds one rounding: u16 |result| with u16 = 2^-11 (f16) or 2^-8 (bf16). Inside attention
// the softmax probabilities and the score gradients are not 16-bit values: rounding them as GEMM
// operands costs u16 sum_j |p_j v_j| (resp. |ds_j k_j|), which is the dominant term there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/gemm_precision.h"
#include "nn/gpt.h"
#include "tests/unit/kernel_bounds.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/runtime.h"
#endif

namespace zero {
namespace {

// Every check runs on cpu too (where the 16-bit operands go into an f32 GEMM of the same exact values,
// well inside the same bounds): that tests the references and the bounds themselves without a GPU.
class TensorCores : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam() == Device::cuda) {
#ifdef ZERO_HAS_CUDA
      if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device visible";
#else
      GTEST_SKIP() << "built without CUDA";
#endif
    }
  }
  Device dev() const { return GetParam(); }
};

using kernel_bounds::random_floats;

constexpr double kU32 = 1.0 / (1 << 24);
double u16(DType t) { return t == DType::f16 ? 1.0 / (1 << 11) : 1.0 / (1 << 8); }

// Host values exactly representable in t (rounded once on the host).
std::vector<float> exact_in(DType t, std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  auto v = random_floats(n, seed, -scale, scale);
  return Tensor::from_vector(v, {static_cast<std::int64_t>(n)}).to(t).to(DType::f32).to_vector();
}

Tensor device_leaf(const std::vector<float>& v, const Shape& shape, DType t, Device dev) {
  Tensor x = Tensor::from_vector(v, shape).to(t).to(dev);
  x.set_requires_grad(true);
  return x;
}

// One element of an fp32 GEMM's result: the exact init + sum_{k<K} term(k) in double, and Note [16-bit
// GEMM tolerances]'s bound 2 (K + 2) u32 (|init| + sum_k |term(k)|), plus one more rounding of the
// result (u16 |result|) when the GEMM stores it in a 16-bit tensor (out_rounding = u16(t); 0 for f32).
struct GemmEntry {
  double value, bound;
};
template <class Term>
GemmEntry gemm_entry(std::int64_t K, Term term, double init = 0.0, double out_rounding = 0.0) {
  double s = init, a = std::abs(init);
  for (std::int64_t k = 0; k < K; ++k) {
    const double x = term(k);
    s += x;
    a += std::abs(x);
  }
  const double acc = 2.0 * (K + 2) * kU32 * a;
  return {s, acc + out_rounding * (std::abs(s) + acc)};
}

// Stores e as element i of a reference and its bound.
void put(std::vector<double>& ref, std::vector<double>& tol, std::int64_t i, GemmEntry e) {
  ref[static_cast<std::size_t>(i)] = e.value;
  tol[static_cast<std::size_t>(i)] = e.bound;
}

using kernel_bounds::within_bounds;

TEST_P(TensorCores, LinearWith16BitWeightMatchesDoubleReference) {
  const std::int64_t N = 37, in = 96, out = 50;
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto xv = exact_in(t, N * in, 1), wv = exact_in(t, out * in, 2, 0.2f), gv = exact_in(t, N * out, 3);
    const auto bv = random_floats(out, 4, -1.0f, 1.0f);
    Tensor x = device_leaf(xv, {N, in}, DType::f32, dev()), w = device_leaf(wv, {out, in}, t, dev()),
           b = device_leaf(bv, {out}, DType::f32, dev());
    Tensor y = linear(x, w, b);
    ASSERT_EQ(y.dtype(), DType::f32);
    sum(mul(y, Tensor::from_vector(gv, {N, out}).to(dev()))).backward();  // dL/dy = g exactly
    ASSERT_EQ(w.grad().dtype(), t);  // in the parameter's dtype, as the ZeRO buckets hold it
    ASSERT_EQ(x.grad().dtype(), DType::f32);

    std::vector<double> y_ref(N * out), y_tol(N * out), dx_ref(N * in), dx_tol(N * in), dw_ref(out * in),
        dw_tol(out * in), db_ref(out), db_tol(out);
    auto x_ = [&](std::int64_t n, std::int64_t k) { return static_cast<double>(xv[n * in + k]); };
    auto w_ = [&](std::int64_t o, std::int64_t k) { return static_cast<double>(wv[o * in + k]); };
    auto g_ = [&](std::int64_t n, std::int64_t o) { return static_cast<double>(gv[n * out + o]); };
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t o = 0; o < out; ++o)
        put(y_ref, y_tol, n * out + o, gemm_entry(in, [&](std::int64_t k) { return x_(n, k) * w_(o, k); }, bv[o]));
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < in; ++k)
        put(dx_ref, dx_tol, n * in + k, gemm_entry(out, [&](std::int64_t o) { return g_(n, o) * w_(o, k); }));
    for (std::int64_t o = 0; o < out; ++o) {
      for (std::int64_t k = 0; k < in; ++k)  // dW is stored in t: one more rounding
        put(dw_ref, dw_tol, o * in + k, gemm_entry(N, [&](std::int64_t n) { return g_(n, o) * x_(n, k); }, 0.0, u16(t)));
      put(db_ref, db_tol, o, gemm_entry(N, [&](std::int64_t n) { return g_(n, o); }));
    }
    EXPECT_TRUE(within_bounds(y.to_vector(), y_ref, y_tol)) << "y";
    EXPECT_TRUE(within_bounds(x.grad().to_vector(), dx_ref, dx_tol)) << "dx";
    EXPECT_TRUE(within_bounds(w.grad().to_vector(), dw_ref, dw_tol)) << "dW";
    EXPECT_TRUE(within_bounds(b.grad().to_vector(), db_ref, db_tol)) << "db";
  }
}

TEST_P(TensorCores, BatchedMatmulOf16BitOperandsMatchesDoubleReference) {
  const std::int64_t batch = 3, M = 17, K = 40, N = 23;
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto av = exact_in(t, batch * M * K, 5), bv = exact_in(t, batch * K * N, 6);
    Tensor a = device_leaf(av, {batch, M, K}, t, dev()), b = device_leaf(bv, {batch, K, N}, t, dev());
    Tensor y = matmul(a, b);
    sum(y).backward();  // dL/dy = 1: da = rowsums of b, db = column sums of a
    std::vector<double> y_ref(batch * M * N), y_tol(y_ref.size()), da_ref(batch * M * K), da_tol(da_ref.size()),
        db_ref(batch * K * N), db_tol(db_ref.size());
    for (std::int64_t i = 0; i < batch; ++i) {
      const float* A = av.data() + i * M * K;
      const float* B = bv.data() + i * K * N;
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n)
          put(y_ref, y_tol, (i * M + m) * N + n,
              gemm_entry(K, [&](std::int64_t k) { return static_cast<double>(A[m * K + k]) * B[k * N + n]; }));
      // gradients leave the GEMM in f32 and are rounded once into the 16-bit leaves' grad
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t k = 0; k < K; ++k)
          put(da_ref, da_tol, (i * M + m) * K + k,
              gemm_entry(N, [&](std::int64_t n) { return static_cast<double>(B[k * N + n]); }, 0.0, u16(t)));
      for (std::int64_t k = 0; k < K; ++k)
        for (std::int64_t n = 0; n < N; ++n)
          put(db_ref, db_tol, (i * K + k) * N + n,
              gemm_entry(M, [&](std::int64_t m) { return static_cast<double>(A[m * K + k]); }, 0.0, u16(t)));
    }
    EXPECT_TRUE(within_bounds(y.to_vector(), y_ref, y_tol)) << "y";
    EXPECT_EQ(a.grad().dtype(), t);
    EXPECT_TRUE(within_bounds(a.grad().to_vector(), da_ref, da_tol)) << "da";
    EXPECT_TRUE(within_bounds(b.grad().to_vector(), db_ref, db_tol)) << "db";
  }
}

// Causal attention in double, with the sums of absolute values the tolerances need (Note [16-bit GEMM
// tolerances]). qkv[B, T, 3C], dout[B, T, C].
struct AttentionRef {
  std::vector<double> y, y_tol, dqkv, dqkv_tol;
};

AttentionRef attention_reference(const std::vector<float>& qkv, const std::vector<float>& dout, std::int64_t B,
                                 std::int64_t T, std::int64_t C, std::int64_t H, double u) {
  const std::int64_t D = C / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  AttentionRef r;
  r.y.assign(B * T * C, 0.0);
  r.y_tol.assign(B * T * C, 0.0);
  r.dqkv.assign(B * T * 3 * C, 0.0);
  r.dqkv_tol.assign(B * T * 3 * C, 0.0);
  auto q = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<double>(qkv[(b * T + t) * 3 * C + h * D + d]);
  };
  auto k = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<double>(qkv[(b * T + t) * 3 * C + C + h * D + d]);
  };
  auto v = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<double>(qkv[(b * T + t) * 3 * C + 2 * C + h * D + d]);
  };
  auto dy = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<double>(dout[(b * T + t) * C + h * D + d]);
  };
  // fp32 accumulation of the scores and products (2 (K + 2) u32 |terms|) plus the operand rounding u
  const double acc = 2.0 * (T + D + 2) * kU32;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<double> P(T * T, 0.0), dS(T * T, 0.0);
      for (std::int64_t i = 0; i < T; ++i) {
        double mx = -1e300;
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0.0;
          for (std::int64_t d = 0; d < D; ++d) s += q(b, i, h, d) * k(b, j, h, d);
          P[i * T + j] = s * scale;
          mx = std::max(mx, P[i * T + j]);
        }
        double z = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) z += P[i * T + j] = std::exp(P[i * T + j] - mx);
        for (std::int64_t j = 0; j <= i; ++j) P[i * T + j] /= z;
        // dP = dy v^T; dS = P (dP - sum_j P dP)
        double dot = 0.0;
        std::vector<double> dP(i + 1);
        for (std::int64_t j = 0; j <= i; ++j) {
          for (std::int64_t d = 0; d < D; ++d) dP[j] += dy(b, i, h, d) * v(b, j, h, d);
          dot += P[i * T + j] * dP[j];
        }
        for (std::int64_t j = 0; j <= i; ++j) dS[i * T + j] = P[i * T + j] * (dP[j] - dot);
        for (std::int64_t d = 0; d < D; ++d) {
          double s = 0.0, a = 0.0;
          for (std::int64_t j = 0; j <= i; ++j) {
            s += P[i * T + j] * v(b, j, h, d);
            a += std::abs(P[i * T + j] * v(b, j, h, d));
          }
          r.y[(b * T + i) * C + h * D + d] = s;
          r.y_tol[(b * T + i) * C + h * D + d] = (2.0 * u + acc) * a + 1e-7;
        }
      }
      for (std::int64_t i = 0; i < T; ++i)
        for (std::int64_t d = 0; d < D; ++d) {
          double gq = 0.0, aq = 0.0, gk = 0.0, ak = 0.0, gv = 0.0, av = 0.0;
          for (std::int64_t j = 0; j < T; ++j) {
            gq += dS[i * T + j] * k(b, j, h, d) * scale;  // dq_i = scale sum_j dS_ij k_j
            aq += std::abs(dS[i * T + j] * k(b, j, h, d) * scale);
            gk += dS[j * T + i] * q(b, j, h, d) * scale;  // dk_i = scale sum_j dS_ji q_j
            ak += std::abs(dS[j * T + i] * q(b, j, h, d) * scale);
            gv += P[j * T + i] * dy(b, j, h, d);  // dv_i = sum_j P_ji dy_j
            av += std::abs(P[j * T + i] * dy(b, j, h, d));
          }
          const std::int64_t row = (b * T + i) * 3 * C + h * D + d;
          r.dqkv[row] = gq;
          r.dqkv[row + C] = gk;
          r.dqkv[row + 2 * C] = gv;
          // dS is computed in f32 from dP (an fp32 GEMM of exact operands) and rounded once as an operand;
          // its own f32 error is of the order of T u32 |P| |dP|: 4u covers both roundings with margin.
          r.dqkv_tol[row] = (4.0 * u + acc) * aq + 1e-7;
          r.dqkv_tol[row + C] = (4.0 * u + acc) * ak + 1e-7;
          r.dqkv_tol[row + 2 * C] = (2.0 * u + acc) * av + 1e-7;
        }
    }
  return r;
}

TEST_P(TensorCores, AttentionWith16BitGemmsMatchesDoubleReference) {
  const std::int64_t B = 2, T = 70, C = 64, H = 4;  // T > 64: more than one tile of the causal softmax
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto qv = exact_in(t, B * T * 3 * C, 7), gv = exact_in(t, B * T * C, 8);
    Tensor qkv = device_leaf(qv, {B, T, 3 * C}, DType::f32, dev());
    Tensor y = causal_self_attention(qkv, H, t);
    sum(mul(y, Tensor::from_vector(gv, {B, T, C}).to(dev()))).backward();
    const AttentionRef r = attention_reference(qv, gv, B, T, C, H, u16(t));
    EXPECT_TRUE(within_bounds(y.to_vector(), r.y, r.y_tol)) << "y";
    EXPECT_TRUE(within_bounds(qkv.grad().to_vector(), r.dqkv, r.dqkv_tol)) << "dqkv";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, TensorCores, ::testing::Values(Device::cpu, Device::cuda),
                         [](const ::testing::TestParamInfo<Device>& i) { return std::string(device_name(i.param)); });

#ifdef ZERO_HAS_CUDA
class CudaTensorCores : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// A layer exposing the GEMM operand it hands to linear().
struct ProbeLinear : nn::Linear {
  using nn::Linear::Linear;
  Tensor operand() const { return gemm_operand(weight); }
};

TEST_F(CudaTensorCores, A16BitLayerHandsItsParameterToTheGemm) {
  Generator gen(1);
  ProbeLinear layer(32, 16, true, gen);
  layer.to(DType::bf16);
  const Tensor on_cpu = layer.operand();
  EXPECT_EQ(on_cpu.dtype(), DType::f32);  // cpu: the cached f32 compute copy
  layer.to(Device::cuda);
  const Tensor on_gpu = layer.operand();
  EXPECT_EQ(on_gpu.dtype(), DType::bf16);  // cuda: the parameter itself, no f32 copy
  EXPECT_TRUE(on_gpu.same(layer.weight));
}

// A bf16 GPT on cuda (every GEMM on tensor cores) against the same bf16 GPT on the CPU (f32 GEMMs of
// the same bf16 weights). The device additionally rounds each GEMM's activation operand to bf16
// (u16 = 2^-8 relative per element); over 2 blocks of small random sums the loss moves by far less than
// 1% (measured differences are reported by the failure message).
TEST_F(CudaTensorCores, Bf16GptLossAndGradientsAreCloseToTheCpu) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 13;
  cfg.block_size = 16;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 32;
  Generator g1(5), g2(5);
  nn::GPT cpu_model(cfg, g1), gpu_model(cfg, g2);
  cpu_model.to(DType::bf16);
  gpu_model.to(DType::bf16);
  gpu_model.to(Device::cuda);
  std::vector<std::int64_t> idx(2 * 16), tgt(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    idx[i] = static_cast<std::int64_t>((i * 7) % 13);
    tgt[i] = static_cast<std::int64_t>((i * 5 + 1) % 13);
  }
  const Tensor x = Tensor::from_indices(idx, {2, 16}), y = Tensor::from_indices(tgt, {2, 16});
  Tensor lc = cpu_model.loss(x, y), lg = gpu_model.loss(x.to(Device::cuda), y.to(Device::cuda));
  EXPECT_NEAR(lg.item(), lc.item(), 1e-2 * std::abs(lc.item()));
  lc.backward();
  lg.backward();
  const auto pc = cpu_model.named_parameters(), pg = gpu_model.named_parameters();
  for (std::size_t i = 0; i < pc.size(); ++i) {
    SCOPED_TRACE(pc[i].name);
    ASSERT_EQ(pg[i].tensor.grad().dtype(), DType::bf16);
    const auto a = pg[i].tensor.grad().to_vector(), b = pc[i].tensor.grad().to_vector();
    double diff = 0.0, norm = 0.0;
    for (std::size_t j = 0; j < a.size(); ++j) {
      diff += (static_cast<double>(a[j]) - b[j]) * (static_cast<double>(a[j]) - b[j]);
      norm += static_cast<double>(b[j]) * b[j];
    }
    // relative L2 error of the gradient: a few u16 from operand rounding through the layers
    EXPECT_LE(std::sqrt(diff), 0.05 * std::sqrt(norm) + 1e-6);
  }
}

#endif  // ZERO_HAS_CUDA

}  // namespace
}  // namespace zero
