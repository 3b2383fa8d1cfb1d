#include "distributed/zero_plan.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace zero::dist {

double StepTraffic::total() const {
  double sum = 0;
  for (double b : bytes) sum += b;
  return sum;
}

namespace {

// The stage-2 pool as ZeroOptimizer grows it with blocking collectives (on_gradient / bucket_buffer /
// issue_bucket / finish): a bucket takes a buffer when the first parameter overlapping it delivers (or,
// holding only padding or undelivered parameters, when it is issued), and gives it back as soon as its
// collective returns. Buckets go out strictly in index order (Note [Bucket order]).
int simulate_pool(const FlatLayout& layout, const std::vector<Bucket>& buckets, std::int64_t bucket_size,
                  const std::vector<std::size_t>& hook_order) {
  const std::int64_t padded = layout.padded_numel();
  std::vector<int> pending(buckets.size());
  for (std::size_t k = 0; k < buckets.size(); ++k) pending[k] = static_cast<int>(buckets[k].params.size());
  std::vector<char> open(buckets.size(), 0);
  int in_use = 0, allocated = 0;
  auto take = [&](std::size_t k) {
    if (open[k]) return;
    open[k] = 1;
    allocated = std::max(allocated, ++in_use);
  };
  std::size_t next = 0;
  auto issue_ready = [&] {
    while (next < buckets.size() && pending[next] == 0) {
      take(next);  // a bucket nobody delivered into still reduces (zeros) through a buffer
      open[next] = 0;
      --in_use;
      ++next;
    }
  };
  for (std::size_t i : hook_order) {
    const ParamRange& p = layout.params()[i];
    if (p.numel == 0) continue;
    const auto first = static_cast<std::size_t>((padded - p.end()) / bucket_size);
    const auto last = static_cast<std::size_t>((padded - 1 - p.offset) / bucket_size);
    for (std::size_t k = first; k <= last; ++k) take(k);
    for (std::size_t k = first; k <= last; ++k) --pending[k];
    issue_ready();
  }
  // The epilogue issues whatever is left, in order (parameters without a gradient contribute zeros).
  while (next < buckets.size()) {
    take(next);
    open[next] = 0;
    --in_use;
    ++next;
  }
  return allocated;
}

void add(StepTraffic& t, Collective c, double full_bytes, int world_size, std::int64_t times = 1) {
  t.bytes[static_cast<int>(c)] += static_cast<double>(times) * Ledger::bus_bytes(c, full_bytes, world_size);
  t.calls[static_cast<int>(c)] += times;
}

}  // namespace

ZeroPlan plan_zero(const std::vector<FlatLayout::Entry>& entries, int world_size, const ZeroOptions& options,
                   const std::vector<std::size_t>& hook_order) {
  ZERO_CHECK(options.stage >= 0 && options.stage <= 2, "ZeRO stage must be 0, 1 or 2, got {}", options.stage);
  ZERO_CHECK(is_floating(options.dtype), "ZeRO: model dtype must be f32, f16 or bf16, got {}",
             dtype_name(options.dtype));
  ZERO_CHECK(options.reduce_bucket_size >= 1, "ZeRO: reduce_bucket_size must be >= 1 element, got {}",
             options.reduce_bucket_size);
  ZERO_CHECK(options.allgather_bucket_size >= 1, "ZeRO: allgather_bucket_size must be >= 1 element, got {}",
             options.allgather_bucket_size);
  ZERO_CHECK(options.gradient_accumulation_steps >= 1, "ZeRO: gradient_accumulation_steps must be >= 1, got {}",
             options.gradient_accumulation_steps);
  ZeroPlan plan;
  plan.layout = FlatLayout(entries, world_size);
  plan.options = options;
  plan.buckets = plan.layout.make_buckets(options.reduce_bucket_size);
  plan.pool_buffer_numel = std::min(options.reduce_bucket_size, plan.layout.padded_numel());

  std::vector<std::size_t> order = hook_order;
  if (order.empty()) {
    order.resize(entries.size());
    std::iota(order.rbegin(), order.rend(), std::size_t{0});
  }
  std::vector<std::size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  bool permutation = sorted.size() == entries.size();
  for (std::size_t i = 0; permutation && i < sorted.size(); ++i) permutation = sorted[i] == i;
  ZERO_CHECK(permutation, "plan_zero: hook_order must list each of the {} parameter indices once", entries.size());

  if (options.stage == 2) {
    plan.pool_buffers = simulate_pool(plan.layout, plan.buckets, options.reduce_bucket_size, order);
    plan.max_pool_buffers = options.overlap_comm ? static_cast<int>(plan.buckets.size()) : plan.pool_buffers;
  }
  return plan;
}

MemoryBreakdown ZeroPlan::memory() const {
  const double b = static_cast<double>(dtype_size(options.dtype));
  const double padded = static_cast<double>(layout.padded_numel());
  const double part = static_cast<double>(layout.partition_size());
  MemoryBreakdown m;
  m.params = b * padded;
  m.grads = b * (options.stage == 2 ? part : padded);
  const double region = options.stage == 0 ? padded : part;
  m.optimizer_states = 4.0 * region * (options.dtype == DType::f32 ? 2.0 : 3.0);  // (master) + m + v, fp32
  m.buckets = b * static_cast<double>(pool_buffers) * static_cast<double>(pool_buffer_numel);
  return m;
}

StepTraffic ZeroPlan::traffic() const {
  const int n = layout.world_size();
  const double b = static_cast<double>(dtype_size(options.dtype));
  StepTraffic t;
  // Gradient reductions: once per step at the accumulation boundary (stages 0/1), every micro-step
  // (stage 2). Stage 0 and reduce_scatter = false all-reduce each bucket; otherwise it is reduce-scattered.
  const std::int64_t reductions = options.stage == 2 ? options.gradient_accumulation_steps : 1;
  const Collective reduce =
      options.stage == 0 || !options.reduce_scatter ? Collective::all_reduce : Collective::reduce_scatter;
  for (const Bucket& k : buckets) add(t, reduce, b * static_cast<double>(k.size()), n, reductions);
  // Parameters after the step (stages 1/2): all-gather chunks of allgather_bucket_size from the start.
  if (options.stage != 0) {
    const std::int64_t padded = layout.padded_numel(), chunk = options.allgather_bucket_size;
    for (std::int64_t begin = 0; begin < padded; begin += chunk)
      add(t, Collective::all_gather, b * static_cast<double>(std::min(padded, begin + chunk) - begin), n);
  }
  return t;
}

double ring_time_s(Collective c, double bus_bytes, int world_size, double bandwidth, double latency) {
  ZERO_CHECK(bandwidth > 0, "ring model: bandwidth must be > 0 bytes/s, got {}", bandwidth);
  ZERO_CHECK(latency >= 0, "ring model: latency must be >= 0 s, got {}", latency);
  if (world_size <= 1) return 0.0;
  const double hops = c == Collective::all_reduce ? 2.0 * (world_size - 1) : (world_size - 1.0);
  return hops * latency + bus_bytes / bandwidth;
}

double step_comm_time_s(const ZeroPlan& plan, double bandwidth, double latency) {
  const StepTraffic t = plan.traffic();
  const int n = plan.layout.world_size();
  double seconds = 0.0;
  for (int c = 0; c < kNumCollectives; ++c) {
    if (t.calls[c] == 0) continue;
    // Latency is paid per call; bytes add up whatever the split into calls.
    seconds += static_cast<double>(t.calls[c]) * ring_time_s(static_cast<Collective>(c), 0.0, n, bandwidth, latency) +
               t.bytes[c] / bandwidth;
  }
  return seconds;
}

}  // namespace zero::dist
