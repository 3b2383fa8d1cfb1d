#include "distributed/mpi_communicator.h"

#include <fmt/format.h>

#include <sched.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <type_traits>

#include "core/trace.h"
#include "distributed/cpu_work.h"
#include "distributed/ring_math.h"

namespace zero::dist {

namespace detail {

std::string mpi_error_message(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  return fmt::format("{} failed: {} (MPI error {})", call, std::string(text, length), code);
}

}  // namespace detail

namespace {

using detail::thread_cpu_ns;

// Note [A short time slice for the communication thread]
// With one rank per core the communication thread shares its core with the training thread. Every
// poll of an asynchronous collective (Note [Waiting without spinning]) wakes it from a short sleep,
// but Linux's EEVDF scheduler (6.6 and later) lets the running task finish its slice (~3 ms) before a
// woken task of the same weight runs, so each step of a ring waited milliseconds behind backward and
// --overlap-comm made steps slower, not faster. A task that asks for a short slice (sched_setattr's
// sched_runtime, unprivileged, 0.1-100 ms) gets an earlier deadline and runs as soon as it wakes; the
// communication thread uses ~0.1 ms at a time, so it asks for that. Older kernels ignore the request
// (their CFS already preempts on wake-up); a failure changes only timing, so it is not an error.
void request_short_time_slice() {
#if defined(__linux__) && defined(SYS_sched_setattr)
  struct {  // the kernel's struct sched_attr, first version (48 bytes); glibc 2.36 does not declare it
    std::uint32_t size, sched_policy;
    std::uint64_t sched_flags;
    std::int32_t sched_nice;
    std::uint32_t sched_priority;
    std::uint64_t sched_runtime, sched_deadline, sched_period;
  } attr{};
  static_assert(sizeof attr == 48);
  attr.size = sizeof attr;
  attr.sched_policy = SCHED_OTHER;
  attr.sched_nice = getpriority(PRIO_PROCESS, 0);  // keep the thread's nice value
  attr.sched_runtime = 100'000;                    // ns
  (void)syscall(SYS_sched_setattr, 0, &attr, 0);
#endif
}


// MPI counts are int; every message is cut to at most this many bytes so buffers of any size work.
constexpr std::size_t kMaxMessageBytes = std::size_t{1} << 30;

using detail::combine;
using detail::narrow;
using detail::prefix_offsets;
using detail::split_even;
using detail::widen;

template <typename T>
MPI_Datatype mpi_type() {
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_UINT16_T;  // 16-bit values travel as raw bits
}

int as_int(std::size_t n) { return static_cast<int>(n); }

}  // namespace

// ---- lifecycle -------------------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  int initialised = 0;
  ZERO_MPI_CHECK(MPI_Initialized(&initialised));
  ZERO_CHECK(initialised, "MpiCommunicator: MPI is not initialised (use mpi_world())");
  int provided = MPI_THREAD_SINGLE;
  ZERO_MPI_CHECK(MPI_Query_thread(&provided));
  ZERO_CHECK(provided >= MPI_THREAD_SERIALIZED,
             "MpiCommunicator: MPI gives thread level {}, the communication thread needs "
             "MPI_THREAD_SERIALIZED ({}) or better",
             provided, int(MPI_THREAD_SERIALIZED));
  // A private duplicate keeps our traffic apart from anyone else's messages on `comm`, and lets us
  // turn MPI errors into exceptions without changing the caller's error handler.
  ZERO_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  ZERO_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  ZERO_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZERO_MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
  if (world_size_ > 1) thread_ = std::thread([this] { run_queue(); });
}

MpiCommunicator::~MpiCommunicator() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: MpiCommunicator shutdown failed: %s\n", rank_, e.what());
  }
}

void MpiCommunicator::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (comm_ != MPI_COMM_NULL && !finalised) ZERO_MPI_CHECK(MPI_Comm_free(&comm_));
  comm_ = MPI_COMM_NULL;
}

void MpiCommunicator::set_segment_bytes(std::size_t bytes) {
  segment_bytes_ = std::clamp<std::size_t>(bytes / sizeof(float), 1, kMaxMessageBytes / sizeof(float)) *
                   sizeof(float);
}

std::shared_ptr<Work> MpiCommunicator::enqueue(const char* name, std::function<void()> task, std::size_t bytes) {
  auto work = std::make_shared<detail::CpuWork>();
  if (world_size_ == 1) {
    ZERO_CHECK(!stopping_, "MpiCommunicator: used after shutdown()");
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    work->finish(error);
    return work;
  }
  {
    std::lock_guard lock(mutex_);
    ZERO_CHECK(!stopping_, "MpiCommunicator: used after shutdown()");
    queue_.push_back(Task{std::move(task), work, name, step(), timeout(), bytes});
  }
  wake_.notify_one();
  return work;
}

void MpiCommunicator::run_queue() {
  request_short_time_slice();
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      // Work queued before shutdown() still runs: the other ranks are expecting it.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // Note [No hang]: once a collective timed out or lost a peer, the ranks are out of step; what follows
    // fails at once.
    if (!broken_ && abandon_) broken_ = std::make_exception_ptr(PeerGone("this rank is leaving the job", rank_, false));
    std::exception_ptr error = broken_;
    if (!error) {
      current_ = Task{nullptr, nullptr, task.name, task.step, task.timeout_s, task.bytes};
      trace::Span span(task.name, "comm", trace::kCommThread);
      span.arg("bytes", task.bytes);
      const auto started = std::chrono::steady_clock::now();
      const std::int64_t cpu_started = thread_cpu_ns();
      // Ledger::seconds: the five data collectives are timed (control scalars and barriers are not).
      int timed = -1;
      for (int c = 0; c < kNumCollectives; ++c)
        if (collective_name(static_cast<Collective>(c)) == task.name) timed = c;
      try {
        task.fn();
      } catch (const CollectiveTimeout&) {
        error = broken_ = std::current_exception();
      } catch (const PeerGone&) {
        error = broken_ = std::current_exception();
      } catch (...) {
        error = std::current_exception();  // e.g. a buffer too large for this rank: the peers did not start
      }
      // Before finish(): whoever waited on the work then sees its time in the ledger.
      if (timed >= 0) {
        busy_ns_[timed] +=
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
        cpu_ns_ += thread_cpu_ns() - cpu_started;
      }
    }
    task.work->finish(error);
  }
}

float* MpiCommunicator::scratch(int which, std::size_t elems) {
  auto& buffer = scratch_[which];
  if (buffer.size() < elems) buffer.resize(elems);
  return buffer.data();
}

// ---- hooks: capture the arguments, run the algorithm on the communication thread ---------------------

std::shared_ptr<Work> MpiCommunicator::issue_all_reduce(void* buf, std::size_t count, DType dtype,
                                                        ReduceOp op) {
  // The wire dtype is read at issue (Note [Wire dtype]), so a later set_reduce_in_fp32 cannot race it.
  const bool wide = reduce_in_fp32();
  return enqueue("all_reduce", [=, this] { all_reduce_impl(buf, count, dtype, op, wide); },
                 count * dtype_size(dtype));
}

std::shared_ptr<Work> MpiCommunicator::issue_reduce_scatter(const void* send, void* recv,
                                                            std::span<const std::size_t> counts,
                                                            DType dtype) {
  std::vector<std::size_t> owned(counts.begin(), counts.end());
  const bool wide = reduce_in_fp32();
  const std::size_t bytes = std::accumulate(owned.begin(), owned.end(), std::size_t{0}) * dtype_size(dtype);
  return enqueue(
      "reduce_scatter",
      [=, this, counts = std::move(owned)] { reduce_scatter_impl(send, recv, counts, dtype, wide); }, bytes);
}

std::shared_ptr<Work> MpiCommunicator::issue_all_gather(const void* send, void* recv,
                                                        std::span<const std::size_t> counts,
                                                        DType dtype) {
  std::vector<std::size_t> owned(counts.begin(), counts.end());
  const std::size_t bytes = std::accumulate(owned.begin(), owned.end(), std::size_t{0}) * dtype_size(dtype);
  return enqueue(
      "all_gather",
      [=, this, counts = std::move(owned)] {
        ring_all_gather_bytes(send, recv, counts, prefix_offsets(counts), dtype_size(dtype));
      },
      bytes);
}

std::shared_ptr<Work> MpiCommunicator::issue_reduce(void* buf, std::size_t count, DType dtype,
                                                    int root) {
  const bool wide = reduce_in_fp32();
  return enqueue("reduce", [=, this] { reduce_impl(buf, count, dtype, root, wide); },
                 count * dtype_size(dtype));
}

std::shared_ptr<Work> MpiCommunicator::issue_broadcast(void* buf, std::size_t count, DType dtype,
                                                       int root) {
  return enqueue("broadcast", [=, this] { broadcast_impl(buf, count, dtype, root); }, count * dtype_size(dtype));
}

std::shared_ptr<Work> MpiCommunicator::issue_barrier() {
  return enqueue("barrier", [this] {
    if (world_size_ == 1) return;
    MPI_Request request;
    ZERO_MPI_CHECK(MPI_Ibarrier(comm_, &request));
    wait_all(1, &request);
  });
}

double MpiCommunicator::control_all_reduce(double value, ReduceOp op) {
  double result = value;
  enqueue("control all_reduce", [&, this] {
    if (world_size_ == 1) return;
    MPI_Request request;
    ZERO_MPI_CHECK(MPI_Iallreduce(&value, &result, 1, MPI_DOUBLE, op == ReduceOp::sum ? MPI_SUM : MPI_MAX,
                                  comm_, &request));
    wait_all(1, &request);
  })->wait();
  return result;
}

void MpiCommunicator::control_all_reduce_values(std::span<double> values, ReduceOp op) {
  enqueue("control all_reduce", [&, this] {
    if (world_size_ == 1) return;
    MPI_Request request;
    ZERO_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values.data(), as_int(values.size()), MPI_DOUBLE,
                                  op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_, &request));
    wait_all(1, &request);
  })->wait();
}

// ---- algorithms -------------------------------------------------------------------------------------

// Note [Waiting without spinning]
// MPI_Wait / MPI_Sendrecv busy-poll until the message is done. With more ranks than cores (4 ranks on
// this machine's 2 cores, the setting every test and benchmark here runs in) the waiting rank burns
// the CPU that the rank it waits for needs — and during an async collective our communication thread
// burns the CPU of its own training thread. So we poll with MPI_Testall for a short while (which keeps
// latency of small messages at MPI's level), then sleep between polls. Measured on 4 ranks ×
// 100 MB (docs/collectives.md): ring reduce-scatter ~105 ms with MPI_Waitall, ~55 ms with this wait.
// The sleep grows with the time already waited (an eighth of it, 20-250 µs): a wait on a slow link
// lasts milliseconds, and waking every 20 µs there costs the training thread that shares the core
// (overlap_comm, one core per rank) tens of thousands of context switches a second, while adding at
// most an eighth to any wait.
//
// Note [No hang]
// A collective waits for its peers, so a peer that never arrives would hang the job. Three guards:
//   - a deadline: each collective must finish within the communicator's timeout (set_timeout,
//     $ZERO_COLLECTIVE_TIMEOUT_S, default 300 s), measured from when this rank starts waiting; past it
//     the requests still pending are cancelled and CollectiveTimeout names the collective, the step and
//     the peers whose messages never came. That covers a peer that is stuck, or whose connection
//     dropped without an MPI error;
//   - a control channel: a duplicate of MPI_COMM_WORLD on which a rank posts a small notice when it
//     fails (fail_job) or leaves (MPI finalisation, which also runs when main returns early). This wait
//     loop probes it about once a millisecond; once a peer's notice is in, the collective gets a short
//     grace (the peer may have finished its part before leaving: messages on two communicators are
//     not ordered) and then fails with PeerGone, so the others stop in about a second instead of
//     waiting out the timeout;
//   - a rank that crashes or is killed is Open MPI's to handle: its runtime ends the whole job as soon
//     as a process dies without finalising. A crashing rank (SIGSEGV, SIGABRT, ...) first prints one
//     line of ours from a signal handler; a killed one (SIGKILL) cannot, and mpirun reports it.
// After any failure the communicator is "broken": the ranks are out of step, so every later
// collective fails at once. Ending the job cleanly, with one line, is fail_job's work (below).
namespace {
constexpr int kNoticeTag = 77;
constexpr double kGoneGraceSeconds = 1.0;
std::string rank_list(const std::vector<int>& ranks);
// The first rank that has posted a notice (or -1) and whether it left without failing.
std::pair<int, bool> gone_peer();
}  // namespace

void MpiCommunicator::wait_all(int count, MPI_Request* requests, const int* peers) {
  constexpr double kSpinSeconds = 100e-6;
  constexpr double kMinSleepSeconds = 20e-6, kMaxSleepSeconds = 250e-6;
  const double start = MPI_Wtime();
  double deadline = start + current_.timeout_s;
  double next_probe = start + 1e-3;
  std::pair<int, bool> gone{-1, false};
  int small[4];  // exchange() waits on two requests: no allocation on the hot path
  std::vector<int> large(count > 4 ? static_cast<std::size_t>(count) : 0);
  int* indices = count > 4 ? large.data() : small;
  int remaining = count;
  for (;;) {
    int completed = 0;
    ZERO_MPI_CHECK(MPI_Testsome(count, requests, &completed, indices, MPI_STATUSES_IGNORE));
    if (completed != MPI_UNDEFINED) remaining -= completed;
    if (completed == MPI_UNDEFINED || remaining <= 0) return;
    const double now = MPI_Wtime();
    if (now >= next_probe) {
      next_probe = now + 1e-3;
      if (gone.first < 0) {
        gone = gone_peer();
        if (gone.first >= 0) deadline = std::min(deadline, now + kGoneGraceSeconds);
      }
      if (abandon_) deadline = now;
    }
    if (now > deadline) {
      std::vector<int> missing;
      for (int i = 0; i < count; ++i) {
        if (requests[i] == MPI_REQUEST_NULL) continue;
        if (peers && std::find(missing.begin(), missing.end(), peers[i]) == missing.end()) missing.push_back(peers[i]);
        MPI_Cancel(&requests[i]);
        MPI_Request_free(&requests[i]);
      }
      std::sort(missing.begin(), missing.end());
      if (abandon_) throw PeerGone("this rank is leaving the job", rank_, false);
      if (gone.first >= 0)
        throw PeerGone(fmt::format("{} at step {}: rank {} {}", current_.name, current_.step, gone.first,
                                   gone.second ? "left the job (finalised MPI, e.g. returned from main) without "
                                                 "taking part"
                                               : "failed"),
                       gone.first, gone.second);
      throw CollectiveTimeout(current_.name, current_.step, current_.timeout_s,
                              missing.empty() ? std::string("(all)") : rank_list(missing));
    }
    if (now - start > kSpinSeconds)
      std::this_thread::sleep_for(
          std::chrono::duration<double>(std::clamp((now - start) / 8, kMinSleepSeconds, kMaxSleepSeconds)));
  }
}

// Sends `send_count` elements to `dest` while receiving `recv_count` from `source`; a zero count posts
// nothing. Unlike MPI_Sendrecv, an empty side sends no message at all, so two neighbours working
// through slices of different lengths (a different number of segments) stay matched: my k-th send is
// always my right neighbour's k-th receive.
void MpiCommunicator::exchange(const void* send, std::size_t send_count, MPI_Datatype type, int dest,
                               void* recv, std::size_t recv_count, int source, int tag) {
  MPI_Request requests[2];
  int peers[2];
  int posted = 0;
  if (recv_count > 0) {
    peers[posted] = source;
    ZERO_MPI_CHECK(MPI_Irecv(recv, as_int(recv_count), type, source, tag, comm_, &requests[posted++]));
  }
  if (send_count > 0) {
    peers[posted] = dest;
    ZERO_MPI_CHECK(MPI_Isend(send, as_int(send_count), type, dest, tag, comm_, &requests[posted++]));
  }
  if (posted > 0) wait_all(posted, requests, peers);
}

// Ring reduce-scatter (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
// workstations", 2009; the reduce-scatter half of NCCL's ring). At step s rank r sends the running
// partial sum of slice (r-s-1) to its right neighbour and receives the partial sum of slice (r-s-2)
// from its left, adding its own contribution; after n-1 steps the slice it holds is its own, summed
// over all ranks. Each rank sends and receives (n-1)/n of the buffer, the minimum. Slices are the
// destination ranks' counts, so uneven and empty partitions need no padding.
//
// Note [Segment-major pipelining]
// The slices are cut into segments of segment_bytes_ and each segment goes all the way round the ring
// (n-1 steps) before the next one starts. The partial sums in flight are then one segment each, in a
// two-segment double buffer that stays in cache (step s receives into acc[s%2] while forwarding
// acc[(s-1)%2]), instead of whole slices going through memory at every step; the all-gather and the
// broadcast chain are pipelined the same way. Measured on 4 ranks × 100 MB: 43-45 ms segment-major
// vs 59-65 ms step-major, 4 MiB segments best among 1-16 MiB (docs/collectives.md).
//
// `send` is never written. The last step writes straight into recv, which may alias this rank's slice
// of send because element i is read before it is written.
template <typename T>
void MpiCommunicator::ring_reduce_scatter(const T* send, T* recv, const std::vector<std::size_t>& counts,
                                          const std::vector<std::size_t>& offsets, ReduceOp op) {
  const int n = world_size_;
  const int r = rank_;
  if (n == 1) {
    if (counts[0] > 0 && recv != send) std::memmove(recv, send, counts[0] * sizeof(T));
    return;
  }
  const std::size_t max_count = *std::max_element(counts.begin(), counts.end());
  const std::size_t seg = std::max<std::size_t>(1, segment_bytes_ / sizeof(T));
  const std::size_t acc_floats = (std::min(seg, max_count) * sizeof(T) + sizeof(float) - 1) / sizeof(float);
  T* acc[2] = {reinterpret_cast<T*>(scratch(0, acc_floats)), reinterpret_cast<T*>(scratch(1, acc_floats))};
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  // Elements of segment [pos, pos+seg) that fall inside a slice of `count` (0 past its end).
  auto clip = [&](std::size_t count, std::size_t pos) { return pos < count ? std::min(seg, count - pos) : 0; };
  for (std::size_t pos = 0; pos < max_count; pos += seg) {
    for (int step = 0; step < n - 1; ++step) {
      const int send_slice = (r - step - 1 + n) % n;
      const int recv_slice = (r - step - 2 + 2 * n) % n;  // == r at the last step
      const std::size_t sn = clip(counts[send_slice], pos);
      const std::size_t rn = clip(counts[recv_slice], pos);
      const T* out = step == 0 ? (sn ? send + offsets[send_slice] + pos : send) : acc[(step - 1) % 2];
      T* in = acc[step % 2];
      exchange(out, sn, mpi_type<T>(), right, in, rn, left, 0);
      if (rn == 0) continue;
      T* dst = step == n - 2 ? recv + pos : in;
      combine(dst, in, send + offsets[recv_slice] + pos, rn, op);
    }
  }
}

// The ring over the buffer's own dtype (Note [Wire dtype]: 16-bit partial sums on the wire).
void MpiCommunicator::ring_reduce_scatter_any(const void* send, void* recv, const std::vector<std::size_t>& counts,
                                              const std::vector<std::size_t>& offsets, ReduceOp op, DType dtype) {
  switch (dtype) {
    case DType::f16:
      return ring_reduce_scatter(static_cast<const half*>(send), static_cast<half*>(recv), counts, offsets, op);
    case DType::bf16:
      return ring_reduce_scatter(static_cast<const bfloat16*>(send), static_cast<bfloat16*>(recv), counts, offsets,
                                 op);
    default:
      return ring_reduce_scatter(static_cast<const float*>(send), static_cast<float*>(recv), counts, offsets, op);
  }
}

// Ring all-gather: rank r first places its own slice, then at step s forwards slice (r-s) to the right
// and receives slice (r-s-1) from the left, straight into recv; segment-major like the reduce-scatter.
// No arithmetic, so it moves raw bytes of any element type.
void MpiCommunicator::ring_all_gather_bytes(const void* send, void* recv,
                                            const std::vector<std::size_t>& counts,
                                            const std::vector<std::size_t>& offsets,
                                            std::size_t elem_size) {
  const int n = world_size_;
  const int r = rank_;
  char* base = static_cast<char*>(recv);
  char* mine = base + offsets[r] * elem_size;
  if (counts[r] > 0 && send != mine) std::memcpy(mine, send, counts[r] * elem_size);
  if (n == 1) return;
  const std::size_t max_bytes = *std::max_element(counts.begin(), counts.end()) * elem_size;
  const std::size_t seg = segment_bytes_;
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  auto clip = [&](std::size_t bytes, std::size_t pos) { return pos < bytes ? std::min(seg, bytes - pos) : 0; };
  for (std::size_t pos = 0; pos < max_bytes; pos += seg) {
    for (int step = 0; step < n - 1; ++step) {
      const int send_slice = (r - step + n) % n;
      const int recv_slice = (r - step - 1 + n) % n;
      const std::size_t sn = clip(counts[send_slice] * elem_size, pos);
      const std::size_t rn = clip(counts[recv_slice] * elem_size, pos);
      exchange(sn ? base + offsets[send_slice] * elem_size + pos : base, sn, MPI_BYTE, right,
               rn ? base + offsets[recv_slice] * elem_size + pos : base, rn, left, 1);
    }
  }
}

// Ring all-reduce = ring reduce-scatter over an even split + ring all-gather, in place: 2(n-1)/n of the
// buffer per rank. fp16/bf16 with reduce_in_fp32(): the reduce-scatter runs on an fp32 copy, each rank
// narrows only its own reduced slice, and the all-gather moves the narrowed slices; otherwise the
// reduce-scatter runs on the 16-bit buffer itself (Note [Wire dtype]).
void MpiCommunicator::all_reduce_impl(void* buf, std::size_t count, DType dtype, ReduceOp op, bool fp32) {
  if (world_size_ == 1 || count == 0) return;
  const auto counts = split_even(count, world_size_);
  const auto offsets = prefix_offsets(counts);
  const std::size_t mine = counts[rank_];
  const std::size_t elem = dtype_size(dtype);
  void* my_slice = static_cast<char*>(buf) + offsets[rank_] * elem;
  if (dtype == DType::f32 || !fp32) {
    ring_reduce_scatter_any(buf, my_slice, counts, offsets, op, dtype);
  } else {
    float* wide = scratch(2, count);
    float* reduced = scratch(3, mine);
    widen(buf, dtype, wide, count);
    ring_reduce_scatter(static_cast<const float*>(wide), reduced, counts, offsets, op);
    narrow(reduced, my_slice, dtype, mine);
  }
  ring_all_gather_bytes(my_slice, buf, counts, offsets, elem);
}

void MpiCommunicator::reduce_scatter_impl(const void* send, void* recv,
                                          const std::vector<std::size_t>& counts, DType dtype, bool fp32) {
  const auto offsets = prefix_offsets(counts);
  const std::size_t mine = counts[rank_];
  if (dtype == DType::f32 || !fp32 || world_size_ == 1) {  // one rank: a plain copy
    ring_reduce_scatter_any(send, recv, counts, offsets, ReduceOp::sum, dtype);
    return;
  }
  const std::size_t total = offsets.back() + counts.back();
  float* wide = scratch(2, total);
  float* reduced = scratch(3, mine);
  widen(send, dtype, wide, total);
  ring_reduce_scatter(static_cast<const float*>(wide), reduced, counts, offsets, ReduceOp::sum);
  narrow(reduced, recv, dtype, mine);
}

// Reduce = ring reduce-scatter over an even split, then every rank sends its reduced slice to root.
// Non-root buffers are only read. fp16/bf16 with reduce_in_fp32(): everything travels in fp32 and
// root narrows once; otherwise both phases move the buffer's own dtype.
void MpiCommunicator::reduce_impl(void* buf, std::size_t count, DType dtype, int root, bool fp32) {
  if (world_size_ == 1 || count == 0) return;
  const auto counts = split_even(count, world_size_);
  const auto offsets = prefix_offsets(counts);
  const bool is_root = rank_ == root;
  const bool wide = dtype != DType::f32 && fp32;
  const DType wire = wide ? DType::f32 : dtype;
  const std::size_t we = dtype_size(wire);
  const void* src = buf;  // the values to reduce, in the wire dtype
  char* gathered = static_cast<char*>(buf);  // where root collects the sums
  if (wide) {
    float* w = scratch(2, count);
    widen(buf, dtype, w, count);
    src = w;
    gathered = reinterpret_cast<char*>(w);  // free to overwrite once the reduce-scatter has read it
  }
  char* reduced = is_root ? gathered + offsets[rank_] * we
                          : reinterpret_cast<char*>(scratch(3, (counts[rank_] * we + 3) / 4));
  ring_reduce_scatter_any(src, reduced, counts, offsets, ReduceOp::sum, wire);

  // The gather: root posts every receive at once so the peers' sends go in parallel.
  const std::size_t seg = kMaxMessageBytes;
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  if (is_root) {
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer == root) continue;
      const std::size_t bytes = counts[peer] * we;
      for (std::size_t pos = 0; pos < bytes; pos += seg) {
        requests.emplace_back();
        peers.push_back(peer);
        ZERO_MPI_CHECK(MPI_Irecv(gathered + offsets[peer] * we + pos, as_int(std::min(seg, bytes - pos)), MPI_BYTE,
                                 peer, 2, comm_, &requests.back()));
      }
    }
  } else {
    const std::size_t bytes = counts[rank_] * we;
    for (std::size_t pos = 0; pos < bytes; pos += seg) {
      requests.emplace_back();
      peers.push_back(root);
      ZERO_MPI_CHECK(MPI_Isend(reduced + pos, as_int(std::min(seg, bytes - pos)), MPI_BYTE, root, 2, comm_,
                               &requests.back()));
    }
  }
  if (!requests.empty()) wait_all(int(requests.size()), requests.data(), peers.data());
  if (is_root && wide) narrow(reinterpret_cast<const float*>(gathered), buf, dtype, count);
}

// Wire bytes of the algorithms above: only the fp32-widened all-reduce mixes dtypes (its reduce-scatter
// half moves fp32, its all-gather half the narrowed slices).
double MpiCommunicator::wire_bus_bytes(Collective c, std::size_t count, DType dtype) const {
  if (c == Collective::all_reduce && dtype != DType::f32 && reduce_in_fp32())
    return detail::widened_all_reduce_bus_bytes(count, dtype, world_size_);
  return Communicator::wire_bus_bytes(c, count, dtype);
}

void MpiCommunicator::collect_timers(Ledger& ledger) const {
  for (int c = 0; c < kNumCollectives; ++c) ledger.seconds[c] += 1e-9 * double(busy_ns_[c].exchange(0));
  ledger.cpu_seconds += 1e-9 * double(cpu_ns_.exchange(0));
}

// Pipelined chain broadcast: ranks form a chain starting at root (root, root+1, ...); the buffer moves
// down it in segments, each rank receiving segment k from its left while forwarding segment k-1 to its
// right. Every non-root rank receives S bytes once and the chain's fill costs (n-2) segments; measured
// faster than MPI_Bcast here (docs/collectives.md).
void MpiCommunicator::broadcast_impl(void* buf, std::size_t count, DType dtype, int root) {
  const int n = world_size_;
  if (n == 1) return;
  char* bytes = static_cast<char*>(buf);
  const std::size_t total = count * dtype_size(dtype);
  const std::size_t seg = segment_bytes_;
  const std::size_t segments = (total + seg - 1) / seg;
  const int position = (rank_ - root + n) % n;  // 0 = root, n-1 = end of the chain
  const int right = (rank_ + 1) % n;
  const int left = (rank_ - 1 + n) % n;
  auto segment_size = [&](std::size_t k) { return std::min(seg, total - k * seg); };
  if (position == 0) {
    for (std::size_t k = 0; k < segments; ++k)
      exchange(bytes + k * seg, segment_size(k), MPI_BYTE, right, nullptr, 0, left, 3);
    return;
  }
  const bool forwards = position < n - 1;
  for (std::size_t k = 0; k <= segments; ++k) {
    const bool receive = k < segments;
    const bool send = forwards && k > 0;
    exchange(send ? bytes + (k - 1) * seg : nullptr, send ? segment_size(k - 1) : 0, MPI_BYTE, right,
             receive ? bytes + k * seg : nullptr, receive ? segment_size(k) : 0, left, 3);
  }
}

// ---- the world communicator, the control channel and the MPI lifetime ---------------------------------

namespace {

std::atomic<int> g_world_rank{-1};  // for abort_job's message; read without calling MPI

// Notices a rank posts on the control channel (Note [No hang]).
enum Notice : int {
  kNoNotice = 0,
  kFailed = 1,       // failed with an error of its own
  kFailedAfter = 2,  // failed only because another rank had (prints nothing)
  kLeaving = 3,      // finalising MPI: done with every collective
};

// The control channel: MPI_COMM_WORLD duplicated, and what each rank has posted on it. Used by the
// communication thread (probing while it waits) and by the main thread in finalize / fail_job once
// that thread is joined, never by both at once (MPI_THREAD_SERIALIZED); the mutex guards the data.
struct Control {
  std::mutex mutex;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::vector<int> notice;  // per world rank: the first notice received from it
  int posted = kNoNotice;   // what this rank posted (the send buffer)
  std::vector<MPI_Request> sends;
};

// Never destroyed: the exit-time finaliser (WorldState's destructor) still needs it, and it is
// created after WorldState, so as a plain static it would be destroyed first.
Control& control() {
  static Control* c = new Control;
  return *c;
}

// Receives every notice that has arrived. Caller holds control().mutex.
void receive_notices(Control& c) {
  if (c.comm == MPI_COMM_NULL) return;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, c.comm, &flag, &status) != MPI_SUCCESS || !flag) return;
    int kind = kNoNotice;
    MPI_Recv(&kind, 1, MPI_INT, status.MPI_SOURCE, kNoticeTag, c.comm, MPI_STATUS_IGNORE);
    int& slot = c.notice[static_cast<std::size_t>(status.MPI_SOURCE)];
    if (slot == kNoNotice) slot = kind;
  }
}

std::pair<int, bool> gone_peer() {
  Control& c = control();
  std::lock_guard lock(c.mutex);
  receive_notices(c);
  for (int r = 0; r < c.size; ++r)
    if (r != c.rank && c.notice[static_cast<std::size_t>(r)] != kNoNotice)
      return {r, c.notice[static_cast<std::size_t>(r)] == kLeaving};
  return {-1, false};
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// Posts `kind` to every other rank and waits until each has posted a notice of its own or `seconds`
// have passed. Returns the ranks that stayed silent. Main thread, after the communication thread ended.
std::vector<int> post_and_wait(int kind, double seconds) {
  Control& c = control();
  std::lock_guard lock(c.mutex);
  if (c.posted == kNoNotice) {
    c.posted = kind;
    for (int r = 0; r < c.size; ++r) {
      if (r == c.rank) continue;
      c.sends.emplace_back();
      if (MPI_Isend(&c.posted, 1, MPI_INT, r, kNoticeTag, c.comm, &c.sends.back()) != MPI_SUCCESS)
        c.sends.pop_back();
    }
  }
  const double deadline = MPI_Wtime() + seconds;
  std::vector<int> silent;
  for (;;) {
    receive_notices(c);
    if (!c.sends.empty()) {
      int done = 0;
      MPI_Testall(static_cast<int>(c.sends.size()), c.sends.data(), &done, MPI_STATUSES_IGNORE);
    }
    silent.clear();
    for (int r = 0; r < c.size; ++r)
      if (r != c.rank && c.notice[static_cast<std::size_t>(r)] == kNoNotice) silent.push_back(r);
    if (silent.empty() || MPI_Wtime() > deadline) return silent;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Completes the notices this rank sent and frees the channel (every peer has answered).
void close_control() {
  Control& c = control();
  std::lock_guard lock(c.mutex);
  if (c.comm == MPI_COMM_NULL) return;
  if (!c.sends.empty()) MPI_Waitall(static_cast<int>(c.sends.size()), c.sends.data(), MPI_STATUSES_IGNORE);
  c.sends.clear();
  MPI_Comm_free(&c.comm);
  c.comm = MPI_COMM_NULL;
}

struct WorldState {
  std::mutex mutex;
  std::shared_ptr<MpiCommunicator> comm;
  bool initialised_by_us = false;
  bool finalised = false;
  double timeout_s = 300.0;  // the world communicator's, when it was shut down

  // Runs at exit if finalize_mpi() was not called: the thread must be joined before MPI_Finalize.
  ~WorldState() {
    try {
      finalize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: finalising MPI failed: %s\n", g_world_rank.load(), e.what());
    }
  }

  // Joins the communication thread (first making it give up waiting when `abandon`).
  void stop_comm(bool abandon) {
    if (!comm) return;
    timeout_s = comm->timeout();
    if (abandon) comm->abandon();
    comm->shutdown();
    comm.reset();
  }

  void finalize() {
    std::lock_guard lock(mutex);
    if (finalised) return;
    finalised = true;
    stop_comm(false);
    int done = 0;
    MPI_Finalized(&done);
    if (!initialised_by_us || done) return;
    // Note [No hang]: say we are leaving, so a rank still waiting for us stops now; then wait (like a
    // barrier, up to the collective timeout) for the others to leave or fail before finalising.
    const Control& c = control();
    if (c.size > 1) {
      const std::vector<int> silent = post_and_wait(kLeaving, timeout_s);
      if (!silent.empty()) {
        // Printed by the lowest-numbered rank that got here (the others stay quiet).
        bool lowest = true;
        for (int r = 0; r < c.rank; ++r)
          if (c.notice[static_cast<std::size_t>(r)] == kLeaving) lowest = false;
        if (lowest)
          std::fprintf(stderr, "error: rank(s) %s did not reach the end of the job within %g s of the others\n",
                       rank_list(silent).c_str(), timeout_s);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      close_control();
    }
    MPI_Finalize();
  }
};

WorldState& world_state() {
  static WorldState state;
  return state;
}

// A rank that crashes is ended by Open MPI, which then ends the others; before that it says so in one
// line of ours (the others are killed and print nothing). Async-signal-safe: write(2) and raise only.
char g_crash_prefix[64];
std::size_t g_crash_prefix_length = 0;

void on_crash(int signal) {
  char digits[8];
  std::size_t n = 0;
  for (int v = signal; v > 0 && n < sizeof digits; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  char line[96];
  std::size_t len = 0;
  for (std::size_t i = 0; i < g_crash_prefix_length; ++i) line[len++] = g_crash_prefix[i];
  while (n > 0) line[len++] = digits[--n];
  line[len++] = ')';
  line[len++] = '\n';
  [[maybe_unused]] const auto written = ::write(2, line, len);
  std::raise(signal);  // SA_RESETHAND: the default action now (core dump / termination)
}

void install_crash_handlers(int rank) {
  const int len = std::snprintf(g_crash_prefix, sizeof g_crash_prefix, "error: rank %d: crashed (signal ", rank);
  g_crash_prefix_length = len > 0 ? static_cast<std::size_t>(len) : 0;
  struct sigaction action {};
  action.sa_handler = on_crash;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &action, nullptr);
}

}  // namespace

std::shared_ptr<Communicator> mpi_world() {
  WorldState& state = world_state();
  std::lock_guard lock(state.mutex);
  ZERO_CHECK(!state.finalised, "mpi_world(): MPI was already finalised");
  if (!state.comm) {
    int initialised = 0;
    ZERO_MPI_CHECK(MPI_Initialized(&initialised));
    if (!initialised) {
      int provided = MPI_THREAD_SINGLE;
      ZERO_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
      state.initialised_by_us = true;
    }
    Control& c = control();
    if (c.comm == MPI_COMM_NULL) {
      ZERO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c.comm));
      ZERO_MPI_CHECK(MPI_Comm_set_errhandler(c.comm, MPI_ERRORS_RETURN));
      ZERO_MPI_CHECK(MPI_Comm_rank(c.comm, &c.rank));
      ZERO_MPI_CHECK(MPI_Comm_size(c.comm, &c.size));
      c.notice.assign(static_cast<std::size_t>(c.size), kNoNotice);
    }
    state.comm = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD);
    g_world_rank = state.comm->rank();
    if (state.comm->world_size() > 1) install_crash_handlers(state.comm->rank());
  }
  return state.comm;
}

void finalize_mpi() { world_state().finalize(); }

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

int launcher_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 1;
}

void fail_job(const std::exception& error, bool verbose, int exit_code) {
  std::string message = error.what();
  const auto* zero_error = dynamic_cast<const Error*>(&error);
  if (verbose && zero_error && !zero_error->location().empty()) message += " (" + zero_error->location() + ")";
  const auto* gone = dynamic_cast<const PeerGone*>(&error);
  const bool caused_here = !(gone && !gone->departed());
  std::fflush(stdout);

  WorldState& state = world_state();
  int initialised = 0;
  int finalised = 0;
  MPI_Initialized(&initialised);
  // An error found before MPI started, in a job of several ranks: start MPI now, so the ranks can agree
  // on who prints (otherwise the launcher may end rank 0 before it has said anything).
  if (!initialised && launcher_size() > 1) {
    try {
      mpi_world();
    } catch (const std::exception&) {
    }
    MPI_Initialized(&initialised);
  }
  MPI_Finalized(&finalised);
  Control& c = control();
  if (!initialised || finalised || c.comm == MPI_COMM_NULL || c.size == 1) {
    // One process (or MPI could not start under a launcher: then the launcher's rank 0 says it).
    if (launcher_rank() == 0 || (initialised && !finalised)) std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    if (initialised && !finalised) {
      state.stop_comm(true);
      state.finalised = true;
      close_control();
      MPI_Finalize();
    }
    std::exit(exit_code);
  }
  {
    std::lock_guard lock(state.mutex);
    state.stop_comm(true);
    state.finalised = true;  // this function finalises (or aborts); the exit-time finaliser must not
  }
  // Long enough for a peer waiting in a collective to see the notice, sit out its grace and answer.
  const std::vector<int> silent =
      post_and_wait(caused_here ? kFailed : kFailedAfter, kGoneGraceSeconds + std::min(state.timeout_s, 3.0));
  if (caused_here) {
    bool lowest = true, everyone = true;
    for (int r = 0; r < c.size; ++r) {
      if (r == c.rank) continue;
      const int n = c.notice[static_cast<std::size_t>(r)];
      if (n == kFailed && r < c.rank) lowest = false;
      if (n != kFailed) everyone = false;
    }
    if (const auto* t = dynamic_cast<const CollectiveTimeout*>(&error); t && !silent.empty())
      message = fmt::format("{} at step {} timed out after {:g} s: rank(s) {} did not arrive", t->collective(),
                            t->step(), t->seconds(), rank_list(silent));
    if (lowest) {
      if (everyone)
        std::fprintf(stderr, "error: %s\n", message.c_str());
      else
        std::fprintf(stderr, "error: rank %d: %s\n", c.rank, message.c_str());
    }
  }
  std::fflush(stderr);
  if (!silent.empty()) MPI_Abort(MPI_COMM_WORLD, exit_code);  // a rank that never answered: stuck
  close_control();
  MPI_Finalize();
  std::exit(exit_code);
}

void abort_job(const std::string& message) {
  int initialised = 0;
  int finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  int rank = g_world_rank.load();
  if (rank < 0 && initialised && !finalised) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "rank %d: %s\n", std::max(rank, 0), message.c_str());
  std::fflush(stderr);
  // MPI_Abort from this thread while the communication thread may be inside MPI bends
  // MPI_THREAD_SERIALIZED, but it is the only way to end the ranks that wait on us.
  if (initialised && !finalised) MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

}  // namespace zero::dist
