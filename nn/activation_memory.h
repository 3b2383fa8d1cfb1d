// Activation memory of a GPT micro-step, predicted in closed form (docs/zero.md, section 9):
// the bytes the forward leaves allocated for the backward, and the largest working set of one
// recompute re-run, as train_gpt measures them (examples/activation_meter.h). The shape is that of
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", section
// 4.1: per layer s·b·h·(34 + 5·a·s/h) bytes for 16-bit activations), counted for this project's own
// ops: what each op of nn/gpt.cpp saves in autograd/ops.cpp, in f32.
#pragma once

#include <cstdint>

#include "autograd/checkpoint.h"
#include "nn/gpt.h"

namespace zero::nn {

struct ActivationBytes {
  double held = 0;       // allocated by the forward and held for the backward (bytes)
  double recompute = 0;  // the largest re-run's working set: its segment's saved tensors (bytes)
  double total() const { return held + recompute; }
};

/// The activation bytes of one forward and backward of `cfg` on a micro-batch of `micro_batch`
/// sequences of cfg.block_size tokens, in training mode, on cpu (activations are f32 whatever the
/// model's dtype; each tensor's bytes rounded up to the cpu allocator's 64-byte blocks). Exact for
/// this project's ops, with either norm: see docs/zero.md for the terms. Throws zero::Error for
/// micro_batch < 1 or a norm it has no terms for.
ActivationBytes activation_bytes(const GPTConfig& cfg, std::int64_t micro_batch, autograd::Recompute mode);

}  // namespace zero::nn
