// ZeroPlan: the one source of sizes of a ZeRO configuration. From the options and the parameter list
// alone (no tensors, no ranks talking, no training) it validates the options, lays out the flat buffer,
// cuts the buckets, and works out what each rank keeps and sends:
//   - the region a rank steps: everything at stage 0, its partition at stages 1/2/3;
//   - stage 3: the gather units, the groups of parameters gathered together (Note [Gather units]);
//   - memory per rank: the flat parameter buffer, the gradient storage (the whole flat gradient at
//     stages 0/1, the partition at stage 2), fp32 master (16-bit models only) + Adam m + v over the
//     region, and the stage-2 bucket pool (Note [ZeRO-2 gradient ownership] in gradient_reducer.cpp);
//   - traffic per optimizer step, counted the ledger's way (nccl-tests bus bytes: all_reduce
//     2(n-1)/n·S, reduce_scatter and all_gather (n-1)/n·S).
// ZeroOptimizer builds from a plan; zero_explain prints one; the tests hold a plan against what a real
// optimizer allocates (its memory()) and what its communicator's ledger counts.
//
// The ZeRO paper (Rajbhandari et al., SC20, §3 and Fig. 1) gives per-rank model-state memory for Ψ
// parameters on N ranks with mixed-precision Adam (b = 2 bytes per 16-bit element, K = 12):
//   stage 0  (b + b + K)Ψ = 16Ψ,   stage 1  2bΨ + KΨ/N = 4Ψ + 12Ψ/N,   stage 2  bΨ + (b + K)Ψ/N = 2Ψ + 14Ψ/N,
//   stage 3  (b + b + K)Ψ/N = 16Ψ/N.
// expected_memory() is that formula; ZeroPlan::memory() is the same formula over the padded buffer, with
// the largest partition for what is partitioned, plus the bucket pool, so the two differ only by padding,
// uneven partitions (Muon; Note [Whole-matrix partitions] in flat_layout.cpp) and buckets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/zero/flat_layout.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"

namespace zero::dist {

/// What step() does with a non-finite (inf/NaN) gradient in f32/bf16 (f16 always skips the step and
/// lowers the loss scale): throw zero::Error naming the step (the default; nothing is changed, so the
/// run stops at that step), or skip the step like an fp16 overflow (counted in skipped_steps()).
enum class NonfiniteGrads { error, skip };

/// A bucket size meaning "choose for me": default_bucket_size(Ψ).
inline constexpr std::int64_t kAutoBucketSize = -1;

/// Stage 2: the most bucket buffers alive at once (DeepSpeed's double buffer: one bucket filling or
/// being reduced while the previous one finishes). When both are busy, the next bucket waits for the
/// older one (Note [ZeRO-2 gradient ownership]).
inline constexpr int kMaxLiveBuckets = 2;

/// The bucket size (elements) used when none is configured: ceil(Ψ/8), at least 4096 and at most
/// DeepSpeed's 5e8, for Ψ trainable elements. Why (docs/zero.md, "Bucket size"): stage 2's gradient
/// memory is the partition gradient bΨ/N plus at most kMaxLiveBuckets buckets; with buckets of Ψ/8
/// that is bΨ/N + bΨ/4 < bΨ (stage 1's full gradient) for every N >= 2, and eight buckets let the first
/// reduction start while backward is still producing the others. DeepSpeed's fixed 5e8 is larger than
/// any model below 500 M parameters, so its single bucket is a full-size gradient buffer. Throws
/// zero::Error for psi < 1.
std::int64_t default_bucket_size(std::int64_t psi);

/// A link for the α-β model (ring_time_s): bandwidth in bytes/s per rank's link, latency in seconds per
/// message. bandwidth 0 means "no model": the automatic bucket size then ignores the link.
struct LinkModel {
  double bandwidth = 0;
  double latency = 0;
};

/// The bucket size (elements) plan_zero uses when reduce_bucket_size is automatic, for Ψ = `numel` real
/// elements in a flat buffer padded to `padded_numel` on `world_size` ranks, `elem_bytes` per element
/// on the wire (Note [Automatic bucket size] in zero_plan.cpp):
///   1. default_bucket_size(numel);
///   2. with a link model and N > 1: grown to the size whose modelled latency, (N-1)·α per ring, is at
///      most 10% of its bandwidth term, (N-1)/N·S/B, i.e. S >= 10·N·α·B bytes — but never past stage 2's
///      memory bound, P + kMaxLiveBuckets buckets < the full gradient (bucket < padded·(N-1)/(2N));
///   3. cut so no bucket is a sliver: when the last bucket (the start of the buffer) would hold less
///      than half a bucket, the buffer is split into one bucket fewer (or, if that would pass the bound
///      of 2., into equal buckets).
/// Without a link model the result equals default_bucket_size(numel) whenever the last bucket is at
/// least half a bucket. Throws zero::Error for numel < 1, padded_numel < numel, world_size < 1 or a
/// negative link parameter.
std::int64_t automatic_bucket_size(std::int64_t numel, std::int64_t padded_numel, int world_size, double elem_bytes,
                                   const LinkModel& link = {});

/// DeepSpeed's "zero_optimization" section plus the top-level keys ZeRO needs. Bucket sizes are in
/// ELEMENTS of the model dtype; kAutoBucketSize (the default) picks default_bucket_size(Ψ), any other
/// value is used as given.
struct ZeroOptions {
  int stage = 0;             // 0, 1, 2 or 3; DeepSpeed's default is 0
  DType dtype = DType::f32;  // model dtype: f32, f16 or bf16
  std::int64_t reduce_bucket_size = kAutoBucketSize;
  std::int64_t allgather_bucket_size = kAutoBucketSize;
  // DeepSpeed's communication_data_type "fp32" for a 16-bit model: reductions travel in fp32 and are
  // rounded once (twice the bytes). false (the default, communication_data_type = the model dtype):
  // 16-bit partial sums, rounded at every hop (Note [Wire dtype] in distributed/comm/communicator.cpp).
  bool reduce_in_fp32 = false;
  // Megatron-LM's reduce_scatter_with_fp32_accumulation: 16-bit reductions (not fp32 ones, and not with
  // reduce_in_fp32) go as an all-to-all whose receiver adds in fp32 and rounds once; same wire bytes
  // (Note [fp32-accumulating reduce-scatter] in distributed/comm/communicator.cpp).
  bool reduce_scatter_with_fp32_accumulation = false;
  // DeepSpeed's zero_quantized_gradients: > 0, the stage 1/2 reduce-scatter sends int8 blocks of this
  // many elements with an fp32 scale each (Note [int8 quantized reduce-scatter] in quantize.cpp); 0 off.
  // A plan without a stage 1/2 reduce-scatter (stage 0, reduce_scatter false) turns it and the error feedback off
  // (the config refuses that combination with an error instead: TrainingConfig::validate).
  std::int64_t quantized_gradients_block = 0;
  // Carry each reduction's quantization residual into the next one (Note [Error feedback] in
  // gradient_reducer.cpp); needs quantized_gradients_block > 0.
  bool quantized_gradients_error_feedback = false;
  // After the step, issue the parameter all-gathers asynchronously, in flat (= forward) order; each
  // parameter's first use in the next forward waits for its own chunk only (Note [Overlapped
  // all-gather] in parameter_gather.cpp). Bitwise the same results.
  bool overlap_param_gather = false;
  // The link automatic bucket sizes are grown for (automatic_bucket_size); bandwidth 0 (the default):
  // none. zero_explain sets it from --bandwidth / --latency.
  LinkModel link;
  bool reduce_scatter = true;           // false: all-reduce each bucket and keep your slice (1.5× traffic)
  bool overlap_comm = false;            // issue bucket collectives asynchronously, wait at the end of backward
  bool contiguous_gradients = true;     // accepted for config compatibility; always on (see docs/zero.md)
  int gradient_accumulation_steps = 1;  // GAS: backward() calls per step()
  float gradient_clipping = 0.0f;       // max global L2 norm; 0 = off
  optim::LossScalerConfig fp16;         // used only when dtype == f16
  optim::AdamWOptions adam;
  float weight_decay = 0.0f;  // AdamW decay, for parameters whose decay flag is set
  // Muon (optim/muon.h) for the hidden matrices (optim::is_muon_matrix), AdamW (`adam`) for the rest, one
  // lr and weight decay (Note [Muon update scale] in optim/muon.cpp). At stages 1-3 the layout keeps each
  // matrix inside one partition, so its owner steps it whole (Note [Whole-matrix partitions] in
  // flat_layout.cpp).
  bool muon = false;
  float muon_momentum = 0.95f;  // in [0, 1), Nesterov
  int muon_ns_steps = 5;        // >= 1
  NonfiniteGrads nonfinite_grads = NonfiniteGrads::error;  // f32/bf16 only (Note [Non-finite gradients])
  // f32/bf16 with nonfinite_grads = skip: the consecutive skipped steps that stop training (step()
  // throws NonfiniteSkipLimitError at the limit-th); 0 = never stop. The default is fp16's
  // min_scale_skip_limit default (Note [Non-finite gradients]).
  int nonfinite_skip_limit = 1;
  // Stage 3 (DeepSpeed's keys, in elements; Note [Gathering on use] in partitioned_parameters.cpp):
  // the elements of the units gathered ahead of the one in use (0: no prefetch), and the most
  // gathered elements alive at once, in flight included (at least the largest gather unit).
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;
  std::int64_t stage3_max_live_parameters = 1'000'000'000;
};

/// The largest quantization block (elements) the options accept.
inline constexpr std::int64_t kMaxQuantizationBlock = std::int64_t{1} << 20;

/// Throws zero::Error naming the first invalid option: a stage outside 0..3, a negative
/// stage3_prefetch_bucket_size or a stage3_max_live_parameters < 1, a
/// non-float dtype, a bucket size < 1 (other than kAutoBucketSize), gradient_accumulation_steps < 1,
/// negative clipping or weight decay, AdamW eps < 0 or a beta outside [0, 1), lr < 0, a negative
/// nonfinite_skip_limit, with Muon a momentum outside [0, 1) or ns_steps < 1. The loss-scaler
/// options are checked by optim::LossScaler.
void check_zero_options(const ZeroOptions& options);

/// Bytes of persistent buffers held by one rank.
struct MemoryBreakdown {
  double params = 0;            // the flat model-dtype parameter buffer
  double grads = 0;             // gradient storage kept across a step
  double optimizer_states = 0;  // fp32 master + AdamW m + v
  double buckets = 0;           // IPG bucket buffers (stage 2), reported apart from the model states
  double recovery = 0;          // restore points of a failed backward (GAS > 1 only; Note [Exception safety],
                                // Note [Error feedback state])
  double gathered = 0;          // stage 3: gathered parameters alive at once (at most; not a model state)
  double residual = 0;          // error feedback's quantization residual (int8 + block scales; Note [Error feedback])
                                // and its copy from the accumulation's start (Note [Error feedback state])
  /// params + grads + optimizer_states (the ZeRO paper's "model states"; buckets excluded).
  double model_states() const { return params + grads + optimizer_states; }
};

/// The ZeRO paper's per-rank model-state memory for Ψ parameters on N ranks with AdamW (§3, Fig. 1):
/// params bΨ (stages 0-2) or bΨ/N (stage 3), grads bΨ (stage 0/1) or bΨ/N (stages 2/3), optimizer
/// states KΨ (stage 0) or KΨ/N (1-3),
/// where b = bytes per model-dtype element and K = 12 for f16/bf16 (fp32 master + m + v) or 8 for f32
/// (the flat buffer is the master, so only m + v). Throws zero::Error for a stage outside 0..3, a
/// non-float dtype or N < 1.
MemoryBreakdown expected_memory(int stage, DType dtype, double psi, int world_size);

/// Bytes one rank sends per optimizer step, per collective, and the number of calls behind them.
struct StepTraffic {
  double bytes[kNumCollectives] = {};
  std::int64_t calls[kNumCollectives] = {};
  double operator[](Collective c) const { return bytes[static_cast<int>(c)]; }
  /// Sum over the collectives (bytes).
  double total() const;
};

/// Stage 3: parameters gathered together, a contiguous range of the flat buffer (Note [Gather units]).
struct GatherUnit {
  std::string name;                 // the module path they share: "wte", "blocks.3", "lnf" ("" = the root)
  std::int64_t begin = 0, end = 0;  // flat elements
  std::size_t first_param = 0, end_param = 0;  // layout parameters [first_param, end_param)
  std::int64_t size() const { return end - begin; }
};

/// The gather units of `layout`: consecutive parameters whose names share a unit name (the owning
/// module's dotted path up to and including its first all-digit part, as "blocks.3" for
/// "blocks.3.attn.qkv.weight", else its first part, as "wte" for "wte.weight"; "" for parameters of the
/// root module). Note [Gather units] in zero_plan.cpp.
std::vector<GatherUnit> make_gather_units(const FlatLayout& layout);

struct ZeroPlan {
  FlatLayout layout;
  ZeroOptions options;          // bucket sizes resolved (never kAutoBucketSize)
  std::vector<Bucket> buckets;  // in issue order (bucket 0 holds the end of the flat buffer)
  /// Stage 2: the bucket buffers the pool allocates: kMaxLiveBuckets with overlap_comm (one bucket
  /// reducing while the next is issued), 1 without (each collective finishes before the next bucket),
  /// never more than there are buckets. 0 for stages 0/1, which reduce in place in the flat gradient.
  int pool_buffers = 0;
  /// Elements of one pool buffer: min(reduce_bucket_size, padded_numel).
  std::int64_t pool_buffer_numel = 0;
  /// Stage 3: the gather units in flat order (empty at stages 0-2).
  std::vector<GatherUnit> units;

  /// Where the flat range rank `rank` steps (and keeps fp32 state for) begins: 0 at stage 0, its
  /// partition's start (FlatLayout::partition_begin) at stages 1-3. Elements.
  std::int64_t region_begin(int rank) const;
  /// Elements of that range: padded_numel at stage 0, the partition's size at stages 1-3 (P, unless Muon's
  /// whole matrices made the partitions uneven). Throws zero::Error for a rank outside [0, world_size).
  std::int64_t region_size(int rank) const;
  /// The parameter slices inside that range, in flat order (each with its weight-decay flag).
  std::vector<ParamSlice> region_slices(int rank) const;

  /// Persistent bytes of rank `rank`, as its ZeroOptimizer::memory() reports them: expected_memory()
  /// over the padded buffer, with the rank's partition for what is partitioned, plus the bucket pool; at
  /// stage 3 also the most gathered parameter bytes alive at once (min(stage3_max_live_parameters, every
  /// unit) elements). The same on every rank unless Muon's matrices made the partitions uneven. Throws
  /// zero::Error for a rank outside [0, world_size).
  MemoryBreakdown memory(int rank) const;
  /// The peak over the ranks: memory(rank) of the rank with the largest partition.
  MemoryBreakdown memory() const;
  /// Bytes per optimizer step of one rank, as its communicator's ledger counts them (control scalars
  /// excluded), for a step that is not skipped (an fp16 overflow skips the all-gather). Stage 3: two
  /// all-gathers of every unit per micro-step (before its forward and before its backward), which is
  /// what a model that uses each unit once per forward, and a live bound that holds every unit the
  /// backward needs, moves.
  StepTraffic traffic() const;
};

/// Plans `options` for parameters `entries` (named_parameters() order) on `world_size` ranks. A
/// reduce_bucket_size left at kAutoBucketSize resolves to automatic_bucket_size (with options.link), an
/// allgather_bucket_size to default_bucket_size(Ψ). Throws zero::Error from
/// check_zero_options, for world_size < 1, and for parameters with no element at all.
ZeroPlan plan_zero(const std::vector<FlatLayout::Entry>& entries, int world_size, const ZeroOptions& options);

/// α-β ring model of one collective's time (Hockney's model, as in Thakur, Rabenseifner & Gropp,
/// "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005): a ring
/// reduce-scatter or all-gather takes n-1 steps, each paying the latency α once, and moves its bus
/// bytes through each rank's link at β = 1/bandwidth; an all-reduce is the two in a row.
///   t = steps·α + bus_bytes / bandwidth,  steps = n-1 (reduce_scatter, all_gather), 2(n-1) (all_reduce).
/// bus_bytes as in Ledger::bus_bytes; bandwidth in bytes/s (> 0), latency in seconds (>= 0). 0 for
/// n = 1. Throws zero::Error for a non-positive bandwidth or negative latency.
double ring_time_s(Collective c, double bus_bytes, int world_size, double bandwidth, double latency);

/// Modelled communication seconds per optimizer step of `plan` (every call of traffic() through
/// ring_time_s).
double step_comm_time_s(const ZeroPlan& plan, double bandwidth, double latency);

}  // namespace zero::dist
