// MpiCommunicator: the CPU backend of Communicator, over MPI point-to-point calls on host buffers.
//
// All MPI traffic of a communicator is issued by ONE communication thread that it owns, from a FIFO
// queue: async calls enqueue and return a Work, blocking calls enqueue and wait. So collectives leave
// every rank in program order, and the training thread can overlap an async reduce-scatter with
// backward. MPI is initialised with MPI_THREAD_SERIALIZED (calls from any thread, one at a time).
//
// Algorithms were chosen by measurement on one node with OpenMPI 4.1, whose own MPI_Allreduce and
// MPI_Reduce_scatter_block were several times slower than a plain ring over point-to-point messages
// (figures in docs/collectives.md):
//   reduce_scatter  ring (Patarasuk & Yuan 2009): n-1 steps, each forwards the destination rank's
//                   partial sum to the right neighbour; per-rank counts; segment-major pipelining.
//   all_gather      ring: n-1 steps, each forwards the slice received in the previous step.
//   all_reduce      ring reduce-scatter over an even split + ring all-gather (the "ring all-reduce").
//   fp16/bf16 reduce_scatter and all_reduce with fp32 accumulation (set_fp32_accumulation): the
//                   reduce-scatter is a direct all-to-all of the 16-bit slices, summed in fp32 by the owner.
//   reduce_scatter with int8 quantization (set_quantized_gradients): the same all-to-all of int8 blocks
//                   and their fp32 scales, dequantized and summed in fp32 by the owner.
//   reduce          ring reduce-scatter + each rank sends its reduced slice to root.
//   broadcast       pipelined chain from root.
// Waiting ranks poll, then sleep, instead of busy-polling (Note [Waiting without spinning] in the .cpp):
// with more ranks than cores, spinning steals the CPU of the rank being waited for. The same loop
// enforces each collective's deadline (Communicator::set_timeout) and asks the control channel
// (control_channel.h) one question, control_channel::first_gone_peer(): "has a peer left or failed?",
// so no rank is left waiting for a peer that failed or left (Note [No hang] in job_runtime.cpp). That
// question is all the collectives know of the job runtime (job_runtime.h: mpi_world, fail_job, ...).
// fp16/bf16 reductions travel in their own dtype, each hop adding in fp32 and rounding once (NCCL's
// behaviour), unless set_reduce_in_fp32(true) widens them to fp32 for the whole collective and narrows
// once at the end (Note [Wire dtype] in communicator.cpp). The communication thread times every
// collective it runs (Ledger::seconds).
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "distributed/comm/communicator.h"
#include "distributed/comm/mpi_check.h"

namespace zero::dist {

namespace detail {
class CpuWork;
}  // namespace detail

class MpiCommunicator final : public Communicator {
 public:
  /// Duplicates `comm` (collective over its ranks) and starts the communication thread. MPI must be
  /// initialised with at least MPI_THREAD_SERIALIZED (throws zero::Error otherwise), and no other
  /// thread may call MPI while this communicator has work queued. Most code wants mpi_world()
  /// (job_runtime.h).
  explicit MpiCommunicator(MPI_Comm comm);
  /// Calls shutdown().
  ~MpiCommunicator() override;

  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view backend_name() const override { return "mpi"; }

  /// Runs what is still queued, joins the communication thread and frees the duplicated MPI
  /// communicator. Idempotent; must happen before MPI_Finalize. Later calls throw zero::Error.
  void shutdown();
  /// Makes the collective in progress and everything queued fail at once (PeerGone) instead of
  /// waiting for peers: for a rank that is leaving the job after an error (fail_job, job_runtime.h).
  /// Thread-safe.
  void abandon();

  /// Size of the pipelining segments of the ring reduce-scatter, ring all-gather and chain broadcast,
  /// in bytes (default 4 MiB, the best measured on one node; rounded down to whole fp32 elements, at
  /// least one). Every rank must use the same value.
  void set_segment_bytes(std::size_t bytes);
  bool supports_quantized_gradients() const override { return true; }
  bool times_collectives() const override { return true; }
  std::size_t segment_bytes() const { return segment_bytes_; }

 protected:
  /// MPI_Comm_dup of this communicator's MPI communicator (run on the communication thread, in order)
  /// and a communication thread of its own. Needs MPI_THREAD_MULTIPLE (throws zero::Error otherwise).
  std::shared_ptr<Communicator> make_duplicate() override;
  std::shared_ptr<Work> issue_all_reduce(void* buf, std::size_t count, DType dtype,
                                         ReduceOp op) override;
  std::shared_ptr<Work> issue_reduce_scatter(const void* send, void* recv,
                                             std::span<const std::size_t> counts,
                                             DType dtype) override;
  std::shared_ptr<Work> issue_all_gather(const void* send, void* recv,
                                         std::span<const std::size_t> counts, DType dtype) override;
  std::shared_ptr<Work> issue_reduce(void* buf, std::size_t count, DType dtype, int root) override;
  std::shared_ptr<Work> issue_broadcast(void* buf, std::size_t count, DType dtype,
                                        int root) override;
  std::shared_ptr<Work> issue_barrier() override;
  double control_all_reduce(double value, ReduceOp op) override;
  void control_all_reduce_values(std::span<double> values, ReduceOp op) override;
  double wire_bus_bytes(Collective c, std::size_t count, DType dtype) const override;
  void collect_timers(Ledger& ledger) const override;

 private:
  struct Adopt {};
  // Takes `comm` as it is (already duplicated): make_duplicate's.
  MpiCommunicator(MPI_Comm comm, Adopt);
  void start(MPI_Comm comm);
  // Note [Identity records]: posts the all-gather of this rank's record of `identity`; polls it (throws
  // CollectiveMismatch when the records are in and differ); waits for it and compares.
  void post_identity(const CollectiveIdentity& identity);
  void poll_identity();
  void finish_identity();
  // Runs `task` on the communication thread after everything queued before it. With one rank there
  // is no traffic to order, so the task runs inline (a local copy costs no thread hand-off).
  // `name` labels the collective in timeout messages; the step and timeout in force are captured.
  // `bytes` (this rank's buffer) labels the collective's span in a trace (core/trace.h).
  std::shared_ptr<Work> enqueue(const char* name, std::function<void()> task, std::size_t bytes = 0);
  void run_queue();

  // ---- algorithms; run on the communication thread only ----
  // Waits for every request. peers[i] is the rank point-to-point request requests[i] talks to;
  // nullptr: the requests are a non-blocking collective's. Throws CollectiveTimeout past the deadline,
  // PeerGone when control_channel::first_gone_peer() named a peer and the requests did not finish
  // within a short grace, after cancelling the point-to-point requests still pending; a collective's
  // are left pending (Note [Never cancel a collective] in mpi_communicator.cpp, Note [No hang] in
  // job_runtime.cpp).
  void wait_all(int count, MPI_Request* requests, const int* peers = nullptr);
  void exchange(const void* send, std::size_t send_count, MPI_Datatype type, int dest, void* recv,
                std::size_t recv_count, int source, int tag);
  // Offsets are prefix sums of counts (elements); `send` is never written. T: float, half or bfloat16
  // (partial sums travel as T, each hop adds in fp32 and rounds once).
  template <typename T>
  void ring_reduce_scatter(const T* send, T* recv, const std::vector<std::size_t>& counts,
                           const std::vector<std::size_t>& offsets, ReduceOp op);
  void ring_reduce_scatter_any(const void* send, void* recv, const std::vector<std::size_t>& counts,
                               const std::vector<std::size_t>& offsets, ReduceOp op, DType dtype);
  // One round of an all-to-all of bytes, per peer q: what to send it and where its message goes.
  struct AllToAllRound {
    explicit AllToAllRound(int n)
        : send(std::size_t(n)), recv(std::size_t(n)), send_bytes(std::size_t(n)), recv_bytes(std::size_t(n)) {}
    std::vector<const void*> send;
    std::vector<void*> recv;
    std::vector<std::size_t> send_bytes, recv_bytes;
  };
  void alltoall_round(const AllToAllRound& round, int tag);
  // Note [fp32-accumulating reduce-scatter] (communicator.cpp): every rank sends slice d of its 16-bit
  // `send` to rank d, and sums the n contributions to its own slice in fp32, rounding once.
  void alltoall_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                               const std::vector<std::size_t>& offsets, DType dtype);
  // Note [int8 quantized reduce-scatter] (quantize.cpp): every rank quantizes slice d of `send` in
  // blocks of `block` elements and sends it to rank d, and sums the n dequantized contributions to its
  // own slice in fp32, rounding once. Any dtype.
  void quantized_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                                const std::vector<std::size_t>& offsets, DType dtype, std::size_t block);
  void ring_all_gather_bytes(const void* send, void* recv, const std::vector<std::size_t>& counts,
                             const std::vector<std::size_t>& offsets, std::size_t elem_size);
  // fp32: widen 16-bit reductions (reduce_in_fp32() as it was when the call was issued); accumulate:
  // the fp32-accumulating all-to-all instead of the ring (accumulates_in_fp32() at issue).
  void all_reduce_impl(void* buf, std::size_t count, DType dtype, ReduceOp op, bool fp32, bool accumulate);
  // block > 0: the quantized all-to-all (quantized_gradients() at issue).
  void reduce_scatter_impl(const void* send, void* recv, const std::vector<std::size_t>& counts,
                           DType dtype, bool fp32, bool accumulate, std::size_t block);
  void reduce_impl(void* buf, std::size_t count, DType dtype, int root, bool fp32);
  void broadcast_impl(void* buf, std::size_t count, DType dtype, int root);
  float* scratch(int which, std::size_t elems);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
  std::size_t segment_bytes_ = std::size_t{4} << 20;
  bool check_identities_ = true;  // Note [Identity records]
  // Communication thread only: the record exchange of the task in progress.
  MPI_Request identity_request_ = MPI_REQUEST_NULL;
  IdentityRecord identity_mine_;
  std::vector<IdentityRecord> identity_all_;

  // fp32 scratch reused across calls (first-touching fresh pages on every call costs more than the
  // copy itself): 0/1 the ring's one-segment double buffer, 2/3 widened fp16/bf16 send/recv buffers,
  // 4/5 the quantized reduce-scatter's outgoing and incoming messages (floats: the scales stay aligned).
  std::vector<float> scratch_[6];

  std::mutex mutex_;
  std::condition_variable wake_;
  struct Task {
    std::function<void()> fn;
    std::shared_ptr<detail::CpuWork> work;
    const char* name = "";
    std::int64_t step = 0;
    double timeout_s = 0;
    std::size_t bytes = 0;
    CollectiveIdentity identity;  // compared across ranks before the task runs
  };
  std::deque<Task> queue_;
  bool stopping_ = false;  // set by shutdown(); the queue drains, then the thread ends
  std::thread thread_;
  // Communication thread only: the task being run, and the failure that ended the job's collectives
  // (every later task fails with it at once: the ranks are no longer in step).
  Task current_;
  std::exception_ptr broken_;
  std::atomic<bool> abandon_{false};
  std::vector<std::weak_ptr<MpiCommunicator>> children_;  // duplicates: shut down and abandoned with this one
  // Nanoseconds the communication thread spent per collective, not yet moved into a ledger.
  mutable std::atomic<std::int64_t> busy_ns_[kNumCollectives] = {};
  mutable std::atomic<std::int64_t> cpu_ns_{0};  // the same collectives' thread CPU time
};

}  // namespace zero::dist
