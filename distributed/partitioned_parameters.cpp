#include "distributed/partitioned_parameters.h"

#include <algorithm>
#include <exception>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/check.h"
#include "core/trace.h"

namespace zero::dist {

// Note [Gathering on use]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// What stage 3 keeps in full is decided one unit at a time, from three rules:
//   - on demand: a unit is gathered when a layer reads one of its parameters (forward) or when autograd
//     is about to run a node recorded while it was in use (backward, Note [Record context]); if its
//     gather was prefetched the training thread only waits for the rest of it;
//   - release: in forward, the unit in use is freed as soon as the forward reads another unit (the
//     layer is done: PyTorch FSDP's reshard after forward); in backward, once the reducer has taken
//     every gradient of the unit (its post-accumulate-grad hooks, which run after the reducer's);
//     end_backward() frees the rest. A unit read again later in the same forward (GPT's tied token
//     embedding, read by the LM head) is simply gathered again. So a forward must read a parameter
//     (Module::compute) after the layers of other units that run before its use: GPT's head runs the
//     final norm, then reads the embedding weight. A forward that reads it first holds a tensor whose
//     memory the norm's gather frees, and the op that uses it throws zero::Error ("tensor read while
//     its storage is freed") instead of computing with stale memory;
//   - prefetch (DeepSpeed's stage3_prefetch_bucket_size): after each on-demand gather, the units that
//     follow it in the order recorded during the last forward with grad enabled (or the last
//     backward) are issued too, as long as they add up to at most stage3_prefetch_bucket_size
//     elements and fit under stage3_max_live_parameters. Before any order is recorded, forward
//     assumes flat order and backward its reverse. Prefetching never frees anything.
// The bound (DeepSpeed's stage3_max_live_parameters) counts gathered and in-flight units. An on-demand
// gather that does not fit first frees units other than the one it gathers, least recently used first
// (gathered ones before in-flight ones, which are waited for); since the bound holds the largest unit
// (plan_zero checks it), this always makes room. Every decision depends only on the order of uses,
// never on timing, so ranks that run the same forward issue the same all-gathers in the same order.
// Ranks must therefore read the same units in the same order: a layer that runs on some ranks only
// (a parameter merely unused on some ranks is fine when its unit is read) makes the ranks' gathers
// differ, and the collective timeout then ends the job with an error (Note [No hang] in
// job_runtime.cpp) — DeepSpeed's ZeRO-3 has the same rule. Evicting a unit that
// is needed again costs a second gather of it, not a wrong result. DeepSpeed's
// stage3_param_persistence_threshold (small parameters kept gathered) is not implemented: every
// parameter is partitioned.

PartitionedParameters::PartitionedParameters(const ZeroPlan& plan, int rank, std::shared_ptr<Communicator> comm,
                                             Tensor shard, std::vector<Tensor> params)
    : plan_(plan), rank_(rank), comm_(std::move(comm)), shard_(std::move(shard)), params_(std::move(params)) {
  ZERO_CHECK(shard_.numel() == plan_.layout.partition_size(), "ZeRO stage 3: the shard has {} elements, a partition {}",
             shard_.numel(), plan_.layout.partition_size());
  unit_of_.assign(params_.size(), kNone);
  units_.resize(plan_.units.size());
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const GatherUnit& g = plan_.units[u];
    units_[u].buffer = Tensor::empty({g.size()}, plan_.options.dtype, shard_.device());
    for (std::size_t i = g.first_param; i < g.end_param; ++i) {
      const ParamRange& r = plan_.layout.params()[i];
      params_[i].set_data(units_[u].buffer.as_strided(r.shape, contiguous_strides(r.shape), r.offset - g.begin));
      unit_of_[i] = u;
    }
    units_[u].buffer.storage()->free_memory();
    forward_order_.push_back(u);
    backward_order_.insert(backward_order_.begin(), u);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::size_t u = unit_of_[i];
    use_hook_ids_.push_back(autograd::register_parameter_use_hook(params_[i], [this, u](const Tensor&) { on_use(u); }));
    grad_hook_ids_.push_back(
        autograd::register_post_accumulate_grad_hook(params_[i], [this, u](Tensor&) { on_gradient(u); }));
  }
}

PartitionedParameters::~PartitionedParameters() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    autograd::remove_parameter_use_hook(params_[i], use_hook_ids_[i]);
    autograd::remove_post_accumulate_grad_hook(params_[i], grad_hook_ids_[i]);
  }
  autograd::set_record_context(0);
  // Gathered units stay as they are: the parameters keep their storage, so what gather_all() gathered
  // is still readable after the optimizer is gone.
  for (Unit& unit : units_) {
    try {
      if (unit.state == State::in_flight) unit.work->wait();  // the communicator writes the buffer until then
    } catch (...) {
      unit.buffer.storage()->free_memory();  // nothing valid arrived; whoever waits on the job reports it
    }
  }
}

// ---- the three events: a forward use, a backward node, a final gradient --------------------------------

void PartitionedParameters::on_use(std::size_t u) {
  if (held_) return;  // gather_all(): everything is gathered and stays so
  if (autograd::grad_mode_enabled() && (recording_.empty() || recording_.back() != u)) {
    // Forwards with grad that no backward follows would grow the record without end: past 64 reads
    // per unit it starts over (prefetch keeps the last complete order meanwhile).
    if (recording_.size() >= 64 * units_.size()) recording_.clear();
    recording_.push_back(u);
  }
  if (u != current_)
    switch_to(u);
  else if (units_[u].state != State::gathered)
    gather_now(u);  // evicted by a gather the bound did not leave room for
}

void PartitionedParameters::before_node(std::uint32_t context) {
  if (context == 0 || context > units_.size()) return;
  const std::size_t u = context - 1;
  if (recording_.empty() || recording_.back() != u) recording_.push_back(u);
  if (u != current_)
    switch_to(u);
  else if (units_[u].state != State::gathered)
    gather_now(u);
}

void PartitionedParameters::on_gradient(std::size_t u) {
  if (!in_backward_) return;  // the reducer refuses a gradient outside ZeroOptimizer::backward
  Unit& unit = units_[u];
  const GatherUnit& g = plan_.units[u];
  if (++unit.final_grads == static_cast<int>(g.end_param - g.first_param)) free_unit(u);
}

void PartitionedParameters::switch_to(std::size_t u) {
  const std::size_t previous = current_;
  current_ = u;
  autograd::set_record_context(static_cast<std::uint32_t>(u + 1));  // context = unit index + 1 (0: none)
  if (!in_backward_ && previous != kNone) free_unit(previous);  // the forward is done with that layer
  gather_now(u);
  prefetch(u);
}

// ---- backward boundaries -------------------------------------------------------------------------------

void PartitionedParameters::begin_backward() {
  held_ = false;
  if (!recording_.empty()) forward_order_.swap(recording_);
  recording_.clear();
  for (Unit& unit : units_) unit.final_grads = 0;
  position_ = 0;
  in_backward_ = true;
}

void PartitionedParameters::end_backward() {
  in_backward_ = false;
  if (!recording_.empty()) backward_order_.swap(recording_);
  recording_.clear();
  position_ = 0;
  current_ = kNone;
  autograd::set_record_context(0);
  for (std::size_t u = 0; u < units_.size(); ++u) free_unit(u);  // waits for prefetches; rethrows a failure
}

void PartitionedParameters::release_all() noexcept {
  held_ = false;
  in_backward_ = false;
  recording_.clear();
  position_ = 0;
  current_ = kNone;
  autograd::set_record_context(0);
  for (std::size_t u = 0; u < units_.size(); ++u) {
    try {
      free_unit(u);
    } catch (...) {
      // free_unit frees the memory even when the gather failed; that failure was or will be reported
      // by whoever waits on the job.
    }
  }
}

void PartitionedParameters::gather_all() {
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (units_[u].state == State::freed) issue(u);
  for (std::size_t u = 0; u < units_.size(); ++u) wait(u);
  current_ = kNone;
  autograd::set_record_context(0);  // nothing recorded now needs a gather before it runs
  held_ = true;
}

// ---- one unit's gather and release ---------------------------------------------------------------------

void PartitionedParameters::gather_now(std::size_t u) {
  if (units_[u].state == State::freed) {
    make_room(plan_.units[u].size(), u);
    issue(u);
  }
  wait(u);
  units_[u].last_use = ++clock_;
}

void PartitionedParameters::issue(std::size_t u) {
  // The unit is the flat range [begin, end): rank r contributes the part inside its partition, so the
  // contributions in rank order are the range itself.
  const GatherUnit& g = plan_.units[u];
  Unit& unit = units_[u];
  const std::vector<std::size_t> counts = plan_.layout.range_counts(g.begin, g.end);
  unit.buffer.storage()->allocate_memory();
  char* recv = element_ptr(unit.buffer, 0);
  const char* send = recv;
  const std::int64_t mine = plan_.layout.partition_begin(rank_);
  if (counts[static_cast<std::size_t>(rank_)] > 0) send = element_ptr(shard_, std::max(g.begin, mine) - mine);
  try {
    unit.work = comm_->all_gather_async(send, recv, counts, plan_.options.dtype);
  } catch (...) {
    unit.buffer.storage()->free_memory();
    throw;
  }
  unit.state = State::in_flight;
  if (trace::active()) unit.issued_us = trace::now_us();
  live_ += g.size();
  max_live_ = std::max(max_live_, live_);
  ++gathers_;
}

void PartitionedParameters::wait(std::size_t u) {
  Unit& unit = units_[u];
  if (unit.state != State::in_flight) return;
  const GatherUnit& g = plan_.units[u];
  {
    std::string name;
    if (trace::active()) name = "wait gather " + g.name;
    trace::Span span(name.c_str(), "stage3");
    try {
      unit.work->wait();
    } catch (...) {
      unit.work.reset();
      unit.state = State::gathered;  // so that free_unit returns the memory
      free_unit(u);
      throw;
    }
  }
  unit.work.reset();
  unit.state = State::gathered;
  if (trace::active())
    trace::add({"gather " + g.name, "stage3", 'X', unit.issued_us, trace::now_us() - unit.issued_us, trace::kCommThread,
                {{"elements", g.size()}}});
  // The values changed behind the tensors' back: the compute copies follow (Note [Compute copies]).
  unit.buffer.storage()->bump_version();
  for (std::size_t i = g.first_param; i < g.end_param; ++i) refresh_compute_copy(params_[i]);
}

void PartitionedParameters::free_unit(std::size_t u) {
  Unit& unit = units_[u];
  if (unit.state == State::in_flight) wait(u);  // the communicator writes the buffer until then
  if (unit.state == State::freed) return;
  const GatherUnit& g = plan_.units[u];
  unit.buffer.storage()->free_memory();
  for (std::size_t i = g.first_param; i < g.end_param; ++i) free_compute_copy(params_[i]);
  unit.state = State::freed;
  live_ -= g.size();
  if (trace::active()) trace::instant("release", "stage3", trace::kComputeThread, {{"unit", g.name}});
}

// ---- the bound and the prefetch (Note [Gathering on use]) ----------------------------------------------

void PartitionedParameters::make_room(std::int64_t elements, std::size_t keep) {
  const std::int64_t bound = plan_.options.stage3_max_live_parameters;
  // Gathered units before in-flight ones, least recently used first.
  auto order = [&](std::size_t w) { return std::make_pair(units_[w].state == State::in_flight, units_[w].last_use); };
  while (live_ + elements > bound) {
    std::size_t victim = kNone;
    for (std::size_t v = 0; v < units_.size(); ++v) {
      if (v == keep || units_[v].state == State::freed) continue;
      if (victim == kNone || order(v) < order(victim)) victim = v;
    }
    ZERO_CHECK(victim != kNone, "ZeRO stage 3: unit '{}' ({} elements) does not fit stage3_max_live_parameters = {}",
               plan_.units[keep].name, elements, bound);
    free_unit(victim);
  }
}

void PartitionedParameters::prefetch(std::size_t u) {
  const std::int64_t budget = plan_.options.stage3_prefetch_bucket_size;
  const std::vector<std::size_t>& order = in_backward_ ? backward_order_ : forward_order_;
  if (budget == 0 || order.empty()) return;
  // Where u sits in the expected order: the next occurrence from the last position, wrapping around.
  std::size_t found = kNone;
  for (std::size_t k = 0; k < order.size() && found == kNone; ++k)
    if (order[(position_ + k) % order.size()] == u) found = (position_ + k) % order.size();
  if (found == kNone) return;  // not in last step's order: nothing to predict
  position_ = found;
  std::int64_t ahead = 0;
  for (std::size_t i = found + 1; i < order.size(); ++i) {
    const std::size_t v = order[i];
    if (v == u) continue;
    ahead += plan_.units[v].size();
    if (ahead > budget) break;
    if (units_[v].state != State::freed) continue;
    if (live_ + plan_.units[v].size() > plan_.options.stage3_max_live_parameters) break;
    issue(v);
  }
}

}  // namespace zero::dist
