// Activation checkpointing (recompute): run a segment of the forward without keeping what its ops save
// for the backward, and run it again inside the backward to get its gradients, trading compute for
// activation memory (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; PyTorch's
// torch.utils.checkpoint; Megatron-LM's full and selective recompute, Korthikanti et al. 2022).
//
//   Tensor y = autograd::checkpoint([&](const std::vector<Tensor>& in) { return block->forward(in[0]); },
//                                   {x}, autograd::keep_nothing());
//
// y then carries one graph node for the whole segment. Its edges are everything outside the segment
// that the segment's ops read and that needs a gradient: the inputs given, and the parameters (their
// AccumulateGrad nodes) or other graph tensors the segment reads directly, found as the segment runs
// (Note [Checkpoint edges] in checkpoint.cpp). A parameter's gradient therefore still reaches it
// through the one backward engine, summed with its other uses, and its post-accumulate-grad hooks fire
// once per backward as without checkpointing (Note [Hook order] in autograd/autograd.h). Results are
// bitwise those of the plain forward and backward: the re-run computes the same ops on the same
// values, and random draws (dropout masks) are replayed from the generators' saved states.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/autograd.h"

namespace zero::autograd {

/// What a checkpointed segment keeps of one op's output (Note [Save or recompute] in checkpoint.cpp).
enum class Keep {
  recompute,  // nothing: the re-run computes the op again
  output,     // its output, which the re-run then takes instead of computing it (ops that support it:
              // linear and matmul; for other ops the policy's answer is ignored and they recompute)
};

/// Decides, per op name ("linear", "gelu", "layer_norm", ... as the op records itself), what a
/// segment keeps. Called in the segment's first run only (the re-run asks the segment what it kept).
using RecomputePolicy = std::function<Keep(std::string_view op)>;

/// Full recompute: keeps nothing but the segment's inputs.
RecomputePolicy keep_nothing();
/// Selective recompute: keeps the outputs of the GEMM ops (linear, matmul) and recomputes the rest
/// (norms, GELU, the attention's scores and softmax, dropout masks, additions).
RecomputePolicy keep_matmul_outputs();

/// The recompute modes of a GPT (train_gpt --recompute; DeepSpeed's activation_checkpointing).
enum class Recompute { none, full, selective };
/// "none", "full", "selective".
const char* recompute_name(Recompute mode);
/// Parses one of recompute_name's words. Throws zero::Error naming the text and the valid words.
Recompute parse_recompute(std::string_view text);
/// The policy of a mode: keep_nothing() for full, keep_matmul_outputs() for selective. Throws
/// zero::Error for none (nothing is checkpointed).
RecomputePolicy recompute_policy(Recompute mode);

/// The segment function: the inputs as given to checkpoint() -> one output tensor.
using SegmentFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;

/// Runs `fn(inputs)` keeping of its ops' saved tensors only what `policy` keeps, and records one node
/// that re-runs `fn` (grad mode on, random generators rewound) when the backward reaches it. With grad
/// mode off, or when nothing the segment reads needs a gradient, it is just `fn(inputs)`.
/// `fn` must compute the same ops in the same order on every run (no data-dependent control flow), and
/// must not nest another checkpoint. Memory: the inputs and kept outputs live until the node runs; the
/// re-run holds one segment's saved tensors at a time (Note [Save or recompute]).
/// Throws zero::Error for a nested checkpoint, and from the backward when the re-run reads a tensor from
/// outside the segment that the first run did not, or asks for a kept GEMM output of another op or shape.
/// A re-run that computes other pointwise ops than the first run is not detected: `fn` must be
/// deterministic in its ops.
Tensor checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs, const RecomputePolicy& policy);

/// Observes checkpoint re-runs (memory accounting: examples/activation_meter.h). Called inside the
/// backward with false when a checkpoint node starts its re-run, and with true when the re-run has
/// finished its forward, before its own backward starts: what was allocated in between is the re-run's
/// working set (the segment's saved tensors and its output). Null: none. This thread only.
using RecomputeProbe = std::function<void(bool forward_done)>;
void set_recompute_probe(RecomputeProbe probe);

}  // namespace zero::autograd
