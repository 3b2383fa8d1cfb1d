// InProcessCommunicator: N ranks of a data-parallel group as N threads of one process.
//
// The same collectives, ledger, wire dtype, deadlines and "no hang" guarantees as MpiCommunicator, with
// no MPI underneath: the ranks share one world object, and a collective reads the peers' buffers
// directly. So a ZeRO step on 4 ranks runs under plain ctest, and a learner can stop all ranks of one
// step in a debugger (examples/zero_in_one_process.cpp). Results are bit for bit those of the MPI
// backend for the same inputs: every element is summed in the order of MpiCommunicator's ring and
// rounded at the same hops (Note [The ring's order] in the .cpp).
//
// A collective on rank r, on r's communication thread (one per rank, a FIFO queue as MpiCommunicator
// has, so an async call returns at once and overlaps with the training thread):
//   1. arrive: r posts its buffers and arguments for its k-th collective in the world and waits until
//      every rank has posted its k-th (Note [Arrive, read, leave] in the .cpp);
//   2. read:   r computes its OWN result from the posted buffers (its slice of a reduce-scatter, the
//      whole buffer of an all-reduce, ...), in the ring's order;
//   3. leave:  r waits until every rank has finished reading, so no buffer it posted is read after its
//      collective returns; only then are results that overwrite an input (all-reduce, reduce, control
//      scalars) written.
// A rank whose thread ends (run_ranks), or whose communicator fails, is marked in the world: ranks
// waiting for it fail at once with PeerGone instead of hanging, and a collective past its deadline
// (Communicator::set_timeout) throws CollectiveTimeout naming the ranks that did not arrive.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "distributed/comm/communicator.h"

namespace zero::dist {

namespace detail {
class InProcessWorld;
class CpuWork;
struct Posted;
struct RingScratch;
}  // namespace detail

class InProcessCommunicator final : public Communicator {
 public:
  /// Rank `rank` of `world`; starts its communication thread when the world has more than one rank.
  /// Most code wants make_inprocess_world() or run_ranks().
  InProcessCommunicator(std::shared_ptr<detail::InProcessWorld> world, int rank);
  /// Calls leave().
  ~InProcessCommunicator() override;

  InProcessCommunicator(const InProcessCommunicator&) = delete;
  InProcessCommunicator& operator=(const InProcessCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view backend_name() const override { return "inprocess"; }
  bool supports_quantized_gradients() const override { return true; }
  bool times_collectives() const override { return true; }

  /// This rank is done: runs what is still queued (the peers expect it), joins the communication
  /// thread and marks the rank as having left, so a peer that later waits for it in a collective fails
  /// at once with PeerGone (departed() true) — the in-process twin of finalize_mpi's leaving notice.
  /// Idempotent; later collectives throw zero::Error.
  void leave();
  /// This rank failed: the collective in progress (if still waiting for peers) and everything queued
  /// fail at once with PeerGone, the rank is marked as failed (peers waiting for it fail with PeerGone,
  /// departed() false), then leave(). The in-process twin of fail_job's notice. Thread-safe.
  void fail();

 protected:
  /// A communicator of a new world over the same threads (the k-th duplicate of every rank shares one).
  std::shared_ptr<Communicator> make_duplicate() override;
  std::shared_ptr<Work> issue_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override;
  std::shared_ptr<Work> issue_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                                             DType dtype) override;
  std::shared_ptr<Work> issue_all_gather(const void* send, void* recv, std::span<const std::size_t> counts,
                                         DType dtype) override;
  std::shared_ptr<Work> issue_reduce(void* buf, std::size_t count, DType dtype, int root) override;
  std::shared_ptr<Work> issue_broadcast(void* buf, std::size_t count, DType dtype, int root) override;
  std::shared_ptr<Work> issue_barrier() override;
  double control_all_reduce(double value, ReduceOp op) override;
  void control_all_reduce_values(std::span<double> values, ReduceOp op) override;
  double wire_bus_bytes(Collective c, std::size_t count, DType dtype) const override;
  void collect_timers(Ledger& ledger) const override;

 private:
  // One queued collective: what this rank posts in the world (buffers, counts, ...) and how long it
  // may wait for its peers.
  struct Task {
    std::shared_ptr<detail::Posted> posted;
    std::shared_ptr<detail::CpuWork> work;
    std::int64_t step = 0;
    double timeout_s = 0;
  };

  // Queues `posted` behind everything issued before it (inline with one rank: nothing to order).
  std::shared_ptr<Work> enqueue(std::shared_ptr<detail::Posted> posted);
  void run_queue();
  // Runs one collective: arrive, read, leave (Note [Arrive, read, leave]). Communication thread only.
  void run(const Task& task);
  void collective(const Task& task);
  void arrive(const Task& task);
  void check_same_collective();
  void wait_until_everyone_has_read();

  std::shared_ptr<detail::InProcessWorld> world_;
  int rank_ = 0;
  int world_size_ = 1;
  // Communication thread only: the number of collectives this rank has started, the peers' posts of
  // the current one, and scratch reused across calls.
  std::int64_t sequence_ = 0;
  std::vector<const detail::Posted*> peers_;
  std::unique_ptr<detail::RingScratch> ring_;
  std::vector<char> result_;             // all_reduce / reduce result before it overwrites the buffer
  std::vector<double> control_result_;   // the same for control scalars

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  bool stopping_ = false;  // set by leave(); the queue drains, then the thread ends
  std::thread thread_;
  // Communication thread only: the failure that ended this rank's collectives (every later task fails
  // with it at once: the ranks are no longer in step).
  std::exception_ptr broken_;
  std::atomic<bool> abandon_{false};
  int duplicates_made_ = 0;  // guarded by the world's mutex
  std::vector<std::weak_ptr<InProcessCommunicator>> children_;  // fail() fails them too
  // Nanoseconds (wall, thread CPU) the communication thread spent per collective, not yet in a ledger.
  mutable std::atomic<std::int64_t> busy_ns_[kNumCollectives] = {};
  mutable std::atomic<std::int64_t> cpu_ns_{0};
};

/// One communicator per rank of a new world of `world_size` (>= 1) ranks; element r is rank r. The
/// communicators share the world, and each must be used from one thread (its rank's) at a time. Throws
/// zero::Error for world_size < 1.
std::vector<std::shared_ptr<Communicator>> make_inprocess_world(int world_size);

/// Runs body(communicator of rank r) on `world_size` threads, r = 0 .. world_size-1, of a new in-process
/// world, and returns when all have returned. When a body returns, its rank leaves (queued collectives
/// still run); when it throws, its rank fails (InProcessCommunicator::leave / fail), so ranks still
/// waiting for it in a collective fail at once with PeerGone instead of hanging. If any body threw,
/// rethrows one exception: the lowest-numbered rank's among those that failed on their own (not with
/// PeerGone from a peer that failed), else the lowest-numbered rank's. Throws zero::Error for
/// world_size < 1.
void run_ranks(int world_size, const std::function<void(std::shared_ptr<Communicator>)>& body);

}  // namespace zero::dist
