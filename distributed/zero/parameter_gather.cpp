#include "distributed/zero/parameter_gather.h"

#include <algorithm>
#include <exception>

#include "autograd/autograd.h"
#include "core/check.h"
#include "core/trace.h"

namespace zero::dist {

// Note [Overlapped all-gather]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// After the step every rank must receive every other rank's updated partition before it can run the
// next forward. With overlap_param_gather the all-gathers are issued asynchronously instead of waited
// for: one per chunk of allgather_bucket_size elements, in flat order, which is named_parameters()
// order and so (for GPT, and for any model that registers its layers in the order it runs them) the
// order the next forward reads them. The communication thread works through them while the training
// thread draws the next batch and starts the forward; each layer reads a parameter through
// Module::compute, whose parameter-use hook (autograd::register_parameter_use_hook) waits for the chunks
// covering that parameter only, once per step (param_ready_). A forward that reads parameters in
// another order is still correct, it just waits earlier. The bytes gathered are the same as without
// overlap, so results are bitwise identical. Everything that reads parameters outside a forward (a
// checkpoint, a comparison across ranks) calls ZeroOptimizer::wait_for_params() first; backward() and
// step() complete the gather before they touch the gradients or the parameters (the step writes this
// rank's partition, which is the send buffer of an in-flight gather). What limits the overlap on a CPU is
// in docs/collectives.md: the communication thread needs a core to make progress.

namespace {

// Waits for every work, then rethrows the first failure (until all have finished they may write).
void wait_all(std::vector<std::shared_ptr<Work>>& works) {
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

}  // namespace

ParameterGather::ParameterGather(const ZeroPlan& plan, int rank, std::shared_ptr<Communicator> comm, Tensor flat_params,
                                 std::vector<Tensor> params)
    : plan_(plan),
      rank_(rank),
      comm_(std::move(comm)),
      flat_params_(std::move(flat_params)),
      params_(std::move(params)),
      param_ready_(params_.size(), 1) {
  if (!plan_.options.overlap_param_gather || plan_.options.stage == 0) return;
  for (std::size_t i = 0; i < params_.size(); ++i)
    hook_ids_.push_back(
        autograd::register_parameter_use_hook(params_[i], [this, i](const Tensor&) { wait_for_param(i); }));
}

ParameterGather::~ParameterGather() {
  for (std::size_t i = 0; i < hook_ids_.size(); ++i) autograd::remove_parameter_use_hook(params_[i], hook_ids_[i]);
  try {
    wait_in_flight();
  } catch (...) {
    // Destructors must not throw; whoever waited on the gather saw its error.
  }
}

std::shared_ptr<Work> ParameterGather::gather_chunk(std::int64_t begin, bool async) {
  // Chunk [begin, begin + allgather_bucket_size) of the flat buffer: this rank sends the part in its
  // partition, in place, and receives the whole chunk, in place.
  const FlatLayout& layout = plan_.layout;
  const std::int64_t end = std::min(layout.padded_numel(), begin + plan_.options.allgather_bucket_size);
  const std::vector<std::size_t> counts = layout.range_counts(begin, end);
  char* recv = element_ptr(flat_params_, begin);
  const char* send = recv;
  if (counts[static_cast<std::size_t>(rank_)] > 0)
    send = element_ptr(flat_params_, std::max(begin, layout.partition_begin(rank_)));
  comm_->with_purpose("all-gather of the updated parameters");
  if (async) return comm_->all_gather_async(send, recv, counts, plan_.options.dtype);
  comm_->all_gather(send, recv, counts, plan_.options.dtype);
  return nullptr;
}

void ParameterGather::all_gather() {
  pending_ = true;
  if (!plan_.options.overlap_param_gather) return complete();
  // Note [Overlapped all-gather]: the same chunks as all_gather_and_wait(), issued without waiting.
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  try {
    for (std::int64_t begin = 0; begin < plan_.layout.padded_numel(); begin += plan_.options.allgather_bucket_size)
      in_flight_.push_back(gather_chunk(begin, true));
  } catch (...) {
    try {
      wait_in_flight();  // the chunks already issued must finish
    } catch (...) {
    }
    pending_ = true;  // not every chunk went out: complete() redoes the whole gather
    throw;
  }
}

void ParameterGather::all_gather_and_wait() {
  trace::Span span("all_gather params", "step");
  std::vector<std::shared_ptr<Work>> works;
  for (std::int64_t begin = 0; begin < plan_.layout.padded_numel(); begin += plan_.options.allgather_bucket_size) {
    std::shared_ptr<Work> w = gather_chunk(begin, plan_.options.overlap_comm);
    if (w) works.push_back(std::move(w));
  }
  wait_all(works);
}

void ParameterGather::complete() {
  if (!in_flight_.empty()) return wait_in_flight();
  if (!pending_) return;
  all_gather_and_wait();
  pending_ = false;
}

void ParameterGather::wait_in_flight() {
  if (in_flight_.empty()) return;
  std::vector<std::shared_ptr<Work>> works;
  works.swap(in_flight_);
  std::fill(param_ready_.begin(), param_ready_.end(), 1);
  wait_all(works);  // on failure pending_ stays set: complete() redoes the gather
  pending_ = false;
}

void ParameterGather::wait_for_param(std::size_t i) {
  if (in_flight_.empty() || param_ready_[i]) return;
  const ParamRange& p = plan_.layout.params()[i];
  const std::int64_t chunk = plan_.options.allgather_bucket_size;
  try {
    if (p.numel > 0)
      for (std::int64_t c = p.offset / chunk; c <= (p.end() - 1) / chunk; ++c)
        in_flight_[static_cast<std::size_t>(c)]->wait();
  } catch (...) {
    wait_in_flight();  // every chunk must finish before the error goes on; rethrows it
    throw;
  }
  param_ready_[i] = 1;
}

}  // namespace zero::dist
