// Backend: the one kernel interface every differentiable op calls (minitorch's TensorBackend, ggml's
// per-backend kernels). An op in autograd/ops.cpp validates its inputs, asks backend(device) for the
// device its inputs live on, calls the kernels below on raw contiguous buffers of that device, and
// records its backward once, beside the forward. Only the kernels are device-specific: the CPU ones
// in core/cpu/ (backend.cpp over kernels.cpp), the CUDA ones in core/cuda/ (backend.cpp over
// kernels.cpp and the .cu files).
//
// Note [Missing kernels]
// Every kernel has a default implementation here that throws zero::Error "<kernel>: no kernel on
// device <device>". A backend overrides the kernels it has; an op reaching a missing one fails with
// that one line before touching any memory, never by reading device memory on the host.
//
// Buffers are contiguous, row-major, on the backend's device (host pointers for cpu, device pointers
// for cuda); sizes are in elements. Shape letters as in core/cpu/kernels.h. Unless a kernel says
// otherwise its output is fully overwritten, and the CPU kernel is the reference the CUDA one is tested
// against (tests/unit/test_gradcheck.cpp runs every op on every device present).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace zero {

class Generator;

enum class BinaryOp { add, sub, mul, div };
enum class UnaryOp { sqrt, rsqrt, exp, log, pow };
enum class ReduceOp { sum, max };

class Backend {
 public:
  explicit Backend(Device device) : device_(device) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  Device device() const { return device_; }

  // ---- GEMM (cpu::gemm's contract: row-major, C not read when beta == 0, bias[N] added per row) ----
  virtual void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                    const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                    std::int64_t ldc, const float* bias);
  /// `batch` gemms; matrix i of A starts at A + i * stride_a, likewise B and C.
  virtual void gemm_batched(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                            const float* A, std::int64_t lda, std::int64_t stride_a, const float* B, std::int64_t ldb,
                            std::int64_t stride_b, float beta, float* C, std::int64_t ldc, std::int64_t stride_c,
                            std::int64_t batch);

  // ---- GEMMs with 16-bit operands (Note [Tensor cores for 16-bit models] in core/gemm_precision.h) ----
  // All-f32 operands work on every backend (the defaults call gemm / gemm_batched); 16-bit ones only on
  // a device whose gemm_operand_dtype() is 16-bit (cuda), elsewhere a missing-kernel error.
  /// gemm with typed operands: A and B of one dtype (f32, f16 or bf16), C f32 or that dtype; fp32
  /// accumulation; bias[N] (f32, may be null) added to every row of an f32 C.
  virtual void gemm_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                       const void* A, DType a_dtype, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb,
                       float beta, void* C, DType c_dtype, std::int64_t ldc, const float* bias);
  /// gemm_batched with gemm_ex's element types (no bias).
  virtual void gemm_batched_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                               const void* A, DType a_dtype, std::int64_t lda, std::int64_t stride_a, const void* B,
                               DType b_dtype, std::int64_t ldb, std::int64_t stride_b, float beta, void* C,
                               DType c_dtype, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch);
  /// attention_forward / attention_backward whose GEMMs read their operands rounded to gemm_dtype (f16,
  /// bf16) with fp32 accumulation; every buffer is f32 as there.
  virtual void attention_forward_ex(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T,
                                    std::int64_t C, std::int64_t H, DType gemm_dtype);
  virtual void attention_backward_ex(float* dqkv, const float* dout, const float* qkv, const float* att,
                                     std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H, DType gemm_dtype);

  // ---- elementwise (f32) ----
  /// out[i] = a[i] op b[i % m] for i < n: b is as large as a (m == n) or a trailing suffix of a's shape
  /// repeated (a bias [C] against [N, C]); m divides n.
  virtual void binary(float* out, const float* a, const float* b, std::int64_t n, std::int64_t m, BinaryOp op);
  /// out[i] = f(x[i]): sqrt, 1/sqrt, exp, log, or x^p (pow; p ignored otherwise).
  virtual void unary(float* out, const float* x, std::int64_t n, UnaryOp op, float p);
  /// out[i] = x[i] * s.
  virtual void scale(float* out, const float* x, std::int64_t n, float s);
  /// dst[i] = dst[i] + src[i] computed in f32 and rounded once to dst's dtype (any float dtypes).
  virtual void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n);
  /// Inverted-dropout mask[n]: 0 with probability p, else 1 / (1 - p), drawn from `gen`.
  virtual void dropout_mask(float* mask, Generator& gen, float p, std::int64_t n);

  // ---- reductions (f32) ----
  /// out[0] = sum of x[n] (accumulated in double).
  virtual void sum(float* out, const float* x, std::int64_t n);
  /// out[C] = sum over the N rows of x[N, C] (f32, rows in order).
  virtual void sum_rows(float* out, const float* x, std::int64_t N, std::int64_t C);
  /// out = x[x_shape] summed down to `shape` (right-aligned; broadcast rules), out fully written.
  virtual void sum_to(float* out, const float* x, const std::vector<std::int64_t>& x_shape,
                      const std::vector<std::int64_t>& shape);
  /// x viewed as [outer, n, inner], reduced over the middle dimension: out[outer, inner]. For max,
  /// argmax[outer, inner] (may be null for sum) receives the index in [0, n) of the first maximum.
  virtual void reduce_dim(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                          std::int64_t inner, ReduceOp op);
  /// dx[outer, n, inner] = g[outer, inner] at argmax, 0 elsewhere.
  virtual void scatter_dim(float* dx, const float* g, const std::int64_t* argmax, std::int64_t outer, std::int64_t n,
                           std::int64_t inner);

  // ---- neural-network kernels (core/cpu/kernels.h has the math and the sources) ----
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, std::int64_t N, std::int64_t C, float eps);
  /// dinp overwritten; dweight, dbias accumulated into.
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, const float* mean, const float* rstd, std::int64_t N,
                                  std::int64_t C);
  virtual void gelu_forward(float* out, const float* inp, std::int64_t n);
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);
  virtual void softmax_forward(float* out, const float* inp, std::int64_t N, std::int64_t C);
  virtual void softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, std::int64_t C);
  virtual void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T,
                                 std::int64_t C, std::int64_t H);
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                                  std::int64_t T, std::int64_t C, std::int64_t H);
  /// loss[0] = mean cross-entropy of logits[N, V] against targets[N]; probs[N, V] the softmax. A target
  /// outside [0, V) throws (cpu) or raises a deferred device error (cuda).
  virtual void cross_entropy_forward(float* loss, float* probs, const float* logits, const std::int64_t* targets,
                                     std::int64_t N, std::int64_t V);
  /// dlogits[N, V] = (probs - onehot(targets)) * dloss[0] / N.
  virtual void cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets,
                                      const float* dloss, std::int64_t N, std::int64_t V);
  virtual void embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N,
                                 std::int64_t V, std::int64_t C);
  /// dweight[V, C] += scatter of dout[N, C] by idx[N].
  virtual void embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N,
                                  std::int64_t V, std::int64_t C);

 protected:
  /// Throws "<kernel>: no kernel on device <device>" (Note [Missing kernels]).
  [[noreturn]] void missing(const char* kernel) const;

 private:
  Device device_;
};

/// The backend of `device`. Throws zero::Error for a device this build has no backend for.
Backend& backend(Device device);

namespace cpu {
Backend& cpu_backend();
}
#ifdef ZERO_HAS_CUDA
namespace cuda {
Backend& cuda_backend();
}
#endif

}  // namespace zero
