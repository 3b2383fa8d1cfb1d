#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/backend.h"
#include "core/check.h"

namespace zero::optim {

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  ZERO_CHECK(config.loss_scale >= 0.0f, "loss_scale must be >= 0 (0 = dynamic), got {}", config.loss_scale);
  ZERO_CHECK(config.loss_scale_window >= 1, "loss_scale_window must be >= 1, got {}", config.loss_scale_window);
  ZERO_CHECK(config.hysteresis >= 1, "hysteresis must be >= 1, got {}", config.hysteresis);
  ZERO_CHECK(config.min_loss_scale > 0.0f, "min_loss_scale must be > 0, got {}", config.min_loss_scale);
  ZERO_CHECK(config.min_scale_skip_limit >= 1, "min_scale_skip_limit must be >= 1, got {}",
             config.min_scale_skip_limit);
  ZERO_CHECK(config.initial_scale_power >= 0 && config.initial_scale_power <= 127,
             "initial_scale_power must be in [0, 127], got {}", config.initial_scale_power);
  dynamic_ = config.loss_scale == 0.0f;
  scale_ = dynamic_ ? std::ldexp(1.0f, config.initial_scale_power) : config.loss_scale;
  cur_hysteresis_ = config.hysteresis;
}

// Note [Stopping at the minimum scale]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At min_loss_scale an overflow can no longer be answered by a smaller scale: the gradients overflow
// f16 unscaled (weights or activations out of range, a diverged model). Every later step is then
// skipped and the run "trains" without changing a weight. DeepSpeed's DynamicLossScaler raises at
// the first such overflow (raise_error_at_min_scale, on by default; "Current loss scale already at
// minimum - cannot decrease scale anymore"). We count the consecutive overflowed steps that found
// the scale at min_loss_scale (a clean step resets the count) and throw once there are
// min_scale_skip_limit of them; the default 1 is DeepSpeed's behaviour. A larger limit lets a run
// ride out a short spike at the floor. The count is saved with the rest of the state, so a resumed
// run stops where the uninterrupted one would.

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  skips_at_min_ = overflow && scale_ == config_.min_loss_scale ? skips_at_min_ + 1 : 0;
  if (overflow) {
    if (config_.hysteresis == 1 || cur_hysteresis_ == 1) {
      scale_ = std::max(scale_ / 2.0f, config_.min_loss_scale);
    } else {
      cur_hysteresis_ -= 1;
    }
    last_overflow_iter_ = iter_;
  } else {
    if (config_.consecutive_hysteresis) cur_hysteresis_ = config_.hysteresis;
    const std::int64_t stable = iter_ - last_overflow_iter_ - 1;
    if (stable > 0 && stable % config_.loss_scale_window == 0) {
      scale_ *= 2.0f;
      cur_hysteresis_ = config_.hysteresis;
    }
  }
  iter_ += 1;
  if (config_.raise_error_at_min_scale && skips_at_min_ >= config_.min_scale_skip_limit)
    throw MinLossScaleError(fmt::format(
        "fp16: the gradients overflowed at the minimum loss scale {:g} on {} consecutive step(s) "
        "(fp16.min_scale_skip_limit {}): training cannot make progress; check the weights, lower the learning "
        "rate, or train in bf16 or fp32",
        config_.min_loss_scale, skips_at_min_, config_.min_scale_skip_limit));
}

void LossScaler::set_state(const State& s) {
  ZERO_CHECK(std::isfinite(s.scale) && s.scale > 0.0f, "loss scaler state: scale must be positive, got {}", s.scale);
  ZERO_CHECK(s.hysteresis_left >= 1 && s.hysteresis_left <= config_.hysteresis,
             "loss scaler state: hysteresis_left must be in [1, {}], got {}", config_.hysteresis, s.hysteresis_left);
  ZERO_CHECK(s.skips_at_min >= 0, "loss scaler state: skips_at_min must be >= 0, got {}", s.skips_at_min);
  scale_ = s.scale;
  cur_hysteresis_ = s.hysteresis_left;
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
  skips_at_min_ = s.skips_at_min;
}

bool has_inf_or_nan(const Tensor& t) {
  if (!t.defined()) return false;
  ZERO_CHECK(is_floating(t.dtype()), "has_inf_or_nan: needs an f32, f16 or bf16 tensor, got {}", dtype_name(t.dtype()));
  const Tensor c = t.is_contiguous() ? t : t.clone();
  return c.numel() > 0 && backend(c.device()).has_inf_or_nan(c.raw_data(), c.dtype(), c.numel());
}

}  // namespace zero::optim
