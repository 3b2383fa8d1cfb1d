// ZeroOptimizer: data-parallel AdamW with ZeRO stages 0 to 3 (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", SC20, arXiv 1910.02054), on top of one
// Communicator. A walk-through of one step, with the memory and traffic formulas, is docs/zero.md.
//
// It is the composition of four parts, each in its own file, built from one ZeroPlan (zero_plan.h):
//   GradientReducer        (gradient_reducer.h)        hooks → buckets → reduction → this rank's averaged gradient
//   ShardedOptimizer       (sharded_optimizer.h)       fp32 master + Adam m, v over the range this rank steps
//   ParameterGather        (parameter_gather.h)        stages 1/2: all-gather of the updated partitions
//   PartitionedParameters  (partitioned_parameters.h)  stage 3: each unit gathered while a layer uses it
// and the stages differ only in how those parts are set up and called:
//
//   stage  parameters kept  gradient kept        reduced                           optimizer state  after the update
//   0      all              whole flat gradient  all-reduce, at the GAS end        everything       nothing to gather
//   1      all              whole flat gradient  reduce-scatter, at the GAS end    my partition     all-gather
//   2      all              my partition only    reduce-scatter, every micro-step  my partition     all-gather
//   3      my partition     my partition only    reduce-scatter, every micro-step  my partition     nothing: units are
//                                                                                                    gathered on use
//   (reduce_scatter=false replaces the reduce-scatter by an all-reduce of which each rank keeps its slice)
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
// flat buffer; it also broadcasts rank 0's values so every rank starts from the same weights. At stage
// 3 it keeps only this rank's partition of that buffer (the shard) and re-points the tensors at views
// of their gather unit's buffer, which holds values only while a layer uses it; the gathers travel on a
// second channel of `comm` (Communicator::duplicate), and a collective the program issues on `comm`
// during a forward first ends that forward's gathers (Note [One schedule] in partitioned_parameters.cpp).
// The object must outlive every backward of the model and cannot be copied or moved (its parts' hooks
// point at them).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/zero/flat_layout.h"
#include "distributed/zero/gradient_reducer.h"
#include "distributed/zero/parameter_gather.h"
#include "distributed/zero/partitioned_parameters.h"
#include "distributed/zero/sharded_optimizer.h"
#include "distributed/zero/zero_plan.h"
#include "nn/module.h"
#include "optim/loss_scaler.h"

namespace zero::dist {

/// What step() throws when f32/bf16 training with nonfinite_grads = skip has skipped
/// nonfinite_skip_limit steps in a row (Note [Non-finite gradients] in zero_optimizer.cpp).
class NonfiniteSkipLimitError : public Error {
 public:
  using Error::Error;
};

class ZeroOptimizer {
 public:
  /// Takes over the trainable parameters of `params` (requires_grad; frozen ones are left alone).
  /// Collective: every rank must construct it with the same parameter list and options.
  /// Parameters on cuda keep every buffer on the device (Note [ZeRO on cuda] in the .cpp); `comm` must
  /// then take device buffers (NcclCommunicator or make_host_staged, distributed/comm/nccl_communicator.h).
  /// Throws zero::Error for a stage outside 0..3, a non-float dtype, a bucket size < 1,
  /// gradient_accumulation_steps < 1, negative clipping / weight decay, a null communicator, no
  /// trainable parameter, a parameter listed twice, a non-leaf parameter, parameters on different
  /// devices, and for the loss-scaler and AdamW option checks.
  ZeroOptimizer(std::vector<nn::NamedParameter> params, std::shared_ptr<Communicator> comm, ZeroOptions opts);
  /// At stage 3 the module's parameters hold no values once the optimizer is gone (every rank kept only
  /// its shard), except what gather_parameters() gathered last: call it first to keep the model.
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
  /// f16 (the loss scale is lowered), for f32/bf16 with nonfinite_grads = skip. A skipped step leaves
  /// every optimizer state bitwise as before its accumulation, the error-feedback residual included
  /// (Note [Error feedback state] in gradient_reducer.cpp). Collective. Throws
  /// NonfiniteSkipLimitError (the step counted as skipped) when it is the nonfinite_skip_limit-th
  /// f32/bf16 step in a row skipped, naming the step and the limit. Throws
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

  /// wait_for_params(), and at stage 3 the end of the forward's gathers and an all-gather of every unit
  /// (Note [One schedule] in partitioned_parameters.cpp): afterwards the module's parameters
  /// hold the last step's values, and forwards neither gather nor free anything, until the next
  /// backward() or step() (DeepSpeed's GatheredParameters), whatever stage3_max_live_parameters says.
  /// For code that reads parameters outside a forward (a comparison across ranks, a state_dict()) and
  /// for forwards that not every rank runs (sampling on rank 0). Collective at stage 3. Rethrows a
  /// failed all-gather.
  void gather_parameters();

  /// Learning rate for the next step(). Throws zero::Error if lr < 0.
  void set_lr(float lr);
  float lr() const { return lr_; }
  /// The scale the next backward() multiplies the loss by (1 unless dtype is f16).
  float loss_scale() const;
  /// Steps skipped for overflow so far.
  std::int64_t skipped_steps() const { return skipped_steps_; }
  /// f32/bf16: steps skipped in a row since the last applied one (what nonfinite_skip_limit counts).
  std::int64_t consecutive_skipped_steps() const { return consecutive_skips_; }
  /// Steps applied so far (the AdamW step count).
  std::int64_t steps() const { return step_count_; }
  /// Global L2 norm of the last step's averaged gradient, unscaled and before clipping (inf/NaN on an
  /// overflowed step).
  double last_grad_norm() const { return last_grad_norm_; }
  const FlatLayout& layout() const { return plan_.layout; }
  const ZeroOptions& options() const { return plan_.options; }
  /// The flat model-dtype parameter buffer ([padded_numel]); module parameters are views into it.
  /// With overlap_param_gather, call wait_for_params() before reading it. Undefined at stage 3, where
  /// no rank holds it: see partitioned().
  const Tensor& flat_params() const { return flat_params_; }
  /// Stage 3's parameters (the shard, the gathers, the live count); null at stages 0-2.
  const PartitionedParameters* partitioned() const { return partitioned_.get(); }
  /// Sizes, buckets and formulas of this configuration (bucket sizes resolved).
  const ZeroPlan& plan() const { return plan_; }
  /// Persistent buffers of this rank, in bytes, measured from what is allocated: params = flat buffer
  /// (stage 3: the shard); grads = full flat gradient (stages 0/1) or the partition gradient (2/3);
  /// optimizer_states = fp32 master (none for f32: the model's parameters are the master) + m + v,
  /// for everything (stage 0) or the partition (1-3); buckets = the stage-2/3 bucket pool (stages 0/1
  /// reduce in place and hold none); recovery = the restore point's copies (allocated by the first
  /// backward with GAS > 1: the accumulated gradient's and, at stages 2/3 with error feedback, the
  /// residual's); gathered = stage 3's most gathered parameter bytes alive at once so far; residual =
  /// error feedback's residual and its copy from the accumulation's start (Note [Error feedback state]).
  MemoryBreakdown memory() const;

  // ---- what a checkpoint reads and restores (distributed/run/checkpoint.h) ----
  /// The flat range this rank steps and keeps fp32 state for: [0, padded_numel) at stage 0, its
  /// partition (FlatLayout::partition_begin/end) at stages 1-3. Elements.
  std::int64_t region_begin() const { return optimizer_->region_begin(); }
  std::int64_t region_size() const { return optimizer_->region_size(); }
  /// fp32 [region_size] buffers on the parameters' device: the master weights (for f32 the flat
  /// buffer's region itself), AdamW exp_avg (m) and exp_avg_sq (v). The handles are const, the
  /// elements are not: a checkpoint load writes them, then calls sync_params_from_master().
  const Tensor& master() const { return optimizer_->master(); }
  const Tensor& exp_avg() const { return optimizer_->exp_avg(); }
  const Tensor& exp_avg_sq() const { return optimizer_->exp_avg_sq(); }
  const optim::LossScaler& loss_scaler() const { return scaler_; }
  /// Sets the step counters (`consecutive_skips`: consecutive_skipped_steps()) and, for f16, the loss
  /// scaler's state. Throws zero::Error for negative counts or between backward() and step().
  void restore_counters(std::int64_t steps, std::int64_t skipped_steps, const optim::LossScaler::State* scaler,
                        std::int64_t consecutive_skips = 0);
  /// Error feedback's residual of this rank (GradientReducer::residual_values / residual_scales: int8
  /// [padded_numel] and fp32 block scales, per bucket per rank slice); empty without error feedback.
  const std::vector<std::int8_t>& residual_values() const { return reducer_->residual_values(); }
  const std::vector<float>& residual_scales() const { return reducer_->residual_scales(); }
  /// Replaces this rank's residual with one saved by a run of the same plan (a checkpoint load).
  /// Throws zero::Error without error feedback, for sizes that differ from this run's, or between
  /// backward() and step().
  void set_residual(const std::vector<std::int8_t>& values, const std::vector<float>& scales);
  /// Rounds the master region into the model-dtype flat buffer (f16/bf16; f32 shares it) and
  /// all-gathers it (stages 1/2), as the end of step() does (stage 3: into the shard, and every gathered
  /// unit is freed). Collective.
  void sync_params_from_master();
  /// Per-parameter AdamW step counts, parallel to layout().params(): the steps that updated it, used
  /// for its bias correction. A parameter that no rank produced a gradient for during a whole
  /// accumulation is not stepped, so its count stays behind steps() (Note [Unused parameters]).
  const std::vector<std::int64_t>& param_steps() const { return optimizer_->param_steps(); }
  /// Restores the counts (loading a checkpoint). Throws zero::Error unless there is one count per
  /// layout parameter, each in [0, steps()].
  void set_param_steps(std::vector<std::int64_t> steps);

 private:
  // One function per stage: the paper's reduce → norm → update → gather, where "reduce" already
  // happened in backward (the GradientReducer) and each function says how.
  bool step_stage_0();
  bool step_stage_1();
  bool step_stage_2();
  bool step_stage_3();
  /// Stage 3's start: this rank's partition [P] (model dtype) of rank 0's parameters. Collective.
  Tensor shard_of_rank0_weights(Device device);

  /// What every rank agrees on before an update (Note [Unused parameters], Note [Non-finite gradients]).
  struct StepDecision {
    bool finite = true;              // the global gradient norm is finite
    float grad_factor = 1.0f;        // 1/loss scale × the clip coefficient
    std::vector<char> stepped;       // per parameter: some rank produced a gradient for it
  };
  StepDecision agree_on_step(const Tensor& grad, bool norm_is_global);
  bool skip_step(const Tensor& grad);
  void update(const Tensor& grad, const StepDecision& d);
  [[noreturn]] void throw_nonfinite(const Tensor& grad, std::int64_t step);

  ZeroPlan plan_;
  std::shared_ptr<Communicator> comm_;
  int rank_ = 0;
  int world_ = 1;
  std::vector<Tensor> params_;  // the module's trainable parameters, parallel to plan_.layout.params()
  Tensor flat_params_;          // [padded] model dtype; params_ are views of it (undefined at stage 3)
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::unique_ptr<ParameterGather> gather_;                // stages 1/2 (null at 0 and 3)
  std::unique_ptr<PartitionedParameters> partitioned_;    // stage 3 only

  optim::LossScaler scaler_;
  float backward_scale_ = 1.0f;  // the scale this accumulation's backward calls used
  float lr_ = 0.0f;
  int micro_step_ = 0;  // backward() calls since the last step()
  std::int64_t step_count_ = 0;
  std::int64_t skipped_steps_ = 0;
  std::int64_t consecutive_skips_ = 0;  // f32/bf16 skipped steps since the last applied one
  double last_grad_norm_ = 0.0;
  bool in_own_collectives_ = false;  // inside step(): stage 3's before-collective hook does nothing
  Tensor grad_backup_;  // the restore point's copy of the accumulated gradient (Note [Exception safety])
};

}  // namespace zero::dist
