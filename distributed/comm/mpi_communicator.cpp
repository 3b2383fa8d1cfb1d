#include "distributed/comm/mpi_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <type_traits>

#include "core/check.h"
#include "core/trace.h"
#include "distributed/comm/control_channel.h"
#include "distributed/comm/cpu_work.h"
#include "distributed/comm/quantize.h"
#include "distributed/comm/ring_math.h"

namespace zero::dist {

namespace detail {


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
  MPI_Comm dup = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  start(dup);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, Adopt) { start(comm); }

void MpiCommunicator::start(MPI_Comm comm) {
  // Note [Identity records]: ZERO_COLLECTIVE_IDENTITY=0 turns the check off, for measuring its cost
  // (bench/identity_cost.sh) and nothing else.
  if (const char* env = std::getenv("ZERO_COLLECTIVE_IDENTITY"); env != nullptr && *env != '\0') {
    const std::string v = env;
    ZERO_CHECK(v == "0" || v == "1", "ZERO_COLLECTIVE_IDENTITY must be 0 or 1, got '{}'", v);
    check_identities_ = v == "1";
  }
  comm_ = comm;
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

std::shared_ptr<Communicator> MpiCommunicator::make_duplicate() {
  int provided = MPI_THREAD_SINGLE;
  ZERO_MPI_CHECK(MPI_Query_thread(&provided));
  ZERO_CHECK(provided >= MPI_THREAD_MULTIPLE || world_size_ == 1,
             "MpiCommunicator: a second channel runs a second communication thread, which needs MPI initialised "
             "with MPI_THREAD_MULTIPLE (this MPI gives thread level {})",
             provided);
  MPI_Comm dup = MPI_COMM_NULL;
  enqueue("duplicate", [&dup, this] { ZERO_MPI_CHECK(MPI_Comm_dup(comm_, &dup)); })->wait();
  std::shared_ptr<MpiCommunicator> d(new MpiCommunicator(dup, Adopt{}));
  std::erase_if(children_, [](const std::weak_ptr<MpiCommunicator>& w) { return w.expired(); });
  children_.push_back(d);
  return d;
}

void MpiCommunicator::abandon() {
  abandon_ = true;
  for (const auto& weak : children_)
    if (auto child = weak.lock()) child->abandon();
}

void MpiCommunicator::shutdown() {
  for (const auto& weak : children_)  // their threads use MPI too: joined before this one's communicator goes
    if (auto child = weak.lock()) child->shutdown();
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
    queue_.push_back(Task{std::move(task), work, name, step(), timeout(), bytes, issuing()});
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
    // Note [No hang] (job_runtime.cpp): once a collective timed out or lost a peer, the ranks are out of
    // step; what follows fails at once.
    if (!broken_ && abandon_) broken_ = std::make_exception_ptr(PeerGone("this rank is leaving the job", rank_, false));
    std::exception_ptr error = broken_;
    if (!error) {
      current_ = Task{nullptr, nullptr, task.name, task.step, task.timeout_s, task.bytes, {}};
      trace::Span span(task.name, "comm", trace::kCommThread);
      span.arg("bytes", task.bytes);
      const auto started = std::chrono::steady_clock::now();
      const std::int64_t cpu_started = thread_cpu_ns();
      // Ledger::seconds: the five data collectives are timed (control scalars and barriers are not).
      int timed = -1;
      for (int c = 0; c < kNumCollectives; ++c)
        if (collective_name(static_cast<Collective>(c)) == task.name) timed = c;
      try {
        post_identity(task.identity);  // Note [Identity records]: compared while the data moves
        task.fn();
        finish_identity();
      } catch (const CollectiveTimeout&) {
        error = broken_ = std::current_exception();
      } catch (const CollectiveMismatch&) {
        error = broken_ = std::current_exception();
      } catch (const PeerGone&) {
        error = broken_ = std::current_exception();
      } catch (...) {
        error = std::current_exception();  // e.g. a buffer too large for this rank: the peers did not start
        try {
          finish_identity();  // an MPI error of mismatched counts: the mismatch is the line to report
        } catch (const CollectiveMismatch&) {
          error = broken_ = std::current_exception();
        } catch (...) {
        }
      }
      identity_request_ = MPI_REQUEST_NULL;  // left pending after a failure (Note [Never cancel a collective])
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

// Note [Identity records]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Ranks compare a collective's identities (Note [Collective identity] in communicator.cpp): each rank
// contributes a fixed record of 256 bytes (the sequence number, a digest of the identity, and its
// description for the message) to one MPI_Iallgather on the collective's own MPI communicator. Every task
// starts by posting it, the control all-reduces and barriers included, so whatever two ranks issued at
// the same position, the first MPI call of that position is the same on both. The data then moves while
// the records travel (waiting for them first would add a collective's latency to every collective), and
// every wait of the task polls them: a mismatch ends the task as soon as the records are in, cancelling
// its point-to-point messages, and an MPI error of the data phase (mismatched counts truncate a message)
// is reported as the mismatch it comes from. Equal counts may let some data of a mismatched collective
// arrive before the records do; the task then fails all the same, so its results are never used. Every rank sees every record, so every rank
// throws the same CollectiveMismatch line, naming rank 0 and the first rank that differs from it. Cost:
// one small collective per collective (bench/bench_collectives: "identity check"); not in the ledger's
// five counters nor in control_bytes, as it moves no data of the program's.
void MpiCommunicator::post_identity(const CollectiveIdentity& identity) {
  identity_request_ = MPI_REQUEST_NULL;
  if (world_size_ == 1 || !check_identities_) return;
  identity_mine_ = make_identity_record(identity);
  identity_all_.resize(static_cast<std::size_t>(world_size_));
  ZERO_MPI_CHECK(MPI_Iallgather(&identity_mine_, sizeof identity_mine_, MPI_BYTE, identity_all_.data(),
                                sizeof identity_mine_, MPI_BYTE, comm_, &identity_request_));
}

void MpiCommunicator::poll_identity() {
  int done = 0;
  ZERO_MPI_CHECK(MPI_Test(&identity_request_, &done, MPI_STATUS_IGNORE));
  if (done) check_identity_records(identity_all_);
}

void MpiCommunicator::finish_identity() {
  if (identity_request_ == MPI_REQUEST_NULL) return;
  MPI_Request request = identity_request_;
  identity_request_ = MPI_REQUEST_NULL;  // wait_all polls nothing else meanwhile
  wait_all(1, &request);
  check_identity_records(identity_all_);
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
  const bool accumulate = op == ReduceOp::sum && accumulates_in_fp32(dtype);
  return enqueue("all_reduce", [=, this] { all_reduce_impl(buf, count, dtype, op, wide, accumulate); },
                 count * dtype_size(dtype));
}

std::shared_ptr<Work> MpiCommunicator::issue_reduce_scatter(const void* send, void* recv,
                                                            std::span<const std::size_t> counts,
                                                            DType dtype) {
  std::vector<std::size_t> owned(counts.begin(), counts.end());
  const bool wide = reduce_in_fp32();
  const bool accumulate = accumulates_in_fp32(dtype);
  const std::size_t block = quantized_gradients();
  const std::size_t bytes = std::accumulate(owned.begin(), owned.end(), std::size_t{0}) * dtype_size(dtype);
  return enqueue(
      "reduce_scatter",
      [=, this, counts = std::move(owned)] {
        reduce_scatter_impl(send, recv, counts, dtype, wide, accumulate, block);
      },
      bytes);
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
// Note [Never cancel a collective]
// The MPI standard makes MPI_Cancel and MPI_Request_free on a non-blocking collective's request
// erroneous, and Open MPI answers them by aborting the whole job (MPI_ERR_REQUEST, exit code 7)
// before any line of ours is printed. So a wait that gives up on a barrier or a control all-reduce
// just stops waiting: the request stays pending, the communicator is broken (every later collective
// fails at once), and the job ends through fail_job with its one line, whose MPI_Finalize (or, for a
// rank that never answers, MPI_Abort after the line) does not need the request.
//
// The same loop keeps a peer that never arrives from hanging the job (Note [No hang] in job_runtime.cpp):
// it enforces the collective's deadline, and about once a millisecond it asks the control channel one
// question, control_channel::first_gone_peer(): "has a peer left or failed?". Once a peer's notice is
// in, it waits out a short grace (kGoneGraceSeconds) and fails with PeerGone; abandon() ends it at once.

void MpiCommunicator::wait_all(int count, MPI_Request* requests, const int* peers) {
  constexpr double kSpinSeconds = 100e-6;
  constexpr double kMinSleepSeconds = 20e-6, kMaxSleepSeconds = 250e-6;
  const double start = MPI_Wtime();
  double deadline = start + current_.timeout_s;
  double next_probe = start + 1e-3;
  std::optional<control_channel::GonePeer> gone;
  int small[4];  // exchange() waits on two requests: no allocation on the hot path
  std::vector<int> large(count > 4 ? static_cast<std::size_t>(count) : 0);
  int* indices = count > 4 ? large.data() : small;
  int remaining = count;
  for (;;) {
    if (identity_request_ != MPI_REQUEST_NULL) {
      try {
        poll_identity();  // Note [Identity records]: a mismatch ends the wait at once
      } catch (const CollectiveMismatch&) {
        for (int i = 0; i < count && peers; ++i) {  // point-to-point requests only (Note [Never cancel a collective])
          if (requests[i] == MPI_REQUEST_NULL) continue;
          MPI_Cancel(&requests[i]);
          MPI_Request_free(&requests[i]);
        }
        throw;
      }
    }
    int completed = 0;
    ZERO_MPI_CHECK(MPI_Testsome(count, requests, &completed, indices, MPI_STATUSES_IGNORE));
    if (completed != MPI_UNDEFINED) remaining -= completed;
    if (completed == MPI_UNDEFINED || remaining <= 0) return;
    const double now = MPI_Wtime();
    if (now >= next_probe) {
      next_probe = now + 1e-3;
      if (!gone) {
        gone = control_channel::first_gone_peer();
        if (gone) deadline = std::min(deadline, now + control_channel::kGoneGraceSeconds);
      }
      if (abandon_) deadline = now;
    }
    if (now > deadline) {
      // Note [Never cancel a collective]: point-to-point requests are cancelled and freed; a collective
      // one (peers == nullptr: barrier, control all-reduce) is left pending and never touched again.
      std::vector<int> missing;
      for (int i = 0; i < count; ++i) {
        if (requests[i] == MPI_REQUEST_NULL || !peers) continue;
        if (std::find(missing.begin(), missing.end(), peers[i]) == missing.end()) missing.push_back(peers[i]);
        MPI_Cancel(&requests[i]);
        MPI_Request_free(&requests[i]);
      }
      std::sort(missing.begin(), missing.end());
      if (abandon_) throw PeerGone("this rank is leaving the job", rank_, false);
      if (gone)
        throw PeerGone(fmt::format("{} at step {}: rank {} {}", current_.name, current_.step, gone->rank,
                                   gone->left ? "left the job (finalised MPI, e.g. returned from main) without "
                                                "taking part"
                                              : "failed"),
                       gone->rank, gone->left);
      throw CollectiveTimeout(current_.name, current_.step, current_.timeout_s,
                              missing.empty() ? std::string("(all)") : fmt::format("{}", fmt::join(missing, ", ")));
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

// Rank r receives round.recv_bytes[q] bytes from every peer q into round.recv[q] and sends
// round.send_bytes[q] bytes of round.send[q] to it (zero bytes: no message; entry r is ignored), the
// k-th receive from rank r-k and the k-th send to rank r+k, so the n-1 messages of one rank go to n-1
// different ranks at once; then waits for all of them.
void MpiCommunicator::alltoall_round(const AllToAllRound& round, int tag) {
  const int n = world_size_, r = rank_;
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n, to = (r + k) % n;
    if (round.recv_bytes[from] > 0) {
      requests.emplace_back();
      peers.push_back(from);
      ZERO_MPI_CHECK(MPI_Irecv(round.recv[from], as_int(round.recv_bytes[from]), MPI_BYTE, from, tag, comm_,
                               &requests.back()));
    }
    if (round.send_bytes[to] > 0) {
      requests.emplace_back();
      peers.push_back(to);
      ZERO_MPI_CHECK(MPI_Isend(round.send[to], as_int(round.send_bytes[to]), MPI_BYTE, to, tag, comm_,
                               &requests.back()));
    }
  }
  if (!requests.empty()) wait_all(int(requests.size()), requests.data(), peers.data());
}

// Note [fp32-accumulating reduce-scatter] (communicator.cpp), over point-to-point messages: for each
// segment position, rank r posts a receive from every peer for its own slice's segment and a send of
// slice d's segment to every peer d (starting with its right neighbour, so the n-1 messages of one
// rank go to n-1 different ranks at once), waits for all of them, then sums the n contributions in
// rank order. Segments of segment_bytes_ per message bound the scratch to n segments of 16-bit values
// plus two fp32 segments. `send` is never written; recv may alias this rank's slice of send (a
// segment of it is read before it is written).
void MpiCommunicator::alltoall_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                                              const std::vector<std::size_t>& offsets, DType dtype) {
  const int n = world_size_, r = rank_;
  const std::size_t elem = dtype_size(dtype), mine = counts[r];
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  if (n == 1) {
    if (mine > 0 && recv != send) std::memmove(recv, send, mine * elem);
    return;
  }
  const std::size_t max_count = *std::max_element(counts.begin(), counts.end());
  const std::size_t seg = std::max<std::size_t>(1, segment_bytes_ / elem);
  const std::size_t seg_floats = std::min(seg, std::max<std::size_t>(mine, 1));
  char* inbox = reinterpret_cast<char*>(scratch(2, (std::size_t(n) * seg_floats * elem + 3) / 4));
  float* acc = scratch(0, seg_floats);
  float* tmp = scratch(1, seg_floats);
  auto clip = [&](std::size_t count, std::size_t pos) { return pos < count ? std::min(seg, count - pos) : 0; };
  std::vector<const void*> parts(static_cast<std::size_t>(n));
  AllToAllRound round(n);
  for (std::size_t pos = 0; pos < max_count; pos += seg) {
    const std::size_t rn = clip(mine, pos);
    for (int q = 0; q < n; ++q) {
      round.recv[q] = inbox + std::size_t(q) * seg_floats * elem;
      round.recv_bytes[q] = rn * elem;
      round.send_bytes[q] = clip(counts[q], pos) * elem;
      round.send[q] = round.send_bytes[q] > 0 ? in + (offsets[q] + pos) * elem : nullptr;
    }
    alltoall_round(round, 4);
    if (rn == 0) continue;
    for (int q = 0; q < n; ++q)
      parts[q] = q == r ? in + (offsets[r] + pos) * elem : inbox + std::size_t(q) * seg_floats * elem;
    detail::sum_in_fp32(parts, dtype, acc, tmp, out + pos * elem, rn);
  }
}

// Note [int8 quantized reduce-scatter] (quantize.cpp), over point-to-point messages, segment by segment
// like alltoall_reduce_scatter: a segment is a whole number of blocks (at least one), so the blocks are
// those of the whole slice whatever the segment size. For each segment position, rank r quantizes
// every destination's segment (its own included) into one message each, [scales][int8 values], posts
// a receive from every peer and a send to every peer, waits, then dequantizes the n contributions to
// its own slice in rank order into fp32 and rounds once. `send` is never written; recv may alias this
// rank's slice of send (a segment is quantized before the result is written over it).
void MpiCommunicator::quantized_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                                               const std::vector<std::size_t>& offsets, DType dtype,
                                               std::size_t block) {
  const int n = world_size_, r = rank_;
  const std::size_t elem = dtype_size(dtype), mine = counts[r];
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const std::size_t max_count = *std::max_element(counts.begin(), counts.end());
  if (max_count == 0) return;
  const std::size_t seg = std::min(std::max(block, segment_bytes_ / block * block), max_count);
  const std::size_t slot_floats = (quantized_bytes(seg, block) + 3) / 4;  // one message, in floats
  float* outbox = scratch(4, std::size_t(n) * slot_floats);
  float* inbox = scratch(5, std::size_t(n) * slot_floats);
  float* acc = scratch(0, std::min(seg, std::max<std::size_t>(mine, 1)));
  auto clip = [&](std::size_t count, std::size_t pos) { return pos < count ? std::min(seg, count - pos) : 0; };
  auto values = [&](float* message, std::size_t len) {  // the int8 values follow the scales
    return reinterpret_cast<std::int8_t*>(message + quantized_blocks(len, block));
  };
  AllToAllRound round(n);
  for (std::size_t pos = 0; pos < max_count; pos += seg) {
    const std::size_t rn = clip(mine, pos);
    for (int q = 0; q < n; ++q) {
      float* message = outbox + std::size_t(q) * slot_floats;
      const std::size_t len = clip(counts[q], pos);
      if (len > 0) quantize_blocks(in + (offsets[q] + pos) * elem, dtype, len, block, message, values(message, len));
      round.send[q] = message;
      round.send_bytes[q] = len > 0 ? quantized_bytes(len, block) : 0;
      round.recv[q] = inbox + std::size_t(q) * slot_floats;
      round.recv_bytes[q] = rn > 0 ? quantized_bytes(rn, block) : 0;
    }
    alltoall_round(round, 5);
    if (rn == 0) continue;
    for (int q = 0; q < n; ++q) {
      float* message = (q == r ? outbox : inbox) + std::size_t(q) * slot_floats;
      dequantize_accumulate(message, values(message, rn), rn, block, acc, q == 0);
    }
    if (dtype == DType::f32)
      std::memcpy(out + pos * elem, acc, rn * elem);
    else
      narrow(acc, out + pos * elem, dtype, rn);
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
void MpiCommunicator::all_reduce_impl(void* buf, std::size_t count, DType dtype, ReduceOp op, bool fp32,
                                      bool accumulate) {
  if (world_size_ == 1 || count == 0) return;
  const auto counts = split_even(count, world_size_);
  const auto offsets = prefix_offsets(counts);
  const std::size_t mine = counts[rank_];
  const std::size_t elem = dtype_size(dtype);
  void* my_slice = static_cast<char*>(buf) + offsets[rank_] * elem;
  if (accumulate) {
    alltoall_reduce_scatter(buf, my_slice, counts, offsets, dtype);
  } else if (dtype == DType::f32 || !fp32) {
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
                                          const std::vector<std::size_t>& counts, DType dtype, bool fp32,
                                          bool accumulate, std::size_t block) {
  const auto offsets = prefix_offsets(counts);
  const std::size_t mine = counts[rank_];
  if (block > 0) {
    quantized_reduce_scatter(send, recv, counts, offsets, dtype, block);
    return;
  }
  if (accumulate) {
    alltoall_reduce_scatter(send, recv, counts, offsets, dtype);
    return;
  }
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

}  // namespace zero::dist
