#include "distributed/zero/gradient_reducer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/autograd.h"
#include "core/backend.h"
#include "core/check.h"
#include "core/trace.h"
#include "distributed/comm/quantize.h"
#include "distributed/comm/ring_math.h"
#include "optim/clip.h"

namespace zero::dist {

// Note [Bucket order]
// ~~~~~~~~~~~~~~~~~~~
// Collectives must be issued by every rank in the same order with the same counts, but hooks fire in
// whatever order each rank's autograd engine reaches the parameters. DeepSpeed fills its IPG bucket in
// hook order and so relies on every rank firing hooks identically; a model whose graph differs between
// ranks (a parameter unused on one rank only) would deadlock or mix up gradients. We make the order a
// property of the LAYOUT instead:
//   - buckets are fixed ranges of the flat buffer, reduce_bucket_size elements each, cut from the END
//     of the buffer and numbered 0, 1, ... towards its start (FlatLayout::make_buckets). Backward
//     reaches the last layers first, and they sit at the end of named_parameters() order, so bucket 0
//     is usually the first to fill and the numbering follows the order gradients become final;
//   - a bucket is issued when every non-empty parameter overlapping it has delivered its gradient
//     (pending_[k] == 0) AND every lower-numbered bucket has been issued (next_bucket_ == k). So the
//     sequence of collectives is bucket 0, 1, 2, ... on every rank, whatever order its hooks fired in;
//     hook order only decides how early each one can go out (how much overlap we get);
//   - end_backward() issues every remaining bucket in order. A parameter that received no gradient
//     this backward (unused, no hook fired) contributes zeros: at stages 0/1 its range of the flat
//     gradient keeps what earlier micro-steps accumulated (zeros if none), at stage 2 its range of a
//     freshly zeroed bucket buffer stays zero.
// A parameter larger than a bucket spans several consecutive buckets and counts in each one's pending;
// a bucket holding only padding has nothing pending and goes out as soon as its predecessors have.
// Because the ranges are fixed, the reduce-scatter counts of bucket k (how much of it falls in each
// rank's partition) are the same on every rank, and the result does not depend on the bucket size or on
// overlap_comm beyond floating-point summation order inside the collective, which is fixed per element.

// Note [ZeRO-2 gradient ownership]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At stage 2 a rank keeps gradients only for its own partition: the partition gradient, P = padded/N
// elements of the model dtype, persistent across micro-steps (it is where accumulation happens).
// Everything else is transient:
//   - autograd allocates param.grad fresh for every parameter (no grad is attached before backward);
//   - the hook keeps it (kept_) and releases the parameter's handle at once (set_grad(Tensor()));
//     when a bucket is issued, the slices of the kept gradients that fall in it are copied into one
//     pool buffer at their fixed offsets, and a gradient is dropped as soon as the bucket holding its
//     first element is out. So a full-size gradient never exists;
//   - the pool holds ZeroPlan::pool_buffers buffers: one when collectives block (each finishes before
//     the next bucket is filled), kMaxLiveBuckets = 2 with overlap_comm (DeepSpeed's double buffer).
//     A bucket takes a buffer when it is issued (zero-filled, so unused parameters and padding
//     contribute zeros) and, when both are busy, first waits for the older bucket's collective;
//   - the buffer is pre-divided by N and reduce-scattered (each rank receives the sum of its own
//     slice, in place in the buffer); the received slice is ADDED into the partition gradient
//     (micro-steps accumulate there), and the buffer goes back to the pool.
// Reduction happens every micro-step (unlike stage 1, which keeps full gradients until the boundary),
// so stage 2 moves GAS·Ψ of reduce-scatter traffic per step: the price of not holding a full gradient.
// Copying at issue time rather than in the hook matters because hooks do not fire in flat order
// within a layer: a Linear's weight gradient arrives before its bias, which sits after the weight in
// the flat buffer, so the weight's buckets wait for the bias's. Copying in the hook would hold one
// buffer per waiting bucket (41 for a 32x128 weight in 100-element buckets); copying at issue holds one
// buffer per bucket in flight. The kept gradients are autograd's per-parameter tensors, which existed
// anyway; they live a little longer (until the bucket holding their start is out). With the automatic
// bucket size (Ψ/8) the partition gradient plus two buckets stay below stage 1's full gradient for every
// N >= 2 (docs/zero.md, "Bucket size").

// Note [Error feedback]
// ~~~~~~~~~~~~~~~~~~~~~~
// With zero_quantized_gradients each reduction sends every element x as its int8 dequantized value
// Q(x) (Note [int8 quantized reduce-scatter] in quantize.cpp), losing e = x - Q(x), up to half a block's
// scale per element. Alone those losses are biased per element (a small gradient in a block with a
// large one rounds to 0 every step), so the applied gradient drifts from the true one. Error feedback
// (Seide et al., "1-bit SGD", Interspeech 2014; Karimireddy et al., ICML 2019, "EF-SGD") keeps e and
// sends x' = x + e_prev instead, so over K reductions the sum of what was sent, sum Q(x'_t), equals
// sum x_t + e_0 - e_K: the applied gradients track the exact ones within one residual, whatever K is.
// Here (feed_back_error, just before a bucket is issued, after the pre-division by N):
//   x' = x + e, rounded to the gradient dtype (it is what the communicator quantizes); Q(x') computed
//   with the same quantize_blocks and the same blocks (each rank's slice of the bucket on its own, from
//   the slice's start) as the communicator will; e = x' - Q(x'), in fp32.
// e is stored compactly, not as an fp32 copy: int8 with one fp32 scale per block (the same blocks), so
// it costs 1 + 4/block bytes per element; its own quantization (up to half of its block's scale, itself
// at most 1/254 of the gradient block's scale) is lost. What is lost for good per element is therefore
// that second-order error plus, for a 16-bit model, the rounding of x + e to 16 bits.
// Size: a rank quantizes every element it sends, and it sends every bucket, so the residual covers the
// whole flat buffer, Ψ elements per rank at stage 2 as at stage 1, not the partition's Ψ/N: about Ψ
// bytes, half of stage 2's partition gradient saving for a 16-bit model at large N (docs/collectives.md,
// "Error feedback"). A block holding inf/NaN (an fp16 overflow) keeps a zero residual (the step is then
// skipped, and the residual put back: Note [Error feedback state]). Counted in memory().residual.

// Note [Error feedback state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The residual is optimizer state: it changes with every reduction, and it is rewritten during
// backward (feed_back_error, at bucket issue), before step() knows whether the step will be skipped
// (an fp16 overflow, or a non-finite fp32/bf16 gradient with nonfinite_grads = skip, on any rank) or
// whether the backward itself will fail (Note [Exception safety] in zero_optimizer.cpp). A skipped step
// must leave it bitwise unchanged, as if the step's micro-batches had never been seen, and so must a
// failed backward. The new residual cannot be recomputed from the old one afterwards (the bucket it
// came from was reduced in place), so the reducer keeps copies, taken at begin_backward of a backward
// that reduces:
//   - window_: the residual before the first reduction of the accumulation (stage 1 reduces once, in
//     the backward that ends it; stages 2/3 in every micro-step). A skipped step puts it back
//     (discard_residual_updates, from ZeroOptimizer::skip_step, before zero_grad closes the
//     accumulation); so does a failure of that first backward (abandon_backward).
//   - backward_: at stages 2/3 with GAS > 1 the later micro-steps reduce too, and a failure there must
//     return to the residual after the earlier ones, not to the accumulation's start; so each of them
//     copies the residual first. Allocated by the first such backward, like the accumulated gradient's
//     copy, and counted with it in memory().recovery.
// Cost: one copy of the residual (int8 + scales, Ψ + 4·blocks bytes) per reducing backward, a memcpy
// next to feed_back_error's several passes over the same elements; memory: window_ always (counted in
// memory().residual, which is therefore twice the residual's own size), backward_ only at stages 2/3
// with GAS > 1. Checkpoints save the residual itself (it is per rank: each rank's own sent elements);
// Note [Error-feedback checkpoints] in checkpoint.cpp says what a resume does with it.
void GradientReducer::feed_back_error(int k, char* data) {
  const Bucket& b = plan_.buckets[static_cast<std::size_t>(k)];
  const DType dt = plan_.options.dtype;
  const std::size_t block = static_cast<std::size_t>(plan_.options.quantized_gradients_block), elem = dtype_size(dt);
  float* scales = residual_scales_.data() + residual_first_scale_[static_cast<std::size_t>(k)];
  std::size_t pos = 0;  // elements of the bucket before rank d's slice
  for (std::size_t c : b.counts) {
    if (c == 0) continue;
    char* x = data + pos * elem;
    std::int8_t* e = residual_.data() + b.begin + static_cast<std::int64_t>(pos);
    const std::size_t blocks = quantized_blocks(c, block);
    // x' = x + e, in the gradient dtype.
    if (dt == DType::f32)
      std::memcpy(sent_.data(), x, c * sizeof(float));
    else
      detail::widen(x, dt, sent_.data(), c);
    dequantize_accumulate(scales, e, c, block, sent_.data(), false);
    if (dt == DType::f32) {
      std::memcpy(x, sent_.data(), c * sizeof(float));
    } else {
      detail::narrow(sent_.data(), x, dt, c);
      detail::widen(x, dt, sent_.data(), c);
    }
    // e = x' - Q(x'), blocks that are not finite zeroed, stored as int8 blocks.
    quantize_blocks(x, dt, c, block, wire_scales_.data(), wire_values_.data());
    dequantize_accumulate(wire_scales_.data(), wire_values_.data(), c, block, lost_.data(), true);
    for (std::size_t i = 0; i < c; ++i) lost_[i] = sent_[i] - lost_[i];
    for (std::size_t j = 0; j < blocks; ++j)
      if (!std::isfinite(wire_scales_[j]))
        std::fill(lost_.begin() + std::ptrdiff_t(j * block), lost_.begin() + std::ptrdiff_t(std::min(c, (j + 1) * block)),
                  0.0f);
    quantize_blocks(lost_.data(), DType::f32, c, block, scales, e);
    scales += blocks;
    pos += c;
  }
}

GradientReducer::GradientReducer(const ZeroPlan& plan, int rank, std::shared_ptr<Communicator> comm,
                                 std::vector<Tensor> params, Device device)
    : plan_(plan), rank_(rank), world_(plan.layout.world_size()), comm_(std::move(comm)), params_(std::move(params)) {
  const DType dt = plan_.options.dtype;
  if (plan_.options.stage < 2)
    accumulated_ = Tensor::zeros({plan_.layout.padded_numel()}, dt, device);
  else
    accumulated_ = Tensor::zeros({plan_.layout.partition_size(rank_)}, dt, device);
  for (int b = 0; b < plan_.pool_buffers; ++b) {
    pool_.push_back(Tensor::empty({plan_.pool_buffer_numel}, dt, device));
    free_buffers_.push_back(b);
  }
  if (plan_.options.quantized_gradients_error_feedback) {
    // Note [Error feedback]: a zero residual for every element, one scale per block of every slice.
    ZERO_CHECK(device == Device::cpu, "ZeRO: zero_quantized_gradients_error_feedback runs on the CPU only");
    const std::size_t block = static_cast<std::size_t>(plan_.options.quantized_gradients_block);
    residual_.assign(static_cast<std::size_t>(plan_.layout.padded_numel()), 0);
    std::size_t scales = 0, max_slice = 0;
    for (const Bucket& b : plan_.buckets) {
      residual_first_scale_.push_back(scales);
      for (std::size_t c : b.counts) {
        scales += quantized_blocks(c, block);
        max_slice = std::max(max_slice, c);
      }
    }
    residual_scales_.assign(scales, 0.0f);
    save_residual(window_);  // allocated now: it exists for the whole run (Note [Error feedback state])
    sent_.resize(max_slice);
    lost_.resize(max_slice);
    wire_values_.resize(max_slice);
    wire_scales_.resize(quantized_blocks(max_slice, block));
  }
  detach_grads();
  for (std::size_t k = 0; k < plan_.buckets.size(); ++k)  // Note [Collective identity]: made once, named per issue
    purposes_.push_back(fmt::format("{} of bucket {}", plan_.options.stage == 0 || !plan_.options.reduce_scatter
                                                           ? "all-reduce" : "reduce-scatter", k));
  delivered_.assign(params_.size(), 0);
  used_.assign(params_.size(), 0);
  pending_.assign(plan_.buckets.size(), 0);
  kept_.assign(params_.size(), Tensor());
  for (std::size_t i = 0; i < params_.size(); ++i)
    hook_ids_.push_back(
        autograd::register_post_accumulate_grad_hook(params_[i], [this, i](Tensor& param) { on_gradient(i, param); }));
}

GradientReducer::~GradientReducer() {
  try {
    wait_for_all();
  } catch (...) {
    // Destructors must not throw; a failed collective was already reported to whoever waited on it.
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    autograd::remove_post_accumulate_grad_hook(params_[i], hook_ids_[i]);
    params_[i].set_grad(Tensor());
  }
}

double GradientReducer::pool_bytes() const {
  double bytes = 0;
  for (const Tensor& t : pool_) bytes += static_cast<double>(t.nbytes());
  return bytes;
}

double GradientReducer::residual_bytes() const {
  // The residual and its copy from the accumulation's start (Note [Error feedback state]).
  return static_cast<double>(residual_.size() + window_.values.size()) +
         sizeof(float) * static_cast<double>(residual_scales_.size() + window_.scales.size());
}

double GradientReducer::residual_recovery_bytes() const {
  return static_cast<double>(backward_.values.size()) + sizeof(float) * static_cast<double>(backward_.scales.size());
}

// ---- error feedback's residual as optimizer state (Note [Error feedback state]) ------------------------

void GradientReducer::save_residual(ResidualCopy& to) const {
  to.values.assign(residual_.begin(), residual_.end());
  to.scales.assign(residual_scales_.begin(), residual_scales_.end());
}

void GradientReducer::load_residual(const ResidualCopy& from) {
  std::copy(from.values.begin(), from.values.end(), residual_.begin());
  std::copy(from.scales.begin(), from.scales.end(), residual_scales_.begin());
}

void GradientReducer::discard_residual_updates() {
  if (window_saved_) load_residual(window_);
  window_saved_ = false;
}

void GradientReducer::set_residual(const std::vector<std::int8_t>& values, const std::vector<float>& scales) {
  ZERO_CHECK(plan_.options.quantized_gradients_error_feedback,
             "ZeRO: set_residual() without zero_quantized_gradients_error_feedback");
  ZERO_CHECK(!in_backward_, "ZeRO: set_residual() inside a backward");
  ZERO_CHECK(values.size() == residual_.size() && scales.size() == residual_scales_.size(),
             "ZeRO: an error-feedback residual of {} values and {} scales, this run's has {} and {}", values.size(),
             scales.size(), residual_.size(), residual_scales_.size());
  residual_ = values;
  residual_scales_ = scales;
  window_saved_ = false;
}

Tensor GradientReducer::gradient() const {
  if (plan_.options.stage >= 2) return accumulated_;
  return flat_range(accumulated_, plan_.region_begin(rank_), plan_.region_size(rank_));
}

void GradientReducer::zero_grad() {
  accumulated_.zero_();
  std::fill(used_.begin(), used_.end(), 0);
  window_saved_ = false;  // the accumulation is over, applied or skipped (Note [Error feedback state])
}

// ---- one backward ------------------------------------------------------------------------------------

void GradientReducer::begin_backward(bool reduce) {
  reducing_ = reduce;
  never_wait_ = plan_.options.stage == 3;
  std::fill(delivered_.begin(), delivered_.end(), 0);
  for (Tensor& g : kept_) g = Tensor();
  for (std::size_t k = 0; k < plan_.buckets.size(); ++k) pending_[k] = static_cast<int>(plan_.buckets[k].params.size());
  next_bucket_ = 0;
  if (plan_.options.stage < 2) attach_flat_grads();
  // Note [Error feedback state]: the residual before this backward's reductions rewrite it.
  restore_ = ResidualRestore::none;
  if (reduce && plan_.options.quantized_gradients_error_feedback) {
    save_residual(window_saved_ ? backward_ : window_);
    restore_ = window_saved_ ? ResidualRestore::backward : ResidualRestore::window;
    window_saved_ = true;
  }
  in_backward_ = true;
}

void GradientReducer::end_backward() {
  in_backward_ = false;
  never_wait_ = false;  // the gathers are settled: the remaining buckets may wait for buffers
  if (reducing_) {
    // Note [Bucket order]: every bucket not yet issued goes out now, in order.
    while (next_bucket_ < static_cast<int>(plan_.buckets.size())) issue_bucket(next_bucket_++);
    wait_for_all();
  }
  detach_grads();
  for (std::size_t i = 0; i < params_.size(); ++i) used_[i] = used_[i] || delivered_[i];
  restore_ = ResidualRestore::none;
}

void GradientReducer::abandon_backward() noexcept {
  in_backward_ = false;
  try {
    wait_for_all();
  } catch (...) {
  }
  free_buffers_.clear();
  for (int b = 0; b < static_cast<int>(pool_.size()); ++b) free_buffers_.push_back(b);
  for (Tensor& g : kept_) g = Tensor();
  detach_grads();
  // Note [Error feedback state]: no collective is in flight any more, nothing writes the residual.
  if (restore_ == ResidualRestore::window) {
    load_residual(window_);
    window_saved_ = false;
  } else if (restore_ == ResidualRestore::backward) {
    load_residual(backward_);
  }
  restore_ = ResidualRestore::none;
}

void GradientReducer::attach_flat_grads() {
  // Contiguous gradients: autograd accumulates straight into the flat gradient buffer, so a stage-0/1
  // bucket is just a range of it and needs no copy.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRange& r = plan_.layout.params()[i];
    Tensor view = accumulated_.as_strided(r.shape, contiguous_strides(r.shape), r.offset);
    const Tensor g = params_[i].grad();
    if (!g.defined() || g.storage() != view.storage() || g.offset() != view.offset()) params_[i].set_grad(view);
  }
}

void GradientReducer::detach_grads() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

// ---- the hook ----------------------------------------------------------------------------------------

void GradientReducer::on_gradient(std::size_t i, Tensor& param) {
  const ParamRange& p = plan_.layout.params()[i];
  // A plain loss.backward(): drop the gradient autograd just allocated, so nothing of it stays
  // (Note [Exception safety] in zero_optimizer.cpp), and refuse.
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
  const bool stage2 = plan_.options.stage >= 2;  // stage 3 reduces as stage 2 does
  if (p.numel == 0) {
    if (stage2) param.set_grad(Tensor());
    return;
  }
  if (stage2) {
    // Note [ZeRO-2 gradient ownership]: keep the gradient until its buckets go out, release the handle.
    Tensor g = param.grad();
    ZERO_CHECK(g.defined(), "ZeRO: hook for '{}' fired without a gradient", p.name);
    if (!g.is_contiguous() || g.dtype() != plan_.options.dtype) {
      Tensor c = Tensor::empty(g.shape(), plan_.options.dtype, g.device());
      c.copy_(g);
      g = c;
    }
    kept_[i] = g;
    param.set_grad(Tensor());
  } else if (!reducing_) {
    return;  // stages 0/1 before the boundary: autograd accumulated into the flat gradient
  }
  const std::int64_t padded = plan_.layout.padded_numel(), bsize = plan_.options.reduce_bucket_size;
  const int first = static_cast<int>((padded - p.end()) / bsize),
            last = static_cast<int>((padded - 1 - p.offset) / bsize);
  for (int k = first; k <= last; ++k)
    if (--pending_[static_cast<std::size_t>(k)] == 0 && !stage2 && trace::active())
      trace::instant("bucket ready", "bucket", trace::kComputeThread, {{"bucket", k}});
  issue_ready_buckets();
}

void GradientReducer::issue_ready_buckets() {
  // Note [Bucket order]: strictly in bucket order, each once all its parameters have delivered. At
  // stage 3 a bucket waits (its gradients kept) rather than the training thread waiting for a buffer.
  while (next_bucket_ < static_cast<int>(plan_.buckets.size()) && pending_[static_cast<std::size_t>(next_bucket_)] == 0) {
    if (never_wait_ && !has_free_buffer()) return;
    issue_bucket(next_bucket_++);
  }
}

void GradientReducer::progress() {
  if (in_backward_ && reducing_) issue_ready_buckets();
}

bool GradientReducer::has_free_buffer() {
  deliver_finished();
  return !free_buffers_.empty();
}

// ---- issue and deliver -------------------------------------------------------------------------------

void GradientReducer::issue_bucket(int k) {
  const Bucket& b = plan_.buckets[static_cast<std::size_t>(k)];
  const DType dt = plan_.options.dtype;
  const int buffer = plan_.options.stage >= 2 ? take_free_buffer() : -1;
  const Tensor bucket = buffer >= 0 ? fill_pool_buffer(k, buffer) : flat_range(accumulated_, b.begin, b.size());
  // Average by pre-dividing: every rank scales its contribution by 1/N, the collective sums.
  if (world_ > 1) optim::scale_grad_(bucket, 1.0f / static_cast<float>(world_));
  char* data = element_ptr(bucket, 0);
  if (plan_.options.quantized_gradients_error_feedback) feed_back_error(k, data);
  const std::size_t n = static_cast<std::size_t>(b.size());
  if (trace::active())
    trace::instant("bucket issued", "bucket", trace::kComputeThread,
                   {{"bucket", k}, {"elements", n}, {"bytes", n * dtype_size(dt)}});
  const bool async = plan_.options.overlap_comm || never_wait_;
  std::shared_ptr<Work> work;
  try {
    if (plan_.options.stage == 0 || !plan_.options.reduce_scatter) {
      // Stage 0, or the reduce_scatter=false scheme: everyone gets the whole reduced bucket.
      if (async)
        work = comm_->with_purpose(purposes_[k]).all_reduce_async(data, n, dt);
      else
        comm_->with_purpose(purposes_[k]).all_reduce(data, n, dt);
    } else {
      // Each rank receives, in place, the summed slice of the bucket that lies in its own partition.
      char* recv = data;
      if (b.counts[static_cast<std::size_t>(rank_)] > 0)
        recv = data + (std::max(b.begin, plan_.layout.partition_begin(rank_)) - b.begin) * dtype_size(dt);
      if (async)
        work = comm_->with_purpose(purposes_[k]).reduce_scatter_async(data, recv, b.counts, dt);
      else
        comm_->with_purpose(purposes_[k]).reduce_scatter(data, recv, b.counts, dt);
    }
  } catch (...) {
    if (buffer >= 0) free_buffers_.push_back(buffer);
    throw;
  }
  const InFlight f{k, work, buffer};
  if (work)
    in_flight_.push_back(f);
  else
    deliver(f);
}

Tensor GradientReducer::fill_pool_buffer(int k, int buffer) {
  // Note [ZeRO-2 gradient ownership]: zeros, then the slices of the kept gradients that reach this
  // bucket; a gradient is dropped once the bucket holding its start (its last one) is out.
  const Bucket& b = plan_.buckets[static_cast<std::size_t>(k)];
  const Tensor& buf = pool_[static_cast<std::size_t>(buffer)];
  flat_range(buf, 0, b.size()).zero_();
  for (std::size_t pi : b.params) {
    const ParamRange& p = plan_.layout.params()[pi];
    Tensor& g = kept_[pi];
    if (!g.defined()) continue;
    const std::int64_t lo = std::max(p.offset, b.begin), hi = std::min(p.end(), b.end);
    flat_range(buf, lo - b.begin, hi - lo).copy_(flat_range(g, lo - p.offset, hi - lo));
    if (p.offset >= b.begin) g = Tensor();
  }
  return flat_range(buf, 0, b.size());
}

int GradientReducer::take_free_buffer() {
  deliver_finished();                            // recycle buffers whose collectives are done
  if (free_buffers_.empty()) wait_for_oldest();  // both busy: the double buffer's bound
  ZERO_CHECK(!free_buffers_.empty(), "ZeRO: no free bucket buffer (internal error)");
  const int b = free_buffers_.back();
  free_buffers_.pop_back();
  return b;
}

void GradientReducer::deliver(const InFlight& f) {
  if (trace::active()) trace::instant("bucket done", "bucket", trace::kComputeThread, {{"bucket", f.bucket}});
  if (f.buffer < 0) return;  // stages 0/1 reduced in place in the flat gradient
  // Note [ZeRO-2 gradient ownership]: add this rank's reduced slice into its partition gradient.
  const Bucket& b = plan_.buckets[static_cast<std::size_t>(f.bucket)];
  const std::int64_t pb = plan_.layout.partition_begin(rank_), pe = plan_.layout.partition_end(rank_);
  const std::int64_t lo = std::max(b.begin, pb), hi = std::min(b.end, pe);
  const DType dt = plan_.options.dtype;
  if (hi > lo)
    backend(accumulated_.device())
        .accumulate(element_ptr(accumulated_, lo - pb), dt,
                    element_ptr(pool_[static_cast<std::size_t>(f.buffer)], lo - b.begin), dt, hi - lo);
  free_buffers_.push_back(f.buffer);
}

void GradientReducer::wait_for(const InFlight& f) {
  try {
    f.work->wait();  // rethrows a failure
  } catch (...) {
    if (f.buffer >= 0) free_buffers_.push_back(f.buffer);
    throw;
  }
  deliver(f);
}

void GradientReducer::wait_for_oldest() {
  // Called at a moment that does not depend on timing (the pool is full), but its failure is kept for
  // end_backward like deliver_finished's, so every rank fails at the same point.
  const InFlight f = in_flight_.front();
  in_flight_.erase(in_flight_.begin());
  try {
    wait_for(f);
  } catch (...) {
    if (!first_error_) first_error_ = std::current_exception();
  }
}

void GradientReducer::deliver_finished() {
  // Called at moments that depend on timing (when a buffer is needed), so a failure found here is kept
  // for end_backward to rethrow: every rank then fails at the same point (Note [Exception safety]),
  // whichever of them happened to notice first.
  while (!in_flight_.empty() && in_flight_.front().work->is_completed()) wait_for_oldest();
}

void GradientReducer::wait_for_all() {
  // Deliver in issue order. A failure is rethrown only once every collective has finished: until then
  // the communicator may still write into our buffers.
  std::exception_ptr first = first_error_;
  first_error_ = nullptr;
  while (!in_flight_.empty()) {
    wait_for_oldest();
    if (!first) first = first_error_;
    first_error_ = nullptr;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace zero::dist
