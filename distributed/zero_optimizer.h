// ZeroOptimizer: data-parallel AdamW with ZeRO stages 0, 1 and 2 (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", SC20, arXiv 1910.02054), on top of one
// Communicator. A walk-through of one step, with the memory and traffic formulas, is docs/zero.md.
//
//   stage 0  plain data parallelism: bucketed all-reduce of the gradients, every rank keeps and steps
//            everything (the baseline every ZeRO figure is compared against).
//   stage 1  optimizer states partitioned (P_os): each rank keeps fp32 master + Adam m, v for its
//            partition only; gradients are reduce-scattered at the accumulation boundary, the updated
//            partitions all-gathered.
//   stage 2  optimizer states and gradients partitioned (P_os+g): gradients are reduce-scattered every
//            micro-step as their buckets fill, and each rank keeps only its partition's gradient.
//   stage 3  (parameters partitioned) is not implemented: the constructor throws.
//
// Usage (every rank runs the same program on its own micro-batches):
//
//   ZeroOptimizer opt(model.named_parameters(), mpi_world(), options);
//   for (step...) {
//     for (int i = 0; i < options.gradient_accumulation_steps; ++i) opt.backward(model.loss(x_i, y_i));
//     opt.step();   // false: skipped for an fp16 overflow
//   }
//
// The constructor moves every trainable parameter into one flat buffer (FlatLayout) in the model dtype
// and re-points the module's tensors at views of it (Tensor::set_data), so the model computes from the
// flat buffer; it also broadcasts rank 0's values so every rank starts from the same weights. The
// optimizer registers a post-accumulate-grad hook on every trainable parameter, which is how backward
// feeds the reduction buckets (Note [Bucket order] and Note [ZeRO-2 gradient ownership] in
// zero_optimizer.cpp). The object must outlive every backward of the model and cannot be copied or
// moved (the hooks point at it); its destructor removes the hooks.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <unordered_map>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/flat_layout.h"
#include "nn/module.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"

namespace zero::dist {

/// What step() does with a non-finite (inf/NaN) gradient in f32/bf16 (f16 always skips the step and
/// lowers the loss scale): throw zero::Error naming the step (the default; nothing is changed, so the
/// run stops at that step), or skip the step like an fp16 overflow (counted in skipped_steps()).
enum class NonfiniteGrads { error, skip };

/// A bucket size meaning "choose for me": default_bucket_size(Ψ).
inline constexpr std::int64_t kAutoBucketSize = -1;

/// The bucket size (elements) used when none is configured: ceil(Ψ/8), at least 4096 and at most
/// DeepSpeed's 5e8, for Ψ trainable elements. Why (docs/zero.md, "Bucket size"): stage 2's gradient
/// memory is the partition gradient bΨ/N plus the bucket pool, which holds at most two buckets when
/// overlap_comm is off (Note [ZeRO-2 gradient ownership]); with buckets of Ψ/8 that is
/// bΨ/N + bΨ/4 < bΨ (stage 1's full gradient) for every N >= 2, and eight buckets let the first
/// reduction start while backward is still producing the others. DeepSpeed's fixed 5e8 is larger than
/// any model below 500 M parameters, so its single bucket is a full-size gradient buffer. Throws
/// zero::Error for psi < 1.
std::int64_t default_bucket_size(std::int64_t psi);

/// DeepSpeed's "zero_optimization" section plus the top-level keys ZeRO needs. Bucket sizes are in
/// ELEMENTS of the model dtype; kAutoBucketSize (the default) picks default_bucket_size(Ψ), any other
/// value is used as given.
struct ZeroOptions {
  int stage = 0;             // 0, 1 or 2 (3 throws); DeepSpeed's default is 0
  DType dtype = DType::f32;  // model dtype: f32, f16 or bf16
  std::int64_t reduce_bucket_size = kAutoBucketSize;
  std::int64_t allgather_bucket_size = kAutoBucketSize;
  // DeepSpeed's communication_data_type "fp32" for a 16-bit model: reductions travel in fp32 and are
  // rounded once (twice the bytes). false (the default, communication_data_type = the model dtype):
  // 16-bit partial sums, rounded at every hop (Note [Wire dtype] in distributed/communicator.cpp).
  bool reduce_in_fp32 = false;
  // After the step, issue the parameter all-gathers asynchronously, in flat (= forward) order; each
  // parameter's first use in the next forward waits for its own chunk only (Note [Overlapped
  // all-gather] in zero_optimizer.cpp). Bitwise the same results.
  bool overlap_param_gather = false;
  bool reduce_scatter = true;           // false: all-reduce each bucket and keep your slice (1.5× traffic)
  bool overlap_comm = false;            // issue bucket collectives asynchronously, wait at the end of backward
  bool contiguous_gradients = true;     // accepted for config compatibility; always on (see docs/zero.md)
  int gradient_accumulation_steps = 1;  // GAS: backward() calls per step()
  float gradient_clipping = 0.0f;       // max global L2 norm; 0 = off
  optim::LossScalerConfig fp16;         // used only when dtype == f16
  optim::AdamWOptions adam;
  float weight_decay = 0.0f;  // AdamW decay, for parameters whose decay flag is set
  NonfiniteGrads nonfinite_grads = NonfiniteGrads::error;  // f32/bf16 only (Note [Non-finite gradients])
};

/// Bytes of persistent buffers held by one rank (see ZeroOptimizer::memory()).
struct MemoryBreakdown {
  double params = 0;            // the flat model-dtype parameter buffer
  double grads = 0;             // gradient storage kept across a step
  double optimizer_states = 0;  // fp32 master + AdamW m + v
  double buckets = 0;           // IPG bucket buffers (stage 2), reported apart from the model states
  double recovery = 0;          // restore point of a failed backward (GAS > 1 only; Note [Exception safety])
  /// params + grads + optimizer_states (the ZeRO paper's "model states"; buckets excluded).
  double model_states() const { return params + grads + optimizer_states; }
};

/// The ZeRO paper's per-rank model-state memory for Ψ parameters on N ranks with AdamW (§3, Fig. 1):
/// params bΨ, grads bΨ (stage 0/1) or bΨ/N (stage 2), optimizer states KΨ (stage 0) or KΨ/N (1/2),
/// where b = bytes per model-dtype element and K = 12 for f16/bf16 (fp32 master + m + v) or 8 for f32
/// (the flat buffer is the master, so only m + v). For f16/bf16: stage 0 16Ψ, stage 1 4Ψ + 12Ψ/N,
/// stage 2 2Ψ + 14Ψ/N. Throws zero::Error for a stage outside 0..2, a non-float dtype or N < 1.
MemoryBreakdown expected_memory(int stage, DType dtype, double psi, int world_size);

class ZeroOptimizer {
 public:
  /// Takes over the trainable parameters of `params` (requires_grad; frozen ones are left alone).
  /// Collective: every rank must construct it with the same parameter list and options.
  /// Parameters on cuda keep every buffer on the device (Note [ZeRO on cuda] in the .cpp); `comm` must
  /// then take device buffers (NcclCommunicator or make_host_staged, distributed/nccl_communicator.h).
  /// Throws zero::Error for stage 3 or outside 0..2, a non-float dtype, a bucket size < 1,
  /// gradient_accumulation_steps < 1, negative clipping / weight decay, a null communicator, no
  /// trainable parameter, a parameter listed twice, a non-leaf parameter, parameters on different
  /// devices, and for the loss-scaler and AdamW option checks.
  ZeroOptimizer(std::vector<nn::NamedParameter> params, std::shared_ptr<Communicator> comm, ZeroOptions opts);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  /// One micro-step's backward: seeds autograd with loss_scale / GAS (the loss must be a one-element
  /// tensor), lets the hooks fill and reduce buckets, then flushes every remaining bucket and waits
  /// for in-flight collectives. Collective. Throws zero::Error if called more than GAS times before
  /// step(), if a parameter's gradient is computed twice in one backward, or if a hook fires outside
  /// this call (a plain loss.backward() on the model). Whatever throws inside (a hook, the model's
  /// backward, a collective) leaves the gradients accumulated so far exactly as before the call and
  /// the optimizer usable: when every rank saw the error, calling backward() again behaves as if the
  /// failed call never happened (Note [Exception safety]). Module parameters have no grad() outside
  /// this call: gradients live in the optimizer's buffers.
  void backward(const Tensor& loss);

  /// Applies the accumulated gradients: one pass over this rank's gradient for the global norm (which
  /// also detects inf/NaN), one control all-reduce (norm + which parameters received a gradient),
  /// unscale + clip, AdamW on this rank's partition (parameters no rank produced a gradient for are
  /// left alone: Note [Unused parameters]), cast back, all-gather. Returns false (parameters untouched,
  /// gradients cleared) if the gradient is non-finite on any rank and the step is skipped: always for
  /// f16 (the loss scale is lowered), for f32/bf16 with nonfinite_grads = skip. Collective. Throws
  /// zero::Error if fewer than gradient_accumulation_steps backward() calls preceded it, and for a
  /// non-finite f32/bf16 gradient with nonfinite_grads = error, naming the step and the first
  /// parameter whose gradient is non-finite. An error before the update changes nothing (step() may be
  /// called again); if the final all-gather fails the step is applied locally and the all-gather is
  /// completed by the next step() or backward() (Note [Exception safety]).
  bool step();

  /// Waits until every parameter holds the last step's values. Only needed with overlap_param_gather,
  /// and only by code that reads parameters OUTSIDE a module's forward (a checkpoint save, a copy of
  /// flat_params() or state_dict(), a comparison across ranks): a forward waits by itself, parameter
  /// by parameter (evaluation and sampling included). Collective only in that every rank must
  /// eventually complete the same gathers; it sends nothing new. Rethrows the error of a failed
  /// all-gather (the next step() or backward() then redoes it). A no-op when nothing is in flight.
  void wait_for_params();

  /// Learning rate for the next step(). Throws zero::Error if lr < 0.
  void set_lr(float lr);
  float lr() const { return lr_; }
  /// The scale the next backward() multiplies the loss by (1 unless dtype is f16).
  float loss_scale() const;
  /// Steps skipped for overflow so far.
  std::int64_t skipped_steps() const { return skipped_steps_; }
  /// Steps applied so far (the AdamW step count).
  std::int64_t steps() const { return step_count_; }
  /// Global L2 norm of the last step's averaged gradient, unscaled and before clipping (inf/NaN on an
  /// overflowed step).
  double last_grad_norm() const { return last_grad_norm_; }
  const FlatLayout& layout() const { return layout_; }
  const ZeroOptions& options() const { return opts_; }
  /// The flat model-dtype parameter buffer ([padded_numel]); module parameters are views into it.
  /// With overlap_param_gather, call wait_for_params() before reading it.
  const Tensor& flat_params() const { return flat_params_; }
  /// Persistent buffers of this rank, in bytes: params = flat buffer; grads = full flat gradient
  /// (stages 0/1) or the partition gradient (stage 2); optimizer_states = fp32 master (none for f32:
  /// the flat buffer is the master) + m + v, for everything (stage 0) or the partition (1/2);
  /// buckets = the stage-2 bucket pool as allocated so far (stages 0/1 reduce in place in the flat
  /// gradient and hold none).
  MemoryBreakdown memory() const;

  // ---- what a checkpoint reads and restores (distributed/checkpoint.h) ----
  /// The flat range this rank steps and keeps fp32 state for: [0, padded_numel) at stage 0, its
  /// partition [r·P, (r+1)·P) at stages 1/2. Elements.
  std::int64_t region_begin() const { return region_begin_; }
  std::int64_t region_size() const { return region_size_; }
  /// fp32 [region_size] buffers on the parameters' device: the master weights (for f32 the flat
  /// buffer's region itself), AdamW exp_avg (m) and exp_avg_sq (v). The handles are const, the
  /// elements are not: a checkpoint load writes them, then calls sync_params_from_master().
  const Tensor& master() const { return master_; }
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  const optim::LossScaler& loss_scaler() const { return scaler_; }
  /// Sets the step counters and, for f16, the loss scaler's state. Throws zero::Error for negative
  /// counts or between backward() and step().
  void restore_counters(std::int64_t steps, std::int64_t skipped_steps, const optim::LossScaler::State* scaler);
  /// Rounds the master region into the model-dtype flat buffer (f16/bf16; f32 shares it) and
  /// all-gathers it (stages 1/2), as the end of step() does. Collective.
  void sync_params_from_master();
  /// Per-parameter AdamW step counts, parallel to layout().params(): the steps that updated it, used
  /// for its bias correction. A parameter that no rank produced a gradient for during a whole
  /// accumulation is not stepped, so its count stays behind steps() (Note [Unused parameters]).
  const std::vector<std::int64_t>& param_steps() const { return param_steps_; }
  /// Restores the counts (loading a checkpoint). Throws zero::Error unless there is one count per
  /// layout parameter, each in [0, steps()].
  void set_param_steps(std::vector<std::int64_t> steps);

 private:
  struct InFlight {
    int bucket;
    std::shared_ptr<Work> work;
    int buffer;  // stage 2: pool index; -1 otherwise
  };

  void on_gradient(std::size_t i, Tensor& param);
  void reset_backward_state();
  void complete(const InFlight& f);
  void release_buffer(const InFlight& f);
  void detach_grads();
  Tensor& gradient_store();
  void finish_pending_gather();
  [[noreturn]] void throw_nonfinite(const Tensor& grad, std::int64_t step);
  void issue_ready_buckets();
  void issue_bucket(int k);
  void finish(const InFlight& f);
  void finish_completed();
  void wait_all();
  int bucket_buffer(int k);
  int acquire_buffer();
  void zero_gradients();
  void all_gather_params();
  /// One all-gather chunk starting at flat element `begin`; the Work when `async`, else null.
  std::shared_ptr<Work> gather_chunk(std::int64_t begin, bool async);
  void start_param_gather();
  void wait_for_param(const Tensor& param);
  void point_grads_at_flat();

  ZeroOptions opts_;
  std::shared_ptr<Communicator> comm_;
  int rank_ = 0;
  int world_ = 1;
  Device device_ = Device::cpu;  // the parameters' device: every buffer below lives there
  FlatLayout layout_;
  std::vector<Tensor> params_;  // parallel to layout_.params()
  std::vector<int> hook_ids_;
  std::vector<Bucket> buckets_;

  Tensor flat_params_;                     // [padded] model dtype
  Tensor flat_grads_;                      // stages 0/1: [padded] model dtype
  Tensor partition_grads_;                 // stage 2: [P] model dtype
  Tensor master_;                          // fp32 [region]: the flat buffer's region itself for f32
  Tensor exp_avg_, exp_avg_sq_;            // fp32 [region]
  std::int64_t region_begin_ = 0;          // flat offset of what this rank steps: 0 (stage 0) or r·P
  std::int64_t region_size_ = 0;           // padded (stage 0) or P
  std::vector<ParamSlice> update_slices_;  // what this rank steps, in flat order

  // Per-backward bucket bookkeeping (Note [Bucket order]).
  bool in_backward_ = false;
  bool reducing_ = false;            // this backward reduces (stage 2, or the accumulation boundary)
  std::vector<char> delivered_;      // per parameter
  std::vector<int> pending_;         // per bucket: overlapping parameters not yet delivered
  int next_bucket_ = 0;              // lowest bucket not yet issued
  std::vector<InFlight> in_flight_;  // issued and not finished, in issue order
  std::exception_ptr deferred_error_;  // a failed collective noticed early; wait_all rethrows it

  // Stage 2 bucket pool (Note [ZeRO-2 gradient ownership]).
  std::vector<Tensor> pool_;  // each [reduce_bucket_size] model dtype
  std::vector<int> free_buffers_;
  std::vector<int> bucket_buffer_;  // per bucket: pool index or -1
  std::vector<Tensor> deferred_;    // per parameter: its gradient, until its last bucket is issued

  optim::LossScaler scaler_;
  float backward_scale_ = 1.0f;  // the scale this accumulation's backward calls used
  float lr_ = 0.0f;
  int micro_step_ = 0;  // backward() calls since the last step()
  std::int64_t step_count_ = 0;
  std::int64_t skipped_steps_ = 0;
  double last_grad_norm_ = 0.0;

  // Note [Unused parameters] and Note [Exception safety].
  std::vector<char> used_;                 // per parameter: this rank delivered a gradient this accumulation
  std::vector<std::int64_t> param_steps_;  // per parameter: AdamW step count
  Tensor grad_backup_;                     // copy of gradient_store() taken by backward() when micro_step_ > 0
  bool gather_pending_ = false;            // the last step's all-gather failed; finish it before going on

  // Note [Overlapped all-gather]: chunk c covers flat elements [c·allgather_bucket_size, +size).
  std::vector<std::shared_ptr<Work>> gather_works_;  // per chunk, while in flight; empty otherwise
  std::vector<char> param_gathered_;                 // per parameter: its chunks have been waited for
  std::unordered_map<const TensorImpl*, std::size_t> param_index_;
  int use_hook_id_ = -1;
};

}  // namespace zero::dist
