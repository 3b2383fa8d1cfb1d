#include "distributed/zero/zero_plan.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "distributed/comm/quantize.h"
#include "optim/muon.h"

namespace zero::dist {

std::int64_t default_bucket_size(std::int64_t psi) {
  ZERO_CHECK(psi >= 1, "default_bucket_size: the model has {} elements; it needs at least one", psi);
  return std::clamp<std::int64_t>((psi + 7) / 8, 4096, 500'000'000);
}

// Note [Automatic bucket size]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Three forces set the size of a bucket (docs/zero.md, "Bucket size"):
//   - memory: stage 2 holds its partition gradient P = padded/N plus up to kMaxLiveBuckets bucket
//     buffers; for stage 2 to save gradient memory over stage 1 that must stay below the full
//     gradient: P + 2·bucket < padded, i.e. bucket < padded·(N-1)/(2N);
//   - overlap: about eight buckets, so the first reduction starts while backward produces the rest
//     (default_bucket_size: Ψ/8);
//   - latency: every bucket's ring pays (N-1) message latencies α and moves (N-1)/N of its S bytes at
//     bandwidth B. At hundreds of ranks the latency term of a Ψ/8 bucket can exceed its bandwidth term
//     (Megatron-LM sizes buckets max(40M, 1M·dp) parameters for this reason). Keeping (N-1)·α below 10%
//     of (N-1)/N·S/B needs S >= 10·N·α·B: the bucket grows linearly with N, up to the memory bound.
// Finally, buckets are cut from the end of the padded buffer, so the one at its start holds what is
// left over. With Ψ/8 computed from the real element count and padding added on top, that remainder can
// be a few elements (at N = 5 a 4-element ninth bucket), which still pays a full latency round per
// collective. A remainder under half a bucket is therefore folded into the others (one bucket fewer,
// each slightly larger), or, when that would pass the memory bound, the buffer is cut into equal
// buckets. A size that already leaves no sliver is kept as it is, so plans without one do not change.
std::int64_t automatic_bucket_size(std::int64_t numel, std::int64_t padded_numel, int world_size, double elem_bytes,
                                   const LinkModel& link) {
  ZERO_CHECK(numel >= 1 && padded_numel >= numel, "automatic_bucket_size: {} elements padded to {}", numel,
             padded_numel);
  ZERO_CHECK(world_size >= 1, "automatic_bucket_size: world_size must be >= 1, got {}", world_size);
  ZERO_CHECK(link.bandwidth >= 0 && link.latency >= 0,
             "automatic_bucket_size: link bandwidth and latency must be >= 0, got {} B/s, {} s", link.bandwidth,
             link.latency);
  const std::int64_t padded = padded_numel, n = world_size;
  // Stage 2's bound: the largest bucket with P + kMaxLiveBuckets·bucket < padded (none at N = 1).
  const std::int64_t cap = n > 1 ? std::max<std::int64_t>(1, (padded * (n - 1) / n - 1) / kMaxLiveBuckets) : padded;
  std::int64_t size = default_bucket_size(numel);
  if (link.bandwidth > 0 && n > 1 && elem_bytes > 0) {
    const double needed = std::ceil(10.0 * double(n) * link.latency * link.bandwidth / elem_bytes);
    if (needed > double(size)) size = std::min<std::int64_t>(cap, static_cast<std::int64_t>(std::min(needed, 1e18)));
  }
  const std::int64_t buckets = (padded + size - 1) / size;
  const std::int64_t last = padded - (buckets - 1) * size;
  if (buckets == 1 || 2 * last >= size) return size;
  const std::int64_t fewer = (padded + buckets - 2) / (buckets - 1);  // one bucket fewer
  if (fewer <= cap || fewer <= size) return fewer;
  return (padded + buckets - 1) / buckets;  // equal buckets, each smaller than `size`
}

void check_zero_options(const ZeroOptions& o) {
  ZERO_CHECK(o.stage >= 0 && o.stage <= 3, "ZeRO stage must be 0, 1, 2 or 3, got {}", o.stage);
  ZERO_CHECK(o.stage3_prefetch_bucket_size >= 0, "ZeRO: stage3_prefetch_bucket_size must be >= 0 elements, got {}",
             o.stage3_prefetch_bucket_size);
  ZERO_CHECK(o.stage3_max_live_parameters >= 1, "ZeRO: stage3_max_live_parameters must be >= 1 element, got {}",
             o.stage3_max_live_parameters);
  ZERO_CHECK(is_floating(o.dtype), "ZeRO: model dtype must be f32, f16 or bf16, got {}", dtype_name(o.dtype));
  ZERO_CHECK(o.reduce_bucket_size >= 1 || o.reduce_bucket_size == kAutoBucketSize,
             "ZeRO: reduce_bucket_size must be >= 1 element, got {}", o.reduce_bucket_size);
  ZERO_CHECK(o.allgather_bucket_size >= 1 || o.allgather_bucket_size == kAutoBucketSize,
             "ZeRO: allgather_bucket_size must be >= 1 element, got {}", o.allgather_bucket_size);
  ZERO_CHECK(o.gradient_accumulation_steps >= 1, "ZeRO: gradient_accumulation_steps must be >= 1, got {}",
             o.gradient_accumulation_steps);
  ZERO_CHECK(o.gradient_clipping >= 0.0f, "ZeRO: gradient_clipping must be >= 0 (0 = off), got {}",
             o.gradient_clipping);
  ZERO_CHECK(o.weight_decay >= 0.0f, "ZeRO: weight_decay must be >= 0, got {}", o.weight_decay);
  ZERO_CHECK(o.nonfinite_skip_limit >= 0, "ZeRO: nonfinite_skip_limit must be >= 0 (0 = never stop), got {}",
             o.nonfinite_skip_limit);
  const optim::AdamWOptions& a = o.adam;
  ZERO_CHECK(a.eps >= 0.0f, "ZeRO: AdamW eps must be >= 0, got {}", a.eps);
  ZERO_CHECK(a.beta1 >= 0.0f && a.beta1 < 1.0f, "ZeRO: AdamW beta1 must be in [0, 1), got {}", a.beta1);
  ZERO_CHECK(a.beta2 >= 0.0f && a.beta2 < 1.0f, "ZeRO: AdamW beta2 must be in [0, 1), got {}", a.beta2);
  ZERO_CHECK(a.lr >= 0.0f, "ZeRO: learning rate must be >= 0, got {}", a.lr);
  // Muon's own checks run per matrix on its owner, mid-step, where a rank that owns none would go on to
  // the all-gather: every rank checks them here, before any work.
  ZERO_CHECK(!o.muon || (o.muon_momentum >= 0.0f && o.muon_momentum < 1.0f),
             "ZeRO: Muon momentum must be in [0, 1), got {}", o.muon_momentum);
  ZERO_CHECK(!o.muon || o.muon_ns_steps >= 1, "ZeRO: Muon ns_steps must be >= 1, got {}", o.muon_ns_steps);
  ZERO_CHECK(o.quantized_gradients_block >= 0 && o.quantized_gradients_block <= kMaxQuantizationBlock,
             "ZeRO: quantized_gradients_block must be in [0, {}] (0 = off), got {}", kMaxQuantizationBlock,
             o.quantized_gradients_block);
  ZERO_CHECK(!o.quantized_gradients_error_feedback || o.quantized_gradients_block > 0,
             "ZeRO: zero_quantized_gradients_error_feedback needs zero_quantized_gradients");
}

namespace {
// The paper's per-rank model states for a buffer of `whole` elements of which this rank's partition holds
// `partition` (whole / N in the paper).
MemoryBreakdown model_states(int stage, DType dtype, double whole, double partition) {
  const double b = static_cast<double>(dtype_size(dtype));
  const double k = dtype == DType::f32 ? 8.0 : 12.0;  // (fp32 master) + m + v, bytes per parameter
  MemoryBreakdown m;
  m.params = stage == 3 ? b * partition : b * whole;
  m.grads = stage >= 2 ? b * partition : b * whole;
  m.optimizer_states = stage == 0 ? k * whole : k * partition;
  return m;
}
}  // namespace

MemoryBreakdown expected_memory(int stage, DType dtype, double psi, int world_size) {
  ZERO_CHECK(stage >= 0 && stage <= 3, "expected_memory: stage must be 0, 1, 2 or 3, got {}", stage);
  ZERO_CHECK(is_floating(dtype), "expected_memory: dtype must be f32, f16 or bf16, got {}", dtype_name(dtype));
  ZERO_CHECK(world_size >= 1, "expected_memory: world_size must be >= 1, got {}", world_size);
  return model_states(stage, dtype, psi, psi / world_size);
}

double StepTraffic::total() const {
  double sum = 0;
  for (double b : bytes) sum += b;
  return sum;
}

// Note [Gather units]
// ~~~~~~~~~~~~~~~~~~~
// Stage 3 gathers parameters a layer at a time: before a layer reads its first parameter the whole
// unit is all-gathered, and it is freed when the forward moves on to another unit (or, in backward,
// when its gradients have been handed to the reducer). A unit is a module subtree, found from the
// dotted parameter names: the owning module's path up to and including its first all-digit part
// ("blocks.3" for every parameter of a transformer block in a ModuleList-style "blocks"), else the
// path's first part ("wte", "lnf"); parameters of the root module itself form the unit "". Consecutive parameters
// with the same unit name form one unit. That is the granularity PyTorch FSDP users wrap with a
// transformer-block policy; DeepSpeed gathers each leaf module. Because named_parameters() order is
// also flat order, a unit is one contiguous range [begin, end) of the flat buffer, so gathering it is
// one all-gather whose rank r contributes the part of the range in its partition.
// Traffic: GPT reads every unit once per forward, except the tied token embedding, which the LM head
// reads again at the end; it is then still gathered when backward starts and stays so until its
// gradient is final, so each unit is gathered twice per micro-step in all, 2Ψ, and with the gradient
// reduce-scatter 3Ψ (the ZeRO paper's 1.5x of data parallelism, §7.2.2).
std::vector<GatherUnit> make_gather_units(const FlatLayout& layout) {
  auto unit_name = [](const std::string& name) {
    const std::size_t last = name.rfind('.');
    if (last == std::string::npos) return std::string();  // a parameter of the root module
    const std::string module = name.substr(0, last);
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = module.find('.', start);
      const std::string part = module.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return module.substr(0, dot);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return module.substr(0, module.find('.'));
  };
  std::vector<GatherUnit> units;
  const std::vector<ParamRange>& params = layout.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string name = unit_name(params[i].name);
    if (units.empty() || units.back().name != name)
      units.push_back({name, params[i].offset, params[i].offset, i, i});
    units.back().end = params[i].end();
    units.back().end_param = i + 1;
  }
  return units;
}

ZeroPlan plan_zero(const std::vector<FlatLayout::Entry>& entries, int world_size, const ZeroOptions& options) {
  check_zero_options(options);
  ZeroPlan plan;
  // Muon's matrices stay whole in their owner's partition (Note [Whole-matrix partitions] in flat_layout.cpp);
  // stage 0 steps the whole buffer on every rank and needs no such layout.
  std::vector<FlatLayout::Entry> laid = entries;
  if (options.muon && options.stage > 0)
    for (FlatLayout::Entry& e : laid) e.whole = optim::is_muon_matrix(e.name, e.shape);
  plan.layout = FlatLayout(laid, world_size);
  ZERO_CHECK(plan.layout.numel() > 0, "ZeRO: no trainable parameter elements ({} trainable parameters given)",
             entries.size());
  plan.options = options;
  if (options.stage == 0 || !options.reduce_scatter) {  // no gradient reduce-scatter to quantize
    plan.options.quantized_gradients_block = 0;
    plan.options.quantized_gradients_error_feedback = false;
  }
  if (plan.options.reduce_bucket_size == kAutoBucketSize)
    plan.options.reduce_bucket_size =
        automatic_bucket_size(plan.layout.numel(), plan.layout.padded_numel(), world_size,
                              plan.options.reduce_in_fp32 && plan.options.dtype != DType::f32
                                  ? 4.0
                                  : static_cast<double>(dtype_size(plan.options.dtype)),
                              plan.options.link);
  if (plan.options.allgather_bucket_size == kAutoBucketSize)
    plan.options.allgather_bucket_size = default_bucket_size(plan.layout.numel());
  plan.buckets = plan.layout.make_buckets(plan.options.reduce_bucket_size);
  plan.pool_buffer_numel = std::min(plan.options.reduce_bucket_size, plan.layout.padded_numel());
  if (options.stage >= 2)
    plan.pool_buffers = std::min(options.overlap_comm ? kMaxLiveBuckets : 1, static_cast<int>(plan.buckets.size()));
  if (options.stage == 3) {
    plan.units = make_gather_units(plan.layout);
    const auto largest = std::max_element(plan.units.begin(), plan.units.end(),
                                          [](const GatherUnit& a, const GatherUnit& b) { return a.size() < b.size(); });
    ZERO_CHECK(largest->size() <= options.stage3_max_live_parameters,
               "ZeRO: stage3_max_live_parameters = {} elements is less than gather unit '{}' ({} elements); "
               "it must hold the largest unit: set it to at least {}",
               options.stage3_max_live_parameters, largest->name, largest->size(), largest->size());
  }
  return plan;
}

std::int64_t ZeroPlan::region_begin(int rank) const { return options.stage == 0 ? 0 : layout.partition_begin(rank); }

std::int64_t ZeroPlan::region_size(int rank) const {
  return options.stage == 0 ? layout.padded_numel() : layout.partition_size(rank);
}

std::vector<ParamSlice> ZeroPlan::region_slices(int rank) const {
  if (options.stage != 0) return layout.owned(rank);
  std::vector<ParamSlice> all;
  for (const ParamRange& r : layout.params()) all.insert(all.end(), r.slices.begin(), r.slices.end());
  return all;
}

namespace {
// Note [Error feedback] (gradient_reducer.cpp): one int8 per element of every bucket this rank sends (the
// whole flat buffer) plus one fp32 scale per quantization block of each bucket's slices.
double residual_bytes(const ZeroPlan& plan) {
  double bytes = 0;
  for (const Bucket& k : plan.buckets)
    bytes += quantized_bytes(k.counts, static_cast<std::size_t>(plan.options.quantized_gradients_block));
  return bytes;
}
}  // namespace

MemoryBreakdown ZeroPlan::memory() const { return memory(layout.largest_partition()); }

MemoryBreakdown ZeroPlan::memory(int rank) const {
  MemoryBreakdown m = model_states(options.stage, options.dtype, static_cast<double>(layout.padded_numel()),
                                   static_cast<double>(layout.partition_size(rank)));
  const double b = static_cast<double>(dtype_size(options.dtype));
  m.buckets = b * static_cast<double>(pool_buffers) * static_cast<double>(pool_buffer_numel);
  if (options.stage == 3) {
    std::int64_t all = 0;
    for (const GatherUnit& u : units) all += u.size();
    m.gathered = b * static_cast<double>(std::min(all, options.stage3_max_live_parameters));
  }
  // The residual and its copy from the accumulation's start (Note [Error feedback state]).
  if (options.quantized_gradients_error_feedback) m.residual = 2.0 * residual_bytes(*this);
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
  const std::int64_t reductions = options.stage >= 2 ? options.gradient_accumulation_steps : 1;
  const bool all_reduce = options.stage == 0 || !options.reduce_scatter;
  for (const Bucket& k : buckets) {
    const double count = static_cast<double>(k.size());
    if (all_reduce)
      add(Collective::all_reduce, wide ? ring * count * (4.0 + b) : Ledger::bus_bytes(Collective::all_reduce, b * count, n),
          reductions);
    else if (options.quantized_gradients_block > 0)  // Note [int8 quantized reduce-scatter] (quantize.cpp)
      add(Collective::reduce_scatter,
          Ledger::bus_bytes(Collective::reduce_scatter,
                            quantized_bytes(k.counts, static_cast<std::size_t>(options.quantized_gradients_block)), n),
          reductions);
    else
      add(Collective::reduce_scatter, Ledger::bus_bytes(Collective::reduce_scatter, (wide ? 4.0 : b) * count, n),
          reductions);
  }
  // Stage 3: every unit, before its forward and before its backward, every micro-step (Note [Gather
  // units]).
  for (const GatherUnit& u : units)
    add(Collective::all_gather, Ledger::bus_bytes(Collective::all_gather, b * static_cast<double>(u.size()), n),
        2 * options.gradient_accumulation_steps);
  // Parameters after the step (stages 1/2): all-gather chunks of allgather_bucket_size from the start.
  if (options.stage == 1 || options.stage == 2) {
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
