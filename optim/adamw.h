// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019, arXiv 1711.05101), with the exact
// semantics of PyTorch's torch.optim.AdamW (amsgrad=False, maximize=False).
//
// The math lives in one function, adamw_update, on one contiguous fp32 range. AdamW::step calls it per
// parameter; the ZeRO optimizer (distributed/) calls it on the slice of the flat fp32 master buffer its
// rank owns. Both therefore compute bit-identical updates for the same inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace zero::optim {

/// Hyperparameters of one AdamW update. lr in parameter units per step; weight_decay is the decoupled
/// decay coefficient (multiplied by lr, as in PyTorch).
struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
};

/// One AdamW step on n contiguous elements, in place:
///   param       <- param * (1 - lr * weight_decay)
///   exp_avg     <- beta1 * exp_avg    + (1 - beta1) * grad
///   exp_avg_sq  <- beta2 * exp_avg_sq + (1 - beta2) * grad²
///   param       <- param - lr / (1 - beta1^step) * exp_avg / (sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps)
/// (torch.optim.AdamW's _single_tensor_adamw, same order of operations; bias corrections in double.)
/// param[n], exp_avg[n], exp_avg_sq[n] are updated; grad[n] is read and must already be unscaled (no
/// loss scale) and clipped. step is the 1-based count of updates this range has received, this one
/// included. Elements are independent, so stepping a range in pieces gives the same result as stepping
/// it whole (what ZeRO relies on). Throws zero::Error if step < 1 or n < 0.
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                  const AdamWHyper& h, std::int64_t step);

/// The mixed-precision form of one AdamW step on n contiguous elements of `device` (ZeRO's partition
/// step, distributed/sharded_optimizer.h): g = f32(grad[i]) * grad_factor, where grad is in grad_dtype
/// (f32, f16, bf16) and grad_factor folds the loss-scale unscale and the clip coefficient; then
/// adamw_update on the fp32 master[n] with exp_avg[n], exp_avg_sq[n]; then, unless model_out is null,
/// the updated master rounded (nearest even) into model_out[n] of model_dtype, the model's own copy.
/// On cpu it runs adamw_update over chunks of 65,536 elements (a bounded f32 scratch for the scaled
/// gradient; elements are independent, so the result is the whole-range one); on cuda one fused
/// kernel on the current stream (core/cuda/kernels.h). Throws zero::Error as adamw_update does, and for a
/// device this build has no kernel for.
void adamw_update_mixed(Device device, float* master, const void* grad, DType grad_dtype, float grad_factor,
                        float* exp_avg, float* exp_avg_sq, void* model_out, DType model_dtype, std::int64_t n,
                        const AdamWHyper& h, std::int64_t step);

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
};

/// Per-parameter state. exp_avg and exp_avg_sq are f32 [numel]; master is the fp32 copy of a 16-bit
/// (or strided) parameter, undefined for a contiguous f32 one (Note [Master weights], optim/optimizer.h).
/// All undefined and step 0 until the parameter's first step.
struct AdamWState {
  Tensor exp_avg;
  Tensor exp_avg_sq;
  Tensor master;
  std::int64_t step = 0;
};

/// AdamW over parameter groups (weight decay per group, see decay_groups). Parameters and gradients may
/// be f32, f16 or bf16 in any combination; moments are always f32. Throws zero::Error from the
/// constructor for lr < 0, eps < 0 or a beta outside [0, 1), and from step() for a gradient whose
/// element count differs from its parameter's or a non-CPU tensor.
class AdamW final : public Optimizer {
 public:
  explicit AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});

  void step() override;

  const AdamWOptions& options() const { return options_; }
  /// The update hyperparameters of group `group` at the current learning rate.
  AdamWHyper hyper(std::size_t group) const;
  /// State of parameter `index` of group `group`. Throws zero::Error when out of range.
  const AdamWState& state(std::size_t group, std::size_t index) const;

 private:
  AdamWOptions options_;
  std::vector<std::vector<AdamWState>> state_;  // parallel to groups_[g].params
};

}  // namespace zero::optim
