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
  ZERO_CHECK(config.initial_scale_power >= 0 && config.initial_scale_power <= 127,
             "initial_scale_power must be in [0, 127], got {}", config.initial_scale_power);
  dynamic_ = config.loss_scale == 0.0f;
  scale_ = dynamic_ ? std::ldexp(1.0f, config.initial_scale_power) : config.loss_scale;
  cur_hysteresis_ = config.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (config_.hysteresis == 1 || cur_hysteresis_ == 1) {
      ZERO_CHECK(!(config_.raise_error_at_min_scale && scale_ == config_.min_loss_scale),
                 "loss scale already at its minimum {} and the gradients still overflow", config_.min_loss_scale);
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
}

void LossScaler::set_state(const State& s) {
  ZERO_CHECK(std::isfinite(s.scale) && s.scale > 0.0f, "loss scaler state: scale must be positive, got {}", s.scale);
  ZERO_CHECK(s.hysteresis_left >= 1 && s.hysteresis_left <= config_.hysteresis,
             "loss scaler state: hysteresis_left must be in [1, {}], got {}", config_.hysteresis, s.hysteresis_left);
  scale_ = s.scale;
  cur_hysteresis_ = s.hysteresis_left;
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
}

bool has_inf_or_nan(const Tensor& t) {
  if (!t.defined()) return false;
  ZERO_CHECK(is_floating(t.dtype()), "has_inf_or_nan: needs an f32, f16 or bf16 tensor, got {}", dtype_name(t.dtype()));
  const Tensor c = t.is_contiguous() ? t : t.clone();
  return c.numel() > 0 && backend(c.device()).has_inf_or_nan(c.raw_data(), c.dtype(), c.numel());
}

}  // namespace zero::optim
