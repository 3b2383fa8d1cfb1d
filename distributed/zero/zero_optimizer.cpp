#include "distributed/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_set>

#include "autograd/autograd.h"
#include "core/check.h"
#include "core/trace.h"
#include "optim/clip.h"

namespace zero::dist {

// Note [ZeRO on cuda]
// ~~~~~~~~~~~~~~~~~~~
// With parameters on cuda every buffer (flat parameters and gradients, bucket pool, master, m, v) is
// allocated on the parameters' device, and everything the parts do to them goes through calls that
// pick the device themselves: Tensor::copy_ / zero_, the backend's accumulate, optim::scale_grad_,
// optim::grad_sq_norm and optim::adamw_update (all through core/backend.h). No ZeRO file branches on
// the device. The communicator is handed device pointers (NCCL, or MPI staged through pinned host
// memory: distributed/comm/nccl_communicator.h).

// Note [Exception safety]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Anything can throw inside backward(): a user hook, an op's backward (a shape error), a collective,
// our own checks. The promise: the call leaves the accumulated gradients, parameters, optimizer state
// and loss scaler as they were before it, and the optimizer usable. How:
//   - stages 0/1 let autograd accumulate straight into the flat gradient and, at the accumulation
//     boundary, reduce buckets IN PLACE there, so a failure mid-backward leaves a mix of old, new and
//     averaged values. backward() therefore opens a BackwardRestorePoint: with micro_step_ == 0 the
//     state before the call is all zeros (restored by zeroing, no copy); with micro_step_ > 0 it copies
//     the accumulated gradient (stage 2: the partition gradient, which deliveries add into) first.
//     Cost: only with GAS > 1, one copy of Ψ model-dtype elements per micro-step after the first
//     (a memcpy, ~0.1 ms for the 0.8 M-parameter example; stage 2 copies Ψ/N), and a buffer of that
//     size (memory().recovery). Letting autograd write each micro-step into a separate buffer and
//     adding it in afterwards would cost the same memory plus an add pass per micro-step, and would
//     still need a copy at the boundary, where the in-place reduction destroys the local sum;
//   - on failure the restore point undoes itself: the reducer waits for every collective in flight
//     (its buffer is ours until it finishes) and returns its pool buffers (and, with error feedback,
//     puts back the residual its bucket issues rewrote: Note [Error feedback state] in
//     gradient_reducer.cpp), then the accumulated gradient is put back; micro_step_ is left unchanged;
//   - module parameters carry no grad() outside backward(): the views into the flat gradient are
//     attached at its start and detached at its end. A plain loss.backward() then makes autograd
//     allocate fresh gradients, and the hook that refuses it drops them, so nothing reaches our buffers;
//   - step() does all its fallible communication (the control all-reduce) before it changes
//     anything, and an error there (or the non-finite error) leaves micro_step_ == GAS, so step() can
//     be called again. Only the final all-gather comes after the update: rolling it back would need
//     a copy of the whole optimizer state every step, so instead the update is committed (moments,
//     step counts, loss scale, cleared gradients) before it, and if it fails the gather is simply
//     redone (it is idempotent: every rank re-sends its own updated partition) at the start of the
//     next step() or backward().
// Recovery is consistent across ranks when every rank saw the same failure (a deterministic error, an
// injected fault: tests/distributed/test_reliability.cpp). An error on some ranks only leaves the
// others waiting in a collective; that ends the job instead (Note [No hang] in job_runtime.cpp).

// Note [Unused parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's rule, which optim::AdamW follows: a parameter whose grad is None is not stepped at all (no
// weight decay, no moment decay, its step count does not advance). Under data parallelism "None" must
// be agreed on: a parameter is unused only if NO rank produced a gradient for it during the whole
// accumulation; a parameter used on some ranks only is a normal parameter (the others contribute
// zeros). Each rank records which hooks fired (GradientReducer::used, OR over micro-steps); step()
// sums these flags over ranks in the same control all-reduce that carries the norm's partial sums (one
// call of (1 + #parameters) doubles, counted as control bytes), and skips the slices of parameters
// nobody used. Bias correction then needs each parameter's own step count (param_steps()), as PyTorch
// keeps in state['step']: a parameter that sat out k steps is corrected with steps() - k.

// Note [Non-finite gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// One NaN in one rank's batch reaches every rank through the reduction and, applied, turns every
// parameter into NaN. step() already makes one pass over its gradient for the global norm (sum of
// squares in fp64); that sum is finite exactly when every element is (an fp32 element's square is at
// most ~1.2e77), and the summed partials are non-finite on every rank if they are on one. So the check
// costs no extra sweep and no extra collective. f16 treats it as overflow (skip, lower the scale: the
// loss scaler's rule); f32/bf16 throw by default, naming the step and, found by a second sweep that
// runs only on this error path, the first parameter with a non-finite gradient (agreed by a min
// all-reduce over the owners); nonfinite_grads = skip skips the step as fp16 does. A skip is not a cure:
// a run whose every step is non-finite would "train" forever without changing a weight, so skip mode
// stops, throwing NonfiniteSkipLimitError, at the nonfinite_skip_limit-th skipped step in a row (an
// applied step resets the count; 0 never stops). It is fp16's rule at the minimum loss scale (Note
// [Stopping at the minimum scale] in optim/loss_scaler.cpp), where a smaller scale can no longer help:
// f32/bf16 have no scale to lower, so every skip counts, and the default limit is the same 1. The count
// is saved in checkpoints, so a resumed run stops where the uninterrupted one would. Every rank sees
// the same non-finite norm, so every rank throws at the same step.

namespace {

// Note [Exception safety]: what a failed backward() undoes. Opened before autograd runs; unless
// commit() is called, its destructor makes the reducer abandon the backward and puts the accumulated
// gradient back (a copy taken here when earlier micro-steps accumulated something, else zeros).
class BackwardRestorePoint {
 public:
  BackwardRestorePoint(GradientReducer& reducer, PartitionedParameters* partitioned, Tensor& backup,
                       bool has_accumulated)
      : reducer_(reducer), partitioned_(partitioned), backup_(backup), copy_(has_accumulated) {
    if (!copy_) return;
    const Tensor& acc = reducer_.accumulated();
    if (!backup_.defined()) backup_ = Tensor::empty({acc.numel()}, acc.dtype(), acc.device());
    backup_.copy_(acc);
  }
  ~BackwardRestorePoint() {
    if (committed_) return;
    reducer_.abandon_backward();
    if (partitioned_ != nullptr) partitioned_->release_all();
    try {
      Tensor acc = reducer_.accumulated();
      if (copy_)
        acc.copy_(backup_);
      else
        acc.zero_();
    } catch (...) {
      // A failed copy back leaves nothing more to undo; the original error is the one to report.
    }
  }
  BackwardRestorePoint(const BackwardRestorePoint&) = delete;
  BackwardRestorePoint& operator=(const BackwardRestorePoint&) = delete;
  void commit() { committed_ = true; }

 private:
  GradientReducer& reducer_;
  PartitionedParameters* partitioned_;  // stage 3: its gathered units are freed too
  Tensor& backup_;
  bool copy_;
  bool committed_ = false;
};

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::vector<nn::NamedParameter> params, std::shared_ptr<Communicator> comm,
                             ZeroOptions opts)
    : comm_(std::move(comm)),
      scaler_(opts.dtype == DType::f16 ? opts.fp16 : optim::LossScalerConfig{.loss_scale = 1.0f}) {
  check_zero_options(opts);
  lr_ = opts.adam.lr;
  ZERO_CHECK(comm_ != nullptr, "ZeRO: null communicator");
  rank_ = comm_->rank();
  world_ = comm_->world_size();

  // ---- the trainable parameters, in the order given (frozen ones stay where they are) ----
  std::vector<FlatLayout::Entry> entries;
  std::unordered_set<const TensorImpl*> seen;
  Device device = Device::cpu;  // the parameters' device: every buffer lives there (Note [ZeRO on cuda])
  for (nn::NamedParameter& p : params) {
    ZERO_CHECK(p.tensor.defined(), "ZeRO: parameter '{}' is undefined", p.name);
    if (!p.tensor.requires_grad()) continue;
    ZERO_CHECK(p.tensor.is_leaf(), "ZeRO: parameter '{}' is not a leaf tensor", p.name);
    if (params_.empty()) device = p.tensor.device();
    ZERO_CHECK(p.tensor.device() == device,
               "ZeRO: parameter '{}' is on {} but the first one is on {}; move the "
               "model with Module::to(Device) first",
               p.name, device_name(p.tensor.device()), device_name(device));
    ZERO_CHECK(seen.insert(p.tensor.impl()).second, "ZeRO: parameter '{}' is listed twice", p.name);
    entries.push_back({p.name, p.tensor.shape(), p.decay});
    params_.push_back(p.tensor);
  }
  plan_ = plan_zero(entries, world_, opts);
  // Note [Wire dtype] (distributed/comm/communicator.cpp): DeepSpeed's communication_data_type.
  comm_->set_reduce_in_fp32(opts.reduce_in_fp32 && opts.dtype != DType::f32);
  comm_->set_fp32_accumulation(opts.reduce_scatter_with_fp32_accumulation);
  comm_->set_quantized_gradients(static_cast<std::size_t>(plan_.options.quantized_gradients_block));

  const FlatLayout& layout = plan_.layout;
  if (plan_.options.stage == 3) {
    // This rank keeps its partition only; the parameters become views of their units' buffers, which
    // hold values only while a layer uses them. The hooks go on after the reducer's.
    reducer_ = std::make_unique<GradientReducer>(plan_, rank_, comm_, params_, device);
    Tensor shard = shard_of_rank0_weights(device);
    // The gathers travel on a channel of their own (Note [One schedule] in partitioned_parameters.cpp),
    // and a collective the program issues here during a forward first settles that forward's gathers.
    partitioned_ = std::make_unique<PartitionedParameters>(plan_, rank_, comm_->duplicate(), shard, params_);
    optimizer_ = std::make_unique<ShardedOptimizer>(plan_, rank_, shard);
    comm_->set_before_collective([this] {
      if (!in_own_collectives_ && !partitioned_->in_backward()) partitioned_->settle();
    });
    return;
  }

  // ---- flat parameter buffer; module tensors become views into it ----
  flat_params_ = Tensor::zeros({layout.padded_numel()}, opts.dtype, device);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRange& r = layout.params()[i];
    Tensor view = flat_params_.as_strided(r.shape, contiguous_strides(r.shape), r.offset);
    view.copy_(params_[i]);  // converts to the model dtype
    params_[i].set_data(view);
  }
  // Every rank starts from rank 0's weights (models built from the same seed already agree).
  if (world_ > 1)
    comm_->with_purpose("broadcast of rank 0's parameters")
        .broadcast(flat_params_.raw_data(), static_cast<std::size_t>(layout.padded_numel()), opts.dtype, 0);
  flat_params_.storage()->bump_version();  // written behind the tensors' back (Note [Compute copies])

  reducer_ = std::make_unique<GradientReducer>(plan_, rank_, comm_, params_, device);
  optimizer_ = std::make_unique<ShardedOptimizer>(plan_, rank_,
                                                  flat_range(flat_params_, plan_.region_begin(rank_), plan_.region_size(rank_)));
  gather_ = std::make_unique<ParameterGather>(plan_, rank_, comm_, flat_params_, params_);
}

Tensor ZeroOptimizer::shard_of_rank0_weights(Device device) {
  // Stage 3: this rank's partition of rank 0's weights, one parameter at a time, so that no rank ever
  // holds the whole flat buffer: only the model as it was built plus one parameter in the model dtype.
  const FlatLayout& layout = plan_.layout;
  const DType dt = plan_.options.dtype;
  const std::int64_t begin = layout.partition_begin(rank_), end = layout.partition_end(rank_);
  Tensor shard = Tensor::zeros({layout.partition_size(rank_)}, dt, device);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRange& r = layout.params()[i];
    const std::int64_t lo = std::max(r.offset, begin), hi = std::min(r.end(), end);
    if (r.numel == 0) continue;
    Tensor full = Tensor::empty(r.shape, dt, device);
    full.copy_(params_[i]);  // converts to the model dtype
    if (world_ > 1) comm_->with_purpose("broadcast of " + r.name).broadcast(full.raw_data(), static_cast<std::size_t>(r.numel), dt, 0);
    if (lo < hi) flat_range(shard, lo - begin, hi - lo).copy_(flat_range(full, lo - r.offset, hi - lo));
  }
  return shard;
}

ZeroOptimizer::~ZeroOptimizer() {
  if (partitioned_) comm_->set_before_collective(nullptr);
}

void ZeroOptimizer::set_lr(float lr) {
  ZERO_CHECK(lr >= 0.0f, "ZeRO: learning rate must be >= 0, got {}", lr);
  lr_ = lr;
}

float ZeroOptimizer::loss_scale() const { return scaler_.scale(); }

MemoryBreakdown ZeroOptimizer::memory() const {
  MemoryBreakdown m;
  if (partitioned_) {
    m.params = static_cast<double>(partitioned_->shard().nbytes());
    m.gathered = static_cast<double>(partitioned_->max_live_elements()) * static_cast<double>(dtype_size(plan_.options.dtype));
  } else {
    m.params = static_cast<double>(flat_params_.nbytes());
  }
  m.grads = static_cast<double>(reducer_->accumulated().nbytes());
  m.optimizer_states = optimizer_->bytes();
  m.buckets = reducer_->pool_bytes();
  m.residual = reducer_->residual_bytes();
  if (grad_backup_.defined()) m.recovery = static_cast<double>(grad_backup_.nbytes());
  m.recovery += reducer_->residual_recovery_bytes();
  return m;
}

void ZeroOptimizer::wait_for_params() {
  if (gather_) gather_->wait_in_flight();
}

void ZeroOptimizer::gather_parameters() {
  wait_for_params();
  if (partitioned_) partitioned_->gather_all();
}

// ---- backward ----------------------------------------------------------------------------------------

void ZeroOptimizer::backward(const Tensor& loss) {
  const int gas = plan_.options.gradient_accumulation_steps;
  ZERO_CHECK(micro_step_ < gas,
             "ZeRO: backward() called {} times since the last step() with gradient_accumulation_steps = {}; "
             "call step() after every {} backward() calls",
             micro_step_ + 1, gas, gas);
  ZERO_CHECK(loss.defined() && loss.numel() == 1, "ZeRO: backward() needs a one-element loss tensor");
  ZERO_CHECK(is_floating(loss.dtype()), "ZeRO: the loss must be a float tensor, got {}", dtype_name(loss.dtype()));
  if (gather_) gather_->complete();  // the last step's parameters must be in place (Note [Overlapped all-gather])
  // The scale is fixed for a whole accumulation: step() unscales with the scale backward used, not the
  // one the scaler moves to afterwards (DeepSpeed unscales with the post-update scale).
  if (micro_step_ == 0) {
    backward_scale_ = scaler_.scale();
    comm_->set_step(step_count_ + skipped_steps_ + 1);
  }
  BackwardRestorePoint restore(*reducer_, partitioned_.get(), grad_backup_, micro_step_ > 0);
  reducer_->begin_backward(plan_.options.stage >= 2 || micro_step_ + 1 == gas);
  // Seeding backward with scale/GAS is the same as backward of loss·scale/GAS, without a graph node.
  const Tensor seed =
      Tensor::full(loss.shape(), backward_scale_ / static_cast<float>(gas), loss.dtype(), loss.device());
  trace::Span span("backward", "backward");
  if (partitioned_) {
    // Stage 3: each node's unit is gathered before it runs (Note [Record context] in autograd.h).
    partitioned_->begin_backward();
    autograd::backward(loss, seed, false, [this](std::uint32_t c) {
      reducer_->progress();
      partitioned_->before_node(c);
    });
    partitioned_->finish_backward();  // before waiting on a reduction (Note [Bucket order])
  } else {
    autograd::backward(loss, seed);  // the reducer's hooks fill and issue buckets as gradients become final
  }
  reducer_->end_backward();  // the remaining buckets, then wait for every reduction
  if (partitioned_) partitioned_->end_backward();
  restore.commit();
  ++micro_step_;
}

// ---- step: one function per stage --------------------------------------------------------------------

bool ZeroOptimizer::step() {
  // Stage 3: the forward gathers since the last backward end here, and the collectives below are the
  // optimizer's own (the hook set in the constructor leaves them alone).
  if (partitioned_) partitioned_->settle();
  in_own_collectives_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{in_own_collectives_};
  // Note [Exception safety]: the previous step's all-gather failed; completing it finishes that step.
  if (gather_ && gather_->failed() && micro_step_ == 0) {
    gather_->complete();
    return true;
  }
  if (gather_) gather_->complete();  // Note [Overlapped all-gather]: a no-op unless gathers are in flight
  const int gas = plan_.options.gradient_accumulation_steps;
  ZERO_CHECK(micro_step_ == gas,
             "ZeRO: step() after {} backward() calls; gradient_accumulation_steps = {} needs {} backward() calls "
             "before each step()",
             micro_step_, gas, gas);
  comm_->set_step(step_count_ + skipped_steps_ + 1);
  switch (plan_.options.stage) {
    case 0: return step_stage_0();
    case 1: return step_stage_1();
    case 2: return step_stage_2();
    default: return step_stage_3();
  }
}

// Stage 0, plain data parallelism (the baseline).
//   reduce: done — the backward that ended the accumulation all-reduced every bucket of the flat
//           gradient, so every rank holds the whole averaged gradient.
bool ZeroOptimizer::step_stage_0() {
  const Tensor grad = reducer_->gradient();  // [padded]: the whole averaged gradient
  // norm: every rank holds the whole gradient, so its own sum of squares is already the global one.
  const StepDecision d = agree_on_step(grad, /*norm_is_global=*/true);
  if (!d.finite) return skip_step(grad);
  // update: AdamW on every element, on every rank. gather: nothing, nobody is missing anything.
  update(grad, d);
  return true;
}

// Stage 1, optimizer states partitioned (P_os).
//   reduce: done — the backward that ended the accumulation reduce-scattered every bucket in place in
//           the flat gradient: only this rank's partition of it holds averaged values (the rest is
//           never read).
bool ZeroOptimizer::step_stage_1() {
  const Tensor grad = reducer_->gradient();  // [P]: this rank's partition of the gradient
  // norm: each rank's partial sum of squares, summed over ranks.
  const StepDecision d = agree_on_step(grad, /*norm_is_global=*/false);
  if (!d.finite) return skip_step(grad);
  // update: AdamW on this rank's partition only.
  update(grad, d);
  // gather: every rank receives every updated partition.
  gather_->all_gather();
  return true;
}

// Stage 2, optimizer states and gradients partitioned (P_os+g).
//   reduce: done — EVERY micro-step's backward reduce-scattered its buckets as they filled, added this
//           rank's slice into its partition gradient and released the rest (Note [ZeRO-2 gradient
//           ownership] in gradient_reducer.cpp).
// From here on the step is stage 1's: norm of the partitions, update of mine, all-gather.
bool ZeroOptimizer::step_stage_2() { return step_stage_1(); }

// Stage 3, optimizer states, gradients and parameters partitioned (P_os+g+p).
//   reduce: done, as at stage 2; the units the backward gathered are freed again.
bool ZeroOptimizer::step_stage_3() {
  const Tensor grad = reducer_->gradient();  // [P]: this rank's partition of the gradient
  // norm: each rank's partial sum of squares, summed over ranks.
  const StepDecision d = agree_on_step(grad, /*norm_is_global=*/false);
  if (!d.finite) return skip_step(grad);
  // update: AdamW on this rank's shard, which is all of the parameters it keeps.
  update(grad, d);
  // gather: nothing now. Units a forward gathered since backward hold old values: free them; the next
  // forward gathers each unit when it reads it (Note [Gathering on use] in partitioned_parameters.cpp).
  partitioned_->release_all();
  return true;
}

ZeroOptimizer::StepDecision ZeroOptimizer::agree_on_step(const Tensor& grad, bool norm_is_global) {
  // One pass for the norm: fp64 sum of squares, non-finite iff an element is (Note [Non-finite
  // gradients]); one control all-reduce for the norm's partial sums and who used each parameter (Note
  // [Unused parameters]). When every rank holds the whole gradient its own sum is already global.
  std::optional<trace::Span> norm_span;
  norm_span.emplace("grad norm", "step");
  const double local_sq = optim::grad_sq_norm(grad);
  const std::vector<char>& used = reducer_->used();
  std::vector<double> control(1 + params_.size());
  control[0] = norm_is_global ? 0.0 : local_sq;
  for (std::size_t i = 0; i < params_.size(); ++i) control[1 + i] = used[i] ? 1.0 : 0.0;
  if (world_ > 1) comm_->with_purpose("gradient norm and used parameters").all_reduce_sum(control);
  const double sq = norm_is_global ? local_sq : control[0];
  norm_span.reset();

  StepDecision d;
  d.finite = std::isfinite(sq);
  if (!d.finite) return d;
  // Unscale by the scale backward used, and clip (torch.nn.utils.clip_grad_norm_'s rule).
  last_grad_norm_ = std::sqrt(sq) / backward_scale_;
  double factor = 1.0 / backward_scale_;
  const float clip = plan_.options.gradient_clipping;
  if (clip > 0.0f && std::isfinite(last_grad_norm_)) {
    const double clip_coef = static_cast<double>(clip) / (last_grad_norm_ + 1e-6);
    if (clip_coef < 1.0) factor *= clip_coef;
  }
  d.grad_factor = static_cast<float>(factor);
  d.stepped.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) d.stepped[i] = control[1 + i] > 0.0 || (world_ == 1 && used[i]);
  return d;
}

bool ZeroOptimizer::skip_step(const Tensor& grad) {
  // A non-finite gradient on some rank: fp16 overflow (or nonfinite_grads = skip) skips the step
  // everywhere and lowers the loss scale; f32/bf16 stop by default, having changed nothing.
  const DType dt = plan_.options.dtype;
  if (dt != DType::f16 && plan_.options.nonfinite_grads == NonfiniteGrads::error)
    throw_nonfinite(grad, step_count_ + skipped_steps_ + 1);
  last_grad_norm_ = std::numeric_limits<double>::infinity();
  reducer_->discard_residual_updates();  // Note [Error feedback state]: as if the step never happened
  reducer_->zero_grad();
  ++skipped_steps_;
  micro_step_ = 0;
  if (dt == DType::f16) {
    scaler_.update(true);  // may throw optim::MinLossScaleError, with the step counted
    return false;
  }
  ++consecutive_skips_;
  const int limit = plan_.options.nonfinite_skip_limit;
  if (limit > 0 && consecutive_skips_ >= limit)
    throw NonfiniteSkipLimitError(fmt::format(
        "step {}: non-finite gradient (inf or NaN) on {} consecutive step(s), all skipped (nonfinite_skip_limit "
        "{}): training cannot make progress; check the data and the weights, or lower the learning rate",
        step_count_ + skipped_steps_, consecutive_skips_, limit));
  return false;
}

void ZeroOptimizer::update(const Tensor& grad, const StepDecision& d) {
  // From here on nothing can fail before the all-gather (Note [Exception safety]): the step is committed.
  micro_step_ = 0;
  ++step_count_;
  consecutive_skips_ = 0;
  optimizer_->step(grad, d.grad_factor, d.stepped, lr_);
  reducer_->zero_grad();
  scaler_.update(false);
}

void ZeroOptimizer::throw_nonfinite(const Tensor& grad, std::int64_t step) {
  // Error path only (Note [Non-finite gradients]): find the first parameter whose slice on this rank
  // is non-finite, agree on the lowest over ranks, and report. Nothing has been changed.
  double first = static_cast<double>(params_.size());
  const std::int64_t region_begin = optimizer_->region_begin();
  for (const ParamSlice& s : plan_.region_slices(rank_)) {
    if (static_cast<double>(s.param) >= first) continue;
    if (!std::isfinite(optim::grad_sq_norm(flat_range(grad, s.flat_offset - region_begin, s.length))))
      first = static_cast<double>(s.param);
  }
  if (world_ > 1) first = -comm_->all_reduce_max(-first);
  const auto index = static_cast<std::size_t>(first);
  const std::string where =
      index < params_.size() ? fmt::format(", first in parameter '{}'", plan_.layout.params()[index].name) : "";
  throw Error(
      fmt::format("step {}: non-finite gradient (inf or NaN){}; the step was not applied (set "
                  "nonfinite_grads to \"skip\" to skip such steps)",
                  step, where));
}

// ---- what a checkpoint reads and restores ------------------------------------------------------------

void ZeroOptimizer::restore_counters(std::int64_t steps, std::int64_t skipped_steps,
                                     const optim::LossScaler::State* scaler, std::int64_t consecutive_skips) {
  ZERO_CHECK(steps >= 0 && skipped_steps >= 0 && consecutive_skips >= 0,
             "ZeRO: step counts must be >= 0, got {}, {} and {}", steps, skipped_steps, consecutive_skips);
  ZERO_CHECK(micro_step_ == 0, "ZeRO: restore_counters() between backward() and step()");
  step_count_ = steps;
  skipped_steps_ = skipped_steps;
  consecutive_skips_ = consecutive_skips;
  // Every parameter stepped every step unless the checkpoint says otherwise (set_param_steps).
  optimizer_->reset_param_steps(steps);
  if (scaler != nullptr && plan_.options.dtype == DType::f16) scaler_.set_state(*scaler);
}

void ZeroOptimizer::set_residual(const std::vector<std::int8_t>& values, const std::vector<float>& scales) {
  ZERO_CHECK(micro_step_ == 0, "ZeRO: set_residual() between backward() and step()");
  reducer_->set_residual(values, scales);
}

void ZeroOptimizer::set_param_steps(std::vector<std::int64_t> steps) {
  optimizer_->set_param_steps(std::move(steps), step_count_);
}

void ZeroOptimizer::sync_params_from_master() {
  if (partitioned_) partitioned_->settle();
  optimizer_->write_master_to_params();
  if (partitioned_) partitioned_->release_all();
  if (gather_ && plan_.options.stage != 0) gather_->all_gather_and_wait();
}

}  // namespace zero::dist
