// Loss scaling for fp16 training (Micikevicius et al. 2018, arXiv 1710.03740) with DeepSpeed's dynamic
// scaler semantics (runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale; config keys of the
// "fp16" section). The loss is multiplied by scale() before backward so small gradients survive f16;
// the optimizer divides the gradients by scale() again. A step whose gradients overflowed (inf / NaN,
// see has_inf_or_nan) is skipped and the scale shrinks; a long run of clean steps grows it again.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zero::optim {

/// DeepSpeed "fp16" config: loss_scale, initial_scale_power, loss_scale_window, hysteresis,
/// consecutive_hysteresis, min_loss_scale.
struct LossScalerConfig {
  float loss_scale = 0.0f;            // 0: dynamic scaling; > 0: this static scale, never changed
  int initial_scale_power = 16;       // dynamic: start at 2^initial_scale_power
  int loss_scale_window = 1000;       // clean steps between doublings
  int hysteresis = 2;                 // overflows tolerated before the scale halves (delayed shift)
  bool consecutive_hysteresis = false;  // refill hysteresis on every clean step, not only on doubling
  float min_loss_scale = 1.0f;        // the scale never halves below this
  // Note [Stopping at the minimum scale]: update() throws MinLossScaleError once min_scale_skip_limit
  // consecutive steps overflowed at min_loss_scale (false keeps skipping at the floor forever).
  bool raise_error_at_min_scale = true;  // DeepSpeed's name and default (DynamicLossScaler)
  int min_scale_skip_limit = 1;          // consecutive overflows at min_loss_scale that stop training, >= 1
};

/// What update() throws when training can no longer make progress (Note [Stopping at the minimum scale]).
class MinLossScaleError : public Error {
 public:
  using Error::Error;
};

class LossScaler {
 public:
  /// Throws zero::Error for a negative loss_scale, loss_scale_window < 1, hysteresis < 1,
  /// min_loss_scale <= 0, min_scale_skip_limit < 1, or an initial_scale_power outside [0, 127].
  explicit LossScaler(const LossScalerConfig& config = {});

  /// Current loss scale (multiply the loss by it; divide the gradients by it).
  float scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  /// Overflows still tolerated before the next one halves the scale.
  int hysteresis_left() const { return cur_hysteresis_; }
  /// Number of update() calls so far.
  std::int64_t iter() const { return iter_; }
  /// Consecutive overflowed updates so far at min_loss_scale (0 after a clean one).
  std::int64_t skips_at_min() const { return skips_at_min_; }

  /// Records the outcome of one step; overflow == true means the step's gradients held inf / NaN and
  /// the step was skipped. Dynamic scaler (DeepSpeed's update_scale):
  ///   overflow: if hysteresis == 1 or one overflow is left, scale = max(scale / 2, min_loss_scale),
  ///             else one fewer overflow is tolerated; last_overflow_iter = iter.
  ///   clean:    (consecutive_hysteresis: refill hysteresis.) stable = iter - last_overflow_iter - 1;
  ///             if stable > 0 and stable % loss_scale_window == 0, scale *= 2 and refill hysteresis.
  ///   then iter += 1.
  /// From a fresh scaler (or right after an overflow), the window-th clean update leaves the scale
  /// alone and the (window + 1)-th doubles it. A static scaler never changes. With
  /// raise_error_at_min_scale, throws MinLossScaleError (after updating) when this overflow is the
  /// min_scale_skip_limit-th in a row that found the scale at min_loss_scale.
  void update(bool overflow);

  /// Everything update() changes, so a checkpoint can restore a scaler exactly.
  struct State {
    float scale = 1.0f;
    int hysteresis_left = 1;
    std::int64_t iter = 0;
    std::int64_t last_overflow_iter = -1;
    std::int64_t skips_at_min = 0;
  };
  State state() const { return {scale_, cur_hysteresis_, iter_, last_overflow_iter_, skips_at_min_}; }
  /// Restores a state() (of a scaler with the same config). Throws zero::Error for a scale that is not
  /// positive and finite, a hysteresis_left outside [1, config hysteresis] or a negative skips_at_min.
  void set_state(const State& s);

 private:
  LossScalerConfig config_;
  bool dynamic_;
  float scale_;
  int cur_hysteresis_;
  std::int64_t iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
  std::int64_t skips_at_min_ = 0;
};

/// True if any element of `t` is +-inf or NaN (any shape and strides; f32, f16 or bf16; CPU). Throws
/// zero::Error for other dtypes. An undefined tensor gives false.
bool has_inf_or_nan(const Tensor& t);

}  // namespace zero::optim
