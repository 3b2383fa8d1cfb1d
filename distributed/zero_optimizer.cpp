#include "distributed/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_set>

#include "autograd/autograd.h"
#include "nn/parameter_hooks.h"
#include "core/check.h"
#include "core/cpu/convert.h"
#include "core/trace.h"
#include "optim/clip.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#endif

namespace zero::dist {

// Note [Bucket order]
// ~~~~~~~~~~~~~~~~~~~
// Collectives must be issued by every rank in the same order with the same counts, but
// hooks fire in whatever order each rank's autograd engine reaches the parameters. DeepSpeed fills its
// IPG bucket in hook order and so relies on every rank firing hooks identically; a model whose graph
// differs between ranks (a parameter unused on one rank only) would deadlock or mix up gradients.
// We make the order a property of the LAYOUT instead:
//   - buckets are fixed ranges of the flat buffer, reduce_bucket_size elements each, cut from the END
//     of the buffer and numbered 0, 1, ... towards its start (FlatLayout::make_buckets). Backward
//     reaches the last layers first, and they sit at the end of named_parameters() order, so bucket 0
//     is usually the first to fill and the numbering follows the order gradients become final;
//   - a bucket is issued when every non-empty parameter overlapping it has delivered its gradient
//     (pending_[k] == 0) AND every lower-numbered bucket has been issued (next_bucket_ == k). So the
//     sequence of collectives is bucket 0, 1, 2, ... on every rank, whatever order its hooks fired in;
//     hook order only decides how early each one can go out (how much overlap we get);
//   - the epilogue at the end of backward issues every remaining bucket in order. A parameter that
//     received no gradient this backward (unused, no hook fired) contributes zeros: in stages 0/1 its
//     range of the flat gradient keeps what earlier micro-steps accumulated (zeros if none), in stage 2
//     its range of a freshly zeroed bucket buffer stays zero.
// A parameter larger than a bucket spans several consecutive buckets and counts in each one's pending;
// a bucket holding only padding has nothing pending and goes out as soon as its predecessors have.
// Because the ranges are fixed, the reduce-scatter counts of bucket k (how much of it falls in each
// rank's partition) are the same on every rank, and the result does not depend on the bucket size or on
// overlap_comm beyond floating-point summation order inside the collective, which is fixed per element.

// Note [ZeRO-2 gradient ownership]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In stage 2 a rank keeps gradients only for its own partition: partition_grads_, P = padded/N elements
// of the model dtype, persistent across micro-steps (it is where accumulation happens). Everything else
// is transient:
//   - autograd allocates param.grad fresh for every parameter (we leave it undefined before backward);
//   - the hook keeps it (deferred_) and releases the parameter's handle at once (set_grad(Tensor()));
//     when a bucket is issued, the slices of the kept gradients that fall in it are copied into one
//     pool buffer at their fixed offsets, and a gradient is dropped as soon as the bucket holding its
//     first element is out. So a full-size gradient never exists, and a pool buffer exists only from
//     the moment its bucket is issued until its reduction finishes;
//   - a bucket buffer comes from a small pool (zero-filled on acquisition, so unused parameters and
//     padding contribute zeros) and is reduced (pre-divided by N, then reduce-scattered: each rank
//     receives the sum of its own slice, in place in the buffer);
//   - the received slice is ADDED into partition_grads_ (micro-steps accumulate there), and the buffer
//     goes back to the pool.
// Reduction happens every micro-step (unlike stage 1, which keeps full gradients until the boundary),
// so stage 2 moves GAS·Ψ of reduce-scatter traffic per step: the price of not holding a full gradient.
// Copying at issue time rather than in the hook matters because hooks do not fire in flat order
// within a layer: a Linear's weight gradient arrives before its bias, which sits after the weight in
// the flat buffer, so the weight's buckets wait for the bias's. Copying in the hook would hold one
// buffer per waiting bucket (41 for a 32x128 weight in 100-element buckets); copying at issue holds one
// buffer per bucket in flight: exactly one without overlap_comm, however parameters fall across buckets.
// The kept gradients are autograd's per-parameter tensors, which existed anyway; they live a little
// longer (until the bucket holding their start is out). memory().buckets reports what the pool has
// allocated. The automatic bucket size and the bound it gives are in docs/zero.md ("Bucket size").

// Note [Overlapped all-gather]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// After the step every rank must receive every other rank's updated partition before it can run the
// next forward. With overlap_param_gather the all-gathers are issued asynchronously instead of waited
// for: one per chunk of allgather_bucket_size elements, in flat order, which is named_parameters()
// order and so (for GPT, and for any model that registers its layers in the order it runs them) the
// order the next forward reads them. The communication thread works through them while the training
// thread draws the next batch and starts the forward; each layer reads a parameter through
// Module::compute, whose parameter-use hook (nn/parameter_hooks.h) waits for the chunks covering that
// parameter only, once per step (param_gathered_). A forward that reads parameters in another order
// is still correct, it just waits earlier. The bytes gathered are the same as without overlap, so
// results are bitwise identical. Everything that reads parameters outside a forward (a checkpoint, a
// comparison across ranks) calls wait_for_params() first; backward() and step() wait for all chunks
// before they touch the gradients or the parameters (the step writes this rank's partition, which is
// the send buffer of an in-flight gather). A failed gather leaves gather_pending_ set, so it is redone
// synchronously by the next step() or backward() (Note [Exception safety]). What limits the overlap
// on a CPU is in docs/collectives.md: the communication thread needs a core to make progress.

// Note [Exception safety]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Anything can throw inside backward(): a user hook, an op's backward (a shape error), a collective,
// our own checks. The promise: the call leaves the accumulated gradients, parameters, optimizer state
// and loss scaler as they were before it, and the optimizer usable. How:
//   - stages 0/1 let autograd accumulate straight into flat_grads_ (param.grad views), and at the
//     accumulation boundary reduce buckets IN PLACE there, so a failure mid-backward leaves a mix of
//     old, new and averaged values. backward() therefore keeps a restore point: with micro_step_ == 0
//     the state before the call is all zeros (restored by zeroing, no copy); with micro_step_ > 0 it
//     copies flat_grads_ into grad_backup_ first (stage 2: partition_grads_, which finish() adds into).
//     Cost: only with GAS > 1, one copy of Ψ model-dtype elements per micro-step after the first
//     (a memcpy, ~0.1 ms for the 0.8 M-parameter example; stage 2 copies Ψ/N), and a buffer of that
//     size (memory().recovery). Letting autograd write each micro-step into a separate buffer and
//     adding it in afterwards would cost the same memory plus an add pass per micro-step, and would
//     still need a copy at the boundary, where the in-place reduction destroys the local sum;
//   - on failure every in-flight collective is waited for (its buffer is ours until it finishes),
//     then the restore point is put back, pool buffers returned and micro_step_ left unchanged;
//   - module parameters carry no grad() outside backward(): the views into flat_grads_ are attached
//     at its start and detached at its end. A plain loss.backward() then makes autograd allocate
//     fresh gradients, and the hook that refuses it drops them, so nothing reaches our buffers;
//   - step() does all its fallible communication (the control all-reduce) before it changes
//     anything, and an error there (or the non-finite error) leaves micro_step_ == GAS, so step() can
//     be called again. Only the final all-gather comes after the update: rolling it back would need
//     a copy of the whole optimizer state every step, so instead the update is committed (moments,
//     step counts, loss scale, cleared gradients) before it, and if it fails the gather is simply
//     redone (it is idempotent: every rank re-sends its own updated partition) at the start of the
//     next step() or backward().
// Recovery is consistent across ranks when every rank saw the same failure (a deterministic error, an
// injected fault: tests/distributed/test_reliability.cpp). An error on some ranks only leaves the
// others waiting in a collective; that ends the job instead (Note [No hang] in mpi_communicator.cpp).

// Note [Unused parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's rule, which optim::AdamW follows: a parameter whose grad is None is not stepped at all (no
// weight decay, no moment decay, its step count does not advance). Under data parallelism "None" must
// be agreed on: a parameter is unused only if NO rank produced a gradient for it during the whole
// accumulation; a parameter used on some ranks only is a normal parameter (the others contribute
// zeros). Each rank records which hooks fired (used_, OR over micro-steps); step() sums these flags
// over ranks in the same control all-reduce that carries the norm's partial sums (one call of
// (1 + #parameters) doubles, counted as control bytes), and skips the slices of parameters nobody
// used. Bias correction then needs each parameter's own step count (param_steps_), as PyTorch keeps in
// state['step']: a parameter that sat out k steps is corrected with steps() - k.

// Note [Non-finite gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// One NaN in one rank's batch reaches every rank through the reduction and, applied, turns every
// parameter into NaN. step() already makes one pass over its gradient for the global norm (sum of
// squares in fp64); that sum is finite exactly when every element is (an fp32 element's square is at
// most ~1.2e77), and the summed partials are non-finite on every rank if they are on one. So the check
// costs no extra sweep and no extra collective. f16 treats it as overflow (skip, lower the scale: the
// loss scaler's rule); f32/bf16 throw by default, naming the step and, found by a second sweep that
// runs only on this error path, the first parameter with a non-finite gradient (agreed by a min
// all-reduce over the owners); nonfinite_grads = skip skips the step as fp16 does.

namespace {

// ---- raw model-dtype loops on host buffers (hot paths) ----

// dst[0:n] = f32(src[0:n]) * factor (the multiply skipped when factor is 1).
void to_f32_scaled(const void* src, DType dtype, float* dst, std::int64_t n, float factor) {
  cpu::convert(dst, DType::f32, src, dtype, n);
  if (factor != 1.0f)
    for (std::int64_t i = 0; i < n; ++i) dst[i] *= factor;
}

char* at(const Tensor& t, std::int64_t element) {
  return static_cast<char*>(t.raw_data()) + element * static_cast<std::int64_t>(dtype_size(t.dtype()));
}

// A 1-D view of elements [begin, begin + n) of contiguous `t`.
Tensor range(const Tensor& t, std::int64_t begin, std::int64_t n) { return t.as_strided({n}, {1}, t.offset() + begin); }

// Note [ZeRO on cuda]
// With parameters on cuda every buffer (flat parameters and gradients, bucket pool, master, m, v) is
// allocated there, the byte moves below become stream-ordered device copies and kernels, and the
// communicator is handed device pointers (NCCL, or MPI staged through pinned host memory:
// distributed/nccl_communicator.h). The CPU branches are the original loops, unchanged.
void copy_bytes(Device device, void* dst, const void* src, std::size_t nbytes) {
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) return cuda::copy_async(dst, src, nbytes);
#endif
  (void)device;
  std::memcpy(dst, src, nbytes);
}
void zero_bytes(Device device, void* dst, std::size_t nbytes) {
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) return cuda::memset_async(dst, 0, nbytes);
#endif
  (void)device;
  std::memset(dst, 0, nbytes);
}
void scale_on(Device device, void* x, DType dtype, std::int64_t n, float factor) {
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) return cuda::scale(x, x, dtype, factor, n);
#endif
  (void)device;
  cpu::scale(x, dtype, n, factor);
}
void accumulate_on(Device device, void* dst, const void* src, DType dtype, std::int64_t n) {
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) return cuda::accumulate(dst, dtype, src, dtype, 1.0f, n);
#endif
  (void)device;
  cpu::accumulate(dst, dtype, src, dtype, n);
}

// Elements per chunk when the step converts gradients to fp32 (bounds the scratch buffer).
constexpr std::int64_t kStepChunk = 1 << 16;

}  // namespace

std::int64_t default_bucket_size(std::int64_t psi) {
  ZERO_CHECK(psi >= 1, "default_bucket_size: the model has {} elements; it needs at least one", psi);
  return std::clamp<std::int64_t>((psi + 7) / 8, 4096, 500'000'000);
}

MemoryBreakdown expected_memory(int stage, DType dtype, double psi, int world_size) {
  ZERO_CHECK(stage >= 0 && stage <= 2, "expected_memory: stage must be 0, 1 or 2, got {}", stage);
  ZERO_CHECK(is_floating(dtype), "expected_memory: dtype must be f32, f16 or bf16, got {}", dtype_name(dtype));
  ZERO_CHECK(world_size >= 1, "expected_memory: world_size must be >= 1, got {}", world_size);
  const double b = static_cast<double>(dtype_size(dtype));
  const double k = dtype == DType::f32 ? 8.0 : 12.0;  // (fp32 master) + m + v, bytes per parameter
  const double n = world_size;
  MemoryBreakdown m;
  m.params = b * psi;
  m.grads = stage == 2 ? b * psi / n : b * psi;
  m.optimizer_states = stage == 0 ? k * psi : k * psi / n;
  return m;
}

ZeroOptimizer::ZeroOptimizer(std::vector<nn::NamedParameter> params, std::shared_ptr<Communicator> comm,
                             ZeroOptions opts)
    : opts_(opts),
      comm_(std::move(comm)),
      scaler_(opts.dtype == DType::f16 ? opts.fp16 : optim::LossScalerConfig{.loss_scale = 1.0f}) {
  ZERO_CHECK(opts_.stage != 3, "ZeRO stage 3 (partitioned parameters) is not implemented; use stage 0, 1 or 2");
  ZERO_CHECK(opts_.stage >= 0 && opts_.stage <= 2, "ZeRO stage must be 0, 1 or 2, got {}", opts_.stage);
  ZERO_CHECK(is_floating(opts_.dtype), "ZeRO: model dtype must be f32, f16 or bf16, got {}", dtype_name(opts_.dtype));
  ZERO_CHECK(opts_.reduce_bucket_size >= 1 || opts_.reduce_bucket_size == kAutoBucketSize,
             "ZeRO: reduce_bucket_size must be >= 1 element, got {}", opts_.reduce_bucket_size);
  ZERO_CHECK(opts_.allgather_bucket_size >= 1 || opts_.allgather_bucket_size == kAutoBucketSize,
             "ZeRO: allgather_bucket_size must be >= 1 element, got {}", opts_.allgather_bucket_size);
  ZERO_CHECK(opts_.gradient_accumulation_steps >= 1, "ZeRO: gradient_accumulation_steps must be >= 1, got {}",
             opts_.gradient_accumulation_steps);
  ZERO_CHECK(opts_.gradient_clipping >= 0.0f, "ZeRO: gradient_clipping must be >= 0 (0 = off), got {}",
             opts_.gradient_clipping);
  ZERO_CHECK(opts_.weight_decay >= 0.0f, "ZeRO: weight_decay must be >= 0, got {}", opts_.weight_decay);
  const optim::AdamWOptions& a = opts_.adam;
  ZERO_CHECK(a.eps >= 0.0f, "ZeRO: AdamW eps must be >= 0, got {}", a.eps);
  ZERO_CHECK(a.beta1 >= 0.0f && a.beta1 < 1.0f, "ZeRO: AdamW beta1 must be in [0, 1), got {}", a.beta1);
  ZERO_CHECK(a.beta2 >= 0.0f && a.beta2 < 1.0f, "ZeRO: AdamW beta2 must be in [0, 1), got {}", a.beta2);
  set_lr(a.lr);
  ZERO_CHECK(comm_ != nullptr, "ZeRO: null communicator");
  rank_ = comm_->rank();
  world_ = comm_->world_size();

  // ---- the trainable parameters, in the order given (frozen ones stay where they are) ----
  std::vector<FlatLayout::Entry> entries;
  std::unordered_set<const TensorImpl*> seen;
  for (nn::NamedParameter& p : params) {
    ZERO_CHECK(p.tensor.defined(), "ZeRO: parameter '{}' is undefined", p.name);
    if (!p.tensor.requires_grad()) continue;
    ZERO_CHECK(p.tensor.is_leaf(), "ZeRO: parameter '{}' is not a leaf tensor", p.name);
    if (params_.empty()) device_ = p.tensor.device();
    ZERO_CHECK(p.tensor.device() == device_, "ZeRO: parameter '{}' is on {} but the first one is on {}; move the "
               "model with Module::to(Device) first", p.name, device_name(p.tensor.device()), device_name(device_));
    ZERO_CHECK(seen.insert(p.tensor.impl()).second, "ZeRO: parameter '{}' is listed twice", p.name);
    entries.push_back({p.name, p.tensor.shape(), p.decay});
    params_.push_back(p.tensor);
  }
  layout_ = FlatLayout(entries, world_);
  ZERO_CHECK(layout_.numel() > 0, "ZeRO: no trainable parameter elements ({} parameters given)", params.size());
  if (opts_.reduce_bucket_size == kAutoBucketSize) opts_.reduce_bucket_size = default_bucket_size(layout_.numel());
  if (opts_.allgather_bucket_size == kAutoBucketSize)
    opts_.allgather_bucket_size = default_bucket_size(layout_.numel());
  buckets_ = layout_.make_buckets(opts_.reduce_bucket_size);
  // Note [Wire dtype] (distributed/communicator.cpp): DeepSpeed's communication_data_type.
  comm_->set_reduce_in_fp32(opts_.reduce_in_fp32 && opts_.dtype != DType::f32);

  const std::int64_t padded = layout_.padded_numel();
  const std::int64_t part = layout_.partition_size();

  // ---- flat parameter buffer; module tensors become views into it ----
  flat_params_ = Tensor::zeros({padded}, opts_.dtype, device_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRange& r = layout_.params()[i];
    Tensor view = flat_params_.as_strided(r.shape, contiguous_strides(r.shape), r.offset);
    view.copy_(params_[i]);  // converts to the model dtype
    params_[i].set_data(view);
  }
  // Every rank starts from rank 0's weights (models built from the same seed already agree).
  if (world_ > 1) comm_->broadcast(flat_params_.raw_data(), static_cast<std::size_t>(padded), opts_.dtype, 0);
  flat_params_.storage()->bump_version();  // written behind the tensors' back (Note [Compute copies])

  // ---- gradient storage ----
  if (opts_.stage < 2)
    flat_grads_ = Tensor::zeros({padded}, opts_.dtype, device_);
  else
    partition_grads_ = Tensor::zeros({part}, opts_.dtype, device_);
  detach_grads();  // Note [Exception safety]: attached only during backward()

  // ---- what this rank steps, and its fp32 optimizer state ----
  if (opts_.stage == 0) {
    region_begin_ = 0;
    region_size_ = padded;
    for (const ParamRange& r : layout_.params())
      update_slices_.insert(update_slices_.end(), r.slices.begin(), r.slices.end());
  } else {
    region_begin_ = layout_.partition_begin(rank_);
    region_size_ = part;
    update_slices_ = layout_.owned(rank_);
  }
  // f32: the flat buffer's region IS the master copy (AdamW updates the model's parameters in place,
  // nothing to cast back). f16/bf16: a separate fp32 master of the region (mixed precision).
  if (opts_.dtype == DType::f32) {
    master_ = range(flat_params_, region_begin_, region_size_);
  } else {
    master_ = Tensor::empty({region_size_}, DType::f32, device_);
    if (device_ == Device::cuda)
      master_.copy_(range(flat_params_, region_begin_, region_size_));  // a device cast
    else
      to_f32_scaled(at(flat_params_, region_begin_), opts_.dtype, master_.data<float>(), region_size_, 1.0f);
  }
  exp_avg_ = Tensor::zeros({region_size_}, DType::f32, device_);
  exp_avg_sq_ = Tensor::zeros({region_size_}, DType::f32, device_);

  // ---- bucket bookkeeping and hooks ----
  delivered_.assign(params_.size(), 0);
  used_.assign(params_.size(), 0);
  param_steps_.assign(params_.size(), 0);
  pending_.assign(buckets_.size(), 0);
  bucket_buffer_.assign(buckets_.size(), -1);
  deferred_.assign(params_.size(), Tensor());
  for (std::size_t i = 0; i < params_.size(); ++i)
    hook_ids_.push_back(
        autograd::register_post_accumulate_grad_hook(params_[i], [this, i](Tensor& param) { on_gradient(i, param); }));
  // Note [Overlapped all-gather]: a forward waits for each parameter's own chunks.
  param_gathered_.assign(params_.size(), 1);
  if (opts_.overlap_param_gather && opts_.stage != 0) {
    for (std::size_t i = 0; i < params_.size(); ++i) param_index_[params_[i].impl()] = i;
    use_hook_id_ = nn::add_parameter_use_hook([this](const Tensor& p) { wait_for_param(p); });
  }
}

ZeroOptimizer::~ZeroOptimizer() {
  if (use_hook_id_ >= 0) nn::remove_parameter_use_hook(use_hook_id_);
  try {
    wait_all();
  } catch (...) {
    // Destructors must not throw; a failed collective was already reported to whoever waited on it.
  }
  try {
    wait_for_params();  // the gathers write into flat_params_
  } catch (...) {
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    autograd::remove_post_accumulate_grad_hook(params_[i], hook_ids_[i]);
    params_[i].set_grad(Tensor());
  }
}

void ZeroOptimizer::set_lr(float lr) {
  ZERO_CHECK(lr >= 0.0f, "ZeRO: learning rate must be >= 0, got {}", lr);
  lr_ = lr;
}

float ZeroOptimizer::loss_scale() const { return scaler_.scale(); }

MemoryBreakdown ZeroOptimizer::memory() const {
  const double b = static_cast<double>(dtype_size(opts_.dtype));
  MemoryBreakdown m;
  m.params = b * static_cast<double>(flat_params_.numel());
  m.grads = b * static_cast<double>(opts_.stage < 2 ? flat_grads_.numel() : partition_grads_.numel());
  const double region = static_cast<double>(region_size_);
  m.optimizer_states = 4.0 * region * (opts_.dtype == DType::f32 ? 2.0 : 3.0);
  for (const Tensor& t : pool_) m.buckets += static_cast<double>(t.nbytes());
  if (grad_backup_.defined()) m.recovery = static_cast<double>(grad_backup_.nbytes());
  return m;
}

void ZeroOptimizer::set_param_steps(std::vector<std::int64_t> steps) {
  ZERO_CHECK(steps.size() == params_.size(), "ZeRO: set_param_steps got {} counts for {} parameters", steps.size(),
             params_.size());
  for (std::size_t i = 0; i < steps.size(); ++i)
    ZERO_CHECK(steps[i] >= 0 && steps[i] <= step_count_, "ZeRO: step count {} of parameter '{}' is outside [0, {}]",
               steps[i], layout_.params()[i].name, step_count_);
  param_steps_ = std::move(steps);
}

void ZeroOptimizer::detach_grads() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

Tensor& ZeroOptimizer::gradient_store() { return opts_.stage < 2 ? flat_grads_ : partition_grads_; }

void ZeroOptimizer::finish_pending_gather() {
  if (!gather_works_.empty()) {
    wait_for_params();  // Note [Overlapped all-gather]
    return;
  }
  if (!gather_pending_) return;
  all_gather_params();
  gather_pending_ = false;
}

void ZeroOptimizer::start_param_gather() {
  // Note [Overlapped all-gather]: the same chunks as all_gather_params(), issued without waiting.
  const std::int64_t padded = layout_.padded_numel();
  const std::int64_t chunk = opts_.allgather_bucket_size;
  std::fill(param_gathered_.begin(), param_gathered_.end(), 0);
  try {
    for (std::int64_t begin = 0; begin < padded; begin += chunk) gather_works_.push_back(gather_chunk(begin, true));
  } catch (...) {
    wait_for_params();  // the chunks already issued must finish; rethrows the first error
    throw;
  }
}

void ZeroOptimizer::wait_for_param(const Tensor& param) {
  if (gather_works_.empty()) return;
  const auto it = param_index_.find(param.impl());
  if (it == param_index_.end() || param_gathered_[it->second]) return;
  const ParamRange& p = layout_.params()[it->second];
  const std::int64_t chunk = opts_.allgather_bucket_size;
  try {
    if (p.numel > 0)
      for (std::int64_t c = p.offset / chunk; c <= (p.end() - 1) / chunk; ++c)
        gather_works_[static_cast<std::size_t>(c)]->wait();
  } catch (...) {
    wait_for_params();  // every chunk must finish before the error goes on; rethrows it
    throw;
  }
  param_gathered_[it->second] = 1;
}

void ZeroOptimizer::wait_for_params() {
  if (gather_works_.empty()) return;
  std::vector<std::shared_ptr<Work>> works;
  works.swap(gather_works_);
  std::fill(param_gathered_.begin(), param_gathered_.end(), 1);
  std::exception_ptr first;
  for (auto& w : works) {
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);  // gather_pending_ stays set: the next step()/backward() redoes it
  gather_pending_ = false;
}

void ZeroOptimizer::restore_counters(std::int64_t steps, std::int64_t skipped_steps,
                                     const optim::LossScaler::State* scaler) {
  ZERO_CHECK(steps >= 0 && skipped_steps >= 0, "ZeRO: step counts must be >= 0, got {} and {}", steps, skipped_steps);
  ZERO_CHECK(micro_step_ == 0, "ZeRO: restore_counters() between backward() and step()");
  step_count_ = steps;
  skipped_steps_ = skipped_steps;
  // Every parameter stepped every step unless the checkpoint says otherwise (set_param_steps).
  std::fill(param_steps_.begin(), param_steps_.end(), steps);
  if (scaler != nullptr && opts_.dtype == DType::f16) scaler_.set_state(*scaler);
}

void ZeroOptimizer::sync_params_from_master() {
  if (opts_.dtype != DType::f32) {
    if (device_ == Device::cuda)
      range(flat_params_, region_begin_, region_size_).copy_(master_);  // a device cast
    else
      cpu::convert(at(flat_params_, region_begin_), opts_.dtype, master_.data<float>(), DType::f32, region_size_);
  }
  if (opts_.stage != 0) all_gather_params();
  flat_params_.storage()->bump_version();  // Note [Compute copies]
}

void ZeroOptimizer::point_grads_at_flat() {
  // Contiguous gradients: autograd accumulates straight into the flat gradient buffer, so the bucket
  // for stages 0/1 is just a range of it and needs no copy.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRange& r = layout_.params()[i];
    Tensor view = flat_grads_.as_strided(r.shape, contiguous_strides(r.shape), r.offset);
    const Tensor g = params_[i].grad();
    if (!g.defined() || g.storage() != view.storage() || g.offset() != view.offset()) params_[i].set_grad(view);
  }
}

void ZeroOptimizer::reset_backward_state() {
  std::fill(delivered_.begin(), delivered_.end(), 0);
  for (Tensor& g : deferred_) g = Tensor();
  for (std::size_t k = 0; k < buckets_.size(); ++k) pending_[k] = static_cast<int>(buckets_[k].params.size());
  next_bucket_ = 0;
}

void ZeroOptimizer::backward(const Tensor& loss) {
  const int gas = opts_.gradient_accumulation_steps;
  ZERO_CHECK(micro_step_ < gas,
             "ZeRO: backward() called {} times since the last step() with gradient_accumulation_steps = {}; "
             "call step() after every {} backward() calls",
             micro_step_ + 1, gas, gas);
  ZERO_CHECK(loss.defined() && loss.numel() == 1, "ZeRO: backward() needs a one-element loss tensor");
  ZERO_CHECK(is_floating(loss.dtype()), "ZeRO: the loss must be a float tensor, got {}", dtype_name(loss.dtype()));
  finish_pending_gather();  // Note [Exception safety]
  // The scale is fixed for a whole accumulation: step() unscales with the scale backward used, not the
  // one the scaler moves to afterwards (DeepSpeed unscales with the post-update scale).
  if (micro_step_ == 0) {
    backward_scale_ = scaler_.scale();
    comm_->set_step(step_count_ + skipped_steps_ + 1);
  }
  reducing_ = opts_.stage == 2 || micro_step_ + 1 == gas;
  reset_backward_state();
  // Note [Exception safety]: the restore point (zeros when nothing has been accumulated yet).
  const bool keep = micro_step_ > 0;
  Tensor& store = gradient_store();
  if (keep) {
    if (!grad_backup_.defined()) grad_backup_ = Tensor::empty({store.numel()}, opts_.dtype, device_);
    copy_bytes(device_, grad_backup_.raw_data(), store.raw_data(), store.nbytes());
  }
  if (opts_.stage < 2) point_grads_at_flat();

  // Seeding backward with scale/GAS is the same as backward of loss·scale/GAS, without a graph node.
  const Tensor seed =
      Tensor::full(loss.shape(), backward_scale_ / static_cast<float>(gas), loss.dtype(), loss.device());
  in_backward_ = true;
  trace::Span span("backward", "backward");
  try {
    autograd::backward(loss, seed);
    in_backward_ = false;
    if (reducing_) {
      // Epilogue (Note [Bucket order]): every bucket not yet issued goes out now, in order; parameters
      // without a gradient this backward contribute zeros.
      while (next_bucket_ < static_cast<int>(buckets_.size())) issue_bucket(next_bucket_++);
      wait_all();
    }
  } catch (...) {
    // Note [Exception safety]: let every issued collective finish (its buffer is in use until then),
    // then put the restore point back.
    in_backward_ = false;
    try {
      wait_all();
    } catch (...) {
    }
    for (std::size_t k = 0; k < bucket_buffer_.size(); ++k)
      if (bucket_buffer_[k] >= 0) {
        free_buffers_.push_back(bucket_buffer_[k]);
        bucket_buffer_[k] = -1;
      }
    for (Tensor& g : deferred_) g = Tensor();
    detach_grads();
    if (keep)
      copy_bytes(device_, store.raw_data(), grad_backup_.raw_data(), store.nbytes());
    else
      zero_gradients();
    throw;
  }
  detach_grads();
  for (std::size_t i = 0; i < params_.size(); ++i) used_[i] = used_[i] || delivered_[i];
  ++micro_step_;
}

void ZeroOptimizer::on_gradient(std::size_t i, Tensor& param) {
  const ParamRange& p = layout_.params()[i];
  // A plain loss.backward(): drop the gradient autograd just allocated, so nothing of it stays
  // (Note [Exception safety]), and refuse.
  if (!in_backward_) param.set_grad(Tensor());
  ZERO_CHECK(in_backward_,
             "ZeRO: parameter '{}' received a gradient outside ZeroOptimizer::backward(); call "
             "optimizer.backward(loss) instead of loss.backward()",
             p.name);
  ZERO_CHECK(!delivered_[i],
             "ZeRO: the gradient of parameter '{}' was computed twice in one backward (a second backward "
             "pass reached it before the first finished)",
             p.name);
  delivered_[i] = 1;
  if (trace::active()) trace::instant("hook", "hook", trace::kComputeThread, {{"param", p.name}});
  if (p.numel == 0) {
    if (opts_.stage == 2) param.set_grad(Tensor());
    return;
  }
  const std::int64_t padded = layout_.padded_numel();
  const std::int64_t bsize = opts_.reduce_bucket_size;
  const int first = static_cast<int>((padded - p.end()) / bsize);
  const int last = static_cast<int>((padded - 1 - p.offset) / bsize);

  if (opts_.stage == 2) {
    // Note [ZeRO-2 gradient ownership]: copy into the bucket buffers, then release the gradient.
    Tensor g = param.grad();
    ZERO_CHECK(g.defined(), "ZeRO: hook for '{}' fired without a gradient", p.name);
    if (!g.is_contiguous() || g.dtype() != opts_.dtype) {
      Tensor c = Tensor::empty(g.shape(), opts_.dtype, device_);
      c.copy_(g);
      g = c;
    }
    // Note [ZeRO-2 gradient ownership]: keep the gradient until its buckets go out; issue_bucket copies
    // it into the one pool buffer of the bucket being issued, so the pool holds only buckets in flight.
    deferred_[i] = g;
    param.set_grad(Tensor());
    for (int k = first; k <= last; ++k) --pending_[static_cast<std::size_t>(k)];
    issue_ready_buckets();
    return;
  }
  if (!reducing_) return;  // stages 0/1 before the boundary: autograd accumulated into the flat buffer
  for (int k = first; k <= last; ++k)
    if (--pending_[static_cast<std::size_t>(k)] == 0 && trace::active())
      trace::instant("bucket ready", "bucket", trace::kComputeThread, {{"bucket", k}});
  issue_ready_buckets();
}

void ZeroOptimizer::issue_ready_buckets() {
  // Note [Bucket order]: strictly in bucket order, each once all its parameters have delivered.
  while (next_bucket_ < static_cast<int>(buckets_.size()) && pending_[static_cast<std::size_t>(next_bucket_)] == 0)
    issue_bucket(next_bucket_++);
}

int ZeroOptimizer::acquire_buffer() {
  finish_completed();  // recycle buffers whose collectives are done
  if (!free_buffers_.empty()) {
    const int b = free_buffers_.back();
    free_buffers_.pop_back();
    return b;
  }
  const std::int64_t size = std::min(opts_.reduce_bucket_size, layout_.padded_numel());
  pool_.push_back(Tensor::empty({size}, opts_.dtype, device_));
  return static_cast<int>(pool_.size()) - 1;
}

int ZeroOptimizer::bucket_buffer(int k) {
  int& slot = bucket_buffer_[static_cast<std::size_t>(k)];
  if (slot < 0) {
    slot = acquire_buffer();
    const Bucket& b = buckets_[static_cast<std::size_t>(k)];
    zero_bytes(device_, pool_[static_cast<std::size_t>(slot)].raw_data(),
               static_cast<std::size_t>(b.size()) * dtype_size(opts_.dtype));
  }
  return slot;
}

void ZeroOptimizer::issue_bucket(int k) {
  const Bucket& b = buckets_[static_cast<std::size_t>(k)];
  const DType dt = opts_.dtype;
  int buffer = -1;
  char* data = nullptr;  // the bucket's b.size() elements
  if (opts_.stage == 2) {
    buffer = bucket_buffer(k);
    data = at(pool_[static_cast<std::size_t>(buffer)], 0);
    // Copy in the slices of the gradients that reached this bucket, and drop each gradient once its
    // last bucket (the one holding its start) is out. Parameters without a gradient stay zeros.
    for (std::size_t pi : b.params) {
      const ParamRange& p = layout_.params()[pi];
      Tensor& g = deferred_[pi];
      if (!g.defined()) continue;
      const std::int64_t lo = std::max(p.offset, b.begin), hi = std::min(p.end(), b.end);
      copy_bytes(device_, data + (lo - b.begin) * static_cast<std::int64_t>(dtype_size(dt)), at(g, lo - p.offset),
                 static_cast<std::size_t>(hi - lo) * dtype_size(dt));
      if (p.offset >= b.begin) g = Tensor();
    }
  } else {
    data = at(flat_grads_, b.begin);
  }
  // Average by pre-dividing: every rank scales its contribution by 1/N, the collective sums.
  if (world_ > 1) scale_on(device_, data, dt, b.size(), 1.0f / static_cast<float>(world_));

  std::shared_ptr<Work> work;
  const std::size_t n = static_cast<std::size_t>(b.size());
  if (trace::active())
    trace::instant("bucket issued", "bucket", trace::kComputeThread,
                   {{"bucket", k}, {"elements", n}, {"bytes", n * dtype_size(dt)}});
  if (opts_.stage == 0 || !opts_.reduce_scatter) {
    // Stage 0, or the reduce_scatter=false scheme: everyone gets the whole reduced bucket.
    if (opts_.overlap_comm)
      work = comm_->all_reduce_async(data, n, dt);
    else
      comm_->all_reduce(data, n, dt);
  } else {
    // Each rank receives, in place, the summed slice of the bucket that lies in its own partition.
    const std::size_t mine = b.counts[static_cast<std::size_t>(rank_)];
    char* recv = data;
    if (mine > 0) recv = data + (std::max(b.begin, layout_.partition_begin(rank_)) - b.begin) * dtype_size(dt);
    if (opts_.overlap_comm)
      work = comm_->reduce_scatter_async(data, recv, b.counts, dt);
    else
      comm_->reduce_scatter(data, recv, b.counts, dt);
  }
  InFlight f{k, work, buffer};
  if (work)
    in_flight_.push_back(f);
  else
    finish(f);
}

void ZeroOptimizer::finish(const InFlight& f) {
  if (trace::active()) trace::instant("bucket done", "bucket", trace::kComputeThread, {{"bucket", f.bucket}});
  if (opts_.stage != 2) return;  // stages 0/1 reduced in place in the flat gradient
  // Note [ZeRO-2 gradient ownership]: add this rank's reduced slice into its partition gradient.
  const Bucket& b = buckets_[static_cast<std::size_t>(f.bucket)];
  const std::int64_t pb = layout_.partition_begin(rank_), pe = layout_.partition_end(rank_);
  const std::int64_t lo = std::max(b.begin, pb), hi = std::min(b.end, pe);
  if (hi > lo)
    accumulate_on(device_, at(partition_grads_, lo - pb), at(pool_[static_cast<std::size_t>(f.buffer)], lo - b.begin),
                  opts_.dtype, hi - lo);
  free_buffers_.push_back(f.buffer);
  bucket_buffer_[static_cast<std::size_t>(f.bucket)] = -1;
}

void ZeroOptimizer::release_buffer(const InFlight& f) {
  if (f.buffer < 0) return;
  free_buffers_.push_back(f.buffer);
  bucket_buffer_[static_cast<std::size_t>(f.bucket)] = -1;
}

void ZeroOptimizer::complete(const InFlight& f) {
  try {
    f.work->wait();  // rethrows a failure
  } catch (...) {
    release_buffer(f);
    throw;
  }
  finish(f);
}

void ZeroOptimizer::finish_completed() {
  // Called at moments that depend on timing (when a buffer is needed), so a failure found here is kept
  // for wait_all to rethrow at the end of backward: every rank then fails at the same point
  // (Note [Exception safety]), whichever of them happened to notice first.
  while (!in_flight_.empty() && in_flight_.front().work->is_completed()) {
    const InFlight f = in_flight_.front();
    in_flight_.erase(in_flight_.begin());
    try {
      complete(f);
    } catch (...) {
      if (!deferred_error_) deferred_error_ = std::current_exception();
    }
  }
}

void ZeroOptimizer::wait_all() {
  // Finish in issue order. A failure is rethrown only once every collective has finished: until then
  // the communicator may still write into our buffers.
  std::vector<InFlight> pending;
  pending.swap(in_flight_);
  std::exception_ptr first = deferred_error_;
  deferred_error_ = nullptr;
  for (const InFlight& f : pending) {
    try {
      complete(f);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void ZeroOptimizer::zero_gradients() {
  if (opts_.stage < 2)
    flat_grads_.zero_();
  else
    partition_grads_.zero_();
}

bool ZeroOptimizer::step() {
  // Note [Exception safety]: the previous step's all-gather failed; completing it finishes that step.
  if (gather_pending_ && gather_works_.empty() && micro_step_ == 0) {
    finish_pending_gather();
    return true;
  }
  finish_pending_gather();  // Note [Overlapped all-gather]: a no-op unless gathers are in flight
  const int gas = opts_.gradient_accumulation_steps;
  ZERO_CHECK(micro_step_ == gas,
             "ZeRO: step() after {} backward() calls; gradient_accumulation_steps = {} needs {} backward() calls "
             "before each step()",
             micro_step_, gas, gas);
  const DType dt = opts_.dtype;
  const std::int64_t this_step = step_count_ + skipped_steps_ + 1;  // 1-based, counting skipped steps
  comm_->set_step(this_step);

  // This rank's reduced gradient: the whole flat gradient (stage 0), its partition of the flat gradient
  // (stage 1), or its partition gradient (stage 2).
  Tensor grad;
  if (opts_.stage == 2)
    grad = partition_grads_;
  else
    grad = range(flat_grads_, region_begin_, region_size_);
  auto grad_at = [&](std::int64_t flat) { return at(grad, flat - region_begin_); };

  // ---- 1. one pass: fp64 sum of squares, non-finite iff an element is (Note [Non-finite gradients]) ----
  std::optional<trace::Span> norm_span;
  norm_span.emplace("grad norm", "step");
  const double local_sq = optim::grad_sq_norm(grad);

  // ---- 2. one control all-reduce: the norm's partial sums + who used each parameter ----
  // (Note [Unused parameters]; stage 0: every rank holds the full gradient, so its sum is already global.)
  std::vector<double> control(1 + params_.size());
  control[0] = opts_.stage == 0 ? 0.0 : local_sq;
  for (std::size_t i = 0; i < params_.size(); ++i) control[1 + i] = used_[i] ? 1.0 : 0.0;
  if (world_ > 1) comm_->all_reduce_sum(control);
  const double sq = opts_.stage == 0 ? local_sq : control[0];
  norm_span.reset();

  // ---- 3. a non-finite gradient on any rank: skip (fp16 overflow, or nonfinite_grads = skip) or stop ----
  if (!std::isfinite(sq)) {
    if (dt != DType::f16 && opts_.nonfinite_grads == NonfiniteGrads::error) throw_nonfinite(grad, this_step);
    last_grad_norm_ = std::numeric_limits<double>::infinity();
    zero_gradients();
    std::fill(used_.begin(), used_.end(), 0);
    if (dt == DType::f16) scaler_.update(true);
    ++skipped_steps_;
    micro_step_ = 0;
    return false;
  }
  const double scale_used = backward_scale_;
  last_grad_norm_ = std::sqrt(sq) / scale_used;

  // ---- 4. unscale by the scale backward used, and clip (torch.nn.utils.clip_grad_norm_'s rule) ----
  double factor = 1.0 / scale_used;
  if (opts_.gradient_clipping > 0.0f && std::isfinite(last_grad_norm_)) {
    const double clip_coef = static_cast<double>(opts_.gradient_clipping) / (last_grad_norm_ + 1e-6);
    if (clip_coef < 1.0) factor *= clip_coef;
  }
  const float f = static_cast<float>(factor);

  // From here on nothing can fail before the all-gather (Note [Exception safety]).
  micro_step_ = 0;
  ++step_count_;
  std::vector<char> stepped(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    stepped[i] = control[1 + i] > 0.0 || (world_ == 1 && used_[i]);
    if (stepped[i]) ++param_steps_[i];
  }

  // ---- 5. AdamW on this rank's fp32 master region, slice by slice (decay and step count per slice) ----
  const optim::AdamWHyper with_decay{lr_, opts_.adam.beta1, opts_.adam.beta2, opts_.adam.eps, opts_.weight_decay};
  optim::AdamWHyper no_decay = with_decay;
  no_decay.weight_decay = 0.0f;
  float* master = master_.data<float>();
  float* m = exp_avg_.data<float>();
  float* v = exp_avg_sq_.data<float>();
#ifdef ZERO_HAS_CUDA
  if (device_ == Device::cuda) {
    // One fused kernel per slice: unscale/clip, AdamW on the fp32 master, cast back into the flat
    // buffer (skipped for f32, whose master is the flat buffer's region).
    const optim::AdamWHyper& a = with_decay;
    for (const ParamSlice& s : update_slices_) {
      if (!stepped[s.param]) continue;
      const std::int64_t t = param_steps_[s.param];
      const cuda::AdamWScalars sc =
          cuda::adamw_scalars(a.lr, a.beta1, a.beta2, a.eps, s.decay ? a.weight_decay : 0.0f, t);
      const std::int64_t j = s.flat_offset - region_begin_;
      cuda::adamw_update_mixed(master + j, grad_at(s.flat_offset), dt, f, m + j, v + j,
                               dt == DType::f32 ? nullptr : at(flat_params_, s.flat_offset), dt, s.length, sc);
    }
  } else
#endif
  {
    trace::Span adamw_span("adamw", "step");
    std::vector<float> scratch;
    for (const ParamSlice& s : update_slices_) {
      if (!stepped[s.param]) continue;  // Note [Unused parameters]
      const optim::AdamWHyper& h = s.decay ? with_decay : no_decay;
      for (std::int64_t done = 0; done < s.length; done += kStepChunk) {
        const std::int64_t n = std::min(kStepChunk, s.length - done);
        const std::int64_t flat = s.flat_offset + done;
        const std::int64_t j = flat - region_begin_;
        const float* g32 = nullptr;
        if (dt == DType::f32 && f == 1.0f) {
          g32 = reinterpret_cast<const float*>(grad_at(flat));
        } else {
          scratch.resize(static_cast<std::size_t>(n));
          to_f32_scaled(grad_at(flat), dt, scratch.data(), n, f);
          g32 = scratch.data();
        }
        optim::adamw_update(master + j, g32, m + j, v + j, n, h, param_steps_[s.param]);
        // ---- 6. cast the updated master back into the model-dtype flat buffer (f32: it already is) ----
        if (dt != DType::f32) cpu::convert(at(flat_params_, flat), dt, master + j, DType::f32, n);
      }
    }
  }

  // The flat buffer changed: layers must convert their 16-bit parameters again (Note [Compute copies]).
  flat_params_.storage()->bump_version();

  // ---- 7. clear gradients, move the loss scale: the step is committed ----
  zero_gradients();
  std::fill(used_.begin(), used_.end(), 0);
  scaler_.update(false);

  // ---- 8. all-gather the partitions so every rank has every parameter (stages 1/2) ----
  if (opts_.stage != 0) {
    gather_pending_ = true;
    if (opts_.overlap_param_gather)
      start_param_gather();  // Note [Overlapped all-gather]
    else
      finish_pending_gather();
  }
  return true;
}

void ZeroOptimizer::throw_nonfinite(const Tensor& grad, std::int64_t step) {
  // Error path only (Note [Non-finite gradients]): find the first parameter whose slice on this rank
  // is non-finite, agree on the lowest over ranks, and report. Nothing has been changed.
  double first = static_cast<double>(params_.size());
  for (const ParamSlice& s : update_slices_) {
    if (static_cast<double>(s.param) >= first) continue;
    const Tensor slice = range(grad, s.flat_offset - region_begin_, s.length);
    if (!std::isfinite(optim::grad_sq_norm(slice))) first = static_cast<double>(s.param);
  }
  if (world_ > 1) first = -comm_->all_reduce_max(-first);
  const auto index = static_cast<std::size_t>(first);
  const std::string where =
      index < params_.size() ? fmt::format(", first in parameter '{}'", layout_.params()[index].name) : "";
  throw Error(fmt::format("step {}: non-finite gradient (inf or NaN){}; the step was not applied (set "
                          "nonfinite_grads to \"skip\" to skip such steps)",
                          step, where));
}

std::shared_ptr<Work> ZeroOptimizer::gather_chunk(std::int64_t begin, bool async) {
  // Chunk [begin, begin + allgather_bucket_size) of the flat buffer: this rank sends the part in its
  // partition, in place, and receives the whole chunk, in place.
  const std::int64_t end = std::min(layout_.padded_numel(), begin + opts_.allgather_bucket_size);
  const std::vector<std::size_t> counts = layout_.range_counts(begin, end);
  char* recv = at(flat_params_, begin);
  const char* send = recv;
  if (counts[static_cast<std::size_t>(rank_)] > 0) send = at(flat_params_, std::max(begin, layout_.partition_begin(rank_)));
  if (async) return comm_->all_gather_async(send, recv, counts, opts_.dtype);
  comm_->all_gather(send, recv, counts, opts_.dtype);
  return nullptr;
}

void ZeroOptimizer::all_gather_params() {
  trace::Span span("all_gather params", "step");
  // Chunks are fixed ranges of the flat buffer of allgather_bucket_size elements; each rank sends the
  // part of the chunk in its partition, in place, and receives the whole chunk, in place.
  const std::int64_t padded = layout_.padded_numel();
  const std::int64_t chunk = opts_.allgather_bucket_size;
  std::vector<std::shared_ptr<Work>> works;
  for (std::int64_t begin = 0; begin < padded; begin += chunk) {
    std::shared_ptr<Work> w = gather_chunk(begin, opts_.overlap_comm);
    if (w) works.push_back(std::move(w));
  }
  // Every chunk must finish before a failure is rethrown: until then they write into flat_params_.
  std::exception_ptr first;
  for (auto& w : works) {
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace zero::dist
