// Differentiable operations, each defined once for every device. An op validates its inputs, picks
// the backend of the device they live on (core/backend.h: kernels in core/cpu/ and core/cuda/), calls
// its kernels, and records its backward (autograd/autograd.h) a few lines below, in the same file; the
// backward runs on the same device through the same kernels. All inputs of one op must be on one device
// (zero::Error naming the op and both devices otherwise), and outputs and gradients stay there; a kernel
// a device lacks is a one-line zero::Error naming the kernel and the device (Note [Missing kernels]).
// All float ops take f32 inputs (convert f16/bf16 tensors with .to(DType::f32) first, which is
// differentiable), except the 16-bit operands of the GEMM ops below; they throw zero::Error for other
// dtypes and for mismatched shapes, naming both shapes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>

#include "autograd/autograd.h"
#include "core/tensor.h"

namespace zero {

/// The shape two shapes broadcast to (NumPy rules). Throws zero::Error if they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);

// ---- elementwise, with broadcasting ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, float s);
/// a + s for a scalar s (composed: s as a [] tensor on a's device).
Tensor add(const Tensor& a, float s);
/// a / b elementwise, with broadcasting (IEEE division: x/0 is +-inf or NaN).
Tensor div(const Tensor& a, const Tensor& b);
/// Elementwise sqrt(x), 1/sqrt(x), e^x, ln(x) and x^p (p a scalar); NaN or inf outside the domain.
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor pow(const Tensor& x, float p);
/// In place, not recorded: dst += src (same numel; src converted to dst's dtype). For accumulation.
void add_(Tensor& dst, const Tensor& src);

// ---- reductions ----
/// Sum of all elements: a one-element tensor of shape [].
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
/// Sum / mean / max over dimension `dim` (negative counts from the end): x[..., n, ...] -> the shape
/// without that dimension, or with it as 1 when keepdim (torch.sum / torch.mean / torch.amax with one
/// dim). Sums accumulate in f32 in index order. max's gradient flows to the first maximal element (as
/// the indices of torch.max(x, dim)); a NaN counts as the maximum. max throws for an empty dimension.
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
Tensor max(const Tensor& x, int dim, bool keepdim = false);
/// Sums `x` down to `shape` (the inverse of broadcasting `shape` to x.shape()).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ----
// The GEMM ops also take f16/bf16 operands (Note [Tensor cores for 16-bit models] in
// core/gemm_precision.h): on cuda the 16-bit tensor goes into the GEMM as it is (tensor cores, fp32
// accumulation), an f32 activation operand is rounded to its dtype once, the output is f32 and each
// gradient comes back in its input's dtype; on cpu they compute exactly as with .to(DType::f32) first.
/// a[..., M, K] @ b[..., K, N] -> [..., M, N] (f32); b may also be [K, N] (shared across the batch).
/// a and b: f32, f16 or bf16; two 16-bit operands must share their dtype.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x[..., in] (f32) @ weight[out, in]^T + bias[out] -> [..., out] (f32; bias may be undefined). weight
/// and bias: f32, f16 or bf16.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- neural-network ops ----
/// weight[V, C] rows gathered by idx[...] (i64) -> [..., C].
Tensor embedding(const Tensor& weight, const Tensor& idx);
/// Normalises x[..., C] over C (Ba et al. 2016), then * weight[C] + bias[C].
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
/// GELU with the tanh approximation (as GPT-2 and PyTorch's approximate='tanh').
Tensor gelu(const Tensor& x);
/// Softmax over the last dimension.
Tensor softmax(const Tensor& x);
/// Fused causal self-attention: qkv[B, T, 3C] (q | k | v) with n_head heads -> [B, T, C]
/// (scaled dot-product attention, Vaswani et al. 2017, scale 1/sqrt(C/n_head)). gemm_dtype: the model's
/// dtype; f16/bf16 on cuda rounds the operands of the attention's GEMMs to it (tensor cores, fp32
/// accumulation; qkv, out and the gradient stay f32); ignored on cpu.
Tensor causal_self_attention(const Tensor& qkv, std::int64_t n_head, DType gemm_dtype = DType::f32);
/// Mean cross-entropy of logits[N, V] against targets[N] (i64): a one-element tensor of shape [].
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
/// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
/// Identity when p == 0 or !training.
Tensor dropout(const Tensor& x, float p, bool training, Generator& gen);

// Note [Compute copies]
// Layers compute in f32. For an f16/bf16 parameter nn::Module::compute() hands out a differentiable f32
// copy (gradient back in the parameter's dtype, like p.to(DType::f32)). Converting every parameter on
// every forward cost a fifth of a CPU step, so the copy is kept in the parameter's ComputeCopy
// (autograd::AutogradMeta, core/autograd_interface.h; one per parameter, shared by every layer that
// reads it) and refreshed only when the parameter changed: another storage (set_data), offset, shape
// or dtype, or a bumped Storage::version() (Tensor::copy_ and fill_ bump it; the ZeRO optimizer bumps
// its flat buffer after writing it in step()). Code that writes a 16-bit parameter through raw
// pointers must bump it too, or the next forward computes with the old values. The values are the
// same bits a fresh conversion gives, so results do not change. ZeRO stage 3 frees the copy with the
// parameter and refills it in place (free_compute_copy, refresh_compute_copy; Note [Storage that is
// freed and refilled] in core/storage.h).
/// p.to(DType::f32), reusing `cache` while p is unchanged (Note [Compute copies]). p: a float tensor.
Tensor to_f32_cached(const Tensor& p, autograd::ComputeCopy& cache);
/// Converts 16-bit parameter `p` again into the f32 copy layers compute with (its cached ComputeCopy),
/// in the copy's own storage (refilled if freed), so tensors autograd saved from it see the new values.
/// Does nothing for an f32 parameter or one without a copy yet (the next forward makes it).
void refresh_compute_copy(const Tensor& p);
/// Frees the memory of `p`'s cached f32 copy, if it has one (refresh_compute_copy refills it).
void free_compute_copy(const Tensor& p);
/// The storage of `p`'s cached f32 copy (to guard it while freed: Note [Guarded storage] in
/// core/storage.h); null when it has none.
Storage* compute_copy_storage(const Tensor& p);

namespace detail {
/// The device of the defined tensors of `inputs` (cpu when none is defined). Throws zero::Error naming
/// `op` and both devices when they differ.
Device op_device(const char* op, std::initializer_list<const Tensor*> inputs);
/// `t` itself (detached) when contiguous, else a contiguous copy; same device and dtype.
Tensor dense(const Tensor& t);
/// `t` broadcast to `shape` (NumPy rules, already checked by the caller) as a contiguous tensor: a
/// detached view when the shapes agree, else a copy.
Tensor materialize_broadcast(const Tensor& t, const Shape& shape);
}  // namespace detail

}  // namespace zero
