#include "distributed/comm/communicator.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "core/check.h"
#include "distributed/comm/quantize.h"

namespace zero::dist {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce: return "reduce";
    case Collective::broadcast: return "broadcast";
  }
  return "?";
}

// ---- failures and deadlines ------------------------------------------------------------------------

CollectiveTimeout::CollectiveTimeout(std::string collective, std::int64_t step, double seconds, std::string peers)
    : Error(fmt::format("{} at step {} timed out after {:g} s waiting for rank(s) {}", collective, step, seconds,
                        peers)),
      collective_(std::move(collective)),
      step_(step),
      seconds_(seconds) {}

void check_collective_timeout(double seconds, const std::string& what) {
  ZERO_CHECK(std::isfinite(seconds) && seconds > 0, "{} must be a number of seconds > 0, got {}", what, seconds);
}

double default_collective_timeout_s() {
  const char* env = std::getenv("ZERO_COLLECTIVE_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return 300.0;
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  ZERO_CHECK(end != env && *end == '\0' && std::isfinite(s) && s > 0,
             "ZERO_COLLECTIVE_TIMEOUT_S must be a number of seconds > 0, got '{}'", env);
  return s;
}

void Communicator::set_quantized_gradients(std::size_t block) {
  ZERO_CHECK(block == 0 || supports_quantized_gradients(),
             "zero_quantized_gradients: the {} communicator does not implement the int8 reduce-scatter (the CPU "
             "backends do)",
             backend_name());
  quantized_block_ = block;
}

void Communicator::set_timeout(double seconds) {
  check_collective_timeout(seconds, "collective timeout");
  timeout_s_ = seconds;
  for (const auto& weak : duplicates_)
    if (auto d = weak.lock()) d->set_timeout(seconds);
}

void Communicator::set_step(std::int64_t step) {
  step_ = step;
  for (const auto& weak : duplicates_)
    if (auto d = weak.lock()) d->set_step(step);
}

// ---- identities and channels ------------------------------------------------------------------------

// Note [Collective identity]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every rank must issue the same collectives on a communicator in the same order; a program that breaks
// the rule (ranks running different modules at ZeRO stage 3, a conditional all-reduce) would otherwise
// exchange the wrong buffers when the counts happen to agree, or stop in a cryptic MPI error or a
// timeout when they do not. So every collective carries its identity (CollectiveIdentity): its
// sequence number on this communicator, kind, the purpose its caller gave (with_purpose: "gather of
// blocks.2", "reduce-scatter of bucket 3"), counts, dtype, root, op and wire format. The backend
// compares the ranks' identities:
//   - in-process: every rank reads every rank's post before any data moves (Note [Arrive, read, leave]);
//   - MPI: each collective posts an MPI_Iallgather of a fixed 256-byte record (sequence, digest,
//     description) on the collective's own MPI communicator, which travels while the data does and is
//     polled by every wait (Note [Identity records] in mpi_communicator.cpp);
//   - NCCL: the same record is all-gathered on the host over an MPI channel when the collective is
//     issued and compared when it is waited for (Note [Identity on NCCL] in nccl_communicator.cpp).
// On a mismatch every rank throws CollectiveMismatch naming the collective's number, the step, and
// both sides ("rank 0 issued all_gather 'gather of blocks.2' (...) but rank 1 issued reduce_scatter
// 'reduce-scatter of bucket 3' (...)"), and the communicator is broken: the ranks are out of step, so
// every later collective fails at once, and the mismatched collective's results are never used.
//
// A second channel (duplicate()) has its own sequence: ZeRO stage 3 gathers parameters on one and
// reduces gradients on the other, so each channel's order is agreed on its own terms even though the
// two interleave differently on different ranks.

std::string CollectiveIdentity::describe() const {
  std::string counts_text;
  if (counts.size() <= 8) {
    counts_text = fmt::format("{}", fmt::join(counts, ","));
  } else {
    counts_text = fmt::format("{},{},...,{} ({} ranks)", counts[0], counts[1], counts.back(), counts.size());
  }
  std::string text = kind;
  if (!purpose.empty()) text += fmt::format(" '{}'", purpose);
  text += fmt::format(" (counts {}; {}", counts_text, dtype_name(dtype));
  if (root >= 0) text += fmt::format("; root {}", root);
  if (op != 0) text += "; max";
  if (!wire.empty()) text += "; " + wire;
  return text + ")";
}

std::uint64_t CollectiveIdentity::digest() const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  auto mix = [&h](const void* data, std::size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  };
  auto mix_text = [&](const std::string& t) {
    const std::size_t n = t.size();
    mix(&n, sizeof n);
    mix(t.data(), n);
  };
  mix_text(kind);
  mix_text(purpose);
  const std::size_t n = counts.size();
  mix(&n, sizeof n);
  mix(counts.data(), n * sizeof(std::size_t));
  mix(&dtype, sizeof dtype);
  mix(&root, sizeof root);
  mix(&op, sizeof op);
  mix_text(wire);
  return h;
}

IdentityRecord make_identity_record(const CollectiveIdentity& identity) {
  IdentityRecord r;
  r.sequence = identity.sequence;
  r.step = identity.step;
  r.digest = identity.digest();
  const std::string text = identity.describe();
  std::memcpy(r.text, text.data(), std::min(text.size(), sizeof(r.text) - 1));
  return r;
}

void check_identity_records(std::span<const IdentityRecord> records) {
  for (std::size_t q = 1; q < records.size(); ++q) {
    const IdentityRecord& a = records[0];
    const IdentityRecord& b = records[q];
    if (a.sequence == b.sequence && a.digest == b.digest) continue;
    throw CollectiveMismatch(fmt::format(
        "collective #{} at step {}: rank 0 issued {} but rank {} issued {} (every rank must issue the same collectives "
        "in the same order)",
        std::max(a.sequence, b.sequence), a.step, a.text, q, b.text));
  }
}

void Communicator::begin_issue(std::string kind, std::vector<std::size_t> counts, DType dtype, int root, int op,
                               bool reduction) {
  if (before_collective_ && !in_before_collective_) {
    in_before_collective_ = true;
    std::string purpose = std::move(next_purpose_);  // the hook may issue collectives of its own here
    try {
      before_collective_();
    } catch (...) {
      in_before_collective_ = false;
      throw;
    }
    in_before_collective_ = false;
    next_purpose_ = std::move(purpose);
  }
  issuing_.sequence = ++sequence_;
  issuing_.kind = std::move(kind);
  issuing_.purpose = std::move(next_purpose_);
  next_purpose_.clear();
  issuing_.counts = std::move(counts);
  issuing_.dtype = dtype;
  issuing_.root = root;
  issuing_.op = op;
  issuing_.wire.clear();
  issuing_.step = step_;
  if (reduction && dtype != DType::f32 && reduce_in_fp32_) issuing_.wire = "fp32 wire";
  else if (reduction && issuing_.kind != "reduce" && accumulates_in_fp32(dtype)) issuing_.wire = "fp32 accumulation";
  if (reduction && issuing_.kind == "reduce_scatter" && quantized_block_ > 0)
    issuing_.wire = fmt::format("int8 blocks of {}", quantized_block_);
}

std::shared_ptr<Communicator> Communicator::make_duplicate() {
  throw Error(fmt::format("the {} communicator cannot make a second channel (duplicate())", backend_name()));
}

std::shared_ptr<Communicator> Communicator::duplicate() {
  begin_issue("duplicate", {}, DType::f32, -1, 0, false);
  std::shared_ptr<Communicator> d = make_duplicate();
  d->ledger_ = ledger_;  // its traffic is this communicator's traffic
  d->set_timeout(timeout_s_);
  d->set_step(step_);
  std::erase_if(duplicates_, [](const std::weak_ptr<Communicator>& w) { return w.expired(); });
  duplicates_.push_back(d);
  return d;
}

void Communicator::collect_all_timers() const {
  collect_timers(*ledger_);
  for (const auto& weak : duplicates_)
    if (auto d = weak.lock()) d->collect_all_timers();
}

// ---- Ledger ---------------------------------------------------------------------------------------

double Ledger::bus_bytes(Collective c, double full_bytes, int world_size) {
  const double n = world_size;
  switch (c) {
    case Collective::all_reduce: return 2.0 * (n - 1.0) / n * full_bytes;
    case Collective::reduce_scatter:
    case Collective::all_gather: return (n - 1.0) / n * full_bytes;
    case Collective::reduce:
    case Collective::broadcast: return full_bytes;
  }
  return 0.0;
}

void Ledger::record(Collective c, double full_bytes, int world_size) {
  bytes[static_cast<int>(c)] += bus_bytes(c, full_bytes, world_size);
  calls[static_cast<int>(c)] += 1;
}

void Ledger::record_control(double full_bytes, int world_size) {
  control_bytes += bus_bytes(Collective::all_reduce, full_bytes, world_size);
  control_calls += 1;
}

double Ledger::total() const {
  double sum = 0;
  for (double b : bytes) sum += b;
  return sum;
}

double Ledger::total_seconds() const {
  double sum = 0;
  for (double s : seconds) sum += s;
  return sum;
}

// Note [Wire dtype]
// ~~~~~~~~~~~~~~~~~
// The ledger counts what goes on the wire, so a traffic ratio it prints is a ratio of bytes sent. For
// a 16-bit model the choice is DeepSpeed's communication_data_type:
//   - the model dtype (the default, as in DeepSpeed and NCCL): partial sums travel in fp16/bf16; every
//     hop of the ring widens the incoming partial sum and its own contribution to fp32, adds, and
//     rounds once before forwarding, so an element of a sum over n ranks is rounded n-1 times. Bytes
//     on the wire: the buffer's own size, so ZeRO's 1.0x / 1.5x traffic ratios hold in wire bytes;
//   - fp32: the buffer is widened once, reduced in fp32 all the way and rounded once at the end
//     (bitwise the fp32 sum rounded once), at twice the wire bytes for the reduction.
// All-gather and broadcast move values, not sums: always the buffer's own dtype.
//
// Note [fp32-accumulating reduce-scatter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The ring rounds an element's partial sum to 16 bits at each of its n-1 hops, so the error of a 16-bit
// reduction grows with n (measured in docs/collectives.md, "Reduction error"), and the order of the
// hops starts at the owner's right neighbour, so the bits of a result depend on which rank owns the
// element (for an all-reduce, on how the buffer was cut into buckets). With set_fp32_accumulation(true)
// (Megatron-LM's reduce_scatter_with_fp32_accumulation) a 16-bit reduce-scatter is an all-to-all
// instead: rank r sends slice d of its buffer, in its own 16 bits, straight to rank d, and rank d
// widens the n contributions and adds them in fp32 in rank order, x[0] + x[1] + ... + x[n-1], rounding
// to 16 bits once (detail::sum_in_fp32). Each rank sends every slice but its own once, exactly what
// the ring sends, so the wire bytes and the ledger are unchanged; what changes is the message count
// (n-1 messages out and in per rank, all at once, instead of n-1 steps of one each) and the
// arithmetic: one rounding, in an order that is the same for every element. An all-reduce runs this
// reduce-scatter over the even split, then the usual ring all-gather of the rounded slices.
double Communicator::wire_bus_bytes(Collective c, std::size_t count, DType dtype) const {
  const bool reduction = c == Collective::all_reduce || c == Collective::reduce_scatter || c == Collective::reduce;
  const std::size_t elem = reduction && reduce_in_fp32_ && dtype != DType::f32 ? sizeof(float) : dtype_size(dtype);
  return Ledger::bus_bytes(c, double(count) * double(elem), world_size());
}

void Ledger::add(Collective c, double wire_bytes) {
  bytes[static_cast<int>(c)] += wire_bytes;
  calls[static_cast<int>(c)] += 1;
}

void Ledger::reset() { *this = Ledger{}; }

nlohmann::json Ledger::to_json() const {
  nlohmann::json j;
  for (int c = 0; c < kNumCollectives; ++c)
    j[std::string(collective_name(static_cast<Collective>(c)))] = bytes[c];
  j["total"] = total();
  return j;
}

// ---- Communicator: validation + ledger, then the backend hook --------------------------------------

void Communicator::check_dtype(DType dtype, const char* what) const {
  ZERO_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
             "{}: unsupported dtype {} (communication buffers must be f32, f16 or bf16)", what,
             dtype_name(dtype));
}

void Communicator::check_counts(std::span<const std::size_t> counts, const char* what) const {
  ZERO_CHECK(counts.size() == static_cast<std::size_t>(world_size()),
             "{}: {} counts given for a world of {} ranks", what, counts.size(), world_size());
}

void Communicator::check_root(int root, const char* what) const {
  ZERO_CHECK(root >= 0 && root < world_size(), "{}: root {} outside a world of {} ranks", what, root,
             world_size());
}

namespace {
std::size_t sum_of(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}
}  // namespace

std::shared_ptr<Work> Communicator::all_reduce_async(void* buf, std::size_t count, DType dtype,
                                                     ReduceOp op) {
  check_dtype(dtype, "all_reduce");
  ZERO_CHECK(buf != nullptr || count == 0, "all_reduce: null buffer for {} elements", count);
  begin_issue("all_reduce", {count}, dtype, -1, static_cast<int>(op), op == ReduceOp::sum);
  auto work = issue_all_reduce(buf, count, dtype, op);
  ledger_->add(Collective::all_reduce, wire_bus_bytes(Collective::all_reduce, count, dtype));
  return work;
}

std::shared_ptr<Work> Communicator::reduce_scatter_async(const void* send, void* recv,
                                                         std::span<const std::size_t> counts,
                                                         DType dtype) {
  check_dtype(dtype, "reduce_scatter");
  check_counts(counts, "reduce_scatter");
  const std::size_t total = sum_of(counts);
  ZERO_CHECK(send != nullptr || total == 0, "reduce_scatter: null send buffer for {} elements", total);
  ZERO_CHECK(recv != nullptr || counts[rank()] == 0, "reduce_scatter: null recv buffer for {} elements",
             counts[rank()]);
  begin_issue("reduce_scatter", {counts.begin(), counts.end()}, dtype, -1, 0, true);
  auto work = issue_reduce_scatter(send, recv, counts, dtype);
  // Note [int8 quantized reduce-scatter] (quantize.cpp): the int8 values and the fp32 scales.
  ledger_->add(Collective::reduce_scatter,
              quantized_block_ > 0
                  ? Ledger::bus_bytes(Collective::reduce_scatter, quantized_bytes(counts, quantized_block_), world_size())
                  : wire_bus_bytes(Collective::reduce_scatter, total, dtype));
  return work;
}

std::shared_ptr<Work> Communicator::all_gather_async(const void* send, void* recv,
                                                     std::span<const std::size_t> counts,
                                                     DType dtype) {
  check_dtype(dtype, "all_gather");
  check_counts(counts, "all_gather");
  const std::size_t total = sum_of(counts);
  ZERO_CHECK(send != nullptr || counts[rank()] == 0, "all_gather: null send buffer for {} elements",
             counts[rank()]);
  ZERO_CHECK(recv != nullptr || total == 0, "all_gather: null recv buffer for {} elements", total);
  begin_issue("all_gather", {counts.begin(), counts.end()}, dtype, -1, 0, false);
  auto work = issue_all_gather(send, recv, counts, dtype);
  ledger_->add(Collective::all_gather, wire_bus_bytes(Collective::all_gather, total, dtype));
  return work;
}

void Communicator::all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  all_reduce_async(buf, count, dtype, op)->wait();
}

void Communicator::reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                                  DType dtype) {
  reduce_scatter_async(send, recv, counts, dtype)->wait();
}

void Communicator::all_gather(const void* send, void* recv, std::span<const std::size_t> counts,
                              DType dtype) {
  all_gather_async(send, recv, counts, dtype)->wait();
}

void Communicator::reduce(void* buf, std::size_t count, DType dtype, int root) {
  check_dtype(dtype, "reduce");
  check_root(root, "reduce");
  ZERO_CHECK(buf != nullptr || count == 0, "reduce: null buffer for {} elements", count);
  begin_issue("reduce", {count}, dtype, root, 0, true);
  auto work = issue_reduce(buf, count, dtype, root);
  ledger_->add(Collective::reduce, wire_bus_bytes(Collective::reduce, count, dtype));
  work->wait();
}

void Communicator::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  check_dtype(dtype, "broadcast");
  check_root(root, "broadcast");
  ZERO_CHECK(buf != nullptr || count == 0, "broadcast: null buffer for {} elements", count);
  begin_issue("broadcast", {count}, dtype, root, 0, false);
  auto work = issue_broadcast(buf, count, dtype, root);
  ledger_->add(Collective::broadcast, wire_bus_bytes(Collective::broadcast, count, dtype));
  work->wait();
}

void Communicator::barrier() {
  begin_issue("barrier", {}, DType::f32, -1, 0, false);
  issue_barrier()->wait();
}

double Communicator::all_reduce_sum(double value) {
  begin_issue("control all_reduce", {1}, DType::f32, -1, 0, false);
  const double result = control_all_reduce(value, ReduceOp::sum);
  ledger_->record_control(sizeof(double), world_size());
  return result;
}

void Communicator::all_reduce_sum(std::span<double> values) {
  if (values.empty()) return;
  begin_issue("control all_reduce", {values.size()}, DType::f32, -1, 0, false);
  control_all_reduce_values(values, ReduceOp::sum);
  ledger_->record_control(static_cast<double>(values.size() * sizeof(double)), world_size());
}

double Communicator::all_reduce_max(double value) {
  begin_issue("control all_reduce", {1}, DType::f32, -1, 1, false);
  const double result = control_all_reduce(value, ReduceOp::max);
  ledger_->record_control(sizeof(double), world_size());
  return result;
}

}  // namespace zero::dist
