// SGD with optional momentum and Nesterov momentum, with the semantics of PyTorch's torch.optim.SGD
// (dampening 0): weight decay is coupled L2 (added to the gradient), and the first step initialises the
// momentum buffer to the gradient itself rather than decaying from zero.
//
// As with AdamW, the math is one function on one contiguous fp32 range (sgd_update) that SGD::step calls
// per parameter and that a partitioned optimizer can call on its slice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace zero::optim {

/// Hyperparameters of one SGD update (lr in parameter units per step).
struct SgdHyper {
  float lr, momentum, weight_decay;
  bool nesterov;
};

/// One SGD step on n contiguous elements, in place (torch.optim.SGD, _single_tensor_sgd, dampening 0):
///   d   = grad + weight_decay * param
///   buf = first_step ? d : momentum * buf + d              (only if momentum != 0)
///   d   = nesterov ? d + momentum * buf : buf              (only if momentum != 0)
///   param -= lr * d
/// param[n] is updated; grad[n] is read (unscaled); momentum_buffer[n] is updated and may be null when
/// momentum == 0. first_step: this range has no buffer yet. Throws zero::Error if n < 0 or momentum != 0
/// with a null buffer.
void sgd_update(float* param, const float* grad, float* momentum_buffer, std::int64_t n, const SgdHyper& h,
                bool first_step);

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  bool nesterov = false;
};

/// SGD over parameter groups (weight decay per group). Parameters and gradients may be f32, f16 or bf16;
/// momentum buffers are f32, and 16-bit parameters keep an fp32 master copy (Note [Master weights],
/// optim/optimizer.h). Throws zero::Error from the constructor for lr < 0, momentum < 0, or nesterov
/// without momentum (as PyTorch), and from step() as AdamW::step does.
class SGD final : public Optimizer {
 public:
  explicit SGD(std::vector<ParamGroup> groups, SgdOptions options = {});

  void step() override;

  const SgdOptions& options() const { return options_; }
  /// f32 [numel] momentum buffer of parameter `index` of group `group`; undefined before its first step
  /// or when momentum == 0. Throws zero::Error when out of range.
  const Tensor& momentum_buffer(std::size_t group, std::size_t index) const;

 private:
  struct State {
    Tensor momentum_buffer;
    Tensor master;
  };
  SgdOptions options_;
  std::vector<std::vector<State>> state_;  // parallel to groups_[g].params
};

}  // namespace zero::optim
