// Learning-rate schedule: linear warmup, then cosine decay to a floor (nanoGPT's get_lr; cosine
// annealing from Loshchilov & Hutter 2017, "SGDR", arXiv 1608.03983, without restarts).
#pragma once

#include <cstdint>

namespace zero::optim {

/// Defaults are nanoGPT's shakespeare_char recipe (learning_rate, min_lr, warmup_iters, lr_decay_iters).
struct LrSchedule {
  float lr = 1e-3f;                  // peak learning rate, reached at the end of warmup
  float min_lr = 1e-4f;              // floor, reached at total_steps and kept after
  std::int64_t warmup = 100;         // steps of linear warmup
  std::int64_t total_steps = 5000;   // step at which the cosine reaches min_lr
};

/// Learning rate for 0-based optimizer step `step`:
///   step <  warmup:                 lr * (step + 1) / warmup
///   warmup <= step < total_steps:   min_lr + 0.5 * (1 + cos(pi * r)) * (lr - min_lr),
///                                   r = (step - warmup) / (total_steps - warmup)
///   step >= total_steps:            min_lr
/// warmup > total_steps is allowed (the schedule warms up, then drops to min_lr). Throws zero::Error for
/// a negative step, lr, min_lr, warmup or total_steps, or min_lr > lr.
float lr_at(std::int64_t step, const LrSchedule& s);

}  // namespace zero::optim
