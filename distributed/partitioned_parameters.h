// PartitionedParameters: stage 3's parameters (the ZeRO paper's P_os+g+p). Each rank keeps only its
// shard, the model-dtype values of its partition [r·P, (r+1)·P) of the flat buffer, which the optimizer
// updates in place. A layer's parameters exist in full only while it runs:
//
//   forward   a layer reads a parameter (the parameter-use hook in nn::Module::compute)
//             ─► its gather unit (Note [Gather units] in zero_plan.cpp) is all-gathered into the unit's
//                buffer, unless already there or in flight (then it is waited for), and the unit the
//                forward used before it is freed ("after the module, release");
//             ─► the next units of last step's order are prefetched (stage3_prefetch_bucket_size).
//   backward  before autograd runs a node recorded while a unit was in use, that unit is gathered
//             again (Note [Record context] in autograd/autograd.h), and the next units prefetched;
//             when the reducer has taken every gradient of a unit, the unit is freed.
//   end       end_backward() frees whatever is left; after the update nothing is gathered at all.
//
// Freeing a unit returns its buffer's memory but keeps the Storage, so the parameters and whatever
// autograd saved of them keep pointing at it and see the values again after the next gather (Note
// [Storage that is freed and refilled] in core/storage.h); the f32 compute copies of a 16-bit model
// are freed and refilled with it (Note [Compute copies] in autograd/ops.h). The gathered elements
// alive at once, in flight included, never exceed stage3_max_live_parameters (Note [Gathering on use]).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/zero_plan.h"

namespace zero::dist {

class PartitionedParameters {
 public:
  /// `shard`: [P] model dtype, this rank's partition of the flat buffer (values included); `params`: the
  /// module's parameters, parallel to plan.layout.params(), holding their full values now. Re-points
  /// every parameter at a view of its unit's buffer, frees every unit, and registers a parameter-use
  /// and a post-accumulate-grad hook on each parameter (after the reducer's, so a unit is freed only
  /// after the reducer has its gradients). Cannot be copied or moved (the hooks point at it).
  PartitionedParameters(const ZeroPlan& plan, int rank, std::shared_ptr<Communicator> comm, Tensor shard,
                        std::vector<Tensor> params);
  /// Waits for gathers in flight and removes the hooks; gathered units keep their values (the
  /// parameters hold their storage). Never throws.
  ~PartitionedParameters();
  PartitionedParameters(const PartitionedParameters&) = delete;
  PartitionedParameters& operator=(const PartitionedParameters&) = delete;

  /// Call around autograd::backward(): gathers follow the backward's order in between.
  void begin_backward();
  /// The autograd::BeforeNodeFn of that backward: gathers the unit in use when the node was recorded.
  void before_node(std::uint32_t context);
  /// Frees every unit (after the reducer's end_backward). Rethrows a failed gather.
  void end_backward();
  /// Waits for gathers in flight and frees every unit: the shard changed (the update, a checkpoint
  /// load) or a backward failed. Never throws (a failed gather was reported to whoever waited on it).
  void release_all() noexcept;

  /// All-gathers every unit that is not gathered, whatever the live bound, and keeps them all until the
  /// next begin_backward() or release_all() (DeepSpeed's GatheredParameters): in between, forwards
  /// gather and free nothing, so one rank alone may run them (sampling on rank 0), and code may read
  /// parameters outside a forward. Collective. Rethrows a failed gather.
  void gather_all();

  /// This rank's shard, [P] model dtype.
  const Tensor& shard() const { return shard_; }
  /// Gathered elements alive now / at most so far (in flight included; elements of the model dtype).
  std::int64_t live_elements() const { return live_; }
  std::int64_t max_live_elements() const { return max_live_; }
  /// Unit all-gathers issued so far.
  std::int64_t gathers() const { return gathers_; }

 private:
  enum class State { freed, in_flight, gathered };
  struct Unit {
    Tensor buffer;  // [unit size] model dtype; parameters of the unit are views of it
    State state = State::freed;
    std::shared_ptr<Work> work;  // while in flight
    double issued_us = 0;        // trace clock when the gather was issued
    std::uint64_t last_use = 0;  // for eviction: least recently used first
    int final_grads = 0;         // backward: parameters whose gradient the reducer has taken
  };

  void on_use(std::size_t u);
  void on_gradient(std::size_t u);
  void switch_to(std::size_t u);
  void gather_now(std::size_t u);
  void issue(std::size_t u);
  void wait(std::size_t u);
  void free_unit(std::size_t u);
  void make_room(std::int64_t elements, std::size_t keep);
  void prefetch(std::size_t u);

  const ZeroPlan& plan_;
  int rank_ = 0;
  std::shared_ptr<Communicator> comm_;
  Tensor shard_;
  std::vector<Tensor> params_;
  std::vector<std::size_t> unit_of_;  // per parameter
  std::vector<Unit> units_;
  std::vector<int> use_hook_ids_, grad_hook_ids_;

  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t current_ = kNone;  // the unit in use (forward) or last gathered (backward)
  bool in_backward_ = false;
  bool held_ = false;  // gather_all(): every unit stays gathered
  // Note [Gathering on use]: the order units were needed in, last forward (with grad) and last backward.
  std::vector<std::size_t> forward_order_, backward_order_, recording_;
  std::size_t position_ = 0;  // where in the expected order the unit in use sits
  std::uint64_t clock_ = 0;
  std::int64_t live_ = 0, max_live_ = 0, gathers_ = 0;
};

}  // namespace zero::dist
