#include "distributed/comm/inprocess_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <exception>

#include "core/check.h"
#include "distributed/comm/cpu_work.h"
#include "distributed/comm/quantize.h"
#include "distributed/comm/ring_math.h"

namespace zero::dist {

namespace detail {

// What a rank's collective is, and the buffers it brings to it (posted in the world for its peers).
enum class Kind { all_reduce, reduce_scatter, all_gather, reduce, broadcast, barrier, control };

struct Posted {
  Kind kind = Kind::barrier;
  const void* send = nullptr;  // read by every rank (reduce_scatter, all_gather: send; else the buffer)
  void* recv = nullptr;        // written by this rank only (reduce_scatter, all_gather: recv; else the buffer)
  std::vector<std::size_t> counts;  // reduce_scatter, all_gather: per rank; otherwise {count}
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  bool fp32 = false;         // 16-bit reductions travel in fp32 (reduce_in_fp32() when issued)
  bool accumulate = false;   // 16-bit all-to-all summed in fp32 (accumulates_in_fp32() when issued)
  std::size_t quantize_block = 0;  // reduce_scatter: int8 blocks of this size (quantized_gradients() when issued)
  double* values = nullptr;  // control: counts[0] doubles, summed / maxed in place
  CollectiveIdentity identity;  // Note [Collective identity] in communicator.cpp
};

// Where a rank stands in the job (the in-process twin of the notices of Note [No hang] in
// mpi_communicator.cpp).
enum class Presence {
  here,          // still taking part
  left,          // its thread is done: it will issue no more collectives
  failed,        // failed with an error of its own
  failed_after,  // failed only because another rank had (PeerGone from a failed peer)
};

// The state the ranks of one world share. Everything is guarded by `mutex`; `changed` is notified
// whenever a rank posts, finishes reading, leaves or fails.
class InProcessWorld {
 public:
  explicit InProcessWorld(int size)
      : size(size), posted(size, nullptr), arrived(size, 0), finished(size, 0), presence(size, Presence::here) {}

  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  // Per rank: the arguments of its current collective, the number of that collective (1, 2, ...; 0 =
  // none yet), and the number of the last collective it has finished reading.
  std::vector<const Posted*> posted;
  std::vector<std::int64_t> arrived;
  std::vector<std::int64_t> finished;
  std::vector<Presence> presence;
  // Second channels (Communicator::duplicate): rank r's k-th duplicate joins children[k], which the
  // first rank to ask creates.
  std::vector<std::shared_ptr<InProcessWorld>> children;
};

// Scratch for reduce_slice, sized before a rank posts its collective (Note [Arrive, read, leave]).
struct RingScratch {
  std::vector<float> partial;  // the partial result between hops, in the wire type (any T fits)
  std::vector<float> widened;  // n contributions of one slice widened to fp32 (reduce_in_fp32)
  std::vector<float> sum;      // the fp32 result before it is rounded (reduce_in_fp32, fp32 accumulation, int8)
  std::vector<float> scales;          // one contribution's block scales (int8)
  std::vector<std::int8_t> values;    // one contribution's int8 values

  void reserve(int n, std::size_t max_slice, bool wide, bool accumulate, std::size_t block) {
    partial.resize(max_slice);
    if (wide) widened.resize(std::size_t(n) * max_slice);
    if (wide || accumulate || block > 0) sum.resize(max_slice);
    if (block > 0) {
      scales.resize(quantized_blocks(max_slice, block));
      values.resize(max_slice);
    }
  }
};

}  // namespace detail

using detail::Kind;
using detail::Posted;
using detail::Presence;
using detail::RingScratch;

namespace {

using detail::thread_cpu_ns;

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::all_reduce: return "all_reduce";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::all_gather: return "all_gather";
    case Kind::reduce: return "reduce";
    case Kind::broadcast: return "broadcast";
    case Kind::barrier: return "barrier";
    case Kind::control: return "control all_reduce";
  }
  return "?";
}

// Every rank must issue the same collective with the same arguments (but its own buffers) and the same
// identity (Note [Collective identity] in communicator.cpp).
bool same_collective(const Posted& a, const Posted& b) {
  return a.kind == b.kind && a.counts == b.counts && a.dtype == b.dtype && a.op == b.op && a.root == b.root &&
         a.fp32 == b.fp32 && a.accumulate == b.accumulate && a.quantize_block == b.quantize_block &&
         a.identity.digest() == b.identity.digest();
}

// The Ledger::seconds slot of a data collective; -1 for barriers and control scalars (not timed).
int timed_slot(Kind kind) {
  switch (kind) {
    case Kind::all_reduce: return int(Collective::all_reduce);
    case Kind::reduce_scatter: return int(Collective::reduce_scatter);
    case Kind::all_gather: return int(Collective::all_gather);
    case Kind::reduce: return int(Collective::reduce);
    case Kind::broadcast: return int(Collective::broadcast);
    default: return -1;
  }
}

std::string rank_list(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ", ")); }

// Names the thread in a debugger's thread list ("rank 2", "rank 2 comm"; at most 15 characters).
void name_this_thread(const std::string& name) { pthread_setname_np(pthread_self(), name.substr(0, 15).c_str()); }

// Note [The ring's order]
// ~~~~~~~~~~~~~~~~~~~~~~~
// MpiCommunicator's ring reduce-scatter (ring_reduce_scatter in mpi_communicator.cpp) builds the sum of
// the slice owned by rank d as a chain: rank d+1 sends its own value to rank d+2, which combines it with
// its own value and forwards the result, and so on round the ring, rank d combining last:
//     ((x[d+1] ⊕ x[d+2]) ⊕ x[d+3]) ⊕ ... ⊕ x[d]        (ranks mod n)
// where each ⊕ is one hop: detail::combine(partial that arrived, own value), which for fp16/bf16 adds in
// fp32 and rounds to the 16-bit type once (Note [Wire dtype] in communicator.cpp). Floating-point sums
// are not associative, so this order IS the result's bits. Segments and pipelining change only when
// a hop happens, never the order of one element's hops, so they do not matter here. reduce_slice()
// below forms the same chain with the same combine from the peers' buffers, which makes every
// collective here bitwise equal to the MPI backend's:
//   reduce_scatter  rank r's slice r, from each rank's send buffer;
//   all_reduce      ring reduce-scatter over the even split (detail::split_even) + all-gather: element
//                   i of slice d is d's chain; every rank computes every slice, in the same order;
//   reduce          the same chains, computed by root only;
//   with reduce_in_fp32, every contribution is widened to fp32, the chain runs in fp32 and the result
//   is rounded to the 16-bit type once (MPI widens the whole buffer first: the same values);
//   with fp32 accumulation (16-bit reduce_scatter and all_reduce sums) there is no chain: the owner adds
//   the widened contributions in rank order and rounds once (Note [fp32-accumulating reduce-scatter]
//   in communicator.cpp), as MpiCommunicator's all-to-all does with the slices it received;
//   with int8 quantization (reduce_scatter) the owner quantizes each peer's slice as that peer would
//   before sending it, and adds the dequantized contributions in rank order (Note [int8 quantized
//   reduce-scatter] in quantize.cpp): the same quantize_blocks and dequantize_accumulate as MPI.
// All-gather and broadcast copy bytes. The control scalars (not part of the ring) are summed in rank
// order 0, 1, ..., n-1; Open MPI's MPI_Allreduce may add them in another order.

// out[0, len) = the chain of Note [The ring's order] for a slice owned by `owner`; parts[q] is rank q's
// contribution (len elements of T). out may alias parts[owner] (it is written at the last hop only).
template <typename T>
void ring_chain(const std::vector<const T*>& parts, int owner, T* out, std::size_t len, ReduceOp op, T* partial) {
  const int n = static_cast<int>(parts.size());
  if (n == 1) {
    if (out != parts[0]) std::memmove(out, parts[0], len * sizeof(T));
    return;
  }
  const T* arrived = parts[(owner + 1) % n];
  for (int hop = 2; hop <= n; ++hop) {
    T* dst = hop == n ? out : partial;
    detail::combine(dst, arrived, parts[(owner + hop) % n], len, op);
    arrived = partial;
  }
}

template <typename T>
std::vector<const T*> slices_of(const std::vector<const void*>& buffers, std::size_t offset) {
  std::vector<const T*> parts;
  for (const void* b : buffers) parts.push_back(static_cast<const T*>(b) + offset);
  return parts;
}

// out (len elements of `dtype`) = the reduction of elements [offset, offset + len) of the n ranks'
// `buffers`, as the ring computes it for the slice of rank `owner` (or, with `accumulate`, as the
// fp32-accumulating all-to-all does, for any owner).
void reduce_slice(const std::vector<const void*>& buffers, std::size_t offset, std::size_t len, int owner,
                  void* out, DType dtype, ReduceOp op, bool fp32, bool accumulate, RingScratch& s) {
  if (len == 0) return;
  if (accumulate && op == ReduceOp::sum && buffers.size() > 1) {
    std::vector<const void*> parts;
    for (const void* b : buffers) parts.push_back(static_cast<const char*>(b) + offset * dtype_size(dtype));
    detail::sum_in_fp32(parts, dtype, s.sum.data(), s.partial.data(), out, len);
    return;
  }
  const bool wide = fp32 && dtype != DType::f32 && buffers.size() > 1;
  if (wide) {
    std::vector<const float*> parts;
    for (std::size_t q = 0; q < buffers.size(); ++q) {
      float* w = s.widened.data() + q * len;
      detail::widen(static_cast<const char*>(buffers[q]) + offset * dtype_size(dtype), dtype, w, len);
      parts.push_back(w);
    }
    ring_chain(parts, owner, s.sum.data(), len, op, s.partial.data());
    detail::narrow(s.sum.data(), out, dtype, len);
    return;
  }
  switch (dtype) {
    case DType::f16:
      return ring_chain(slices_of<half>(buffers, offset), owner, static_cast<half*>(out), len, op,
                        reinterpret_cast<half*>(s.partial.data()));
    case DType::bf16:
      return ring_chain(slices_of<bfloat16>(buffers, offset), owner, static_cast<bfloat16*>(out), len, op,
                        reinterpret_cast<bfloat16*>(s.partial.data()));
    default:
      return ring_chain(slices_of<float>(buffers, offset), owner, static_cast<float*>(out), len, op,
                        s.partial.data());
  }
}

// out (len elements of `dtype`) = the int8 quantized reduce-scatter of elements [offset, offset + len)
// of the n ranks' `buffers`: each contribution quantized in blocks of `block` from `offset` (the start
// of the owner's slice), dequantized and added in fp32 in rank order, rounded once. out may alias any
// buffer's slice (every contribution is quantized before it is written).
void quantized_slice(const std::vector<const void*>& buffers, std::size_t offset, std::size_t len, void* out,
                     DType dtype, std::size_t block, RingScratch& s) {
  if (len == 0) return;
  for (std::size_t q = 0; q < buffers.size(); ++q) {
    quantize_blocks(static_cast<const char*>(buffers[q]) + offset * dtype_size(dtype), dtype, len, block,
                    s.scales.data(), s.values.data());
    dequantize_accumulate(s.scales.data(), s.values.data(), len, block, s.sum.data(), q == 0);
  }
  if (dtype == DType::f32)
    std::memcpy(out, s.sum.data(), len * sizeof(float));
  else
    detail::narrow(s.sum.data(), out, dtype, len);
}

}  // namespace

// ---- lifecycle -------------------------------------------------------------------------------------

InProcessCommunicator::InProcessCommunicator(std::shared_ptr<detail::InProcessWorld> world, int rank)
    : world_(std::move(world)), rank_(rank), ring_(std::make_unique<detail::RingScratch>()) {
  ZERO_CHECK(world_ != nullptr, "InProcessCommunicator: no world");
  world_size_ = world_->size;
  ZERO_CHECK(rank >= 0 && rank < world_size_, "InProcessCommunicator: rank {} outside a world of {} ranks", rank,
             world_size_);
  if (world_size_ > 1)
    thread_ = std::thread([this] {
      name_this_thread(fmt::format("rank {} comm", rank_));
      run_queue();
    });
}

InProcessCommunicator::~InProcessCommunicator() { leave(); }

void InProcessCommunicator::leave() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(world_->mutex);
  if (world_->presence[rank_] == Presence::here) world_->presence[rank_] = Presence::left;
  world_->changed.notify_all();
}

void InProcessCommunicator::fail() {
  for (const auto& weak : children_)
    if (auto child = weak.lock()) child->fail();
  abandon_ = true;
  {
    std::lock_guard lock(world_->mutex);
    if (world_->presence[rank_] == Presence::here) world_->presence[rank_] = Presence::failed;
    world_->changed.notify_all();  // also wakes this rank's own communication thread
  }
  leave();
}

// ---- the queue ---------------------------------------------------------------------------------------

std::shared_ptr<Work> InProcessCommunicator::enqueue(std::shared_ptr<Posted> posted) {
  auto work = std::make_shared<detail::CpuWork>();
  Task task{std::move(posted), work, step(), timeout()};
  {
    std::lock_guard lock(mutex_);
    ZERO_CHECK(!stopping_, "InProcessCommunicator: rank {} used after leave()", rank_);
    if (world_size_ > 1) queue_.push_back(std::move(task));
  }
  if (world_size_ == 1) {
    run(task);  // one rank: nothing to wait for, run inline (as MpiCommunicator does)
    return work;
  }
  wake_.notify_one();
  return work;
}

void InProcessCommunicator::run_queue() {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      // Work queued before leave() still runs: the other ranks are expecting it.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    run(task);
  }
}

// Runs one collective and completes its Work. Once a collective failed for want of a peer (timeout,
// PeerGone, a mismatch), the ranks are out of step: every later one fails at once with that error.
void InProcessCommunicator::run(const Task& task) {
  if (!broken_ && abandon_) broken_ = std::make_exception_ptr(PeerGone("this rank is leaving the job", rank_, false));
  std::exception_ptr error = broken_;
  if (!error) {
    const auto started = std::chrono::steady_clock::now();
    const std::int64_t cpu_started = thread_cpu_ns();
    try {
      collective(task);
    } catch (...) {
      error = std::current_exception();
    }
    if (const int slot = timed_slot(task.posted->kind); slot >= 0) {  // before finish(): see MpiCommunicator
      busy_ns_[slot] +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
      cpu_ns_ += thread_cpu_ns() - cpu_started;
    }
  }
  task.work->finish(error);
}

// ---- one collective: arrive, read, leave -----------------------------------------------------------------

// Note [Arrive, read, leave]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Rank r's k-th collective (every rank issues the same collectives in the same order, so "the k-th"
// names one collective of the job):
//   arrive  r posts its Posted (buffers + arguments) and arrived[r] = k, then waits until every rank
//           has arrived[q] >= k. Nobody can be at k+1 yet: finishing k needs r to finish reading k.
//           While some rank is missing, r gives up when a missing rank has left or failed (PeerGone),
//           when r itself is failing (fail()), or at the deadline (CollectiveTimeout naming the
//           missing ranks); giving up withdraws r's post (arrived[r] = k-1) under the mutex. The first
//           rank to see everyone arrived commits the collective: from then on no rank can withdraw
//           (each checks "everyone arrived" before giving up), so every rank will read, and every
//           posted buffer stays valid until the end of "leave".
//   read    r checks that every rank posted the same collective (kind, counts, dtype, op, root, wire
//           dtype; on a mismatch every rank finds it, and each still goes through "leave" before it
//           throws), then computes its own result from the peers' Posted buffers, without the mutex.
//           Inputs are only read; r writes only its own outputs that no peer reads (a reduce-scatter's
//           recv, an all-gather's other slices, a non-root broadcast buffer). A result that would
//           overwrite an input a peer may still be reading (all-reduce and reduce buffers, control
//           values) goes to this rank's scratch first.
//   leave   r sets finished[r] = k and waits until every rank has finished reading k, then writes the
//           scratch results. This wait has no deadline and ignores departures: every rank that arrived
//           reads and finishes without waiting for anything, so it cannot hang, and a rank returning
//           earlier could free a buffer a peer is still reading.
// Memory a collective needs is allocated before "arrive", so a failure to allocate (a count too large
// for this machine, say) fails the call on this rank alone without disturbing the world.
void InProcessCommunicator::arrive(const Task& task) {
  detail::InProcessWorld& w = *world_;
  const std::int64_t k = ++sequence_;
  const auto seconds = std::min(task.timeout_s, 1e8);  // a "timeout" of centuries: wait_until cannot overflow
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  const char* name = kind_name(task.posted->kind);
  std::unique_lock lock(w.mutex);
  w.posted[rank_] = task.posted.get();
  w.arrived[rank_] = k;
  w.changed.notify_all();
  // Gives up: withdraws this rank's post, records how this rank fails, and throws `error`.
  auto give_up = [&](auto error, Presence presence) {
    w.arrived[rank_] = k - 1;
    if (w.presence[rank_] == Presence::here) w.presence[rank_] = presence;
    w.changed.notify_all();
    broken_ = std::make_exception_ptr(error);
    throw error;
  };
  for (;;) {
    std::vector<int> missing;
    int gone = -1;  // a missing rank that will never arrive: one that left or failed first, if any
    for (int q = 0; q < w.size; ++q) {
      if (w.arrived[q] >= k) continue;
      missing.push_back(q);
      const Presence p = w.presence[q];
      if (p != Presence::here && (gone < 0 || (w.presence[gone] == Presence::failed_after && p != Presence::failed_after)))
        gone = q;
    }
    if (missing.empty()) break;
    if (gone >= 0) {
      const bool departed = w.presence[gone] == Presence::left;
      give_up(PeerGone(fmt::format("{} at step {}: rank {} {}", name, task.step, gone,
                                   departed ? "left the job (its thread returned) without taking part" : "failed"),
                       gone, departed),
              Presence::failed_after);
    }
    if (abandon_) give_up(PeerGone("this rank is leaving the job", rank_, false), Presence::failed_after);
    if (std::chrono::steady_clock::now() >= deadline)
      give_up(CollectiveTimeout(name, task.step, task.timeout_s, rank_list(missing)), Presence::failed);
    w.changed.wait_until(lock, deadline);
  }
  // Everyone arrived: the collective is committed.
  peers_.assign(w.posted.begin(), w.posted.end());
}

// Part of "read": every rank compares every post, so all of them find a mismatch, and each still
// finishes the collective (wait_until_everyone_has_read) before its post may go away.
void InProcessCommunicator::check_same_collective() {
  // Ranks differ iff some rank's post differs from rank 0's; naming the first such pair, every rank
  // words the same line.
  for (int q = 1; q < world_size_; ++q) {
    if (same_collective(*peers_[0], *peers_[q])) continue;
    const CollectiveMismatch mismatch(
        fmt::format("collective #{} at step {}: rank 0 issued {} but rank {} issued {} (every rank must issue the same "
                    "collectives in the same order)",
                    sequence_, peers_[0]->identity.step, peers_[0]->identity.describe(), q,
                    peers_[q]->identity.describe()));
    broken_ = std::make_exception_ptr(mismatch);  // the ranks are out of step from here on
    std::lock_guard lock(world_->mutex);
    if (world_->presence[rank_] == Presence::here) world_->presence[rank_] = Presence::failed;
    world_->changed.notify_all();
    throw mismatch;
  }
}

void InProcessCommunicator::wait_until_everyone_has_read() {
  detail::InProcessWorld& w = *world_;
  std::unique_lock lock(w.mutex);
  w.finished[rank_] = sequence_;
  w.changed.notify_all();
  w.changed.wait(lock, [&] {
    return std::all_of(w.finished.begin(), w.finished.end(), [&](std::int64_t f) { return f >= sequence_; });
  });
}

void InProcessCommunicator::collective(const Task& task) {
  const Posted& p = *task.posted;
  const int n = world_size_;
  const std::size_t elem = dtype_size(p.dtype);
  const std::size_t count = p.counts.empty() ? 0 : p.counts[0];
  // Sizes first (Note [Arrive, read, leave]: allocate before arriving).
  std::vector<std::size_t> counts = p.counts, offsets;
  if (p.kind == Kind::all_reduce || p.kind == Kind::reduce) counts = detail::split_even(count, n);
  offsets = detail::prefix_offsets(counts);
  const std::size_t max_slice = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  const bool reduces = p.kind == Kind::all_reduce || p.kind == Kind::reduce_scatter ||
                       (p.kind == Kind::reduce && rank_ == p.root);
  const bool into_scratch = p.kind == Kind::all_reduce || (p.kind == Kind::reduce && rank_ == p.root);
  // Scratch takes up to (n + 2) fp32 copies of a slice: a count beyond any address space fails here,
  // before the sizes below could overflow (and before a sanitizer's allocator would abort instead).
  const std::size_t elements = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  ZERO_CHECK(elements <= std::size_t(PTRDIFF_MAX) / sizeof(float) / std::size_t(n + 2),
             "{}: {} elements are more than a buffer of this process can hold", kind_name(p.kind), elements);
  if (reduces) ring_->reserve(n, max_slice, p.fp32 && p.dtype != DType::f32, p.accumulate, p.quantize_block);
  if (into_scratch) result_.resize(count * elem);
  if (p.kind == Kind::control) control_result_.resize(count);

  arrive(task);

  std::exception_ptr error;
  try {
    check_same_collective();
    auto buffers = [&](bool send) {  // every rank's input buffer
      std::vector<const void*> b;
      for (const Posted* q : peers_) b.push_back(send ? q->send : q->recv);
      return b;
    };
    switch (p.kind) {
      case Kind::all_reduce:
      case Kind::reduce:
        if (into_scratch)
          for (int d = 0; d < n; ++d)
            reduce_slice(buffers(false), offsets[d], counts[d], d, result_.data() + offsets[d] * elem, p.dtype, p.op,
                         p.fp32, p.accumulate, *ring_);
        break;
      case Kind::reduce_scatter:
        if (p.quantize_block > 0)
          quantized_slice(buffers(true), offsets[rank_], counts[rank_], p.recv, p.dtype, p.quantize_block, *ring_);
        else
          reduce_slice(buffers(true), offsets[rank_], counts[rank_], rank_, p.recv, p.dtype, ReduceOp::sum, p.fp32,
                       p.accumulate, *ring_);
        break;
      case Kind::all_gather:
        for (int q = 0; q < n; ++q) {
          char* dst = static_cast<char*>(p.recv) + offsets[q] * elem;
          if (counts[q] > 0 && dst != peers_[q]->send) std::memcpy(dst, peers_[q]->send, counts[q] * elem);
        }
        break;
      case Kind::broadcast:
        if (rank_ != p.root && count > 0) std::memcpy(p.recv, peers_[p.root]->recv, count * elem);
        break;
      case Kind::barrier: break;
      case Kind::control:
        for (std::size_t i = 0; i < count; ++i) {
          double v = peers_[0]->values[i];
          for (int q = 1; q < n; ++q) v = p.op == ReduceOp::sum ? v + peers_[q]->values[i] : std::max(v, peers_[q]->values[i]);
          control_result_[i] = v;
        }
        break;
    }
  } catch (...) {
    error = std::current_exception();
  }
  wait_until_everyone_has_read();
  if (error) std::rethrow_exception(error);
  if (into_scratch && count > 0) std::memcpy(p.recv, result_.data(), count * elem);
  if (p.kind == Kind::control) std::copy(control_result_.begin(), control_result_.end(), p.values);
}

// ---- hooks: describe the collective, queue it ---------------------------------------------------------

namespace {
std::shared_ptr<Posted> posted(Kind kind, const void* send, void* recv, std::vector<std::size_t> counts, DType dtype,
                               const CollectiveIdentity& identity) {
  auto p = std::make_shared<Posted>();
  p->identity = identity;
  p->kind = kind;
  p->send = send;
  p->recv = recv;
  p->counts = std::move(counts);
  p->dtype = dtype;
  return p;
}
}  // namespace

std::shared_ptr<Work> InProcessCommunicator::issue_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  auto p = posted(Kind::all_reduce, buf, buf, {count}, dtype, issuing());
  p->op = op;
  p->fp32 = reduce_in_fp32();  // read at issue (Note [Wire dtype])
  p->accumulate = op == ReduceOp::sum && accumulates_in_fp32(dtype);
  return enqueue(std::move(p));
}

std::shared_ptr<Work> InProcessCommunicator::issue_reduce_scatter(const void* send, void* recv,
                                                                  std::span<const std::size_t> counts, DType dtype) {
  auto p = posted(Kind::reduce_scatter, send, recv, {counts.begin(), counts.end()}, dtype, issuing());
  p->fp32 = reduce_in_fp32();
  p->accumulate = accumulates_in_fp32(dtype);
  p->quantize_block = quantized_gradients();
  return enqueue(std::move(p));
}

std::shared_ptr<Work> InProcessCommunicator::issue_all_gather(const void* send, void* recv,
                                                              std::span<const std::size_t> counts, DType dtype) {
  return enqueue(posted(Kind::all_gather, send, recv, {counts.begin(), counts.end()}, dtype, issuing()));
}

std::shared_ptr<Work> InProcessCommunicator::issue_reduce(void* buf, std::size_t count, DType dtype, int root) {
  auto p = posted(Kind::reduce, buf, buf, {count}, dtype, issuing());
  p->root = root;
  p->fp32 = reduce_in_fp32();
  return enqueue(std::move(p));
}

std::shared_ptr<Work> InProcessCommunicator::issue_broadcast(void* buf, std::size_t count, DType dtype, int root) {
  auto p = posted(Kind::broadcast, buf, buf, {count}, dtype, issuing());
  p->root = root;
  return enqueue(std::move(p));
}

std::shared_ptr<Work> InProcessCommunicator::issue_barrier() {
  return enqueue(posted(Kind::barrier, nullptr, nullptr, {}, DType::f32, issuing()));
}

double InProcessCommunicator::control_all_reduce(double value, ReduceOp op) {
  control_all_reduce_values(std::span<double>(&value, 1), op);
  return value;
}

void InProcessCommunicator::control_all_reduce_values(std::span<double> values, ReduceOp op) {
  auto p = posted(Kind::control, nullptr, nullptr, {values.size()}, DType::f32, issuing());
  p->op = op;
  p->values = values.data();
  enqueue(std::move(p))->wait();
}

// The ledger counts what MpiCommunicator's ring would put on the wire, so the two backends report the
// same bytes: only the fp32-widened all-reduce mixes dtypes (its reduce-scatter half moves fp32, its
// all-gather half the narrowed slices).
double InProcessCommunicator::wire_bus_bytes(Collective c, std::size_t count, DType dtype) const {
  if (c == Collective::all_reduce && dtype != DType::f32 && reduce_in_fp32())
    return detail::widened_all_reduce_bus_bytes(count, dtype, world_size_);
  return Communicator::wire_bus_bytes(c, count, dtype);
}

void InProcessCommunicator::collect_timers(Ledger& ledger) const {
  for (int c = 0; c < kNumCollectives; ++c) ledger.seconds[c] += 1e-9 * double(busy_ns_[c].exchange(0));
  ledger.cpu_seconds += 1e-9 * double(cpu_ns_.exchange(0));
}

// ---- worlds ----------------------------------------------------------------------------------------------

std::shared_ptr<Communicator> InProcessCommunicator::make_duplicate() {
  std::shared_ptr<detail::InProcessWorld> child;
  {
    std::lock_guard lock(world_->mutex);
    const std::size_t k = static_cast<std::size_t>(duplicates_made_++);
    if (world_->children.size() <= k) world_->children.push_back(std::make_shared<detail::InProcessWorld>(world_size_));
    child = world_->children[k];
  }
  auto d = std::make_shared<InProcessCommunicator>(child, rank_);
  children_.push_back(d);
  return d;
}

std::vector<std::shared_ptr<Communicator>> make_inprocess_world(int world_size) {
  ZERO_CHECK(world_size >= 1, "in-process world: world size must be >= 1, got {}", world_size);
  auto world = std::make_shared<detail::InProcessWorld>(world_size);
  std::vector<std::shared_ptr<Communicator>> comms;
  for (int r = 0; r < world_size; ++r) comms.push_back(std::make_shared<InProcessCommunicator>(world, r));
  return comms;
}

void run_ranks(int world_size, const std::function<void(std::shared_ptr<Communicator>)>& body) {
  auto comms = make_inprocess_world(world_size);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r)
    threads.emplace_back([&, r] {
      name_this_thread(fmt::format("rank {}", r));
      auto& comm = static_cast<InProcessCommunicator&>(*comms[r]);
      try {
        body(comms[r]);
        comm.leave();
      } catch (...) {
        errors[r] = std::current_exception();
        comm.fail();
      }
    });
  for (auto& t : threads) t.join();
  // The error to report: the lowest rank's that is its own, not a PeerGone caused by a failed peer.
  auto secondary = [](const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const PeerGone& gone) {
      return !gone.departed();
    } catch (...) {
      return false;
    }
  };
  for (const auto& e : errors)
    if (e && !secondary(e)) std::rethrow_exception(e);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace zero::dist
