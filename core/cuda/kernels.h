// CUDA kernels on raw contiguous device buffers (row-major), mirroring core/cpu/kernels.h.
//
// Every function with a name from cpu:: has the same signature and the same contract as its CPU
// twin, with device pointers; tests/unit/test_cuda_kernels.cpp checks each against a double-precision
// reference or the CPU kernel (Note [CUDA test tolerances] in tests/unit/cuda_test_util.h). All of them run asynchronously on the current stream
// (core/cuda/runtime.h) unless they return a host value, which synchronizes. Validation that needs the
// data (embedding indices, cross-entropy targets) is deferred: the kernel skips the bad element and
// sets a device flag; the next check_device_errors() — cross_entropy_forward and synchronize() call it —
// throws zero::Error. Sizes must fit the kernels' index types: rows N, sizes n up to 2^63 (row kernels loop over
// rows past the grid's 2^31 - 1 blocks: Note [Row grids] in kernel_math.h), a row length (C, V, T) up to
// 2^31 - 1; GEMM dimensions and leading dimensions up to 2^31 - 1 (cuBLAS).
//
// Beyond the CPU set, what the GPU path needs to stay on the device: dtype-generic elementwise helpers
// (fill, cast, scale, accumulate, strided copy), deterministic reductions into device scalars, the
// fp16/bf16 overflow check, fused AdamW with unscale and cast-back, and mixed-precision GEMM.
// Shape letters as in core/cpu/kernels.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "core/cuda/launch.h"
#include "core/dtype.h"

namespace zero::cuda {

// ---- GEMM through cuBLAS (core/cuda/blas.cpp) ------------------------------------------------------------

/// C[M,N] = alpha * op(A) @ op(B) + beta * C (+ bias[N] added to every row, when bias is not null),
/// row-major: exactly cpu::gemm's contract (C is not read when beta == 0). fp32 in and out, fp32
/// accumulation; on tensor cores in TF32 when set_allow_tf32(true) (~10-bit mantissa inputs). The bias
/// is a second pass over C (a cublasLt epilogue could fuse it).
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
          const float* bias = nullptr);

/// gemm with element types: A and B f32, f16 or bf16 (the same type), C f32 or A's type (f32 inputs:
/// f32 only). Always fp32 accumulation (CUBLAS_COMPUTE_32F; 16-bit inputs run on tensor cores; f32 ones
/// in TF32 when allowed): the choice is cuda_gemm_plan's (core/gemm_precision.h). bias[N] (f32, may be
/// null) is added to every row of an f32 C. Throws zero::Error for other combinations.
void gemm_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const void* A,
             DType a_type, std::int64_t lda, const void* B, DType b_type, std::int64_t ldb, float beta, void* C,
             DType c_type, std::int64_t ldc, const float* bias = nullptr);
/// gemm_strided_batched with gemm_ex's element types (no bias).
void gemm_strided_batched_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                             const void* A, DType a_type, std::int64_t lda, std::int64_t stride_a, const void* B,
                             DType b_type, std::int64_t ldb, std::int64_t stride_b, float beta, void* C, DType c_type,
                             std::int64_t ldc, std::int64_t stride_c, std::int64_t batch);

/// `batch` independent f32 gemms: matrix i of A starts at A + i * stride_a (elements), likewise B, C.
void gemm_strided_batched(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, std::int64_t stride_a, const float* B, std::int64_t ldb,
                          std::int64_t stride_b, float beta, float* C, std::int64_t ldc, std::int64_t stride_c,
                          std::int64_t batch);

/// Whether f32 GEMMs may use TF32 tensor cores (default false, PyTorch's default for matmul).
void set_allow_tf32(bool allow);
bool allow_tf32();

// ---- the cpu:: kernels -------------------------------------------------------------------------------

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       std::int64_t N, std::int64_t C, float eps);
/// dinp overwritten; dweight, dbias += (deterministic: fixed-order partial sums, no atomics).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t N, std::int64_t C);

void gelu_forward(float* out, const float* inp, std::int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);

void softmax_forward(float* out, const float* inp, std::int64_t N, std::int64_t C);
void softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, std::int64_t C);

/// cpu::attention_forward's contract. Scores and outputs through cuBLAS strided-batched GEMMs over
/// B*H heads, the causal softmax fused into one kernel in place in att; q, k, v are first gathered into
/// head-major scratch ([B,H,T,D] each, freed when the stream reaches them). gemm_dtype f16 or bf16: its
/// GEMMs (two forward, four backward) read their operands rounded to it, on tensor cores with fp32
/// accumulation (Note [Tensor cores for 16-bit models]); att, out and dqkv stay f32 either way.
void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                       std::int64_t H, DType gemm_dtype = DType::f32);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                        std::int64_t T, std::int64_t C, std::int64_t H, DType gemm_dtype = DType::f32);

/// Synchronizes and returns the mean loss (like cpu::cross_entropy_forward); a target outside [0, V)
/// throws zero::Error (after the kernel ran). Each row's loss is the log-softmax log(sum exp(x - max)) -
/// (x[target] - max), accurate for any finite logits (the CPU's -log(max(p, 1e-30)) stops at 69).
float cross_entropy_forward(float* probs, const float* logits, const std::int64_t* targets, std::int64_t N,
                            std::int64_t V);
void cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets, float dloss,
                            std::int64_t N, std::int64_t V);

/// An index outside [0, V) gives a zero row and a deferred error.
void embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N, std::int64_t V,
                       std::int64_t C);
/// dweight[V,C] += scatter of dout[N,C] (atomicAdd: the summation order, so the last bits, may vary).
/// This overload, with cpu::embedding_backward's signature, cannot bound-check the index: prefer the
/// one with V.
void embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N, std::int64_t C);
/// Indices outside [0, V) are skipped.
void embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N, std::int64_t C,
                        std::int64_t V);

// ---- device-resident variants (no host synchronization) ----------------------------------------------

/// *loss (device f32) = mean cross-entropy; probs as above. Bad targets: deferred error.
void cross_entropy_forward_async(float* loss, float* probs, const float* logits, const std::int64_t* targets,
                                 std::int64_t N, std::int64_t V);
/// dlogits = (probs - onehot(targets)) * (*dloss) / N with dloss a device f32 scalar.
void cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets, const float* dloss,
                            std::int64_t N, std::int64_t V);

// ---- elementwise ------------------------------------------------------------------------------------

using zero::BinaryOp;
using zero::UnaryOp;
/// out[i] = a[i] op b[i % m] for i < n: b is either the same size as a (m == n) or a trailing suffix
/// of a's shape repeated (a bias [C] against [N, C]: m = C). m must divide n. out may alias a or b.
void binary(float* out, const float* a, const float* b, std::int64_t n, std::int64_t m, BinaryOp op);
/// out[i] = f(x[i]) (core/backend.h's unary; 1/sqrt is computed exactly, not with rsqrtf).
void unary(float* out, const float* x, std::int64_t n, UnaryOp op, float p);
/// x[outer, n, inner] reduced over n (backend.h's reduce_dim): one thread per output, j in order.
void reduce_dim(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                std::int64_t inner, bool max);
/// dx[outer, n, inner] = g[outer, inner] at argmax, 0 elsewhere.
void scatter_dim(float* dx, const float* g, const std::int64_t* argmax, std::int64_t outer, std::int64_t n,
                 std::int64_t inner);
/// *out (device f32) = sum of x[n], through fp64 partials; no synchronization.
void sum_async(float* out, const float* x, std::int64_t n);
/// out[N,C] = row[C] in every row (a bias before a GEMM with beta = 1).
void copy_rows(float* out, const float* row, std::int64_t N, std::int64_t C);
/// Inverted-dropout mask: mask[i] = 0 with probability p, else 1 / (1 - p), from a counter-based hash
/// of (seed, i) (not the CPU's mt19937 stream: the same seed gives a different mask than on the host).
/// Throws zero::Error unless 0 <= p < 1.
void dropout_mask(float* mask, std::uint64_t seed, float p, std::int64_t n);
/// out[i] = x[i] * factor, computed in f32 and rounded to `dtype` (f32, f16, bf16); out may be x.
void scale(void* out, const void* x, DType dtype, float factor, std::int64_t n);
/// dst[i] = value, converted to `dtype` (any dtype; integers truncate).
void fill(void* dst, DType dtype, float value, std::int64_t n);
/// dst[i] = src[i] converted (f32, f16, bf16 in any combination; round to nearest even). Same dtype
/// is a device copy.
void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n);
/// dst[i] += alpha * src[i] in f32, rounded once to dst's dtype (gradient accumulation, f16 += f32).
void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, float alpha, std::int64_t n);
/// Copies the strided view (shape, src_strides, src_offset; in elements) of src_base into the strided
/// view of dst_base, element by element (no dtype conversion; elem_size bytes each). At most 8 dims.
void strided_copy(void* dst_base, const std::vector<std::int64_t>& dst_strides, std::int64_t dst_offset,
                  const void* src_base, const std::vector<std::int64_t>& src_strides, std::int64_t src_offset,
                  const std::vector<std::int64_t>& shape, std::size_t elem_size);

// ---- reductions --------------------------------------------------------------------------------------
// fp64 partials over a fixed grid, then one block adds them in order: deterministic for a given n.

/// Column sums: out[C] (= or +=) sum over rows of x[N,C], fp32 accumulation (cuBLAS gemv against
/// ones). The bias gradient of a linear layer.
void sum_rows(float* out, const float* x, std::int64_t N, std::int64_t C, bool accumulate);
/// Sum of x[n] (f32, f16, bf16) in double. Synchronizes.
double sum(const void* x, DType dtype, std::int64_t n);
/// Sum of squares in double (grad_sq_norm). Synchronizes.
double sum_squares(const void* x, DType dtype, std::int64_t n);
/// *acc (device double) += sum of squares of x. No synchronization: sum many tensors, read once.
void sum_squares_async(double* acc, const void* x, DType dtype, std::int64_t n);

/// True if any of the n elements is +-inf or NaN (f32, f16, bf16). Synchronizes.
bool has_inf_or_nan(const void* x, DType dtype, std::int64_t n);
/// Sets *flag (device int) to 1 if any element is +-inf or NaN; leaves it alone otherwise.
void has_inf_or_nan_async(int* flag, const void* x, DType dtype, std::int64_t n);

// ---- AdamW ---------------------------------------------------------------------------------------------

/// The scalars of AdamW step `step` (1-based), formed as optim::adamw_update forms them (double, then
/// float). Throws zero::Error if step < 1.
AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float eps, float weight_decay, std::int64_t step);
/// optim::adamw_update on device buffers (param, grad, exp_avg, exp_avg_sq: n f32 each).
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                  const AdamWScalars& scalars);
/// The fp16/bf16 partition step in one pass: g = grad[i] (grad_dtype) * grad_mul (1 / loss scale times
/// the clip coefficient), AdamW on the fp32 master, and — unless param_out is null — the updated master
/// rounded into param_out (param_dtype: f32, f16 or bf16), the model's copy.
void adamw_update_mixed(float* master, const void* grad, DType grad_dtype, float grad_mul, float* exp_avg,
                        float* exp_avg_sq, void* param_out, DType param_dtype, std::int64_t n,
                        const AdamWScalars& scalars);

}  // namespace zero::cuda
