// nn/rms_norm.h — RMSNorm (Zhang & Sennrich 2019): y[..., C] = x / sqrt(mean(x², over C) + eps) * weight[C].
// Composed from ops only: its backward is the ops' backward, on every device (docs/adding_a_layer.md).
#pragma once

#include "autograd/ops_elementwise.h"
#include "autograd/ops_reduce.h"
#include "nn/layers.h"

namespace zero::nn {

class RMSNorm : public Norm {
 public:
  explicit RMSNorm(std::int64_t dim, float eps = 1e-6f) : eps_(eps) {
    weight = register_parameter("weight", Tensor::ones({dim}), /*decay=*/false);
  }
  /// x[..., C] -> [..., C].
  Tensor forward(const Tensor& x) const override {
    Tensor ms = mean(mul(x, x), -1, /*keepdim=*/true);  // [..., 1]
    return mul(mul(x, rsqrt(add(ms, eps_))), compute(weight));
  }
  Tensor weight;

 private:
  float eps_;
};

}  // namespace zero::nn
