// GradientReducer: from each parameter's post-accumulate-grad hook to this rank's averaged gradient.
//
//   backward ─► a parameter's gradient is final ─► on_gradient (the hook)
//                 stage 2: keep the gradient, release the parameter's handle
//                 stages 0/1: autograd already accumulated it into the flat gradient buffer
//            ─► every bucket whose parameters have all delivered goes out, strictly in bucket order
//               (Note [Bucket order]): issue_bucket
//                 stage 2: copy the kept gradients' slices into a pool buffer (at most kMaxLiveBuckets)
//                 stages 0/1: the bucket is a range of the flat gradient itself
//               pre-divide by N, then reduce:
//                 stage 0, or reduce_scatter=false   all-reduce (every rank gets the whole bucket)
//                 stages 1/2                         reduce-scatter (each rank gets its own slice only)
//            ─► deliver (when the collective has finished): stage 2 adds this rank's slice into its
//               partition gradient and frees the buffer; stages 0/1 reduced in place, nothing to do.
//
// Stage 3 reduces exactly as stage 2 ("stage 2" below means both). Stage 2 reduces every micro-step; stages 0/1 only in the backward that ends an accumulation
// (until then autograd just keeps summing into the flat gradient). With overlap_comm the collectives
// run while backward goes on, and end_backward() waits for them; without it each one blocks.
// gradient() is then the averaged gradient of the range this rank steps (ZeroPlan::region_begin).
//
// Module parameters carry a grad() only between begin_backward() and the end of that backward (the
// stage-0/1 views into the flat gradient; Note [Exception safety] in zero_optimizer.cpp): a plain
// loss.backward() on the model outside it is refused by the hook and leaves nothing behind.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/zero/zero_plan.h"

namespace zero::dist {

class GradientReducer {
 public:
  /// Registers a post-accumulate-grad hook on each of `params` (parallel to plan.layout.params(), views
  /// of the flat parameter buffer) and allocates the gradient storage on `device`: the flat gradient
  /// [padded_numel] (stages 0/1) or this rank's partition gradient [P] and the bucket pool (stage 2),
  /// all in the model dtype and zeroed. Cannot be copied or moved (the hooks point at it).
  GradientReducer(const ZeroPlan& plan, int rank, std::shared_ptr<Communicator> comm, std::vector<Tensor> params,
                  Device device);
  /// Waits for anything in flight and removes the hooks.
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Before autograd runs one micro-step's backward. `reduce`: this backward ends with the reduction
  /// (stage 2: every micro-step; stages 0/1: the one that ends the accumulation).
  void begin_backward(bool reduce);
  /// During the backward (stage 3, before each autograd node): issues the buckets that are ready and
  /// find a free pool buffer. Never waits.
  void progress();
  /// After autograd returned: issues every bucket not yet issued (in order; parameters that delivered
  /// nothing contribute zeros) and waits for every reduction. Rethrows the first failure, once every
  /// collective has finished.
  void end_backward();
  /// After a failure anywhere in the backward: waits for every collective in flight (their buffers are
  /// in use until then), returns the pool buffers and drops the kept gradients. Never throws.
  void abandon_backward() noexcept;

  /// This rank's reduced gradient of the region it steps: [region_size] model dtype, a view of the flat
  /// gradient (stages 0/1: all of it, or this rank's partition of it) or the partition gradient.
  Tensor gradient() const;
  /// The buffer micro-steps accumulate into: the flat gradient (stages 0/1) or the partition gradient.
  const Tensor& accumulated() const { return accumulated_; }
  /// Zeros the accumulated gradient and the used() flags (after a step, applied or skipped).
  void zero_grad();
  /// Per parameter: this rank's hook fired in some backward since the last zero_grad().
  const std::vector<char>& used() const { return used_; }
  /// Bytes of the stage-2 bucket pool (0 at stages 0/1).
  double pool_bytes() const;
  /// Bytes error feedback holds for good (0 without zero_quantized_gradients_error_feedback): the
  /// residual and its copy from the start of the accumulation (Note [Error feedback state]).
  double residual_bytes() const;
  /// Bytes of the residual's per-backward restore copy (stages 2/3, allocated by the first backward
  /// after the first of an accumulation; Note [Error feedback state]). 0 until then.
  double residual_recovery_bytes() const;

  // ---- error feedback's residual as optimizer state (Note [Error feedback state]) ----
  /// A step was skipped: puts the residual (values and scales) back to what it was before the first
  /// reduction since the last zero_grad(), so the skipped step leaves it bitwise unchanged. Call before
  /// zero_grad(). A no-op without error feedback or when nothing was reduced.
  void discard_residual_updates();
  /// This rank's residual (Note [Error feedback]): int8 [padded_numel], one per flat element (this rank
  /// sends every bucket), and fp32 scales, one per quantization block of each bucket's per-rank slices,
  /// bucket by bucket. Both empty without error feedback.
  const std::vector<std::int8_t>& residual_values() const { return residual_; }
  const std::vector<float>& residual_scales() const { return residual_scales_; }
  /// Replaces the residual with one saved from a run of the same plan (world size, buckets, block).
  /// Throws zero::Error, changing nothing, when error feedback is off, when a size differs from
  /// residual_values() / residual_scales() (naming both), or inside a backward.
  void set_residual(const std::vector<std::int8_t>& values, const std::vector<float>& scales);

 private:
  struct InFlight {
    int bucket;
    std::shared_ptr<Work> work;  // null: a blocking collective, already finished
    int buffer;                  // stage 2: pool index; -1 otherwise
  };

  void on_gradient(std::size_t i, Tensor& param);
  void issue_ready_buckets();
  void issue_bucket(int k);
  Tensor fill_pool_buffer(int k, int buffer);  // the bucket's b.size() elements of pool buffer `buffer`
  int take_free_buffer();
  bool has_free_buffer();  // after delivering what has finished; never waits
  void deliver(const InFlight& f);
  void wait_for(const InFlight& f);
  void wait_for_oldest();
  void deliver_finished();
  void wait_for_all();
  void feed_back_error(int k, char* data);  // Note [Error feedback]
  void attach_flat_grads();
  void detach_grads();

  const ZeroPlan& plan_;
  int rank_ = 0;
  int world_ = 1;
  std::shared_ptr<Communicator> comm_;
  std::vector<Tensor> params_;
  std::vector<int> hook_ids_;
  std::vector<std::string> purposes_;  // per bucket: its collective's purpose ("reduce-scatter of bucket 3")
  Tensor accumulated_;  // stages 0/1: the flat gradient [padded]; stage 2: the partition gradient [P]

  // One backward (Note [Bucket order]).
  bool in_backward_ = false;
  bool reducing_ = false;
  bool never_wait_ = false;          // stage 3 until end_backward: never wait on a reduction (Note [Bucket order])
  std::vector<char> delivered_;      // per parameter: its hook fired in this backward
  std::vector<char> used_;           // per parameter: delivered in some backward since zero_grad()
  std::vector<int> pending_;         // per bucket: overlapping parameters not yet delivered
  int next_bucket_ = 0;              // lowest bucket not yet issued
  std::vector<InFlight> in_flight_;  // issued and not delivered, in issue order
  std::exception_ptr first_error_;   // a failed collective noticed early; end_backward rethrows it

  // Stage 2 (Note [ZeRO-2 gradient ownership]).
  std::vector<Tensor> pool_;       // plan.pool_buffers buffers of pool_buffer_numel elements
  std::vector<int> free_buffers_;  // pool indices not in use
  std::vector<Tensor> kept_;       // per parameter: its gradient, until the bucket holding its start is out

  // Error feedback (Note [Error feedback]): the residual of every element this rank sends, int8 at its
  // flat index, with one fp32 scale per quantization block of each bucket's per-rank slices
  // (residual_scales_ from residual_first_scale_[k] for bucket k); fp32 scratch of one slice.
  std::vector<std::int8_t> residual_;
  std::vector<float> residual_scales_;
  std::vector<std::size_t> residual_first_scale_;
  std::vector<float> sent_, lost_, wire_scales_;
  std::vector<std::int8_t> wire_values_;
  // Its restore points (Note [Error feedback state]): the residual before the first reduction of this
  // accumulation (window_) and, at stages 2/3, before this backward's reductions when an earlier
  // micro-step already reduced (backward_, allocated on first use); restore_ says which one
  // abandon_backward() puts back.
  struct ResidualCopy {
    std::vector<std::int8_t> values;
    std::vector<float> scales;
  };
  enum class ResidualRestore { none, window, backward };
  void save_residual(ResidualCopy& to) const;
  void load_residual(const ResidualCopy& from);
  ResidualCopy window_, backward_;
  bool window_saved_ = false;  // window_ holds this accumulation's starting residual
  ResidualRestore restore_ = ResidualRestore::none;
};

}  // namespace zero::dist
