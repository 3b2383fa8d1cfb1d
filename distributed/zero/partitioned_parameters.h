// PartitionedParameters: stage 3's parameters (the ZeRO paper's P_os+g+p). Each rank keeps only its
// shard, the model-dtype values of its partition (FlatLayout::partition_begin/end), which the optimizer
// updates in place. A layer's parameters exist in full only while it runs:
//
//   forward   a layer reads a parameter (the parameter-use hook in nn::Module::compute)
//             ─► its gather unit (Note [Gather units] in zero_plan.cpp) is gathered, unless it is already
//                there or in flight (then it is waited for), and the unit the forward used before it is
//                freed ("after the module, release");
//   backward  before autograd runs a node recorded while a unit was in use, that unit is gathered
//             again (Note [Record context] in autograd/autograd.h); when the reducer has taken every
//             gradient of a unit, the unit is freed.
//   anywhere  a read of a parameter outside its layer (sum(W) in a loss, to_vector()) waits for a unit
//             in flight, or gathers a freed one, through the same schedule (Note [Guarded storage] in
//             core/storage.h).
//
// Which all-gathers a rank issues, and in what order, never depends on which units its own forward
// happened to read: every rank walks one agreed schedule per phase (forward, backward), joining the
// gathers of units it does not need, and ranks agree on the rest in small rounds (Note [One schedule]
// in the .cpp). So ranks may run different modules (mixture-of-experts routing, a rank that runs none,
// a branch taken on some ranks only) and still exchange the right values. The gathers travel on their
// own channel (Communicator::duplicate), apart from the gradient reductions.
//
// Freeing a unit returns its buffer's memory but keeps the Storage, so the parameters and whatever
// autograd saved of them keep pointing at it and see the values again after the next gather (Note
// [Storage that is freed and refilled] in core/storage.h); the f32 compute copies of a 16-bit model
// are freed and refilled with it (Note [Compute copies] in autograd/compute_copy.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/storage.h"
#include "distributed/comm/communicator.h"
#include "distributed/zero/zero_plan.h"

namespace zero::dist {

class PartitionedParameters {
 public:
  /// `channel`: the communicator the gathers and the schedule's rounds travel on, a duplicate of the
  /// one the gradients are reduced on (Communicator::duplicate). `shard`: [P] model dtype, this rank's
  /// partition of the flat buffer (values included); `params`: the module's parameters, parallel to
  /// plan.layout.params(), holding their full values now. Re-points every parameter at a view of its
  /// unit's buffer, frees every unit, and registers a parameter-use and a post-accumulate-grad hook on
  /// each parameter (after the reducer's, so a unit is freed only after the reducer has its gradients).
  /// Cannot be copied or moved (the hooks point at it).
  PartitionedParameters(const ZeroPlan& plan, int rank, std::shared_ptr<Communicator> channel, Tensor shard,
                        std::vector<Tensor> params);
  /// Waits for gathers in flight and removes the hooks and guards; gathered units keep their values (the
  /// parameters hold their storage). Never throws.
  ~PartitionedParameters();
  PartitionedParameters(const PartitionedParameters&) = delete;
  PartitionedParameters& operator=(const PartitionedParameters&) = delete;

  /// Ends the forward phase (settle()) and starts the backward phase. Collective.
  void begin_backward();
  /// The autograd::BeforeNodeFn of that backward: gathers the unit in use when the node was recorded.
  void before_node(std::uint32_t context);
  /// Ends the backward phase's schedule (settle()): call before anything waits on a gradient reduction,
  /// which a peer may issue only after it has joined this rank's gathers. Collective.
  void finish_backward();
  /// Frees every unit (after the reducer's end_backward); the next reads start a forward phase.
  void end_backward();
  /// Ends the phase in progress: every rank joins every gather of the schedule it has not joined yet,
  /// and the ranks agree that nobody needs more (Note [One schedule]). A no-op's cost when nothing was
  /// gathered anywhere: one round. Collective; throws what a failed gather or round throws.
  void settle();
  /// Waits for gathers in flight and frees every unit: the shard changed (the update, a checkpoint
  /// load) or a backward failed. Call settle() first when the ranks are in step. Never throws.
  void release_all() noexcept;

  /// settle(), then all-gathers every unit and keeps them all until the next begin_backward() or
  /// release_all() (DeepSpeed's GatheredParameters): in between, forwards gather and free nothing, so
  /// one rank alone may run them (sampling on rank 0), and code may read parameters anywhere.
  /// Collective. Rethrows a failed gather.
  void gather_all();

  /// Between begin_backward() and end_backward().
  bool in_backward() const { return in_backward_; }
  /// This rank's shard, [P] model dtype.
  const Tensor& shard() const { return shard_; }
  /// Gathered elements alive now / at most so far (in flight included; elements of the model dtype).
  std::int64_t live_elements() const { return live_; }
  std::int64_t max_live_elements() const { return max_live_; }
  /// Bytes of the f32 compute copies (Note [Compute copies]) of a 16-bit model's parameters that hold
  /// memory now: a unit's are made on the first read after its gather and freed with it. 0 for f32.
  std::size_t live_compute_copy_bytes() const;
  /// Unit all-gathers issued so far, and the schedule's rounds (small control all-reduces).
  std::int64_t gathers() const { return gathers_; }
  std::int64_t rounds() const { return rounds_; }
  /// The agreed schedule of a phase (unit indices into plan.units, in gather order), as learned so far.
  const std::vector<std::size_t>& schedule(bool backward) const { return schedule_[backward ? 1 : 0]; }

 private:
  enum class State { freed, in_flight, gathered };
  enum Phase { kForward = 0, kBackward = 1 };
  // A read of a unit whose contents are not valid (Note [Guarded storage] in core/storage.h).
  struct UnitGuard final : Storage::Guard {
    PartitionedParameters* owner = nullptr;
    std::size_t unit = 0;
    void before_access(Storage& storage) override;
  };
  struct Unit {
    Tensor buffer;  // [unit size] model dtype; parameters of the unit are views of it
    State state = State::freed;
    std::shared_ptr<Work> work;  // while in flight
    double issued_us = 0;        // trace clock when the gather was issued
    std::uint64_t last_use = 0;  // for eviction: least recently used first
    int final_grads = 0;         // backward: parameters whose gradient the reducer has taken
    std::int64_t entry = -1;     // the schedule entry it was gathered for (-1: none, or an extension)
    UnitGuard guard;
  };
  // A gather joined for the others while this rank's own copy of the unit was busy: into scratch.
  struct Scratch {
    Tensor buffer;
    std::shared_ptr<Work> work;
    std::int64_t elements = 0;
  };
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  void on_use(std::size_t u);
  void on_gradient(std::size_t u);
  void switch_to(std::size_t u);
  /// Backward: the reducer has taken every gradient of unit u (its final_grads count them).
  bool all_gradients_taken(std::size_t u) const;
  // Note [One schedule]: makes unit u valid through the agreed schedule (walk, rounds) and waits for it.
  void need(std::size_t u, bool may_evict);
  void start_round(bool settling);
  void extension_rounds(std::size_t want, bool may_evict, bool learn_schedule);
  // settle(); `learn_schedule`: at the end of a training phase, which teaches the next schedule.
  void end_schedule(bool learn_schedule);
  // Issues entry `entry` (-1: an extension) of unit u; true when into u's own buffer, false into scratch.
  bool join(std::int64_t entry, std::size_t u, bool may_evict);
  void consume(std::int64_t entry, std::size_t keep);
  // The next schedule of the phase: every rank's record exchanged and merged (Note [One schedule]).
  void learn();
  void end_phase();
  void prefetch();
  // One unit's gather and release.
  void issue(std::size_t u);
  void wait(std::size_t u);
  void free_unit(std::size_t u);
  void drop_scratch() noexcept;
  void make_room(std::int64_t elements, std::size_t keep);
  std::string unit_description(std::size_t u) const;

  const ZeroPlan& plan_;
  int rank_ = 0;
  std::shared_ptr<Communicator> channel_;
  Tensor shard_;
  std::vector<Tensor> params_;
  std::vector<std::size_t> unit_of_;  // per parameter
  std::vector<Unit> units_;
  std::vector<std::string> gather_purposes_;  // per unit: "gather of blocks.2"
  std::vector<Scratch> scratch_;
  std::vector<int> use_hook_ids_, grad_hook_ids_;

  std::size_t current_ = kNone;  // the unit in use (forward) or last gathered for a node (backward)
  bool in_backward_ = false;
  bool held_ = false;     // gather_all(): every unit stays gathered
  bool walking_ = false;   // inside need() or settle(): a read from a guard then is an internal error
  bool settling_ = false;  // inside settle(): the unit in use may be evicted
  // Note [One schedule]: the phase's agreed schedule, where this rank stands in it, and what it read.
  Phase phase_ = kForward;
  std::vector<std::size_t> schedule_[2];
  bool started_ = false;            // this phase's start round said some rank reads
  std::size_t issue_pos_ = 0;       // entries before it were joined
  std::size_t read_pos_ = 0;        // entries before it were consumed or passed by
  std::vector<std::size_t> record_;  // units this phase gathered on demand, in order
  std::uint64_t clock_ = 0;
  std::int64_t live_ = 0, max_live_ = 0, gathers_ = 0, rounds_ = 0;
};

}  // namespace zero::dist
