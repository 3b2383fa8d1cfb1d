// Communicator: the collectives data-parallel training needs, and the ledger that counts their bytes.
//
// Every rank of a data-parallel group holds one Communicator. ZeRO uses five collectives on flat host
// (or, for the NCCL backend, device) buffers: all-reduce (stage 0 and the reduce_scatter=false path),
// reduce-scatter (partition-aware gradient reduction), all-gather (parameters after the step), reduce
// and broadcast. All of them are collective: every rank must issue the same calls, with the same
// counts, dtypes and roots, in the same order (Note [Bucket order] in gradient_reducer.cpp), and the
// ranks check it: every collective carries its identity (Note [Collective identity] in communicator.cpp).
//
// The public methods here validate their arguments, record the call in the ledger and then hand it
// to a backend (MpiCommunicator in mpi_communicator.h; an NCCL backend implements the same hooks).
// Calls are made from one thread (the training thread); a backend may run them on a thread of its
// own, but in issue order.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace zero::dist {

// ---- failures of the job, not of one call (Note [No hang] in job_runtime.cpp) ---------------------------

/// A collective could not finish within the communicator's timeout. what() names the collective, the
/// optimizer step (set_step) and the peer ranks whose messages never arrived.
class CollectiveTimeout : public Error {
 public:
  CollectiveTimeout(std::string collective, std::int64_t step, double seconds, std::string peers);
  const std::string& collective() const { return collective_; }
  std::int64_t step() const { return step_; }
  double seconds() const { return seconds_; }

 private:
  std::string collective_;
  std::int64_t step_;
  double seconds_;
};

/// A collective could not finish because another rank left the job: it finalised MPI (returned from
/// main) or reported a failure of its own on the control channel. rank() is that rank; departed() is
/// true when it left without failing (so this rank's error is the one to report).
class PeerGone : public Error {
 public:
  PeerGone(const std::string& message, int rank, bool departed) : Error(message), rank_(rank), departed_(departed) {}
  int rank() const { return rank_; }
  bool departed() const { return departed_; }

 private:
  int rank_;
  bool departed_;
};

/// Ranks issued different collectives at the same position of one communicator's sequence (Note
/// [Collective identity] in communicator.cpp). what(): "collective #41 at step 3: rank 0 issued all_gather
/// 'gather of blocks.2' (...) but rank 1 issued reduce_scatter 'reduce-scatter of bucket 3' (...)".
class CollectiveMismatch : public Error {
 public:
  using Error::Error;
};

/// The collective timeout a new communicator starts with, in seconds: $ZERO_COLLECTIVE_TIMEOUT_S if
/// set, else 300. Throws zero::Error naming the variable when it is not a number > 0.
double default_collective_timeout_s();

/// Checks a collective timeout (finite and > 0); `what` names the culprit in the message.
void check_collective_timeout(double seconds, const std::string& what);

enum class ReduceOp { sum, max };
enum class Collective { all_reduce, reduce_scatter, all_gather, reduce, broadcast };
inline constexpr int kNumCollectives = 5;

/// "all_reduce", "reduce_scatter", "all_gather", "reduce", "broadcast" (the ledger's JSON keys).
std::string_view collective_name(Collective c);

/// Traffic per rank, in bytes, counted the way nccl-tests counts "bus bytes" so the figure does not
/// depend on the algorithm a backend happens to use (nccl-tests, doc/PERFORMANCE.md), in the dtype that
/// actually goes on the wire (Note [Wire dtype] in communicator.cpp): a 16-bit reduction counts 2 bytes
/// per element by default and 4 when the communicator reduces in fp32 (set_reduce_in_fp32). For a
/// buffer of S wire bytes on n ranks one call counts
///   all_reduce 2(n-1)/n·S,  reduce_scatter and all_gather (n-1)/n·S,  reduce and broadcast S,
/// where for reduce_scatter / all_gather S is the whole concatenated buffer (sum of the per-rank
/// counts × element size). Tiny scalar control collectives (overflow flags, norms) go to
/// control_bytes instead, so gradient and parameter traffic stays comparable with the ZeRO paper's
/// 2Ψ / 3Ψ figures. seconds[c] is the wall time the backend spent running calls of c (on its
/// communication thread: waiting for peers included, so it is the time the link was in use, whether or
/// not the training thread waited for it); backends without a timer leave it 0.
struct Ledger {
  double bytes[kNumCollectives] = {};
  std::int64_t calls[kNumCollectives] = {};
  double seconds[kNumCollectives] = {};
  /// CPU time (user + system, seconds) the communication thread used while running the five data
  /// collectives, its own copies and reductions and the kernel's TCP work for its sockets included; 0
  /// where not measured (NCCL). Beside seconds[], it tells how much of a core the communication takes
  /// from the training thread when the two overlap.
  double cpu_seconds = 0;
  double control_bytes = 0;
  std::int64_t control_calls = 0;

  /// Bus bytes per rank of one `c` over a buffer of `full_bytes` bytes on `world_size` ranks.
  static double bus_bytes(Collective c, double full_bytes, int world_size);

  /// Adds one call of `c` over `full_bytes` bytes (S above) on `world_size` ranks.
  void record(Collective c, double full_bytes, int world_size);
  /// Adds one call of `c` that put `wire_bytes` bus bytes on the wire (Communicator::wire_bus_bytes).
  void add(Collective c, double wire_bytes);
  /// Adds one scalar control all-reduce over `full_bytes` bytes (counted like an all_reduce).
  void record_control(double full_bytes, int world_size);

  double operator[](Collective c) const { return bytes[static_cast<int>(c)]; }
  /// Sum of the five collective counters; control_bytes is not included.
  double total() const;
  /// Sum of seconds[] over the five collectives.
  double total_seconds() const;
  void reset();
  /// {"all_reduce": .., "reduce_scatter": .., "reduce": .., "all_gather": .., "broadcast": .., "total": ..}
  /// in bytes.
  nlohmann::json to_json() const;
};

/// Who a collective is: what the k-th collective every rank issues on one communicator must agree on
/// (Note [Collective identity] in communicator.cpp).
struct CollectiveIdentity {
  std::int64_t sequence = 0;         // 1, 2, ...: this communicator's collectives so far, control ones included
  std::string kind;                  // "all_gather", "control all_reduce", "barrier", ...
  std::string purpose;               // what the caller said it is (Communicator::with_purpose); may be empty
  std::vector<std::size_t> counts;   // elements: per rank (reduce_scatter, all_gather), else {count}
  DType dtype = DType::f32;
  int root = -1;                     // reduce, broadcast; -1 otherwise
  int op = 0;                        // ReduceOp of the reductions, 0 otherwise
  std::string wire;                  // how a reduction travels: "", "fp32 wire", "fp32 accumulation", "int8/256"
  std::int64_t step = 0;             // the issuing rank's optimizer step (set_step), for messages; not compared

  /// "all_gather 'gather of blocks.2' (counts 4,4,4; bf16)", at most a few hundred characters.
  std::string describe() const;
  /// FNV-1a over every field but `sequence` and `step`: equal identities give equal digests.
  std::uint64_t digest() const;
};

/// The fixed record backends exchange to compare identities (Note [Identity records] in
/// mpi_communicator.cpp): 256 bytes, the description cut to 231 characters.
struct IdentityRecord {
  std::int64_t sequence = 0;
  std::int64_t step = 0;
  std::uint64_t digest = 0;
  char text[232] = {};
};
static_assert(sizeof(IdentityRecord) == 256);
IdentityRecord make_identity_record(const CollectiveIdentity& identity);
/// Throws CollectiveMismatch naming rank 0 and the first rank whose record differs from rank 0's
/// (records[r] is rank r's), at rank 0's optimizer step; returns when they all agree.
void check_identity_records(std::span<const IdentityRecord> records);

/// Handle to a collective issued asynchronously.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the collective has finished. If it failed, rethrows the exception it failed with
  /// (zero::Error for MPI errors) — on every call to wait().
  virtual void wait() = 0;
  /// True once the collective has finished, successfully or not. Never blocks.
  virtual bool is_completed() const = 0;
};

/// One rank's view of a data-parallel group. Buffers are raw pointers to f32, f16 or bf16 elements;
/// every count is in ELEMENTS. Any other dtype, a count list whose length is not world_size(), a null
/// buffer with a non-zero count, or a root outside [0, world_size()) throws zero::Error before anything
/// is sent. fp16/bf16 reductions send 16-bit partial sums by default: each hop adds in fp32 and rounds
/// once (NCCL's behaviour); with set_reduce_in_fp32(true) they travel in fp32 and the result is the
/// fp32 sum rounded once, at twice the bytes (Note [Wire dtype] in communicator.cpp).
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// "mpi", "nccl": for logs.
  virtual std::string_view backend_name() const = 0;

  // ---- channels and identities (Note [Collective identity] in communicator.cpp) ---------------------

  /// A new communicator over the same ranks whose collectives are ordered on their own (its own queue,
  /// thread and sequence numbers), so that a rank waiting on one of them never holds up the other's
  /// collectives (ZeRO stage 3 gathers on one, reduces on the other: Note [One schedule] in
  /// partitioned_parameters.cpp). Its traffic is counted in this communicator's ledger(), and it follows
  /// this communicator's set_step and set_timeout. Collective: every rank calls it at the same point of
  /// this communicator's sequence. Throws zero::Error where the backend cannot make one.
  std::shared_ptr<Communicator> duplicate();

  /// Names the next collective this rank issues here ("gather of blocks.2"): ranks compare it, with the
  /// kind, counts, dtype, root and sequence number, and a mismatch fails every rank with
  /// CollectiveMismatch naming both sides (Note [Collective identity] in communicator.cpp says when). Applies to one collective; returns *this, so
  /// `comm.with_purpose("...").all_gather_async(...)` reads as one call.
  Communicator& with_purpose(std::string purpose) {
    next_purpose_ = std::move(purpose);
    return *this;
  }
  /// Collectives issued here so far (the sequence number of the last one).
  std::int64_t collectives_issued() const { return sequence_; }

  /// `hook` runs on the issuing thread before each collective issued here from then on (null: none),
  /// for a part whose own channel must reach an agreed point first: ZeRO stage 3 ends a forward's
  /// gathers before the program's next collective (Note [One schedule] in partitioned_parameters.cpp).
  /// Not run for collectives the hook itself issues here.
  void set_before_collective(std::function<void()> hook) { before_collective_ = std::move(hook); }

  // ---- blocking collectives -------------------------------------------------------------------

  /// In place: buf[i] = op over ranks of buf[i]. buf: count elements.
  void all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op = ReduceOp::sum);

  /// send: sum(counts) elements, rank r's slice starting at counts[0] + .. + counts[r-1].
  /// recv: counts[rank()] elements = the elementwise sum over ranks of this rank's slice of send.
  /// Counts may differ per rank and may be zero. recv may alias this rank's slice of send.
  /// Each rank receives only its own slice (a true reduce-scatter, (n-1)/n·S bytes per rank).
  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype);

  /// send: counts[rank()] elements. recv: sum(counts) elements, rank r's contribution at offset
  /// counts[0] + .. + counts[r-1]. send may alias this rank's slice of recv (in-place all-gather).
  void all_gather(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype);

  /// Sums buf (count elements) over ranks into root's buf. Other ranks' buf is left unchanged.
  void reduce(void* buf, std::size_t count, DType dtype, int root);
  /// Copies root's buf (count elements) into every rank's buf.
  void broadcast(void* buf, std::size_t count, DType dtype, int root);
  void barrier();

  // ---- asynchronous collectives ----------------------------------------------------------------
  // Same contracts as above. They start in issue order (FIFO, interleaved with the blocking calls);
  // buffers must stay alive and untouched until wait() returns. `counts` is copied.

  std::shared_ptr<Work> all_reduce_async(void* buf, std::size_t count, DType dtype,
                                         ReduceOp op = ReduceOp::sum);
  std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv,
                                             std::span<const std::size_t> counts, DType dtype);
  std::shared_ptr<Work> all_gather_async(const void* send, void* recv,
                                         std::span<const std::size_t> counts, DType dtype);

  // ---- control scalars -------------------------------------------------------------------------
  // Blocking all-reduces of one double (overflow flags, norms, loss). Counted in
  // ledger().control_bytes only.

  double all_reduce_sum(double value);
  double all_reduce_max(double value);

  /// Control vector: values[i] = sum over ranks of values[i], in place (per-parameter "used" flags,
  /// norm partials). Blocking; counted in ledger().control_bytes as one all-reduce of 8·n bytes.
  void all_reduce_sum(std::span<double> values);

  /// The traffic counters (and the backend's timers, collected on each call).
  Ledger& ledger() {
    collect_all_timers();
    return *ledger_;
  }
  const Ledger& ledger() const {
    collect_all_timers();
    return *ledger_;
  }

  // ---- wire dtype (DeepSpeed's communication_data_type) ------------------------------------------------
  /// true: fp16/bf16 all_reduce / reduce_scatter / reduce are widened to fp32 for the wire and rounded
  /// once at the end; false (the default for the MPI backend): they travel in their own dtype, rounded
  /// at every hop. Applies to collectives issued after the call; every rank must use the same value.
  /// Virtual so a wrapping communicator can pass it on to the one it wraps.
  virtual void set_reduce_in_fp32(bool on) { reduce_in_fp32_ = on; }
  bool reduce_in_fp32() const { return reduce_in_fp32_; }

  /// true: fp16/bf16 reduce_scatter and all_reduce (its reduce-scatter half) no longer run the ring:
  /// every rank sends each destination its own 16-bit slice directly (an all-to-all), and the owner
  /// widens the n contributions, adds them in fp32 in rank order 0, 1, ..., n-1 and rounds once
  /// (Megatron-LM's reduce_scatter_with_fp32_accumulation; Note [fp32-accumulating reduce-scatter] in
  /// communicator.cpp). The same 16-bit bytes on the wire as the ring, and a result that depends neither
  /// on which rank owns an element nor on how the buffer is cut into buckets. No effect on f32 buffers,
  /// on reduce(), or while reduce_in_fp32() is on (that path already sums in fp32). Read at issue; every
  /// rank must use the same value. Virtual for the same reason as set_reduce_in_fp32.
  virtual void set_fp32_accumulation(bool on) { fp32_accumulation_ = on; }
  bool fp32_accumulation() const { return fp32_accumulation_; }
  /// fp32_accumulation() applies to a reduction of `dtype` issued now.
  bool accumulates_in_fp32(DType dtype) const {
    return fp32_accumulation_ && !reduce_in_fp32_ && dtype != DType::f32;
  }

  /// block > 0: reduce_scatter (of any dtype) becomes DeepSpeed's zero_quantized_gradients: every rank
  /// quantizes each destination's slice to int8 in blocks of `block` elements with one fp32 scale per
  /// block, sends it directly to the owner (an all-to-all), and the owner dequantizes the n
  /// contributions, adds them in fp32 in rank order and rounds once into the buffer's dtype (Note [int8
  /// quantized reduce-scatter] in quantize.cpp). The ledger counts the int8 values and the scales.
  /// block = 0 (the default): off. No effect on all_reduce, reduce or all_gather. Read at issue; every
  /// rank must use the same value. Throws zero::Error when the backend does not implement it
  /// (supports_quantized_gradients()). Virtual for the same reason as set_reduce_in_fp32.
  virtual void set_quantized_gradients(std::size_t block);
  std::size_t quantized_gradients() const { return quantized_block_; }
  /// The backend implements set_quantized_gradients (the CPU backends do; NCCL does not).
  virtual bool supports_quantized_gradients() const { return false; }
  /// The backend times its data collectives (ledger().seconds and cpu_seconds, through collect_timers).
  /// The MPI and in-process backends do; NCCL and the host-staged test mode do not, and leave them 0.
  virtual bool times_collectives() const { return false; }

  // ---- deadlines -------------------------------------------------------------------------------
  /// Every collective issued after this call must finish within `seconds` (> 0) of starting, or it
  /// throws CollectiveTimeout (the job cannot go on; see fail_job in job_runtime.h). Every rank should
  /// use the same value. Throws zero::Error for a value that is not finite and > 0.
  virtual void set_timeout(double seconds);
  double timeout() const { return timeout_s_; }
  /// The optimizer step in progress (1-based; 0 = before the first), named in timeout messages.
  virtual void set_step(std::int64_t step);
  std::int64_t step() const { return step_; }

 protected:
  /// The backend's part of duplicate(): a new communicator of the same kind over the same ranks.
  /// Collective. The default throws zero::Error (the backend has no second channel).
  virtual std::shared_ptr<Communicator> make_duplicate();
  /// The identity of the collective being issued: valid inside the issue_* and control hooks, which
  /// must make the ranks compare it before moving data (Note [Collective identity]).
  const CollectiveIdentity& issuing() const { return issuing_; }

  // Backend hooks, called after the arguments are validated (dtype is f32/f16/bf16, counts.size() ==
  // world_size(), root in range, non-null buffers where count > 0). They must start the collective in
  // issue order and may return before it finishes. A hook that keeps `counts` must copy it.
  virtual std::shared_ptr<Work> issue_all_reduce(void* buf, std::size_t count, DType dtype,
                                                 ReduceOp op) = 0;
  virtual std::shared_ptr<Work> issue_reduce_scatter(const void* send, void* recv,
                                                     std::span<const std::size_t> counts,
                                                     DType dtype) = 0;
  virtual std::shared_ptr<Work> issue_all_gather(const void* send, void* recv,
                                                 std::span<const std::size_t> counts,
                                                 DType dtype) = 0;
  virtual std::shared_ptr<Work> issue_reduce(void* buf, std::size_t count, DType dtype,
                                             int root) = 0;
  virtual std::shared_ptr<Work> issue_broadcast(void* buf, std::size_t count, DType dtype,
                                                int root) = 0;
  virtual std::shared_ptr<Work> issue_barrier() = 0;
  /// Blocking all-reduce of one double, ordered after everything issued before it.
  virtual double control_all_reduce(double value, ReduceOp op) = 0;
  /// The same over a few doubles, in place. The default runs the scalar hook once per value.
  virtual void control_all_reduce_values(std::span<double> values, ReduceOp op) {
    for (double& v : values) v = control_all_reduce(v, op);
  }
  /// Bus bytes one call of `c` over `count` elements of `dtype` puts on the wire (the ledger's figure).
  /// The default: Ledger::bus_bytes over the wire dtype (fp32 for a 16-bit reduction when
  /// reduce_in_fp32(), else the buffer's dtype). A backend whose algorithm mixes dtypes overrides it.
  virtual double wire_bus_bytes(Collective c, std::size_t count, DType dtype) const;
  /// Adds the seconds the backend spent per collective since the last call into `ledger.seconds`, and
  /// the CPU time they took into `ledger.cpu_seconds`.
  virtual void collect_timers(Ledger& ledger) const { (void)ledger; }

 private:
  // Fills issuing_ for the collective about to be issued (the next sequence number, the purpose given).
  void begin_issue(std::string kind, std::vector<std::size_t> counts, DType dtype, int root, int op, bool reduction);
  void check_dtype(DType dtype, const char* what) const;
  void check_counts(std::span<const std::size_t> counts, const char* what) const;
  void collect_all_timers() const;
  void check_root(int root, const char* what) const;

  // The ledger, shared with every duplicate (theirs add into it); duplicates' timers are collected too.
  std::shared_ptr<Ledger> ledger_ = std::make_shared<Ledger>();
  std::vector<std::weak_ptr<Communicator>> duplicates_;
  std::int64_t sequence_ = 0;
  std::string next_purpose_;
  CollectiveIdentity issuing_;
  std::function<void()> before_collective_;
  bool in_before_collective_ = false;
  bool reduce_in_fp32_ = false;
  bool fp32_accumulation_ = false;
  std::size_t quantized_block_ = 0;
  double timeout_s_ = default_collective_timeout_s();
  std::int64_t step_ = 0;
};

}  // namespace zero::dist
