// Internal: the kernel launchers of core/cuda/*.cu, called by the CUDA backend's host entries
// (core/cuda/backend.h). Use kernels(Device::cuda) instead.
//
// The .cu files hold device code only, compiled by nvcc; they see neither Eigen nor fmt, so this header
// uses plain types: Elem mirrors zero::DType (checked by static_asserts in kernels.cpp), every launcher
// takes its stream and every scratch buffer explicitly, and nothing here allocates. Arguments were
// validated by the callers in kernels.cpp; sizes of zero launch nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/adamw_step.h"
#include "core/cuda/kernel_math.h"

namespace zero::cuda {

namespace detail {

enum class Elem : int { f32 = 0, f16 = 1, bf16 = 2, i32 = 3, i64 = 4 };

// Bits kernels OR into the device error flag (zero::cuda::DeviceError in runtime.h has the same values).
constexpr int kEmbeddingIndexBit = 1;
constexpr int kCrossEntropyTargetBit = 2;

constexpr int kMaxDims = 8;
/// Shape and element strides of a strided copy; pointers already include the offsets.
struct StridedLayout {
  int ndim;
  std::int64_t shape[kMaxDims];
  std::int64_t src_strides[kMaxDims];
  std::int64_t dst_strides[kMaxDims];
};

// ---- elementwise.cu ----
void launch_fill(void* dst, Elem t, float value, std::int64_t n, cudaStream_t s);
/// Float types only (f32, f16, bf16); dst and src differ in type.
void launch_cast(void* dst, Elem dt, const void* src, Elem st, std::int64_t n, cudaStream_t s);
/// elem_bytes in {1, 2, 4, 8}; n = product of the shape.
void launch_strided_copy(void* dst, const void* src, int elem_bytes, const StridedLayout& layout, std::int64_t n,
                         cudaStream_t s);
/// out[i] = a[i] op b[i % m]; op 0 add, 1 sub, 2 mul, 3 div; m divides n.
void launch_binary(float* out, const float* a, const float* b, std::int64_t n, std::int64_t m, int op,
                   cudaStream_t s);
/// out[i] = row[i % C] for i < N*C.
void launch_copy_rows(float* out, const float* row, std::int64_t N, std::int64_t C, cudaStream_t s);
/// mask[i] = hash(seed, i) < p ? 0 : 1 / (1 - p) (inverted dropout), hash uniform in [0, 1).
void launch_dropout_mask(float* mask, std::uint64_t seed, float p, std::int64_t n, cudaStream_t s);
/// C[i, j] += bias[j] for i < M, j < N; rows of C are ldc apart.
void launch_add_bias_rows(float* C, std::int64_t ldc, const float* bias, std::int64_t M, std::int64_t N,
                          cudaStream_t s);
/// out[i] = x[i] * factor (computed in f32, rounded to t); out may be x.
void launch_scale(void* out, const void* x, Elem t, float factor, std::int64_t n, cudaStream_t s);
/// C = beta * C over `batch` matrices of rows x cols (rows ldc apart, matrices stride apart; elements),
/// in f32, rounded to t; beta == 0 stores zeros without reading C (a GEMM with K = 0).
void launch_scale_matrix(void* C, Elem t, float beta, std::int64_t rows, std::int64_t cols, std::int64_t ldc,
                         std::int64_t stride, std::int64_t batch, cudaStream_t s);
/// dst[i] = dst[i] + alpha * src[i] in f32, rounded once to dt.
void launch_accumulate(void* dst, Elem dt, const void* src, Elem st, float alpha, std::int64_t n, cudaStream_t s);

/// Number of blocks (and so of partials) the reductions below use for n elements: fixed for a given n,
/// so results are deterministic.
int reduction_blocks(std::int64_t n);
/// partials[b] = sum over block b's elements of x (or x², squares) in double. x float-typed.
void launch_sum_partials(double* partials, int blocks, const void* x, Elem t, std::int64_t n, bool squares,
                         cudaStream_t s);
/// total = scale * sum(partials[0..blocks)) in double, in fixed order; then
/// dst_d: *dst_d = total (or += total if accumulate); dst_f: *dst_f = float(total). Either may be null.
void launch_sum_finalize(double* dst_d, float* dst_f, const double* partials, int blocks, double scale,
                         bool accumulate, cudaStream_t s);
/// Sets *flag = 1 if any element of x (float-typed) is +-inf or NaN; leaves it alone otherwise.
void launch_nonfinite(int* flag, const void* x, Elem t, std::int64_t n, cudaStream_t s);

/// AdamW on n elements (Backend::adamw_update, core/backend.def): grad of type gt multiplied by grad_mul;
/// param_out (type pt) receives the updated param rounded, unless null.
void launch_adamw(float* param, const void* grad, Elem gt, float grad_mul, float* exp_avg, float* exp_avg_sq,
                  void* param_out, Elem pt, std::int64_t n, const AdamWScalars& sc, cudaStream_t s);

// ---- ops.cu (all f32) ----
/// out[i] = f(x[i]): op 0 sqrt, 1 1/sqrt, 2 exp, 3 log, 4 x^p.
void launch_unary(float* out, const float* x, std::int64_t n, int op, float p, cudaStream_t s);
/// x as [outer, n, inner] reduced over n into out[outer, inner]: op 0 sum (f32, j in order), 1 max with
/// argmax[outer, inner] the first maximal j.
void launch_reduce_dim(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                       std::int64_t inner, int op, cudaStream_t s);
/// dx[outer, n, inner] = g[outer, inner] where j == argmax, else 0.
void launch_scatter_dim(float* dx, const float* g, const std::int64_t* argmax, std::int64_t outer, std::int64_t n,
                        std::int64_t inner, cudaStream_t s);

// ---- nn.cu (all f32) ----
void launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, std::int64_t N, int C, float eps, cudaStream_t s);
void launch_layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                                     const float* mean, const float* rstd, std::int64_t N, int C, cudaStream_t s);
// layernorm_param_groups(N) (kernel_math.h): the row groups G of the parameter-gradient pass, whose
// partials are [G, C] each.
void launch_layernorm_backward_params(float* part_dweight, float* part_dbias, int groups, const float* dout,
                                      const float* inp, const float* mean, const float* rstd, std::int64_t N, int C,
                                      cudaStream_t s);
/// dst[c] += sum over g of partials[g * C + c], g in order.
void launch_column_finalize(float* dst, const float* partials, int groups, int C, cudaStream_t s);

void launch_gelu_forward(float* out, const float* inp, std::int64_t n, cudaStream_t s);
void launch_gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n, cudaStream_t s);

void launch_softmax_forward(float* out, const float* inp, std::int64_t N, int C, cudaStream_t s);
void launch_softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, int C,
                             cudaStream_t s);

/// dst[B,H,T,D] (contiguous) from src rows: dst[b,h,t,d] = src[(b*T + t) * row_stride + h*D + d].
void launch_rows_to_heads(float* dst, const float* src, std::int64_t row_stride, int B, int T, int H, int D,
                          cudaStream_t s);
/// The inverse: dst[(b*T + t) * row_stride + h*D + d] = src[b,h,t,d].
void launch_heads_to_rows(float* dst, std::int64_t row_stride, const float* src, int B, int T, int H, int D,
                          cudaStream_t s);
/// In place on att[rows, T] (rows = B*H*T, row r is query position r % T): causal softmax of the
/// scores, zero above the diagonal.
void launch_causal_softmax_forward(float* att, std::int64_t rows, int T, cudaStream_t s);
/// In place: datt <- att * (datt - sum(att * datt)) * scale on the causal part, zero above it.
void launch_causal_softmax_backward(float* datt, const float* att, std::int64_t rows, int T, float scale,
                                    cudaStream_t s);

/// probs[N,V] = softmax(logits); losses[n] = -log softmax(logits[n])[target], computed as
/// log(sum exp(logits - max)) - (logits[target] - max) (no clamp: finite for any finite logits). Bad
/// targets set the error flag bit and get loss 0.
void launch_cross_entropy_forward(float* probs, float* losses, const float* logits, const std::int64_t* targets,
                                  std::int64_t N, int V, int* error_flag, cudaStream_t s);
/// dlogits = (probs - onehot) * (dloss_dev ? *dloss_dev : dloss) / N.
void launch_cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets, float dloss,
                                   const float* dloss_dev, std::int64_t N, int V, cudaStream_t s);
void launch_embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N,
                              std::int64_t V, int C, int* error_flag, cudaStream_t s);
void launch_embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N,
                               std::int64_t V, int C, cudaStream_t s);

}  // namespace detail
}  // namespace zero::cuda
