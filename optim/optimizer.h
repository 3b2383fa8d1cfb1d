// Optimizer: the interface every optimizer in optim/ implements, and the parameter groups it steps.
//
// An optimizer owns per-parameter state (momentum buffers, Adam moments) and updates parameters in place
// from their grad(). It knows nothing of ranks: ZeRO (distributed/) calls the same update math on the one
// contiguous fp32 range its rank owns (adamw_update in optim/adamw.h, sgd_update in optim/sgd.h).
//
// Note [Master weights]
// The update math always runs in fp32. A parameter that is a contiguous f32 tensor is updated in its own
// memory. Any other parameter (f16 / bf16, or a strided view) gets an fp32 "master" copy, made from the
// parameter at its first step and kept in the optimizer state; each step updates the master and writes
// it back rounded to nearest even (mixed-precision training, Micikevicius et al. 2018, arXiv 1710.03740).
// Small updates therefore accumulate in fp32 instead of vanishing in 16-bit rounding. Consequence: after
// the first step the master, not the parameter, is the source of truth; code that overwrites a 16-bit
// parameter (loading a checkpoint) must build a fresh optimizer.
#pragma once

#include <cstdint>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"

namespace zero::optim {

/// Parameters that share hyperparameters. Only weight decay varies per group; the learning rate is the
/// optimizer's (one schedule drives all groups).
struct ParamGroup {
  std::vector<Tensor> params;
  float weight_decay = 0.0f;
};

/// Two groups for nanoGPT's configure_optimizers rule: parameters with dim() >= 2 (matmul weights,
/// embeddings) decay by `weight_decay`, the rest (biases, LayerNorm gains) do not. Group 0 decays,
/// group 1 does not; either may be empty. Throws zero::Error for an undefined tensor.
inline std::vector<ParamGroup> decay_groups(const std::vector<Tensor>& params, float weight_decay) {
  ParamGroup decay{{}, weight_decay};
  ParamGroup no_decay{{}, 0.0f};
  for (const Tensor& p : params) {
    ZERO_CHECK(p.defined(), "decay_groups: undefined parameter tensor");
    (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  }
  return {std::move(decay), std::move(no_decay)};
}

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Updates, in place, every parameter whose grad() is defined. A parameter without a gradient is
  /// skipped and its state (including its step count) does not advance, as in PyTorch.
  virtual void step() = 0;

  /// Sets every parameter's gradient to undefined (PyTorch's zero_grad(set_to_none=True)): the next
  /// backward allocates fresh gradients instead of accumulating into old ones.
  void zero_grad() {
    for (ParamGroup& g : groups_)
      for (Tensor& p : g.params) p.set_grad(Tensor());
  }

  /// Learning rate used by the next step() (all groups).
  float lr() const { return lr_; }
  /// Sets the learning rate (e.g. from lr_at in optim/lr_schedule.h). Throws zero::Error if lr < 0.
  void set_lr(float lr) {
    ZERO_CHECK(lr >= 0.0f, "learning rate must be >= 0, got {}", lr);
    lr_ = lr;
  }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

 protected:
  /// Throws zero::Error for an undefined or non-float parameter, a parameter listed twice, a negative
  /// weight decay or a negative learning rate.
  Optimizer(std::vector<ParamGroup> groups, float lr) : groups_(std::move(groups)) {
    set_lr(lr);
    std::unordered_set<const TensorImpl*> seen;
    for (const ParamGroup& g : groups_) {
      ZERO_CHECK(g.weight_decay >= 0.0f, "weight_decay must be >= 0, got {}", g.weight_decay);
      for (const Tensor& p : g.params) {
        ZERO_CHECK(p.defined(), "optimizer given an undefined parameter");
        ZERO_CHECK(is_floating(p.dtype()), "optimizer parameters must be f32, f16 or bf16, got {}",
                   dtype_name(p.dtype()));
        ZERO_CHECK(seen.insert(p.impl()).second, "a parameter of shape {} appears more than once in the groups",
                   shape_str(p.shape()));
      }
    }
  }

  std::vector<ParamGroup> groups_;
  float lr_ = 0.0f;
};

namespace detail {

/// True if the update math can run directly in `t`'s memory (see Note [Master weights]).
inline bool is_plain_f32(const Tensor& t) { return t.dtype() == DType::f32 && t.is_contiguous(); }

/// The fp32 values to update for `param` (numel elements): its own memory when it is a contiguous f32
/// tensor, else `master`, made from the parameter on first use. See Note [Master weights].
inline float* master_data(const Tensor& param, Tensor& master) {
  if (is_plain_f32(param)) return param.data<float>();
  if (!master.defined()) {
    master = Tensor::empty({param.numel()}, DType::f32, param.device());
    master.copy_(param);  // copy_ matches elements in row-major order, whatever the shapes
  }
  return master.data<float>();
}

/// Writes the master copy back into a 16-bit or strided parameter (no-op when there is none).
inline void write_back(const Tensor& param, const Tensor& master) {
  if (master.defined()) Tensor(param).copy_(master);
}

/// The gradient as numel contiguous fp32 values: grad's own memory if it is contiguous f32, else a
/// converted copy held in `scratch`.
inline const float* grad_f32(const Tensor& grad, Tensor& scratch) {
  if (is_plain_f32(grad)) return grad.data<float>();
  scratch = Tensor::empty({grad.numel()}, DType::f32, grad.device());
  scratch.copy_(grad);
  return scratch.data<float>();
}

/// Checks that `param` and its gradient can be stepped on this build (CPU, or both on cuda when the
/// optimizer has a device path: `allow_cuda`; same element count).
inline void check_param_and_grad(const Tensor& param, const Tensor& grad, bool allow_cuda = false) {
  const bool ok = allow_cuda ? param.device() == grad.device()
                             : param.device() == Device::cpu && grad.device() == Device::cpu;
  ZERO_CHECK(ok, "optim: got a {} parameter with a {} gradient ({})", device_name(param.device()),
             device_name(grad.device()), allow_cuda ? "they must be on the same device" : "only CPU is supported");
  ZERO_CHECK(is_floating(grad.dtype()), "optim: gradient must be f32, f16 or bf16, got {}", dtype_name(grad.dtype()));
  ZERO_CHECK(grad.numel() == param.numel(), "optim: gradient of shape {} for a parameter of shape {}",
             shape_str(grad.shape()), shape_str(param.shape()));
}

}  // namespace detail

}  // namespace zero::optim
