// ParameterGather: after the update, every rank receives every other rank's updated partition of the
// flat parameter buffer (stages 1/2; at stage 0 every rank updated everything itself). The buffer is
// gathered in fixed chunks of allgather_bucket_size elements from its start; in each chunk a rank sends
// the part inside its own partition and receives the whole chunk, both in place.
//
//   blocking    (the default) all_gather() returns when every chunk has arrived (with overlap_comm the
//               chunks are issued together and waited for together);
//   overlapped  (overlap_param_gather) all_gather() issues the chunks and returns; the next forward
//               waits, parameter by parameter, for the chunks that hold it (Note [Overlapped
//               all-gather]): the gather runs while the training thread draws the next batch and
//               computes the first layers.
//
// A failed all-gather (a collective error) leaves the step applied locally and the gather pending:
// complete() redoes it, which is safe because every rank re-sends the same partition (Note [Exception
// safety] in zero_optimizer.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/zero/zero_plan.h"

namespace zero::dist {

class ParameterGather {
 public:
  /// `flat_params` [padded_numel] model dtype; `params` the module's parameters (views of it, parallel
  /// to plan.layout.params()); with overlap_param_gather a parameter-use hook is registered on each.
  /// Cannot be copied or moved (the hooks point at it).
  ParameterGather(const ZeroPlan& plan, int rank, std::shared_ptr<Communicator> comm, Tensor flat_params,
                  std::vector<Tensor> params);
  /// Waits for gathers in flight (they write into the buffer) and removes the hooks. Never throws.
  ~ParameterGather();
  ParameterGather(const ParameterGather&) = delete;
  ParameterGather& operator=(const ParameterGather&) = delete;

  /// Starts (overlapped) or runs (blocking) the all-gather of every chunk. Collective. Rethrows a
  /// failed collective (blocking), leaving pending() set.
  void all_gather();
  /// The blocking all-gather of every chunk, whatever the options (a checkpoint load's). Collective.
  /// Rethrows the first failed chunk once all have finished; pending() is left as it was.
  void all_gather_and_wait();
  /// Waits until every parameter holds the last step's values: waits for the chunks in flight, or
  /// redoes a gather that failed. Collective only in that every rank must complete the same gathers.
  /// A no-op when nothing is pending. Rethrows a failure (pending() stays set).
  void complete();
  /// Waits for the chunks in flight only (never starts a collective). Rethrows the first failure once
  /// all of them have finished.
  void wait_in_flight();
  /// The last all-gather has not completed (in flight, or failed and to be redone).
  bool pending() const { return pending_; }
  /// The last all-gather failed and nothing of it is in flight: complete() will redo it.
  bool failed() const { return pending_ && in_flight_.empty(); }

 private:
  std::shared_ptr<Work> gather_chunk(std::int64_t begin, bool async);
  void wait_for_param(std::size_t i);

  const ZeroPlan& plan_;
  int rank_ = 0;
  std::shared_ptr<Communicator> comm_;
  Tensor flat_params_;
  std::vector<Tensor> params_;
  std::vector<int> hook_ids_;  // overlap_param_gather only
  bool pending_ = false;
  // Note [Overlapped all-gather]: chunk c covers flat elements [c·allgather_bucket_size, +size).
  std::vector<std::shared_ptr<Work>> in_flight_;  // per chunk while in flight; empty otherwise
  std::vector<char> param_ready_;                 // per parameter: its chunks have been waited for
};

}  // namespace zero::dist
