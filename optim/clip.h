// Gradient-norm clipping (Pascanu et al. 2013, arXiv 1211.5063) with PyTorch's clip_grad_norm_
// semantics, and the sum-of-squares primitive ZeRO reuses to form a global norm from partitions.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace zero::optim {

/// Sum of the squares of `grad`'s elements, accumulated in double (any shape and strides; f32, f16 or
/// bf16). Deterministic: partial sums over fixed chunks of 65,536 elements are added in order, so the
/// result does not depend on the thread count. An undefined tensor gives 0. Throws zero::Error for a
/// non-float dtype or a non-CPU tensor.
double grad_sq_norm(const Tensor& grad);

/// Multiplies every element of `grad` by `factor`, in place (any float dtype; 16-bit values are scaled
/// in f32 and rounded to nearest even).
void scale_grad_(const Tensor& grad, float factor);

/// Global L2 norm of the defined gradients of `params`: sqrt of the sum of grad_sq_norm over them
/// (parameters without a gradient are skipped). If max_norm > 0 and clip_coef = max_norm / (norm + 1e-6)
/// is below 1, every gradient is multiplied by clip_coef, so the clipped norm is just under max_norm
/// (torch.nn.utils.clip_grad_norm_). max_norm <= 0 disables clipping. Returns the norm before clipping;
/// a non-finite norm is returned as is and the gradients are left alone (an fp16 run checks for overflow
/// first and skips the step).
float clip_grad_norm(const std::vector<Tensor>& params, float max_norm);

}  // namespace zero::optim
