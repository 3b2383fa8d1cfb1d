// Activation memory as train_gpt measures it (metrics JSON memory_bytes.activations): the bytes a
// micro-step's forward leaves allocated for its backward, plus the largest working set of a recompute
// re-run (autograd/checkpoint.h), both read from the device allocator's bytes in use (core/storage.h;
// blocks rounded up to 64 bytes on cpu). nn/activation_memory.h predicts the same two numbers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>

#include "autograd/checkpoint.h"

namespace zero::examples {

class ActivationMeter {
 public:
  /// `in_use`: the allocator's bytes in use now. `other`: bytes in use now that are not activations
  /// but may grow during a forward or a re-run (ZeRO stage 3's gathered parameters and their compute
  /// copies); 0 when there are none.
  /// While the meter lives it is this thread's recompute probe (autograd::set_recompute_probe); its
  /// destructor removes it, so no probe outlives the meter.
  ActivationMeter(std::function<std::size_t()> in_use, std::function<std::size_t()> other)
      : in_use_(std::move(in_use)), other_(std::move(other)) {
    autograd::set_recompute_probe([this](bool forward_done) { on_recompute(forward_done); });
  }
  ~ActivationMeter() { autograd::set_recompute_probe(nullptr); }
  ActivationMeter(const ActivationMeter&) = delete;
  ActivationMeter& operator=(const ActivationMeter&) = delete;

  /// Only measured steps count (train_gpt skips the first, which makes the persistent caches).
  void set_counting(bool on) { counting_ = on; }
  /// Around one micro-step's forward.
  void begin_forward() { base_ = now(); }
  void end_forward() {
    if (counting_) held_ = std::max(held_, grown(base_));
  }
  /// The recompute probe: false at a re-run's start, true after its forward.
  void on_recompute(bool forward_done) {
    if (!forward_done) {
      rerun_base_ = now();
    } else if (counting_) {
      working_ = std::max(working_, grown(rerun_base_));
    }
  }

  /// Most bytes held for the backward at the end of a forward (bytes).
  std::size_t held() const { return held_; }
  /// Most bytes a recompute re-run allocated for its segment (0 without recompute).
  std::size_t recompute_working_set() const { return working_; }
  /// held() + recompute_working_set(): the metrics' memory_bytes.activations.
  std::size_t activations() const { return held_ + working_; }

 private:
  std::size_t now() const {
    const std::size_t used = in_use_(), other = other_ ? other_() : 0;
    return used > other ? used - other : 0;
  }
  std::size_t grown(std::size_t since) const {
    const std::size_t n = now();
    return n > since ? n - since : 0;
  }
  std::function<std::size_t()> in_use_, other_;
  bool counting_ = true;
  std::size_t base_ = 0, rerun_base_ = 0, held_ = 0, working_ = 0;
};

}  // namespace zero::examples
