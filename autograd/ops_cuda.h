// Internal: the CUDA twins of the differentiable ops of autograd/ops.h (builds with ZERO_HAS_CUDA only).
//
// Note [Op device dispatch]
// Each op in autograd/ops.cpp starts with `if (detail::any_cuda({...})) return detail::cuda_<op>(...);`
// under #ifdef ZERO_HAS_CUDA: when any input lives on cuda the twin here runs instead, and it throws
// zero::Error unless every input is on cuda (no silent transfers). A twin has the same contract as its
// CPU op: it computes the output with core/cuda kernels on the current stream and records its backward
// a few lines below, also on the device. Without CUDA no cuda tensor can exist, so the CPU path needs
// no check and stays exactly as it was.
#pragma once

#ifdef ZERO_HAS_CUDA

#include <cstdint>
#include <initializer_list>

#include "core/tensor.h"

namespace zero {
class Generator;
namespace detail {

/// True if any defined tensor of `ts` is on cuda.
inline bool any_cuda(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && t->device() == Device::cuda) return true;
  return false;
}

Tensor cuda_add(const Tensor& a, const Tensor& b);
Tensor cuda_sub(const Tensor& a, const Tensor& b);
Tensor cuda_mul(const Tensor& a, const Tensor& b);
Tensor cuda_mul_scalar(const Tensor& a, float s);
void cuda_add_(Tensor& dst, const Tensor& src);
Tensor cuda_sum(const Tensor& x);
Tensor cuda_sum_to(const Tensor& x, const Shape& shape);
Tensor cuda_matmul(const Tensor& a, const Tensor& b);
Tensor cuda_linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor cuda_embedding(const Tensor& weight, const Tensor& idx);
Tensor cuda_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
Tensor cuda_gelu(const Tensor& x);
Tensor cuda_softmax(const Tensor& x);
Tensor cuda_causal_self_attention(const Tensor& qkv, std::int64_t n_head);
Tensor cuda_cross_entropy(const Tensor& logits, const Tensor& targets);
Tensor cuda_dropout(const Tensor& x, float p, Generator& gen);

}  // namespace detail
}  // namespace zero

#endif  // ZERO_HAS_CUDA
