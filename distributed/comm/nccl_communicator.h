// NcclCommunicator: the GPU backend of Communicator, over NCCL on device buffers; and the host-staged
// test mode that runs the MPI backend on device buffers through pinned host memory.
//
// One process per GPU. The constructor picks the device (the launcher's local rank modulo the visible
// GPUs), makes it current, and builds the NCCL communicator from an ncclUniqueId that rank 0 creates and
// broadcasts over a bootstrap Communicator (mpi_world()). NCCL refuses two ranks on one GPU; for that
// case — the lent test machine has one GPU — use make_host_staged(mpi_world()) instead.
//
// Streams (Note [Communication stream] in the .cpp). Collectives run on a dedicated high-priority
// communication stream. Each call first records an event on the caller's current (compute) stream and
// makes the communication stream wait for it, so the collective sees every kernel issued before the call
// — a gradient bucket filled by backward — and nothing after; the returned Work holds an event recorded
// after the collective. So with overlap_comm the reduction of one bucket runs while backward computes
// the next. Work::wait() blocks the host until the collective is done (checking NCCL's asynchronous
// error state while it waits) and also makes the caller's current stream wait for it; is_completed()
// polls the event.
//
// Buffers are device pointers (cuda::device_alloc or cuda tensors) on this process's device; counts are
// elements, as in communicator.h. Every rank must call the collectives in the same order (NCCL itself
// deadlocks otherwise).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string_view>
#include <utility>

#include "distributed/comm/communicator.h"
#include "distributed/comm/scoped.h"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace zero::dist {

namespace detail {
struct NcclHandle;
// Releasers for the communicator's CUDA resources (never throw).
struct StreamFree {
  void operator()(cudaStream_t s) const;
};
struct EventFree {
  void operator()(cudaEvent_t e) const;
};
struct DeviceFree {
  void operator()(double* p) const;
};
}  // namespace detail

struct NcclOptions {
  /// CUDA device of this rank; -1: local rank (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID
  /// or LOCAL_RANK; else the global rank) modulo the number of visible devices.
  int device = -1;
  /// Note [16-bit sums on NCCL]: NCCL reduces fp16/bf16 buffers in their own type, rounding after every
  /// addition (every hop of its ring or tree), while the Communicator contract is "fp32 sum, rounded
  /// once". true (default) keeps the contract: the buffer is widened into fp32 device scratch on the
  /// communication stream, reduced in fp32 and narrowed once — twice the bytes on the wire, which the
  /// ledger counts. The initial value of Communicator::set_reduce_in_fp32 (ZeroOptimizer sets it from
  /// communication_data_type, whose default is the model dtype). false sends 16-bit data
  /// and accepts NCCL's per-hop rounding (what DeepSpeed does by default for fp16), for speed.
  bool fp32_accumulate = true;
  /// For tests: reduce-scatter and all-gather take the grouped per-slice path (one ncclReduce /
  /// ncclBroadcast per rank inside one NCCL group, the path uneven counts need) even when every rank's
  /// count is equal, so a single rank, whose one count is always "equal", runs the code that ZeRO's
  /// uneven buckets run on several ranks.
  bool force_grouped = false;
};

class NcclCommunicator final : public Communicator {
 public:
  /// Collective over `bootstrap`'s ranks (one NCCL rank per bootstrap rank, same numbering). Throws
  /// zero::Error if CUDA is not available, if more ranks run on this node than it has GPUs (pointing
  /// at make_host_staged), or if NCCL fails to initialise.
  explicit NcclCommunicator(std::shared_ptr<Communicator> bootstrap, NcclOptions options = {});
  /// Waits for the communication stream, then releases NCCL (after the last Work is gone).
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view backend_name() const override { return "nccl"; }

  int device() const { return device_; }
  /// The stream the collectives run on.
  cudaStream_t comm_stream() const { return stream_.get(); }
  const NcclOptions& options() const { return options_; }

 protected:
  /// A second NCCL communicator over the same ranks and device, with its own communication stream (so
  /// neither channel's kernels wait behind the other's), built over the same bootstrap. Collective.
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

 private:
  // Makes the communication stream wait for everything issued so far on the caller's current stream.
  void order_after_compute();
  // Records the completion event on the communication stream; `scratch` (device memory the collective
  // uses, may be null) is released once the collective is done.
  std::shared_ptr<Work> finish(std::shared_ptr<void> scratch);
  // fp32 device scratch of `count` elements on the communication stream, released with its Work.
  std::shared_ptr<void> fp32_scratch(std::size_t count);
  bool widen(DType dtype) const { return dtype != DType::f32 && reduce_in_fp32(); }
  // The fp32-accumulating 16-bit reduce-scatter (set_fp32_accumulation), enqueued on the communication
  // stream; returns its device scratch.
  std::shared_ptr<void> alltoall_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                                                DType dtype);

  std::shared_ptr<Communicator> bootstrap_;
  std::shared_ptr<Communicator> identity_channel_;  // host MPI channel for identity records (Note [Identity on NCCL])
  NcclOptions options_;
  int rank_ = 0;
  int world_size_ = 1;
  int device_ = 0;
  // Owned, so a constructor that throws half-way (NCCL init failing, say) frees what it had acquired.
  // Destroyed in reverse order, after ~NcclCommunicator has drained the stream and released NCCL.
  detail::UniqueHandle<cudaStream_t, detail::StreamFree> stream_;
  detail::UniqueHandle<cudaEvent_t, detail::EventFree> ready_;  // recorded on the compute stream before each collective
  detail::UniqueHandle<double*, detail::DeviceFree> control_dev_;  // the device double the barrier reduces
  std::shared_ptr<detail::NcclHandle> handle_;
};

/// The local rank and the number of ranks on this node, from the launcher's environment
/// (OpenMPI, MPICH, Slurm, torchrun variables); (rank, world_size) when none is set.
std::pair<int, int> local_rank_and_size(int rank, int world_size);

/// True if NCCL can give each of `world_size` ranks its own GPU on this node: CUDA is available and the
/// node's rank count is at most the visible device count. Never throws. Every rank of a node gets the
/// same answer.
bool nccl_usable(int rank, int world_size);

/// Host-staged mode (one GPU, several ranks): a Communicator over device buffers that copies each
/// buffer to pinned host memory, runs `mpi`'s collective on it and copies the result back. The copy to
/// the host happens at issue (it waits for the current stream, so the data is what the kernels issued
/// so far wrote); the MPI collective runs asynchronously on `mpi`'s thread; the copy back happens in
/// Work::wait() (on the caller's current stream, synchronously). Host buffers pass straight through.
/// Same ledger and contracts as `mpi` (fp16/bf16 sums in fp32, rounded once). A documented test mode —
/// PCIe copies every bucket — not a fast path. A world of one rank has nothing to exchange: every
/// collective is then a local copy at most (reduce_scatter / all_gather into a separate buffer), with no
/// staging and no MPI call; this is what train_gpt --comm auto gives a single process, which needs no
/// NCCL bootstrap either. Throws zero::Error if `mpi` is null or CUDA is unavailable.
std::shared_ptr<Communicator> make_host_staged(std::shared_ptr<Communicator> mpi);

}  // namespace zero::dist
