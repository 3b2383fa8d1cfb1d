#include "distributed/zero/partitioned_parameters.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "autograd/autograd.h"
#include "autograd/compute_copy.h"
#include "core/check.h"
#include "core/trace.h"

namespace zero::dist {

// Note [One schedule]
// ~~~~~~~~~~~~~~~~~~~
// An all-gather needs every rank, so the gathers a rank issues cannot follow what its own forward reads:
// ranks that run different modules (rank 0 routes to one expert, rank 1 to another) would gather
// different units, and the exchange mixes their values up when the counts agree. So the ORDER of
// gathers comes only from what every rank agrees on, and each read is served from it:
//   - each phase (forward, backward) has an agreed schedule, a list of units; every rank walks it in
//     order. A read of a unit that is not gathered joins the schedule's gathers up to the unit's next
//     entry; the units passed on the way are gathered for the others and freed (a rank that does not
//     run a unit still joins its gather: that is what rank-dependent use costs, one unit's gather per
//     entry it skips). Prefetch (stage3_prefetch_bucket_size) issues the next entries early, so it
//     changes when a gather is issued, never which;
//   - a forward phase begins with a start round (a small control all-reduce on the gather channel, every
//     rank either reading or settling: "does anyone read?"; a backward phase needs none, every rank
//     being in ZeroOptimizer::backward) and a phase ends with settle(), called where every rank
//     is at the same point of the program (ZeroOptimizer::backward, step, gather_parameters, and
//     before any collective the program issues on the optimizer's communicator during a forward). A
//     settling rank joins what is left of the schedule, then end rounds: each carries, per unit,
//     whether a rank needs it. A rank that read past the schedule's end asks for its unit there; every
//     rank then gathers the units asked for, in unit order (an extension), and the rounds go on until
//     one in which nobody asks, which needs every rank to be settling;
//   - at the end of a training phase (a forward that ends in ZeroOptimizer::backward, the backward
//     itself; not evaluation forwards, which may run many passes) the ranks compare what they gathered
//     on demand with the schedule; if any differs, they exchange their records and the next schedule is
//     their shortest common supersequence (computed the same way on every rank). Schedules start empty:
//     the first step is all extensions, one round per unit, and from the second step a model whose
//     ranks read the same units costs four rounds a step (forward start and end, backward end, and
//     step's start round).
// Everything a rank decides alone (eviction under stage3_max_live_parameters, prefetch, freeing after
// use) changes only what it keeps, never the sequence of collectives, and a unit it freed too early
// is gathered again through the schedule. The gathers and rounds travel on their own channel
// (Communicator::duplicate): the gradient reductions interleave with them differently on each rank
// (a rank reduces a bucket when its own gradients are ready), and on one channel that order would
// have to agree too. Note [Bucket order] in gradient_reducer.cpp keeps stage 3's reductions from
// waiting on a peer before the backward's schedule is settled.
//
// Note [Gathering on use]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// What stage 3 keeps in full is decided one unit at a time:
//   - on demand: a unit is gathered when a layer reads one of its parameters (forward) or when autograd
//     is about to run a node recorded while it was in use (backward, Note [Record context]); if its
//     gather was prefetched the training thread only waits for the rest of it. A read outside any
//     layer (a loss term sum(W), to_vector()) finds the storage guarded (Note [Guarded storage]): it
//     waits for a gather in flight or gathers the unit through the schedule, never sees stale values;
//   - release: in forward, the unit in use is freed as soon as the forward reads another unit (the
//     layer is done: PyTorch FSDP's reshard after forward); in backward, once the reducer has taken
//     every gradient of the unit (its post-accumulate-grad hooks, which run after the reducer's);
//     end_backward() frees the rest. A unit read again later in the same forward (GPT's tied token
//     embedding, read by the LM head) is simply gathered again, and the schedule learns it;
//   - the bound (DeepSpeed's stage3_max_live_parameters) counts gathered and in-flight elements. A
//     gather that does not fit first frees other units, least recently used first (gathered ones before
//     in-flight ones, which are waited for), never the one in use; since the bound holds the largest
//     unit (plan_zero checks it), this always makes room. A read outside a layer never evicts (the op
//     reading it may hold another unit's memory), so it may exceed the bound by one unit.
// DeepSpeed's stage3_param_persistence_threshold (small parameters kept gathered) is not implemented:
// every parameter is partitioned.

// Note [Nodes after the last gradient]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer composed of ops leaves backward nodes in its unit's context after the node that finishes the
// unit's last gradient: RMSNorm's y = (x · rsqrt(mean(x²) + eps)) · w gives w its gradient in the
// first node of its backward, and the nodes of x · rsqrt(...) follow. Once the reducer has taken every
// gradient of the unit, on_gradient frees it, and before_node does not gather it again for those nodes:
// they read no parameter of it (the nodes that use one to give it a gradient have all run). A node that
// still reads one (a parameter used without a gradient, through detach()) finds the storage guarded
// (Note [Guarded storage]) and gathers it through the schedule, so it never sees freed memory. Gathering
// for those nodes would gather every unit that ends in such a layer three times a step instead of two.

namespace {
const char* phase_name(int phase) { return phase == 0 ? "forward" : "backward"; }

// The shortest common supersequence of a and b (LCS table, ties broken towards a): a schedule that
// serves both orders of reads.
std::vector<std::size_t> merge_orders(const std::vector<std::size_t>& a, const std::vector<std::size_t>& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::uint32_t>> lcs(n + 1, std::vector<std::uint32_t>(m + 1, 0));
  for (std::size_t i = n; i-- > 0;)
    for (std::size_t j = m; j-- > 0;)
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  std::vector<std::size_t> out;
  std::size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      out.push_back(a[i]);
      ++i, ++j;
    } else if (j == m || (i < n && lcs[i + 1][j] >= lcs[i][j + 1])) {
      out.push_back(a[i++]);
    } else {
      out.push_back(b[j++]);
    }
  }
  return out;
}

char* unguarded_ptr(const Tensor& t) {
  return static_cast<char*>(t.storage()->unguarded_data()) + t.offset() * static_cast<std::int64_t>(dtype_size(t.dtype()));
}
}  // namespace

PartitionedParameters::PartitionedParameters(const ZeroPlan& plan, int rank, std::shared_ptr<Communicator> channel,
                                             Tensor shard, std::vector<Tensor> params)
    : plan_(plan), rank_(rank), channel_(std::move(channel)), shard_(std::move(shard)), params_(std::move(params)) {
  ZERO_CHECK(shard_.numel() == plan_.layout.partition_size(rank_),
             "ZeRO stage 3: the shard has {} elements, rank {}'s partition {}", shard_.numel(), rank_,
             plan_.layout.partition_size(rank_));
  ZERO_CHECK(channel_ != nullptr, "ZeRO stage 3: null gather channel");
  unit_of_.assign(params_.size(), kNone);
  units_.resize(plan_.units.size());
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const GatherUnit& g = plan_.units[u];
    Unit& unit = units_[u];
    unit.buffer = Tensor::empty({g.size()}, plan_.options.dtype, shard_.device());
    for (std::size_t i = g.first_param; i < g.end_param; ++i) {
      const ParamRange& r = plan_.layout.params()[i];
      params_[i].set_data(unit.buffer.as_strided(r.shape, contiguous_strides(r.shape), r.offset - g.begin));
      unit_of_[i] = u;
    }
    gather_purposes_.push_back("gather of " + g.name);  // Note [Collective identity]
    unit.guard.owner = this;
    unit.guard.unit = u;
    unit.buffer.storage()->free_memory();
    unit.buffer.storage()->set_guard(&unit.guard);
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
  drop_scratch();
  // Gathered units stay as they are: the parameters keep their storage, so what gather_all() gathered
  // is still readable after the optimizer is gone. A freed one then reads as plainly freed.
  for (Unit& unit : units_) {
    try {
      if (unit.state == State::in_flight) unit.work->wait();  // the communicator writes the buffer until then
    } catch (...) {
      unit.buffer.storage()->free_memory();  // nothing valid arrived; whoever waits on the job reports it
    }
    unit.buffer.storage()->set_guard(nullptr);
  }
  for (const Tensor& p : params_)
    if (Storage* copy = compute_copy_storage(p)) copy->set_guard(nullptr);
}

// ---- the events: a forward use, a backward node, a final gradient, a read anywhere ---------------------

void PartitionedParameters::on_use(std::size_t u) {
  if (held_) return;  // gather_all(): everything is gathered and stays so
  if (u != current_)
    switch_to(u);
  else if (units_[u].state != State::gathered)
    need(u, true);  // evicted by a gather the bound did not leave room for
}

bool PartitionedParameters::all_gradients_taken(std::size_t u) const {
  const GatherUnit& g = plan_.units[u];
  return units_[u].final_grads == static_cast<int>(g.end_param - g.first_param);
}

std::size_t PartitionedParameters::live_compute_copy_bytes() const {
  std::size_t bytes = 0;
  for (const Tensor& p : params_)
    if (const Storage* copy = compute_copy_storage(p); copy != nullptr && !copy->freed()) bytes += copy->nbytes();
  return bytes;
}

void PartitionedParameters::before_node(std::uint32_t context) {
  if (held_ || context == 0 || context > units_.size()) return;
  const std::size_t u = context - 1;
  // on_gradient freed it, and what is left of its backward needs no parameter (Note [Nodes after the
  // last gradient]).
  if (in_backward_ && all_gradients_taken(u)) return;
  if (u != current_)
    switch_to(u);
  else if (units_[u].state != State::gathered)
    need(u, true);
}

void PartitionedParameters::on_gradient(std::size_t u) {
  if (!in_backward_) return;  // the reducer refuses a gradient outside ZeroOptimizer::backward
  ++units_[u].final_grads;
  if (all_gradients_taken(u) && !held_) free_unit(u);
}

void PartitionedParameters::switch_to(std::size_t u) {
  const std::size_t previous = current_;
  current_ = u;
  autograd::set_record_context(static_cast<std::uint32_t>(u + 1));  // context = unit index + 1 (0: none)
  if (!in_backward_ && previous != kNone) free_unit(previous);  // the forward is done with that layer
  need(u, true);
  prefetch();
}

void PartitionedParameters::UnitGuard::before_access(Storage& storage) {
  PartitionedParameters& p = *owner;
  if (p.units_[unit].state == State::in_flight) {
    p.wait(unit);
    return;
  }
  if (p.units_[unit].state == State::gathered) {  // a compute copy made after its unit's gather
    storage.set_guard(nullptr);
    return;
  }
  ZERO_CHECK(!p.walking_,
             "ZeRO stage 3: {} was read while stage 3 was gathering another unit (a read from inside a gather); "
             "read parameters in a layer's forward or after optimizer.gather_parameters()",
             p.unit_description(unit));
  p.need(unit, /*may_evict=*/false);
}

std::string PartitionedParameters::unit_description(std::size_t u) const {
  const GatherUnit& g = plan_.units[u];
  std::string names;
  for (std::size_t i = g.first_param; i < g.end_param && i < g.first_param + 3; ++i)
    names += (names.empty() ? "" : ", ") + plan_.layout.params()[i].name;
  if (g.end_param - g.first_param > 3) names += ", ...";
  return fmt::format("a parameter of unit '{}' ({})", g.name, names);
}

// ---- the schedule (Note [One schedule]) ----------------------------------------------------------------

void PartitionedParameters::need(std::size_t u, bool may_evict) {
  Unit& unit = units_[u];
  if (unit.state != State::freed) {
    if (unit.entry >= static_cast<std::int64_t>(read_pos_)) {  // prefetched for this read
      record_.push_back(u);
      consume(unit.entry, u);
    }
    wait(u);
    unit.last_use = ++clock_;
    return;
  }
  ZERO_CHECK(!walking_, "ZeRO stage 3: {} was needed while another unit was being gathered (internal error)",
             unit_description(u));
  walking_ = true;
  try {
    record_.push_back(u);
    if (!started_) start_round(false);
    const std::vector<std::size_t>& schedule = schedule_[phase_];
    bool found = false;
    while (!found && issue_pos_ < schedule.size()) {
      const std::size_t e = issue_pos_++;
      join(static_cast<std::int64_t>(e), schedule[e], may_evict);
      if (schedule[e] == u) {
        consume(static_cast<std::int64_t>(e), u);
        found = true;
      }
    }
    if (!found) extension_rounds(u, may_evict, false);
    walking_ = false;
  } catch (...) {
    walking_ = false;
    throw;
  }
  wait(u);
  unit.last_use = ++clock_;
}

void PartitionedParameters::start_round(bool settling) {
  double v[2] = {settling ? 0.0 : 1.0, settling ? 1.0 : 0.0};  // {reads, settles}
  channel_->with_purpose(fmt::format("stage-3 schedule start ({})", phase_name(phase_)))
      .all_reduce_sum(std::span<double>(v, 2));
  ++rounds_;
  started_ = v[0] > 0;
}

void PartitionedParameters::extension_rounds(std::size_t want, bool may_evict, bool learn_schedule) {
  const std::size_t n_units = units_.size();
  for (;;) {
    // {needs, settles, differs from the schedule, then per unit: asked for}
    std::vector<double> v(3 + n_units, 0.0);
    if (want != kNone) {
      v[0] = 1;
      v[3 + want] = 1;
    } else {
      v[1] = 1;
      v[2] = learn_schedule && record_ != schedule_[phase_] ? 1 : 0;
    }
    channel_->with_purpose(fmt::format("stage-3 schedule round ({})", phase_name(phase_))).all_reduce_sum(v);
    ++rounds_;
    if (trace::active()) trace::instant("schedule round", "stage3", trace::kComputeThread, {{"needs", v[0]}});
    std::vector<std::size_t> asked;
    for (std::size_t x = 0; x < n_units; ++x)
      if (v[3 + x] > 0) asked.push_back(x);
    if (asked.empty()) {  // nobody needs anything: every rank is settling
      if (v[2] > 0) learn();
      return;
    }
    std::vector<std::size_t> for_others;
    for (std::size_t x : asked)
      if (join(-1, x, may_evict) && x != want && x != current_) for_others.push_back(x);
    for (std::size_t x : for_others) free_unit(x);  // gathered for the others: not kept
    drop_scratch();
    if (want != kNone) return;
  }
}

bool PartitionedParameters::join(std::int64_t entry, std::size_t u, bool may_evict) {
  Unit& unit = units_[u];
  const std::int64_t size = plan_.units[u].size();
  if (unit.state == State::freed) {
    if (may_evict) make_room(size, u);
    issue(u);
    unit.entry = entry;
    return true;
  }
  // This rank's copy is busy (gathered, or in flight for an earlier entry): join into scratch.
  Scratch s;
  s.buffer = Tensor::empty({size}, plan_.options.dtype, shard_.device());
  s.elements = size;
  const GatherUnit& g = plan_.units[u];
  const std::vector<std::size_t> counts = plan_.layout.range_counts(g.begin, g.end);
  char* recv = element_ptr(s.buffer, 0);
  const char* send = recv;
  const std::int64_t mine = plan_.layout.partition_begin(rank_);
  if (counts[static_cast<std::size_t>(rank_)] > 0) send = element_ptr(shard_, std::max(g.begin, mine) - mine);
  s.work = channel_->with_purpose(gather_purposes_[u]).all_gather_async(send, recv, counts, plan_.options.dtype);
  live_ += size;
  max_live_ = std::max(max_live_, live_);
  ++gathers_;
  scratch_.push_back(std::move(s));
  return false;
}

void PartitionedParameters::consume(std::int64_t entry, std::size_t keep) {
  // Entries passed by without a read were gathered for the others: free what this rank did not use.
  const std::vector<std::size_t>& schedule = schedule_[phase_];
  for (std::size_t i = read_pos_; i < static_cast<std::size_t>(entry) && i < schedule.size(); ++i) {
    const std::size_t v = schedule[i];
    if (v != keep && v != current_ && units_[v].entry == static_cast<std::int64_t>(i)) free_unit(v);
  }
  read_pos_ = std::max(read_pos_, static_cast<std::size_t>(entry) + 1);
  drop_scratch();
}

void PartitionedParameters::learn() {
  // Every rank's record of on-demand gathers, one row each (unit + 1; 0 ends a row), summed.
  const std::size_t cap = 4 * units_.size() + 16, n = static_cast<std::size_t>(channel_->world_size());
  std::vector<double> rows(n * cap, 0.0);
  for (std::size_t k = 0; k < record_.size() && k < cap; ++k)
    rows[static_cast<std::size_t>(rank_) * cap + k] = static_cast<double>(record_[k] + 1);
  channel_->with_purpose(fmt::format("stage-3 schedule records ({})", phase_name(phase_))).all_reduce_sum(rows);
  ++rounds_;
  std::vector<std::size_t> merged;
  for (std::size_t r = 0; r < n; ++r) {
    std::vector<std::size_t> row;
    for (std::size_t k = 0; k < cap && rows[r * cap + k] > 0; ++k) row.push_back(static_cast<std::size_t>(rows[r * cap + k]) - 1);
    merged = merge_orders(merged, row);
  }
  if (merged.size() <= cap) schedule_[phase_] = std::move(merged);
}

void PartitionedParameters::end_phase() {
  started_ = false;
  issue_pos_ = read_pos_ = 0;
  record_.clear();
  for (Unit& unit : units_) unit.entry = -1;
}

void PartitionedParameters::settle() { end_schedule(false); }

void PartitionedParameters::end_schedule(bool learn_schedule) {
  if (held_) return;  // gather_all() on every rank: nobody walks until it ends
  walking_ = settling_ = true;
  try {
    if (!started_) start_round(true);
    if (started_) {
      const std::vector<std::size_t>& schedule = schedule_[phase_];
      while (issue_pos_ < schedule.size()) {
        const std::size_t e = issue_pos_++;
        join(static_cast<std::int64_t>(e), schedule[e], true);
      }
      consume(static_cast<std::int64_t>(schedule.size()), current_);
      extension_rounds(kNone, true, learn_schedule);
    }
    walking_ = settling_ = false;
  } catch (...) {
    walking_ = settling_ = false;
    throw;
  }
  end_phase();
}

void PartitionedParameters::prefetch() {
  const std::int64_t budget = plan_.options.stage3_prefetch_bucket_size;
  const std::vector<std::size_t>& schedule = schedule_[phase_];
  std::int64_t ahead = 0;
  while (budget > 0 && started_ && issue_pos_ < schedule.size()) {
    const std::size_t v = schedule[issue_pos_];
    const std::int64_t size = plan_.units[v].size();
    ahead += size;
    if (units_[v].state != State::freed || ahead > budget ||
        live_ + size > plan_.options.stage3_max_live_parameters)
      break;  // a busy unit is left for the walk, which joins it into scratch if it is still busy
    join(static_cast<std::int64_t>(issue_pos_++), v, false);
  }
}

// ---- backward boundaries -------------------------------------------------------------------------------

void PartitionedParameters::begin_backward() {
  if (held_) {  // every rank called gather_all(): every rank frees the same units
    held_ = false;
    release_all();
  }
  end_schedule(true);  // the forward phase; a forward that ends in a backward teaches the schedule
  for (Unit& unit : units_) unit.final_grads = 0;
  phase_ = kBackward;
  started_ = true;  // every rank is here (begin_backward is collective): no start round needed
  in_backward_ = true;
  prefetch();  // the backward's first units, before autograd asks for them
}

void PartitionedParameters::finish_backward() { end_schedule(true); }

void PartitionedParameters::end_backward() {
  in_backward_ = false;
  phase_ = kForward;
  end_phase();
  current_ = kNone;
  autograd::set_record_context(0);
  drop_scratch();
  for (std::size_t u = 0; u < units_.size(); ++u) free_unit(u);  // waits for prefetches; rethrows a failure
}

void PartitionedParameters::release_all() noexcept {
  held_ = false;
  in_backward_ = false;
  phase_ = kForward;
  end_phase();
  current_ = kNone;
  autograd::set_record_context(0);
  drop_scratch();
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
  settle();
  release_all();
  for (std::size_t u = 0; u < units_.size(); ++u) issue(u);  // every rank, every unit, in unit order
  for (std::size_t u = 0; u < units_.size(); ++u) wait(u);
  autograd::set_record_context(0);  // nothing recorded now needs a gather before it runs
  held_ = true;
}

// ---- one unit's gather and release ---------------------------------------------------------------------

void PartitionedParameters::issue(std::size_t u) {
  // The unit is the flat range [begin, end): rank r contributes the part inside its partition, so the
  // contributions in rank order are the range itself.
  const GatherUnit& g = plan_.units[u];
  Unit& unit = units_[u];
  const std::vector<std::size_t> counts = plan_.layout.range_counts(g.begin, g.end);
  unit.buffer.storage()->allocate_memory();
  char* recv = unguarded_ptr(unit.buffer);
  const char* send = recv;
  const std::int64_t mine = plan_.layout.partition_begin(rank_);
  if (counts[static_cast<std::size_t>(rank_)] > 0) send = element_ptr(shard_, std::max(g.begin, mine) - mine);
  try {
    unit.work = channel_->with_purpose(gather_purposes_[u]).all_gather_async(send, recv, counts, plan_.options.dtype);
  } catch (...) {
    unit.buffer.storage()->free_memory();
    throw;
  }
  unit.state = State::in_flight;  // the guard stays: a read waits for the gather
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
  unit.buffer.storage()->set_guard(nullptr);
  for (std::size_t i = g.first_param; i < g.end_param; ++i)
    if (Storage* copy = compute_copy_storage(params_[i])) copy->set_guard(nullptr);
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
  unit.buffer.storage()->set_guard(&unit.guard);
  for (std::size_t i = g.first_param; i < g.end_param; ++i) {
    free_compute_copy(params_[i]);
    if (Storage* copy = compute_copy_storage(params_[i])) copy->set_guard(&unit.guard);
  }
  unit.state = State::freed;
  unit.entry = -1;
  live_ -= g.size();
  if (trace::active()) trace::instant("release", "stage3", trace::kComputeThread, {{"unit", g.name}});
}

void PartitionedParameters::drop_scratch() noexcept {
  for (Scratch& s : scratch_) {
    try {
      s.work->wait();  // the communicator writes the buffer until then
    } catch (...) {
      // reported by whoever waits on the unit gathers that follow it on the channel
    }
    live_ -= s.elements;
  }
  scratch_.clear();
}

void PartitionedParameters::make_room(std::int64_t elements, std::size_t keep) {
  const std::int64_t bound = plan_.options.stage3_max_live_parameters;
  // Gathered units before in-flight ones, least recently used first; never the unit in use (while
  // settling nothing is in use).
  auto order = [&](std::size_t w) { return std::make_pair(units_[w].state == State::in_flight, units_[w].last_use); };
  while (live_ + elements > bound) {
    std::size_t victim = kNone;
    for (std::size_t v = 0; v < units_.size(); ++v) {
      if (v == keep || (v == current_ && !settling_) || units_[v].state == State::freed) continue;
      if (victim == kNone || order(v) < order(victim)) victim = v;
    }
    if (victim == kNone && !scratch_.empty()) {
      drop_scratch();
      continue;
    }
    // Only the unit in use is left (a layer's unit beside the one a read outside it needs): the bound
    // gives way by that unit. plan_zero checks that every unit fits on its own.
    if (victim == kNone) return;
    free_unit(victim);
  }
}

}  // namespace zero::dist
