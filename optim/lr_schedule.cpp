#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/check.h"

namespace zero::optim {

float lr_at(std::int64_t step, const LrSchedule& s) {
  ZERO_CHECK(step >= 0, "lr_at: negative step {}", step);
  ZERO_CHECK(s.lr >= 0.0f && s.min_lr >= 0.0f, "lr_at: lr {} and min_lr {} must be >= 0", s.lr, s.min_lr);
  ZERO_CHECK(s.min_lr <= s.lr, "lr_at: min_lr {} exceeds lr {}", s.min_lr, s.lr);
  ZERO_CHECK(s.warmup >= 0 && s.total_steps >= 0, "lr_at: warmup {} and total_steps {} must be >= 0", s.warmup,
             s.total_steps);
  if (step < s.warmup) return static_cast<float>(static_cast<double>(s.lr) * (step + 1) / s.warmup);
  if (step >= s.total_steps) return s.min_lr;
  // Here warmup <= step < total_steps, so the denominator is positive.
  const double ratio = static_cast<double>(step - s.warmup) / static_cast<double>(s.total_steps - s.warmup);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return static_cast<float>(s.min_lr + coeff * (static_cast<double>(s.lr) - s.min_lr));
}

}  // namespace zero::optim
