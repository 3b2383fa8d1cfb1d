#include "core/cpu/kernels.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace zero::cpu {

namespace {
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ColMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Stride = Eigen::OuterStride<>;
// A row-major [rows, cols] block with row stride ld.
using ConstRowMap = Eigen::Map<const RowMajor, 0, Stride>;
using RowMap = Eigen::Map<RowMajor, 0, Stride>;
// The same memory read as its transpose ([cols, rows]) without copying.
using ConstColMap = Eigen::Map<const ColMajor, 0, Stride>;
}  // namespace

void set_num_threads(int n) {
  ZERO_CHECK(n >= 1, "thread count must be >= 1, got {}", n);
  omp_set_num_threads(n);
  Eigen::setNbThreads(n);
}

int num_threads() { return omp_get_max_threads(); }

void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  RowMap c(C, M, N, Stride(ldc));
  if (beta == 0.0f) {
    c.setZero();
  } else if (beta != 1.0f) {
    c *= beta;
  }
  if (K == 0 || M == 0 || N == 0) return;
  // A stored [K,M] row-major is op(A) = [M,K] column-major with the same stride: no copy for transposes.
  if (!trans_a && !trans_b)
    c.noalias() += alpha * ConstRowMap(A, M, K, Stride(lda)) * ConstRowMap(B, K, N, Stride(ldb));
  else if (!trans_a && trans_b)
    c.noalias() += alpha * ConstRowMap(A, M, K, Stride(lda)) * ConstColMap(B, K, N, Stride(ldb));
  else if (trans_a && !trans_b)
    c.noalias() += alpha * ConstColMap(A, M, K, Stride(lda)) * ConstRowMap(B, K, N, Stride(ldb));
  else
    c.noalias() += alpha * ConstColMap(A, M, K, Stride(lda)) * ConstColMap(B, K, N, Stride(ldb));
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       std::int64_t N, std::int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float m = 0.0f;
    for (std::int64_t i = 0; i < C; ++i) m += x[i];
    m /= static_cast<float>(C);
    float var = 0.0f;
    for (std::int64_t i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
    var /= static_cast<float>(C);
    const float s = 1.0f / std::sqrt(var + eps);
    float* y = out + n * C;
    for (std::int64_t i = 0; i < C; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t N, std::int64_t C) {
  // Rows are independent for dinp; dweight/dbias are sums over rows, kept serial to stay deterministic.
  for (std::int64_t n = 0; n < N; ++n) {
    const float* dy = dout + n * C;
    const float* x = inp + n * C;
    const float m = mean[n], s = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (std::int64_t i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
      dbias[i] += dy[i];
      dweight[i] += norm * dy[i];
    }
    dnorm_mean /= static_cast<float>(C);
    dnorm_norm_mean /= static_cast<float>(C);
    float* dx = dinp + n * C;
    for (std::int64_t i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      dx[i] = (weight[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}

// GELU works in chunks so Eigen's vectorised tanh (a rational approximation, accurate to float
// rounding) replaces one libm call per element.
namespace {
constexpr std::int64_t kGeluChunk = 4096;
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;
}  // namespace

void gelu_forward(float* out, const float* inp, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < n; c += kGeluChunk) {
    const std::int64_t len = std::min(kGeluChunk, n - c);
    ConstArrayMap x(inp + c, len);
    ArrayMap y(out + c, len);
    y = 0.5f * x * (1.0f + (kGeluScale * (x + 0.044715f * x.cube())).tanh());
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < n; c += kGeluChunk) {
    const std::int64_t len = std::min(kGeluChunk, n - c);
    ConstArrayMap x(inp + c, len), dy(dout + c, len);
    ArrayMap dx(dinp + c, len);
    const Eigen::ArrayXf t = (kGeluScale * (x + 0.044715f * x.cube())).tanh();
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x),  u' = sqrt(2/pi)(1 + 3·0.044715 x^2)
    dx = dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t.square()) * kGeluScale * (1.0f + 3.0f * 0.044715f * x.square()));
  }
}

void softmax_forward(float* out, const float* inp, std::int64_t N, std::int64_t C) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float* y = out + n * C;
    float mx = -INFINITY;
    for (std::int64_t i = 0; i < C; ++i) mx = std::max(mx, x[i]);
    float sum = 0.0f;
    for (std::int64_t i = 0; i < C; ++i) sum += (y[i] = std::exp(x[i] - mx));
    const float inv = 1.0f / sum;
    for (std::int64_t i = 0; i < C; ++i) y[i] *= inv;
  }
}

void softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, std::int64_t C) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const float* y = out + n * C;
    const float* dy = dout + n * C;
    float dot = 0.0f;
    for (std::int64_t i = 0; i < C; ++i) dot += y[i] * dy[i];
    float* dx = dinp + n * C;
    for (std::int64_t i = 0; i < C; ++i) dx[i] = y[i] * (dy[i] - dot);
  }
}

void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                       std::int64_t H) {
  const std::int64_t D = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(static)
  for (std::int64_t bh = 0; bh < B * H; ++bh) {
    const std::int64_t b = bh / H, h = bh % H;
    const float* q = qkv + b * T * C3 + h * D;  // [T,D], row stride 3C
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + bh * T * T;  // [T,T]
    // scores = q k^T * scale; only the lower triangle is used (causal mask).
    gemm(false, true, T, T, D, scale, q, C3, k, C3, 0.0f, a, T);
    for (std::int64_t t = 0; t < T; ++t) {
      float* row = a + t * T;
      float mx = -INFINITY;
      for (std::int64_t s = 0; s <= t; ++s) mx = std::max(mx, row[s]);
      float sum = 0.0f;
      for (std::int64_t s = 0; s <= t; ++s) sum += (row[s] = std::exp(row[s] - mx));
      const float inv = 1.0f / sum;
      for (std::int64_t s = 0; s <= t; ++s) row[s] *= inv;
      for (std::int64_t s = t + 1; s < T; ++s) row[s] = 0.0f;
    }
    gemm(false, false, T, D, T, 1.0f, a, T, v, C3, 0.0f, out + b * T * C + h * D, C);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                        std::int64_t T, std::int64_t C, std::int64_t H) {
  const std::int64_t D = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    std::vector<float> datt(static_cast<std::size_t>(T * T));
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < B * H; ++bh) {
      const std::int64_t b = bh / H, h = bh % H;
      const float* q = qkv + b * T * C3 + h * D;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + b * T * C3 + h * D;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + bh * T * T;
      const float* dy = dout + b * T * C + h * D;  // [T,D], row stride C
      // dv = att^T dy ; datt = dy v^T
      gemm(true, false, T, D, T, 1.0f, a, T, dy, C, 0.0f, dv, C3);
      gemm(false, true, T, T, D, 1.0f, dy, C, v, C3, 0.0f, datt.data(), T);
      // softmax backward on the causal rows, folding in the score scale.
      for (std::int64_t t = 0; t < T; ++t) {
        const float* p = a + t * T;
        float* dp = datt.data() + t * T;
        float dot = 0.0f;
        for (std::int64_t s = 0; s <= t; ++s) dot += p[s] * dp[s];
        for (std::int64_t s = 0; s <= t; ++s) dp[s] = p[s] * (dp[s] - dot) * scale;
        for (std::int64_t s = t + 1; s < T; ++s) dp[s] = 0.0f;
      }
      // dq = dscores k ; dk = dscores^T q
      gemm(false, false, T, D, T, 1.0f, datt.data(), T, k, C3, 0.0f, dq, C3);
      gemm(true, false, T, D, T, 1.0f, datt.data(), T, q, C3, 0.0f, dk, C3);
    }
  }
}

float cross_entropy_forward(float* probs, const float* logits, const std::int64_t* targets, std::int64_t N,
                            std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n)
    ZERO_CHECK(targets[n] >= 0 && targets[n] < V, "cross_entropy: target {} at row {} outside [0, {})", targets[n], n, V);
  softmax_forward(probs, logits, N, V);
  double loss = 0.0;
  for (std::int64_t n = 0; n < N; ++n) loss -= std::log(std::max(probs[n * V + targets[n]], 1e-30f));
  return static_cast<float>(loss / static_cast<double>(N));
}

void cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets, float dloss,
                            std::int64_t N, std::int64_t V) {
  const float s = dloss / static_cast<float>(N);
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t i = 0; i < V; ++i) dlogits[n * V + i] = probs[n * V + i] * s;
    dlogits[n * V + targets[n]] -= s;
  }
}

void embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N, std::int64_t V,
                       std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) {
    ZERO_CHECK(idx[n] >= 0 && idx[n] < V, "embedding: index {} at position {} outside [0, {})", idx[n], n, V);
    std::copy_n(weight + idx[n] * C, C, out + n * C);
  }
}

void embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N, std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) {
    float* row = dweight + idx[n] * C;
    const float* g = dout + n * C;
    for (std::int64_t i = 0; i < C; ++i) row[i] += g[i];
  }
}

}  // namespace zero::cpu
