#include "distributed/zero_plan.h"

#include <algorithm>

#include "core/check.h"

namespace zero::dist {

double StepTraffic::total() const {
  double sum = 0;
  for (double b : bytes) sum += b;
  return sum;
}

ZeroPlan plan_zero(const std::vector<FlatLayout::Entry>& entries, int world_size, const ZeroOptions& options) {
  ZERO_CHECK(options.stage >= 0 && options.stage <= 2, "ZeRO stage must be 0, 1 or 2, got {}", options.stage);
  ZERO_CHECK(is_floating(options.dtype), "ZeRO: model dtype must be f32, f16 or bf16, got {}",
             dtype_name(options.dtype));
  ZERO_CHECK(options.reduce_bucket_size >= 1 || options.reduce_bucket_size == kAutoBucketSize,
             "ZeRO: reduce_bucket_size must be >= 1 element, got {}", options.reduce_bucket_size);
  ZERO_CHECK(options.allgather_bucket_size >= 1 || options.allgather_bucket_size == kAutoBucketSize,
             "ZeRO: allgather_bucket_size must be >= 1 element, got {}", options.allgather_bucket_size);
  ZERO_CHECK(options.gradient_accumulation_steps >= 1, "ZeRO: gradient_accumulation_steps must be >= 1, got {}",
             options.gradient_accumulation_steps);
  ZeroPlan plan;
  plan.layout = FlatLayout(entries, world_size);
  plan.options = options;
  // Unset bucket sizes resolve as the optimizer resolves them (default_bucket_size).
  if (plan.options.reduce_bucket_size == kAutoBucketSize)
    plan.options.reduce_bucket_size = default_bucket_size(plan.layout.numel());
  if (plan.options.allgather_bucket_size == kAutoBucketSize)
    plan.options.allgather_bucket_size = default_bucket_size(plan.layout.numel());
  plan.buckets = plan.layout.make_buckets(plan.options.reduce_bucket_size);
  plan.pool_buffer_numel = std::min(plan.options.reduce_bucket_size, plan.layout.padded_numel());
  if (options.stage == 2) {
    // A bucket takes its buffer when it is issued and returns it when its collective has finished:
    // one buffer when collectives block, up to one per bucket while they are in flight.
    plan.pool_buffers = plan.buckets.empty() ? 0 : 1;
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
  // Note [Wire dtype]: reductions of a 16-bit model send 16-bit partial sums, or fp32 ones with
  // communication_data_type "fp32"; an all-reduce is then an fp32 reduce-scatter plus a 16-bit
  // all-gather (the MPI backend's count). All-gathers move the model dtype.
  const bool wide = options.reduce_in_fp32 && options.dtype != DType::f32;
  const double ring = n > 1 ? static_cast<double>(n - 1) / n : 0.0;
  StepTraffic t;
  auto add = [&](Collective c, double bytes, std::int64_t times) {
    t.bytes[static_cast<int>(c)] += static_cast<double>(times) * bytes;
    t.calls[static_cast<int>(c)] += times;
  };
  // Gradient reductions: once per step at the accumulation boundary (stages 0/1), every micro-step
  // (stage 2). Stage 0 and reduce_scatter = false all-reduce each bucket; otherwise it is reduce-scattered.
  const std::int64_t reductions = options.stage == 2 ? options.gradient_accumulation_steps : 1;
  const bool all_reduce = options.stage == 0 || !options.reduce_scatter;
  for (const Bucket& k : buckets) {
    const double count = static_cast<double>(k.size());
    if (all_reduce)
      add(Collective::all_reduce, wide ? ring * count * (4.0 + b) : Ledger::bus_bytes(Collective::all_reduce, b * count, n),
          reductions);
    else
      add(Collective::reduce_scatter, Ledger::bus_bytes(Collective::reduce_scatter, (wide ? 4.0 : b) * count, n),
          reductions);
  }
  // Parameters after the step (stages 1/2): all-gather chunks of allgather_bucket_size from the start.
  if (options.stage != 0) {
    const std::int64_t padded = layout.padded_numel(), chunk = options.allgather_bucket_size;
    for (std::int64_t begin = 0; begin < padded; begin += chunk)
      add(Collective::all_gather,
          Ledger::bus_bytes(Collective::all_gather, b * static_cast<double>(std::min(padded, begin + chunk) - begin), n),
          1);
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
