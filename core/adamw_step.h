// The AdamW update of one element, written once for every device: the CPU kernel (core/cpu/
// elementwise.cpp) and the CUDA kernel (core/cuda/elementwise.cu) both call adamw_step, so the two
// devices run the same operations in the same order. optim::adamw_update (optim/adamw.h) forms the
// scalars and documents the math (torch.optim.AdamW's _single_tensor_adamw).
//
// Plain C++17 (only <math.h>): it compiles as host code and, under nvcc, as device code (ZERO_HD).
#pragma once

#include <math.h>

#include "core/host_device.h"

namespace zero {

/// The per-step constants of one AdamW update, formed on the host by optim::adamw_scalars (bias
/// corrections in double, then rounded to f32, as PyTorch forms its Python-float scalars).
struct AdamWScalars {
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^step)
  float beta1, beta2, eps;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
};

/// One element: exp_avg and exp_avg_sq move towards g and g², then param takes the decayed,
/// bias-corrected step. Returns the new param (also stored).
ZERO_HD inline float adamw_step(float& param, float& exp_avg, float& exp_avg_sq, float g, const AdamWScalars& s) {
  const float m = s.beta1 * exp_avg + (1.0f - s.beta1) * g;
  const float v = s.beta2 * exp_avg_sq + (1.0f - s.beta2) * g * g;
  exp_avg = m;
  exp_avg_sq = v;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  param = param * s.decay - s.step_size * (m / denom);
  return param;
}

}  // namespace zero
