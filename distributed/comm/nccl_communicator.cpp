#include "distributed/comm/nccl_communicator.h"

#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"

namespace zero::dist {

/// Throws zero::Error naming the call, NCCL's error string and its last detailed message.
#define ZERO_NCCL_CHECK(call)                                                                              \
  do {                                                                                                     \
    const ncclResult_t zero_nccl_rc_ = (call);                                                             \
    if (zero_nccl_rc_ != ncclSuccess && zero_nccl_rc_ != ncclInProgress)                                   \
      ::zero::detail::fail(__FILE__, __LINE__,                                                             \
                           fmt::format("{} failed: {} (NCCL error {}; {})", #call,                         \
                                       ncclGetErrorString(zero_nccl_rc_), static_cast<int>(zero_nccl_rc_), \
                                       ncclGetLastError(nullptr)));                                        \
  } while (0)

namespace detail {
void StreamFree::operator()(cudaStream_t s) const {
  cudaStreamDestroy(s);
  cudaGetLastError();
}
void EventFree::operator()(cudaEvent_t e) const {
  cudaEventDestroy(e);
  cudaGetLastError();
}
void DeviceFree::operator()(double* p) const {
  cudaFree(p);
  cudaGetLastError();
}

// Owns the NCCL communicator; shared by the NcclCommunicator and its outstanding Works, so a Work that
// outlives the communicator can still ask NCCL for errors.
struct NcclHandle {
  ncclComm_t comm = nullptr;
  ~NcclHandle() {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
};
}  // namespace detail

namespace {

static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0, "ncclUniqueId is broadcast as f32 words");

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    default: break;
  }
  ZERO_CHECK(false, "NCCL: unsupported dtype {}", dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

// cudaEventQuery: true when done, false when not yet; throws on a real error. The runtime also leaves a
// "not ready" answer in the thread's last-error slot, where a later launch check would report it, so it
// is cleared there; but only that answer: an error some other call left in the slot first (a failed
// launch not yet checked) is reported here, not swallowed by the clearing.
bool event_done(cudaEvent_t event) {
  const cudaError_t pending = cudaPeekAtLastError();
  if (pending != cudaSuccess && pending != cudaErrorNotReady) ZERO_CUDA_CHECK(pending);
  const cudaError_t rc = cudaEventQuery(event);
  if (rc == cudaSuccess) return true;
  if (rc != cudaErrorNotReady) ZERO_CUDA_CHECK(rc);
  if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
  return false;
}

// Note [Identity on NCCL]
// ~~~~~~~~~~~~~~~~~~~~~~~
// NCCL queues a collective's kernels when it is issued, and no rank may wait for its peers at issue: a
// ZeRO stage-3 rank issues a gradient reduction while a peer may still need it to join gathers on the
// other channel (Note [One schedule] in partitioned_parameters.cpp). So each collective's identity
// record (Note [Identity records] in mpi_communicator.cpp) is all-gathered asynchronously over a host
// MPI channel (a duplicate of the bootstrap communicator) when the collective is issued, and the
// records are compared when the collective is waited for. A mismatch throws the same CollectiveMismatch
// line on every rank that waits, and aborts the NCCL communicator (ncclCommAbort) so that its
// mismatched kernels end instead of hanging the device. What this covers: a mismatch is named, never a
// silent exchange or a hang. What it does not: by the time the line appears the device may already have
// exchanged the mismatched buffers (which the error then discards), and NCCL's own kernels are not
// inspected.
struct IdentityCheck {
  IdentityRecord mine;
  std::vector<IdentityRecord> all;
  std::shared_ptr<Work> work;
  bool verified = false;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<detail::NcclHandle> handle, cudaEvent_t done, std::shared_ptr<void> scratch,
           std::shared_ptr<IdentityCheck> identity)
      : handle_(std::move(handle)), done_(done), scratch_(std::move(scratch)), identity_(std::move(identity)) {}

  ~NcclWork() override {
    // Scratch must outlive the collective: wait for it if nobody did.
    if (!finished_) cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
    cudaGetLastError();
  }

  void wait() override {
    if (!finished_) {
      try {
        poll();
      } catch (...) {
        error_ = std::current_exception();
      }
      finished_ = true;
      scratch_.reset();
    }
    if (error_) std::rethrow_exception(error_);
    // The caller's later kernels (reading the result) are ordered after the collective on the device too.
    ZERO_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), done_, 0));
  }

  bool is_completed() const override {
    if (finished_) return true;
    try {
      return event_done(done_);
    } catch (const std::exception&) {
      return true;  // finished, unsuccessfully: wait() reports it
    }
  }

 private:
  // Waits for the event, watching NCCL's asynchronous error state (a dead peer would otherwise hang us):
  // spin briefly, then sleep between polls (Note [Waiting without spinning], mpi_communicator.cpp).
  void poll() {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      if (identity_ && !identity_->verified && identity_->work->is_completed()) verify_identity();
      if (event_done(done_) && (!identity_ || identity_->verified)) return;
      ZERO_CHECK(handle_->comm != nullptr, "NCCL communicator was aborted after a mismatched collective");
      ncclResult_t state = ncclSuccess;
      ZERO_NCCL_CHECK(ncclCommGetAsyncError(handle_->comm, &state));
      ZERO_CHECK(state == ncclSuccess || state == ncclInProgress, "NCCL collective failed asynchronously: {} ({})",
                 ncclGetErrorString(state), ncclGetLastError(handle_->comm));
      if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(100))
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      else
        std::this_thread::yield();
    }
  }

  // Note [Identity on NCCL]: the ranks' records are in; a mismatch aborts NCCL and throws.
  void verify_identity() {
    identity_->work->wait();
    try {
      check_identity_records(identity_->all);
    } catch (const CollectiveMismatch&) {
      ncclCommAbort(handle_->comm);  // the mismatched kernels end; the communicator is unusable from here
      handle_->comm = nullptr;
      throw;
    }
    identity_->verified = true;
  }

  std::shared_ptr<detail::NcclHandle> handle_;
  cudaEvent_t done_;
  std::shared_ptr<void> scratch_;
  std::shared_ptr<IdentityCheck> identity_;  // null: not checked (one rank)
  bool finished_ = false;
  std::exception_ptr error_;
};

std::vector<std::size_t> prefix_offsets(std::span<const std::size_t> counts) {
  std::vector<std::size_t> offsets(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}

bool all_equal(std::span<const std::size_t> counts) {
  for (std::size_t c : counts)
    if (c != counts[0]) return false;
  return true;
}

// Runs `body` (NCCL calls) inside ncclGroupStart / ncclGroupEnd, closing the group on every path
// (detail::run_grouped, distributed/comm/scoped.h).
template <class Body>
void nccl_group(Body&& body) {
  detail::run_grouped([] { ZERO_NCCL_CHECK(ncclGroupStart()); }, std::forward<Body>(body),
                      [] { ZERO_NCCL_CHECK(ncclGroupEnd()); });
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::atoi(v);
}

}  // namespace

std::pair<int, int> local_rank_and_size(int rank, int world_size) {
  for (const auto& [r, s] : {std::pair{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                             std::pair{"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
                             std::pair{"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
                             std::pair{"LOCAL_RANK", "LOCAL_WORLD_SIZE"}}) {
    const int local = env_int(r, -1);
    if (local >= 0) return {local, env_int(s, world_size)};
  }
  return {rank, world_size};
}

bool nccl_usable(int rank, int world_size) {
  if (!cuda::cuda_available()) return false;
  return local_rank_and_size(rank, world_size).second <= cuda::device_count();
}

// ---- NcclCommunicator ------------------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::shared_ptr<Communicator> bootstrap, NcclOptions options)
    : bootstrap_(std::move(bootstrap)), options_(options) {
  set_reduce_in_fp32(options_.fp32_accumulate);  // the ledger counts what widen() sends
  ZERO_CHECK(bootstrap_ != nullptr, "NcclCommunicator: null bootstrap communicator");
  rank_ = bootstrap_->rank();
  world_size_ = bootstrap_->world_size();
  ZERO_CHECK(cuda::cuda_available(), "NcclCommunicator: CUDA is not available on this machine");
  const auto [local_rank, local_size] = local_rank_and_size(rank_, world_size_);
  const int devices = cuda::device_count();
  if (options_.device < 0) {
    ZERO_CHECK(local_size <= devices,
               "NcclCommunicator: {} ranks on this node but {} GPU(s); NCCL needs one GPU per rank. To run several "
               "ranks on one GPU use make_host_staged(mpi_world()) (distributed/comm/nccl_communicator.h)",
               local_size, devices);
    device_ = local_rank % devices;
  } else {
    device_ = options_.device;
  }
  cuda::set_device(device_);

  // Note [Communication stream]
  // Collectives get their own non-blocking stream at the highest priority, so a reduction that becomes
  // ready in the middle of backward is scheduled ahead of the compute kernels queued behind it instead
  // of waiting for them. Ordering with the compute stream is by events only (order_after_compute and
  // NcclWork::wait), never by synchronising the device.
  // Each resource is owned the moment it exists (a throw further down frees it).
  int least = 0, greatest = 0;
  ZERO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  ZERO_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  stream_.reset(stream);
  cudaEvent_t ready = nullptr;
  ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  ready_.reset(ready);
  double* control = nullptr;
  ZERO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&control), sizeof(double)));
  control_dev_.reset(control);
  // The barrier all-reduces this double: zeroed on the stream the barrier runs on, so every sum is zero
  // (never uninitialised memory).
  ZERO_CUDA_CHECK(cudaMemsetAsync(control, 0, sizeof(double), stream));

  ncclUniqueId id{};
  if (rank_ == 0) ZERO_NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap_->broadcast(&id, sizeof(id) / sizeof(float), DType::f32, 0);
  handle_ = std::make_shared<detail::NcclHandle>();
  ZERO_NCCL_CHECK(ncclCommInitRank(&handle_->comm, world_size_, id, rank_));
  if (world_size_ > 1) identity_channel_ = bootstrap_->duplicate();  // Note [Identity on NCCL]
  cuda::register_side_stream(stream_.get());  // Backend::synchronize waits for it too; last: nothing throws after
}

std::shared_ptr<Communicator> NcclCommunicator::make_duplicate() {
  NcclOptions options = options_;
  options.device = device_;
  return std::make_shared<NcclCommunicator>(bootstrap_, options);
}

NcclCommunicator::~NcclCommunicator() {
  // Nothing may still use the stream or the control buffers when they go (the members release them
  // after this body, in reverse order of declaration).
  cuda::unregister_side_stream(stream_.get());
  if (stream_ != nullptr) cudaStreamSynchronize(stream_.get());
  handle_.reset();  // ncclCommDestroy once the last Work is gone too
  cudaGetLastError();
}

void NcclCommunicator::order_after_compute() {
  ZERO_CUDA_CHECK(cudaEventRecord(ready_.get(), cuda::current_stream()));
  ZERO_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), ready_.get(), 0));
}

std::shared_ptr<Work> NcclCommunicator::finish(std::shared_ptr<void> scratch) {
  cudaEvent_t done = nullptr;
  ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const cudaError_t rc = cudaEventRecord(done, stream_.get());
  if (rc != cudaSuccess) cudaEventDestroy(done);
  ZERO_CUDA_CHECK(rc);
  // Note [Identity on NCCL]: this collective's record goes out on the host channel now, checked at wait.
  std::shared_ptr<IdentityCheck> identity;
  if (identity_channel_) {
    identity = std::make_shared<IdentityCheck>();
    identity->mine = make_identity_record(issuing());
    identity->all.resize(static_cast<std::size_t>(world_size_));
    const std::vector<std::size_t> counts(static_cast<std::size_t>(world_size_), sizeof(IdentityRecord) / sizeof(float));
    identity->work = identity_channel_->all_gather_async(&identity->mine, identity->all.data(), counts, DType::f32);
  }
  return std::make_shared<NcclWork>(handle_, done, std::move(scratch), std::move(identity));
}

std::shared_ptr<void> NcclCommunicator::fp32_scratch(std::size_t count) {
  void* ptr = cuda::device_alloc(count * sizeof(float), stream_.get());
  return std::shared_ptr<void>(ptr, [](void* p) { cuda::device_free(p); });
}

// Note [fp32-accumulating reduce-scatter] (communicator.cpp) on the communication stream: one NCCL group
// of ncclSend (slice r of `send` to rank r) and ncclRecv (rank r's contribution to this rank's slice,
// into a 16-bit inbox), then the owner widens its own contribution, adds the others in rank order in
// fp32 (Backend::accumulate: dst += src in fp32, one fp32 rounding per addition, as on the
// CPU) and narrows once into recv. Returns the device scratch, to be released with the Work.
std::shared_ptr<void> NcclCommunicator::alltoall_reduce_scatter(const void* send, void* recv,
                                                                std::span<const std::size_t> counts, DType dtype) {
  const auto offsets = prefix_offsets(counts);
  const std::size_t mine = counts[rank_], elem = dtype_size(dtype);
  const int n = world_size_;
  // One fp32 block: the accumulator (mine floats), then the inbox (n slices of mine 16-bit elements).
  const std::size_t inbox_floats = (std::size_t(n) * mine * elem + sizeof(float) - 1) / sizeof(float);
  auto scratch = fp32_scratch(std::max<std::size_t>(1, mine + inbox_floats));
  float* acc = static_cast<float*>(scratch.get());
  char* inbox = reinterpret_cast<char*>(acc + mine);
  const char* base = static_cast<const char*>(send);
  const ncclDataType_t type = nccl_type(dtype);
  cudaStream_t stream = stream_.get();
  ncclComm_t comm = handle_->comm;
  nccl_group([&] {
    for (int k = 1; k < n; ++k) {
      const int to = (rank_ + k) % n, from = (rank_ - k + n) % n;
      if (counts[to] > 0) ZERO_NCCL_CHECK(ncclSend(base + offsets[to] * elem, counts[to], type, to, comm, stream));
      if (mine > 0) ZERO_NCCL_CHECK(ncclRecv(inbox + std::size_t(from) * mine * elem, mine, type, from, comm, stream));
    }
  });
  if (mine == 0) return scratch;
  cuda::StreamGuard on_comm(stream);
  auto part = [&](int q) -> const void* {
    return q == rank_ ? static_cast<const void*>(base + offsets[rank_] * elem) : inbox + std::size_t(q) * mine * elem;
  };
  const auto len = static_cast<std::int64_t>(mine);
  cuda::cast(acc, DType::f32, part(0), dtype, len);
  for (int q = 1; q < n; ++q) backend(Device::cuda).accumulate(acc, DType::f32, part(q), dtype, len);
  cuda::cast(recv, dtype, acc, DType::f32, len);
  return scratch;
}

std::shared_ptr<Work> NcclCommunicator::issue_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  order_after_compute();
  cudaStream_t stream = stream_.get();
  if (count == 0) return finish(nullptr);
  ncclComm_t comm = handle_->comm;
  if (op == ReduceOp::sum && accumulates_in_fp32(dtype) && world_size_ > 1) {
    // The fp32-accumulating reduce-scatter over the even split, then every rank's rounded slice to all.
    std::vector<std::size_t> counts(static_cast<std::size_t>(world_size_), count / world_size_);
    for (std::size_t r = 0; r < count % world_size_; ++r) counts[r] += 1;
    const auto offsets = prefix_offsets(counts);
    char* base = static_cast<char*>(buf);
    const std::size_t elem = dtype_size(dtype);
    auto scratch = alltoall_reduce_scatter(buf, base + offsets[rank_] * elem, counts, dtype);
    nccl_group([&] {
      for (int r = 0; r < world_size_; ++r)
        if (counts[r] > 0)
          ZERO_NCCL_CHECK(ncclBroadcast(base + offsets[r] * elem, base + offsets[r] * elem, counts[r],
                                        nccl_type(dtype), r, comm, stream));
    });
    return finish(std::move(scratch));
  }
  // A max is exact in any type; only sums need the fp32 detour.
  if (op == ReduceOp::sum && widen(dtype)) {
    auto scratch = fp32_scratch(count);
    float* wide = static_cast<float*>(scratch.get());
    cuda::StreamGuard on_comm(stream);
    cuda::cast(wide, DType::f32, buf, dtype, static_cast<std::int64_t>(count));
    ZERO_NCCL_CHECK(ncclAllReduce(wide, wide, count, ncclFloat32, ncclSum, comm, stream));
    cuda::cast(buf, dtype, wide, DType::f32, static_cast<std::int64_t>(count));
    return finish(std::move(scratch));
  }
  ZERO_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), comm, stream));
  return finish(nullptr);
}

// Equal counts: one ncclReduceScatter. Unequal counts (a bucket that straddles partitions unevenly, the
// usual case in ZeRO): NCCL's reduce-scatter needs equal slices, so each slice is an ncclReduce to its
// owner, all in one NCCL group — the same bytes per rank as a reduce-scatter, without padding (DeepSpeed
// reduces per partition the same way).
std::shared_ptr<Work> NcclCommunicator::issue_reduce_scatter(const void* send, void* recv,
                                                             std::span<const std::size_t> counts, DType dtype) {
  order_after_compute();
  cudaStream_t stream = stream_.get();
  const auto offsets = prefix_offsets(counts);
  const std::size_t total = offsets.back() + counts.back();
  if (total == 0) return finish(nullptr);
  ncclComm_t comm = handle_->comm;
  const std::size_t mine = counts[rank_];
  if (accumulates_in_fp32(dtype) && world_size_ > 1) return finish(alltoall_reduce_scatter(send, recv, counts, dtype));

  std::shared_ptr<void> scratch;
  const void* src = send;
  ncclDataType_t type = nccl_type(dtype);
  std::size_t elem = dtype_size(dtype);
  cuda::StreamGuard on_comm(stream);
  if (widen(dtype)) {
    scratch = fp32_scratch(total);
    cuda::cast(scratch.get(), DType::f32, send, dtype, static_cast<std::int64_t>(total));
    src = scratch.get();
    type = ncclFloat32;
    elem = sizeof(float);
  }
  const char* base = static_cast<const char*>(src);
  // With fp32 scratch the reduced slice lands in the scratch (in place) and is narrowed into recv after.
  void* dst = scratch ? static_cast<void*>(static_cast<char*>(scratch.get()) + offsets[rank_] * elem) : recv;
  if (all_equal(counts) && !options_.force_grouped) {
    ZERO_NCCL_CHECK(ncclReduceScatter(src, dst, counts[0], type, ncclSum, comm, stream));
  } else {
    nccl_group([&] {
      for (int r = 0; r < world_size_; ++r) {
        if (counts[r] == 0) continue;
        const void* slice = base + offsets[r] * elem;
        // recvbuff matters only at the root; elsewhere pass the (valid) send slice.
        void* out = r == rank_ ? dst : const_cast<void*>(slice);
        ZERO_NCCL_CHECK(ncclReduce(slice, out, counts[r], type, ncclSum, r, comm, stream));
      }
    });
  }
  if (scratch && mine > 0) cuda::cast(recv, dtype, dst, DType::f32, static_cast<std::int64_t>(mine));
  return finish(std::move(scratch));
}

// Equal counts: ncclAllGather. Unequal: each rank's slice is an ncclBroadcast from its owner, grouped.
std::shared_ptr<Work> NcclCommunicator::issue_all_gather(const void* send, void* recv,
                                                         std::span<const std::size_t> counts, DType dtype) {
  order_after_compute();
  cudaStream_t stream = stream_.get();
  const auto offsets = prefix_offsets(counts);
  const std::size_t total = offsets.back() + counts.back();
  if (total == 0) return finish(nullptr);
  ncclComm_t comm = handle_->comm;
  const ncclDataType_t type = nccl_type(dtype);
  const std::size_t elem = dtype_size(dtype);
  char* base = static_cast<char*>(recv);
  if (all_equal(counts) && !options_.force_grouped) {
    ZERO_NCCL_CHECK(ncclAllGather(send, recv, counts[0], type, comm, stream));
  } else {
    nccl_group([&] {
      for (int r = 0; r < world_size_; ++r) {
        if (counts[r] == 0) continue;
        void* slice = base + offsets[r] * elem;
        const void* src = r == rank_ ? send : slice;
        ZERO_NCCL_CHECK(ncclBroadcast(src, slice, counts[r], type, r, comm, stream));
      }
    });
  }
  return finish(nullptr);
}

std::shared_ptr<Work> NcclCommunicator::issue_reduce(void* buf, std::size_t count, DType dtype, int root) {
  order_after_compute();
  cudaStream_t stream = stream_.get();
  if (count == 0) return finish(nullptr);
  ncclComm_t comm = handle_->comm;
  if (widen(dtype)) {
    auto scratch = fp32_scratch(count);
    float* wide = static_cast<float*>(scratch.get());
    cuda::StreamGuard on_comm(stream);
    cuda::cast(wide, DType::f32, buf, dtype, static_cast<std::int64_t>(count));
    ZERO_NCCL_CHECK(ncclReduce(wide, wide, count, ncclFloat32, ncclSum, root, comm, stream));
    if (rank_ == root) cuda::cast(buf, dtype, wide, DType::f32, static_cast<std::int64_t>(count));
    return finish(std::move(scratch));
  }
  ZERO_NCCL_CHECK(ncclReduce(buf, buf, count, nccl_type(dtype), ncclSum, root, comm, stream));
  return finish(nullptr);
}

std::shared_ptr<Work> NcclCommunicator::issue_broadcast(void* buf, std::size_t count, DType dtype, int root) {
  order_after_compute();
  cudaStream_t stream = stream_.get();
  if (count == 0) return finish(nullptr);
  ZERO_NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, handle_->comm, stream));
  return finish(nullptr);
}

std::shared_ptr<Work> NcclCommunicator::issue_barrier() {
  order_after_compute();
  cudaStream_t stream = stream_.get();
  ZERO_NCCL_CHECK(ncclAllReduce(control_dev_.get(), control_dev_.get(), 1, ncclFloat64, ncclSum, handle_->comm, stream));
  return finish(nullptr);
}

double NcclCommunicator::control_all_reduce(double value, ReduceOp op) {
  control_all_reduce_values(std::span<double>(&value, 1), op);
  return value;
}

void NcclCommunicator::control_all_reduce_values(std::span<double> values, ReduceOp op) {
  // One ncclAllReduce for the whole vector (ZeroOptimizer's norm partial and per-parameter flags, every
  // step), ordered after every collective issued before it (same stream); the values travel through
  // pinned memory, the device buffer is released with the Work.
  if (values.empty()) return;
  const std::size_t bytes = values.size() * sizeof(double);
  cudaStream_t stream = stream_.get();
  std::unique_ptr<void, void (*)(void*)> host(cuda::pinned_alloc(bytes), [](void* p) { cuda::pinned_free(p); });
  std::memcpy(host.get(), values.data(), bytes);
  std::shared_ptr<void> dev(cuda::device_alloc(bytes, stream), [](void* p) { cuda::device_free(p); });
  ZERO_CUDA_CHECK(cudaMemcpyAsync(dev.get(), host.get(), bytes, cudaMemcpyHostToDevice, stream));
  ZERO_NCCL_CHECK(ncclAllReduce(dev.get(), dev.get(), values.size(), ncclFloat64, nccl_op(op), handle_->comm, stream));
  ZERO_CUDA_CHECK(cudaMemcpyAsync(host.get(), dev.get(), bytes, cudaMemcpyDeviceToHost, stream));
  const auto work = finish(std::move(dev));
  try {
    work->wait();
  } catch (...) {
    (void)host.release();  // the copy back may still be pending: the block must never be handed out again
    throw;
  }
  std::memcpy(values.data(), host.get(), bytes);
}

// ---- host-staged mode ------------------------------------------------------------------------------------

namespace {

// Note [Host-staged collectives]
// NCCL will not put two ranks on one GPU, so with one GPU the only way to run ZeRO with N > 1 ranks on
// cuda tensors is to move each buffer through the host: device -> pinned host (waiting for the kernels
// that wrote it), the MPI backend's collective on the host copy (asynchronous, on its own thread), and
// host -> device when the caller waits. Pinned blocks come from cuda's caching pinned allocator, so a
// training loop reuses them.
struct Staging {
  void* host = nullptr;  // pinned
  explicit Staging(std::size_t nbytes) : host(cuda::pinned_alloc(nbytes)) {}
  ~Staging() { cuda::pinned_free(host); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
};

class StagedWork final : public Work {
 public:
  // After `inner` completes, wait() copies `bytes` from `from` (in the staging buffer) to `to`.
  StagedWork(std::shared_ptr<Work> inner, std::unique_ptr<Staging> staging, void* to, const void* from,
             std::size_t bytes)
      : inner_(std::move(inner)), staging_(std::move(staging)), to_(to), from_(from), bytes_(bytes) {}

  ~StagedWork() override {
    // The communication thread may still use the staging buffer.
    if (!finished_ && inner_) {
      try {
        inner_->wait();
      } catch (const std::exception&) {
      }
    }
  }

  void wait() override {
    if (!finished_) {
      try {
        if (inner_) inner_->wait();
        if (bytes_ > 0) cuda::copy(to_, from_, bytes_);
      } catch (...) {
        error_ = std::current_exception();
      }
      finished_ = true;
      staging_.reset();
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() const override { return finished_ || !inner_ || inner_->is_completed(); }

 private:
  std::shared_ptr<Work> inner_;
  std::unique_ptr<Staging> staging_;
  void* to_;
  const void* from_;
  std::size_t bytes_;
  bool finished_ = false;
  std::exception_ptr error_;
};

class HostStagedCommunicator final : public Communicator {
 public:
  explicit HostStagedCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {
    ZERO_CHECK(inner_ != nullptr, "make_host_staged: null communicator");
    ZERO_CHECK(cuda::cuda_available(), "make_host_staged: CUDA is not available on this machine");
  }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  // The inner communicator does the reducing, so it must use the same wire dtype.
  void set_fp32_accumulation(bool on) override {
    Communicator::set_fp32_accumulation(on);
    inner_->set_fp32_accumulation(on);
  }
  void set_reduce_in_fp32(bool on) override {
    Communicator::set_reduce_in_fp32(on);
    inner_->set_reduce_in_fp32(on);
  }
  std::string_view backend_name() const override { return "mpi-host-staged"; }

 protected:
  std::shared_ptr<Communicator> make_duplicate() override { return make_host_staged(inner_->duplicate()); }
  // The inner communicator, told this collective's purpose (Note [Collective identity]).
  Communicator& inner() { return inner_->with_purpose(issuing().purpose); }

  // A world of one rank: a sum or max over one contribution is the contribution, a reduce-scatter or
  // all-gather a copy of this rank's slice (nothing when it is in place), a reduce or broadcast nothing.
  bool solo() const { return inner_->world_size() == 1; }

  std::shared_ptr<Work> issue_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (solo()) return done();
    if (!cuda::is_device_pointer(buf)) return inner().all_reduce_async(buf, count, dtype, op);
    const std::size_t bytes = count * dtype_size(dtype);
    auto staging = std::make_unique<Staging>(bytes);
    cuda::copy(staging->host, buf, bytes);
    void* host = staging->host;
    auto work = inner().all_reduce_async(host, count, dtype, op);
    return std::make_shared<StagedWork>(std::move(work), std::move(staging), buf, host, bytes);
  }

  std::shared_ptr<Work> issue_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                                             DType dtype) override {
    if (solo()) return local_copy(recv, send, counts[0] * dtype_size(dtype));
    if (!cuda::is_device_pointer(send) && !cuda::is_device_pointer(recv))
      return inner().reduce_scatter_async(send, recv, counts, dtype);
    const auto offsets = prefix_offsets(counts);
    const std::size_t elem = dtype_size(dtype);
    const std::size_t total = offsets.back() + counts.back();
    auto staging = std::make_unique<Staging>(total * elem);
    cuda::copy(staging->host, send, total * elem);
    char* host = static_cast<char*>(staging->host);
    void* mine = host + offsets[rank()] * elem;  // reduced in place into this rank's slice
    auto work = inner().reduce_scatter_async(host, mine, counts, dtype);
    return std::make_shared<StagedWork>(std::move(work), std::move(staging), recv, mine, counts[rank()] * elem);
  }

  std::shared_ptr<Work> issue_all_gather(const void* send, void* recv, std::span<const std::size_t> counts,
                                         DType dtype) override {
    if (solo()) return local_copy(recv, send, counts[0] * dtype_size(dtype));
    if (!cuda::is_device_pointer(send) && !cuda::is_device_pointer(recv))
      return inner().all_gather_async(send, recv, counts, dtype);
    const auto offsets = prefix_offsets(counts);
    const std::size_t elem = dtype_size(dtype);
    const std::size_t total = offsets.back() + counts.back();
    auto staging = std::make_unique<Staging>(total * elem);
    char* host = static_cast<char*>(staging->host);
    void* mine = host + offsets[rank()] * elem;
    cuda::copy(mine, send, counts[rank()] * elem);
    auto work = inner().all_gather_async(mine, host, counts, dtype);  // in place
    return std::make_shared<StagedWork>(std::move(work), std::move(staging), recv, host, total * elem);
  }

  // reduce, broadcast and barrier have only blocking public forms on the inner communicator: run them
  // now (still in issue order, after everything queued before) and return a finished Work.
  std::shared_ptr<Work> issue_reduce(void* buf, std::size_t count, DType dtype, int root) override {
    if (solo()) return done();
    const std::size_t bytes = count * dtype_size(dtype);
    if (!cuda::is_device_pointer(buf)) {
      inner().reduce(buf, count, dtype, root);
      return done();
    }
    Staging staging(bytes);
    cuda::copy(staging.host, buf, bytes);
    inner().reduce(staging.host, count, dtype, root);
    if (rank() == root) cuda::copy(buf, staging.host, bytes);
    return done();
  }

  std::shared_ptr<Work> issue_broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    if (solo()) return done();
    const std::size_t bytes = count * dtype_size(dtype);
    if (!cuda::is_device_pointer(buf)) {
      inner().broadcast(buf, count, dtype, root);
      return done();
    }
    Staging staging(bytes);
    if (rank() == root) cuda::copy(staging.host, buf, bytes);
    inner().broadcast(staging.host, count, dtype, root);
    if (rank() != root) cuda::copy(buf, staging.host, bytes);
    return done();
  }

  std::shared_ptr<Work> issue_barrier() override {
    inner().barrier();
    return done();
  }

  double control_all_reduce(double value, ReduceOp op) override {
    return op == ReduceOp::sum ? inner().all_reduce_sum(value) : inner().all_reduce_max(value);
  }
  // Control values are host doubles: the inner communicator's own batched all-reduce, one call for the
  // whole vector (a max, which ZeRO never batches, has no vector form there: one call per value).
  void control_all_reduce_values(std::span<double> values, ReduceOp op) override {
    if (op == ReduceOp::sum) {
      inner().all_reduce_sum(values);
      return;
    }
    for (double& v : values) v = inner().all_reduce_max(v);
  }

 private:
  static std::shared_ptr<Work> done() { return std::make_shared<StagedWork>(nullptr, nullptr, nullptr, nullptr, 0); }

  // recv = send (bytes, either side host or device), ordered on the current stream: a device-to-device
  // copy is left in the stream (the caller's later kernels come after it), one touching the host is
  // finished before returning, as the Work says it is.
  static std::shared_ptr<Work> local_copy(void* recv, const void* send, std::size_t bytes) {
    if (bytes > 0 && recv != send) {
      if (cuda::is_device_pointer(recv) && cuda::is_device_pointer(send))
        cuda::copy_async(recv, send, bytes);
      else
        cuda::copy(recv, send, bytes);
    }
    return done();
  }

  std::shared_ptr<Communicator> inner_;
};

}  // namespace

std::shared_ptr<Communicator> make_host_staged(std::shared_ptr<Communicator> mpi) {
  return std::make_shared<HostStagedCommunicator>(std::move(mpi));
}

}  // namespace zero::dist
