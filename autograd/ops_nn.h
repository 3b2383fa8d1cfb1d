// One family of the differentiable operations of autograd/ops.h (its rules are there): the
// neural-network ops (embedding, normalisation, activations, softmax, attention, loss, dropout).
// Defined in autograd/ops.cpp.
#pragma once

#include <cstdint>

#include "autograd/autograd.h"
#include "core/tensor.h"

namespace zero {

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

}  // namespace zero
