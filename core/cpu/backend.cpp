// The CPU backend (core/backend.h): the kernels of core/cpu/kernels.h, plus the small elementwise and
// reduction loops the ops need, written here. Every loop keeps the summation order of the op it
// serves, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "core/backend.h"
#include "core/check.h"
#include "core/cpu/convert.h"
#include "core/cpu/kernels.h"
#include "core/strided.h"
#include "core/tensor.h"

namespace zero::cpu {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend() : Backend(Device::cpu) {}

  void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
            std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
            const float* bias) override {
    cpu::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
  }
  void gemm_batched(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                    const float* A, std::int64_t lda, std::int64_t stride_a, const float* B, std::int64_t ldb,
                    std::int64_t stride_b, float beta, float* C, std::int64_t ldc, std::int64_t stride_c,
                    std::int64_t batch) override {
    for (std::int64_t i = 0; i < batch; ++i)
      cpu::gemm(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c,
                ldc);
  }

  void binary(float* y, const float* a, const float* b, std::int64_t n, std::int64_t m, BinaryOp op) override {
    // b is either full-size or a suffix repeated every m elements; loop over the repeats.
    for (std::int64_t base = 0; base < n; base += m) {
      float* yb = y + base;
      const float* ab = a + base;
      switch (op) {
        case BinaryOp::add:
          for (std::int64_t i = 0; i < m; ++i) yb[i] = ab[i] + b[i];
          break;
        case BinaryOp::sub:
          for (std::int64_t i = 0; i < m; ++i) yb[i] = ab[i] - b[i];
          break;
        case BinaryOp::mul:
          for (std::int64_t i = 0; i < m; ++i) yb[i] = ab[i] * b[i];
          break;
        case BinaryOp::div:
          for (std::int64_t i = 0; i < m; ++i) yb[i] = ab[i] / b[i];
          break;
      }
    }
  }

  void unary(float* y, const float* x, std::int64_t n, UnaryOp op, float p) override {
    switch (op) {
      case UnaryOp::sqrt:
        for (std::int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
        break;
      case UnaryOp::rsqrt:
        for (std::int64_t i = 0; i < n; ++i) y[i] = 1.0f / std::sqrt(x[i]);
        break;
      case UnaryOp::exp:
        for (std::int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
        break;
      case UnaryOp::log:
        for (std::int64_t i = 0; i < n; ++i) y[i] = std::log(x[i]);
        break;
      case UnaryOp::pow:
        if (p == 2.0f) {
          for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * x[i];
        } else {
          for (std::int64_t i = 0; i < n; ++i) y[i] = std::pow(x[i], p);
        }
        break;
    }
  }

  void scale(float* y, const float* x, std::int64_t n, float s) override {
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
  }

  void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) override {
    cpu::accumulate(dst, dst_dtype, src, src_dtype, n);
  }

  void dropout_mask(float* mask, Generator& gen, float p, std::int64_t n) override {
    const float keep = 1.0f / (1.0f - p);
    for (std::int64_t i = 0; i < n; ++i) mask[i] = gen.uniform() < p ? 0.0f : keep;
  }

  void sum(float* out, const float* x, std::int64_t n) override {
    double acc = 0.0;
    for (std::int64_t i = 0; i < n; ++i) acc += x[i];
    out[0] = static_cast<float>(acc);
  }

  void sum_rows(float* out, const float* x, std::int64_t N, std::int64_t C) override {
    // Row by row, so the inner loop runs along contiguous memory.
    std::fill(out, out + C, 0.0f);
    for (std::int64_t r = 0; r < N; ++r) {
      const float* row = x + r * C;
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) out[c] += row[c];
    }
  }

  void sum_to(float* dst, const float* src, const Shape& x_shape, const Shape& shape) override {
    const int nd = static_cast<int>(x_shape.size()), od = static_cast<int>(shape.size());
    // A suffix of x's shape (a bias [C] or positions [T, C] under [B, T, C]): add whole contiguous blocks.
    if (od <= nd && std::equal(shape.begin(), shape.end(), x_shape.end() - od))
      return sum_rows(dst, src, shape_numel(x_shape) / std::max<std::int64_t>(1, shape_numel(shape)),
                      shape_numel(shape));
    // Otherwise view `out` with x's shape and stride 0 on the broadcast dimensions, accumulate through it.
    std::fill(dst, dst + shape_numel(shape), 0.0f);
    const Shape ostrides = contiguous_strides(shape);
    Shape strides(nd, 0);
    for (int i = 0; i < od; ++i) strides[nd - od + i] = shape[i] == 1 ? 0 : ostrides[i];
    std::int64_t k = 0;
    for_each_offset(x_shape, strides, 0, [&](std::int64_t off) { dst[off] += src[k++]; });
  }

  void reduce_dim(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                  std::int64_t inner, ReduceOp op) override {
    for (std::int64_t o = 0; o < outer; ++o) {
      const float* xo = x + o * n * inner;
      float* yo = out + o * inner;
      if (op == ReduceOp::sum) {
        std::fill(yo, yo + inner, 0.0f);
        for (std::int64_t j = 0; j < n; ++j)
          for (std::int64_t i = 0; i < inner; ++i) yo[i] += xo[j * inner + i];
        continue;
      }
      std::int64_t* ao = argmax + o * inner;
      for (std::int64_t i = 0; i < inner; ++i) {
        // The first maximum wins; a NaN is the maximum (it propagates, as in PyTorch).
        float best = xo[i];
        std::int64_t at = 0;
        for (std::int64_t j = 1; j < n && !std::isnan(best); ++j) {
          const float v = xo[j * inner + i];
          if (v > best || std::isnan(v)) {
            best = v;
            at = j;
          }
        }
        yo[i] = best;
        ao[i] = at;
      }
    }
  }

  void scatter_dim(float* dx, const float* g, const std::int64_t* argmax, std::int64_t outer, std::int64_t n,
                   std::int64_t inner) override {
    std::fill(dx, dx + outer * n * inner, 0.0f);
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < inner; ++i) dx[(o * n + argmax[o * inner + i]) * inner + i] = g[o * inner + i];
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, std::int64_t N, std::int64_t C, float eps) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, std::int64_t N,
                          std::int64_t C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, std::int64_t n) override { cpu::gelu_forward(out, inp, n); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) override {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  void softmax_forward(float* out, const float* inp, std::int64_t N, std::int64_t C) override {
    cpu::softmax_forward(out, inp, N, C);
  }
  void softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, std::int64_t C) override {
    cpu::softmax_backward(dinp, out, dout, N, C);
  }
  void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                         std::int64_t H) override {
    cpu::attention_forward(out, att, qkv, B, T, C, H);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                          std::int64_t T, std::int64_t C, std::int64_t H) override {
    cpu::attention_backward(dqkv, dout, qkv, att, B, T, C, H);
  }
  void cross_entropy_forward(float* loss, float* probs, const float* logits, const std::int64_t* targets,
                             std::int64_t N, std::int64_t V) override {
    loss[0] = cpu::cross_entropy_forward(probs, logits, targets, N, V);
  }
  void cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets, const float* dloss,
                              std::int64_t N, std::int64_t V) override {
    cpu::cross_entropy_backward(dlogits, probs, targets, dloss[0], N, V);
  }
  void embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N, std::int64_t V,
                         std::int64_t C) override {
    cpu::embedding_forward(out, weight, idx, N, V, C);
  }
  void embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N, std::int64_t,
                          std::int64_t C) override {
    cpu::embedding_backward(dweight, dout, idx, N, C);
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend* b = new CpuBackend();  // never destroyed: tensors may be freed after main's statics
  return *b;
}

}  // namespace zero::cpu
