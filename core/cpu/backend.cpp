// The CPU backend's memory and the small f32 loops the ops need (binary, unary, dropout, reductions);
// core/cpu/backend.h lists where the other CPU kernels are. Every loop keeps the summation order of the
// op it serves, so results do not depend on the thread count.
#include "core/cpu/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/caching_allocator.h"
#include "core/check.h"
#include "core/strided.h"
#include "core/tensor.h"

namespace zero::cpu {

namespace {

// Host blocks: exact-size free lists, sizes rounded up to 64 bytes so near-equal requests share a list.
CachingAllocator& host_allocator() {
  static auto* a = new CachingAllocator(CachingAllocator::Source{
      [](std::size_t n) { return n == 0 ? std::size_t{64} : (n + 63) / 64 * 64; },
      [](std::size_t size) { return std::aligned_alloc(64, size); },
      [](void* p) { std::free(p); },
      {}});
  return *a;  // never destroyed: storages may outlive main's statics
}

}  // namespace

// ---- memory ----

void* CpuBackend::allocate(std::size_t nbytes) {
  void* p = host_allocator().allocate(nbytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void CpuBackend::deallocate(void* ptr) { host_allocator().deallocate(ptr); }

void CpuBackend::copy_bytes(void* dst, const void* src, std::size_t nbytes) { std::memmove(dst, src, nbytes); }

void CpuBackend::synchronize() {}

// ---- GEMMs beyond gemm (kernels.cpp) ----

void CpuBackend::gemm_batched(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                              const float* A, std::int64_t lda, std::int64_t stride_a, const float* B, std::int64_t ldb,
                              std::int64_t stride_b, float beta, float* C, std::int64_t ldc, std::int64_t stride_c,
                              std::int64_t batch) {
  for (std::int64_t i = 0; i < batch; ++i)
    gemm(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc,
         nullptr);
}

// All-f32 typed GEMMs are the plain ones, so an op has one body for f32 and 16-bit operands; 16-bit
// operands need a backend with 16-bit GEMMs (cuda).
void CpuBackend::gemm_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                         const void* A, DType a_dtype, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb,
                         float beta, void* C, DType c_dtype, std::int64_t ldc, const float* bias) {
  if (a_dtype != DType::f32 || b_dtype != DType::f32 || c_dtype != DType::f32) missing("gemm_ex with 16-bit operands");
  gemm(trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb, beta,
       static_cast<float*>(C), ldc, bias);
}

void CpuBackend::gemm_batched_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                                 float alpha, const void* A, DType a_dtype, std::int64_t lda, std::int64_t stride_a,
                                 const void* B, DType b_dtype, std::int64_t ldb, std::int64_t stride_b, float beta,
                                 void* C, DType c_dtype, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  if (a_dtype != DType::f32 || b_dtype != DType::f32 || c_dtype != DType::f32)
    missing("gemm_batched_ex with 16-bit operands");
  gemm_batched(trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(A), lda, stride_a,
               static_cast<const float*>(B), ldb, stride_b, beta, static_cast<float*>(C), ldc, stride_c, batch);
}

void CpuBackend::attention_forward_ex(float*, float*, const float*, std::int64_t, std::int64_t, std::int64_t,
                                      std::int64_t, DType) {
  missing("attention_forward_ex");
}

void CpuBackend::attention_backward_ex(float*, const float*, const float*, const float*, std::int64_t, std::int64_t,
                                       std::int64_t, std::int64_t, DType) {
  missing("attention_backward_ex");
}

// ---- elementwise and reductions ----

void CpuBackend::binary(float* y, const float* a, const float* b, std::int64_t n, std::int64_t m, BinaryOp op) {
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

void CpuBackend::unary(float* y, const float* x, std::int64_t n, UnaryOp op, float p) {
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

void CpuBackend::dropout_mask(float* mask, Generator& gen, float p, std::int64_t n) {
  const float keep = 1.0f / (1.0f - p);
  for (std::int64_t i = 0; i < n; ++i) mask[i] = gen.uniform() < p ? 0.0f : keep;
}

void CpuBackend::sum(float* out, const float* x, std::int64_t n) {
  double acc = 0.0;
  for (std::int64_t i = 0; i < n; ++i) acc += x[i];
  out[0] = static_cast<float>(acc);
}

void CpuBackend::sum_rows(float* out, const float* x, std::int64_t N, std::int64_t C) {
  // Row by row, so the inner loop runs along contiguous memory.
  std::fill(out, out + C, 0.0f);
  for (std::int64_t r = 0; r < N; ++r) {
    const float* row = x + r * C;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) out[c] += row[c];
  }
}

void CpuBackend::sum_to(float* dst, const float* src, const Shape& x_shape, const Shape& shape) {
  const int nd = static_cast<int>(x_shape.size()), od = static_cast<int>(shape.size());
  // A suffix of x's shape (a bias [C] or positions [T, C] under [B, T, C]): add whole contiguous blocks.
  if (od <= nd && std::equal(shape.begin(), shape.end(), x_shape.end() - od))
    return sum_rows(dst, src, shape_numel(x_shape) / std::max<std::int64_t>(1, shape_numel(shape)), shape_numel(shape));
  // Otherwise view `out` with x's shape and stride 0 on the broadcast dimensions, accumulate through it.
  std::fill(dst, dst + shape_numel(shape), 0.0f);
  const Shape ostrides = contiguous_strides(shape);
  Shape strides(nd, 0);
  for (int i = 0; i < od; ++i) strides[nd - od + i] = shape[i] == 1 ? 0 : ostrides[i];
  std::int64_t k = 0;
  for_each_offset(x_shape, strides, 0, [&](std::int64_t off) { dst[off] += src[k++]; });
}

void CpuBackend::reduce_dim(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                            std::int64_t inner, ReduceOp op) {
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

void CpuBackend::scatter_dim(float* dx, const float* g, const std::int64_t* argmax, std::int64_t outer, std::int64_t n,
                             std::int64_t inner) {
  std::fill(dx, dx + outer * n * inner, 0.0f);
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) dx[(o * n + argmax[o * inner + i]) * inner + i] = g[o * inner + i];
}

Kernels& cpu_backend() {
  static CpuBackend* b = new CpuBackend();  // never destroyed: tensors may be freed after main's statics
  return *b;
}

}  // namespace zero::cpu

namespace zero {

AllocatorStats cpu_allocator_stats() { return cpu::host_allocator().stats(); }
void reset_cpu_allocator_peak() { cpu::host_allocator().reset_peak(); }
void empty_cpu_cache() { cpu::host_allocator().empty_cache(); }

}  // namespace zero
