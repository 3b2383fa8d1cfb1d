// Basic layers: Linear, Embedding, LayerNorm (a Norm), GELU, Dropout. Each composes ops (autograd/ops.h)
// in its forward(), defined in nn/layers.cpp so that only that file is rebuilt when the ops change;
// initialisation follows GPT-2 / nanoGPT (weights N(0, std), biases 0, LayerNorm weight 1, bias 0).
#pragma once

#include <memory>

#include "nn/module.h"

namespace zero::nn {

/// y[..., out] = x[..., in] @ weight[out, in]^T + bias[out] (torch.nn.Linear).
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias, Generator& gen, float init_std = 0.02f) {
    weight = register_parameter("weight", Tensor::randn({out_features, in_features}, gen, 0.0f, init_std), true);
    if (bias) this->bias = register_parameter("bias", Tensor::zeros({out_features}), false);
  }
  /// x[..., in] -> [..., out].
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
};

/// out[..., C] = weight[idx[...], :] (torch.nn.Embedding).
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t dim, Generator& gen, float init_std = 0.02f) {
    weight = register_parameter("weight", Tensor::randn({num_embeddings, dim}, gen, 0.0f, init_std), true);
  }
  /// idx[...] (i64) -> [..., dim].
  Tensor forward(const Tensor& idx) const;
  /// The weight as a tied output layer's GEMM reads it (Module::gemm_operand: 16-bit on cuda).
  Tensor gemm_weight() const { return gemm_operand(weight); }
  Tensor weight;
};

/// A normalisation over the last dimension: LayerNorm, or RMSNorm (nn/rms_norm.h). x[..., C] -> [..., C].
class Norm : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
};

/// LayerNorm over the last dimension C (torch.nn.LayerNorm, eps 1e-5).
class LayerNorm : public Norm {
 public:
  explicit LayerNorm(std::int64_t dim, float eps = 1e-5f) : eps_(eps) {
    weight = register_parameter("weight", Tensor::ones({dim}), false);
    bias = register_parameter("bias", Tensor::zeros({dim}), false);
  }
  Tensor forward(const Tensor& x) const override;
  Tensor weight, bias;

 private:
  float eps_;
};

/// GELU, tanh approximation (torch.nn.GELU(approximate='tanh')).
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) const;
};

/// Inverted dropout, active only in training mode; draws its masks from `gen`.
class Dropout : public Module {
 public:
  Dropout(float p, Generator& gen) : p_(p), gen_(&gen) {
    ZERO_CHECK(p >= 0.0f && p < 1.0f, "dropout probability must be in [0, 1), got {}", p);
  }
  Tensor forward(const Tensor& x) const;

 private:
  float p_;
  Generator* gen_;
};

}  // namespace zero::nn
