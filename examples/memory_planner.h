// The memory planner of zero_explain --memory-budget: which training configurations of a GPT fit in a
// per-rank memory budget, ordered by a modelled step time, and which one to choose.
//
// Memory per rank = the ZeRO plan's persistent buffers (model states, bucket pool, stage 3's gathered
// bound, error-feedback residual: dist::ZeroPlan::memory) + the activations of one micro-step
// (nn::activation_bytes, docs/zero.md section 9): what train_gpt's metrics count. The budget is checked
// against a predicted peak RSS: that + the transient tensors at the allocator's peak (transient_bytes)
// + a stated per-process overhead (--runtime-overhead: the program, its libraries and data, and the
// allocator's cache; Note [Peak RSS] in memory_planner.cpp).
// Step time = compute + communication: compute = tokens per rank per step · FLOPs per token / the
// rank's FLOP/s, FLOPs per token being 6Ψ + 12·L·T·C (nn::flops_per_token, PaLM appendix B) plus what a
// recompute re-runs (full: the blocks' forward, 2Ψ_blocks + 4·L·T·C; selective: the attention's
// scores and weighted sum, 4·L·T·C; the norms, GELU and dropout counted as free); communication =
// dist::step_comm_time_s over the given link (0 without --bandwidth). The model is a ranking, not a
// promise: it ignores overlap and the kernels' different speeds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "distributed/zero/zero_plan.h"
#include "nn/activation_memory.h"
#include "nn/gpt.h"

namespace zero::examples {

/// Parses a size: a number with an optional suffix B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB,
/// GB, TB (powers of 1000), e.g. "2GiB", "1.5GB", "800MiB". Throws zero::Error naming `flag` and the
/// text for anything else or a size <= 0.
double parse_size(const std::string& text, const char* flag);

/// --runtime-overhead's default (bytes): what train_gpt's peak RSS measured above its allocator's peak,
/// 50-57 MiB on the runs of docs/zero.md section 9, rounded up.
inline constexpr double kDefaultRuntimeOverhead = 64.0 * 1048576.0;

/// Bytes of the transient tensors above the counted memory at the cpu allocator's peak of one step, in
/// f32: the optimizer step's temporary of the rank's partition (all Ψ elements at stage 0, Ψ/N above)
/// and the head's backward (the logits' gradient, n·V, and two n·C gradients; n = micro_batch · T
/// tokens): 4·(P + n·(V + 2C)). Measured, not derived: Note [Peak RSS] in memory_planner.cpp.
double transient_bytes(const nn::GPTConfig& cfg, std::int64_t micro_batch, std::int64_t partition_elements);

struct PlanChoice {
  int stage = 0;
  autograd::Recompute recompute = autograd::Recompute::none;
  int gradient_accumulation_steps = 1;
  std::int64_t micro_batch = 1;
  std::int64_t reduce_bucket_size = 0;          // elements, as resolved by the plan
  std::int64_t stage3_max_live_parameters = 0;  // elements (stage 3)
  double memory_bytes = 0;                      // per rank: persistent buffers + activations
  double persistent_bytes = 0, activation_bytes = 0;
  double transient_bytes = 0;  // the transient tensors at the allocator's peak (transient_bytes())
  double rss_bytes = 0;        // predicted peak RSS: memory + transient + the input's runtime overhead
  double compute_s = 0, comm_s = 0;  // modelled, per optimizer step
  double step_s() const { return compute_s + comm_s; }
};

struct PlannerInput {
  nn::GPTConfig cfg;
  std::vector<dist::FlatLayout::Entry> entries;  // the model's trainable parameters
  int world_size = 1;
  std::int64_t batch = 1;      // global batch: sequences per optimizer step over all ranks
  dist::ZeroOptions base;      // dtype, buckets, wire... as configured; stage and GAS are varied
  double budget_bytes = 0;     // per rank
  double runtime_overhead_bytes = kDefaultRuntimeOverhead;  // per process, beside the allocator's peak
  double flops_per_s = 1e11;   // per rank
  double bandwidth = 0, latency = 0;  // the link (bandwidth 0: no communication time)
};

/// Every configuration (stage 0-3 x recompute none/full/selective x every GAS that divides the batch
/// per rank), with its memory and modelled step time; those that fit the budget first, fastest first
/// (ties: fewer micro-steps, then less memory), then those that do not, smallest predicted RSS first. Throws
/// zero::Error when the batch does not split into the ranks.
std::vector<PlanChoice> plan_configurations(const PlannerInput& in);

/// Whether `c` fits `in`'s budget: its predicted peak RSS (rss_bytes) is at most the budget.
inline bool fits(const PlanChoice& c, const PlannerInput& in) { return c.rss_bytes <= in.budget_bytes; }

/// The planner's text: the configurations that fit (and the nearest that do not), and its choice.
void print_plan(const PlannerInput& in, const std::vector<PlanChoice>& choices);

}  // namespace zero::examples
