// Differentiable operations. Each op computes its output with a core/cpu kernel and records its
// backward (autograd/autograd.h) a few lines below, in the same file. Inputs on cuda run the op's twin
// in autograd/ops_cuda.cpp on core/cuda kernels instead (Note [Op device dispatch]); all inputs of one
// op must be on the same device (zero::Error otherwise), and outputs and gradients stay there. All float ops take f32 inputs
// (convert f16/bf16 tensors with .to(DType::f32) first, which is differentiable); they throw zero::Error
// for other dtypes and for mismatched shapes, naming both shapes.
#pragma once

#include <cstdint>

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
/// In place, not recorded: dst += src (same numel; src converted to dst's dtype). For accumulation.
void add_(Tensor& dst, const Tensor& src);

// ---- reductions ----
/// Sum of all elements: a one-element tensor of shape [].
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
/// Sums `x` down to `shape` (the inverse of broadcasting `shape` to x.shape()).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ----
/// a[..., M, K] @ b[..., K, N] -> [..., M, N]; b may also be [K, N] (shared across the batch).
Tensor matmul(const Tensor& a, const Tensor& b);
/// x[..., in] @ weight[out, in]^T + bias[out] -> [..., out] (bias may be undefined).
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
/// (scaled dot-product attention, Vaswani et al. 2017, scale 1/sqrt(C/n_head)).
Tensor causal_self_attention(const Tensor& qkv, std::int64_t n_head);
/// Mean cross-entropy of logits[N, V] against targets[N] (i64): a one-element tensor of shape [].
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
/// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
/// Identity when p == 0 or !training.
Tensor dropout(const Tensor& x, float p, bool training, Generator& gen);

namespace detail {
/// `t` itself (detached) when contiguous, else a contiguous copy; same device and dtype.
Tensor dense(const Tensor& t);
/// `t` broadcast to `shape` (NumPy rules, already checked by the caller) as a contiguous tensor: a
/// detached view when the shapes agree, else a copy.
Tensor materialize_broadcast(const Tensor& t, const Shape& shape);
}  // namespace detail

}  // namespace zero
