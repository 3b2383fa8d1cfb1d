// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019, arXiv 1711.05101), with the exact
// semantics of PyTorch's torch.optim.AdamW (amsgrad=False, maximize=False).
//
// One entry, adamw_update, steps one contiguous range on any device: AdamW::step calls it per parameter;
// the ZeRO optimizer (distributed/zero/sharded_optimizer.cpp) calls it on each slice of the flat fp32 master
// buffer its rank owns. It forms the step's scalars once and runs the device's one AdamW kernel
// (Backend::adamw_update: core/cpu/elementwise.cpp, core/cuda/elementwise.cu), whose per-element math
// is adamw_step in core/adamw_step.h, shared by both devices. Both optimizers therefore compute
// bit-identical updates for the same inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/adamw_step.h"
#include "optim/optimizer.h"

namespace zero::optim {

/// Hyperparameters of one AdamW update. lr in parameter units per step; weight_decay is the decoupled
/// decay coefficient (multiplied by lr, as in PyTorch).
struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
};

/// The constants of AdamW step `step` (1-based) under `h`, formed as PyTorch forms them: bias
/// corrections 1 - beta^step in double (Python floats), rounded to f32 where they meet the tensors.
/// Throws zero::Error if step < 1.
AdamWScalars adamw_scalars(const AdamWHyper& h, std::int64_t step);

/// One AdamW step on n contiguous elements of `device`, in place (torch.optim.AdamW's
/// _single_tensor_adamw, same order of operations):
///   g           <- f32(grad) * grad_factor
///   master      <- master * (1 - lr * weight_decay)
///   exp_avg     <- beta1 * exp_avg    + (1 - beta1) * g
///   exp_avg_sq  <- beta2 * exp_avg_sq + (1 - beta2) * g²
///   master      <- master - lr / (1 - beta1^step) * exp_avg / (sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps)
///   model_out   <- master rounded to nearest even in model_dtype (skipped when model_out is null)
/// master[n], exp_avg[n], exp_avg_sq[n] are f32 and updated; grad[n] is in grad_dtype (f32, f16, bf16)
/// and read; grad_factor folds in what the gradient still needs (1 / loss scale, the clip coefficient;
/// 1 for none). model_out[n] (model_dtype: f32, f16, bf16) is the model's own copy of a separate fp32
/// master. step is the 1-based count of updates this range has received, this one included. Elements
/// are independent, so stepping a range in pieces gives the same result as stepping it whole (what
/// ZeRO relies on). Queued on the device (the current stream on cuda). Throws zero::Error if step < 1,
/// n < 0, a dtype is not a float type, or the build has no backend for `device`.
void adamw_update(Device device, float* master, const void* grad, DType grad_dtype, float grad_factor, float* exp_avg,
                  float* exp_avg_sq, void* model_out, DType model_dtype, std::int64_t n, const AdamWHyper& h,
                  std::int64_t step);

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

namespace detail {
/// One AdamW step of parameter `p` (any float dtype and device) with its gradient `grad` (same numel;
/// any float dtype): the state made on the first step, then adamw_update over its numel elements and
/// the master copy written back. AdamW::step and Muon::step (for its AdamW parameters) call it. Throws
/// zero::Error as check_param_and_grad does.
void adamw_step_param(const Tensor& p, const Tensor& grad, AdamWState& s, const AdamWHyper& h);
}  // namespace detail

/// AdamW over parameter groups (weight decay per group, see decay_groups). Parameters and gradients may
/// be f32, f16 or bf16 in any combination, on any device (a parameter and its gradient on the same
/// one); moments are always f32, on the parameter's device. Throws zero::Error from the constructor for
/// lr < 0, eps < 0 or a beta outside [0, 1), and from step() for a gradient whose element count or
/// device differs from its parameter's.
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
