#include "nn/layers.h"

#include "autograd/ops_linalg.h"
#include "autograd/ops_nn.h"

namespace zero::nn {

Tensor Linear::forward(const Tensor& x) const {
  // The weight goes into the GEMM as it is where the device can (Module::gemm_operand); the bias is a
  // vector added in f32 (its cached compute copy).
  return linear(x, gemm_operand(weight), bias.defined() ? compute(bias) : Tensor());
}

Tensor Embedding::forward(const Tensor& idx) const { return embedding(compute(weight), idx); }

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, compute(weight), compute(bias), eps_); }

Tensor GELU::forward(const Tensor& x) const { return gelu(x); }

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p_, training(), *gen_); }

}  // namespace zero::nn
