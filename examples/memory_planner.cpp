#include "examples/memory_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/check.h"

namespace zero::examples {

double parse_size(const std::string& text, const char* flag) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::pair<const char*, double> units[] = {{"", 1.0},          {"B", 1.0},         {"KIB", 1024.0},
                                                  {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0},
                                                  {"KB", 1e3},        {"MB", 1e6},        {"GB", 1e9},
                                                  {"TB", 1e12}};
  for (const auto& [name, scale] : units)
    if (used > 0 && unit == name && std::isfinite(value) && value > 0) return value * scale;
  ZERO_CHECK(false, "{} must be a positive size such as 2GiB, 1.5GB or 800MiB, got '{}'", flag, text);
  return 0;
}

// Note [Peak RSS]
// train_gpt's peak RSS (getrusage's ru_maxrss) is more than the memory its metrics count (model
// states, buckets, gathered parameters, activations). Split with the metrics' allocator_peak (the cpu
// allocator's most bytes in use) on the bench model (--n-layer 8 --block 256 --dropout 0.1, batch 8
// per rank) at stage 0 GAS 2, 4, 8, full recompute GAS 2, and stages 2 and 3 on two ranks:
// - allocator_peak − counted = 7.76, 7.14, 6.84, 7.76 MiB at stage 0 (micro-batch 4, 2, 1, 4), 4.68
//   and 4.69 MiB at stages 2 and 3: one f32 buffer of the rank's partition (6.21 MiB at stage 0, 3.10
//   on two ranks: the optimizer step's temporary) plus 4·n·(V + 2C) bytes (0.31 MiB per sequence: the
//   head's backward, the logits' gradient and two n·C gradients); what is left, at most 0.35 MiB, goes
//   with the overhead. transient_bytes() is that sum.
// - peak RSS − allocator_peak = 50-57 MiB on all six: the program, its libraries, MPI and the data
//   (26.5 MiB for a 4,608-parameter model), and blocks the allocator keeps cached (freed sizes that
//   a later request of another size does not reuse). Neither is computed here: --runtime-overhead,
//   64 MiB by default, stands for them.

double transient_bytes(const nn::GPTConfig& cfg, std::int64_t micro_batch, std::int64_t partition_elements) {
  const double n = static_cast<double>(micro_batch * cfg.block_size);
  return 4.0 * (static_cast<double>(partition_elements) +
                n * static_cast<double>(cfg.vocab_size + 2 * cfg.n_embd));
}

namespace {

// FLOPs per token a recompute mode adds (header: the blocks' forward, or the attention's two GEMMs).
double recompute_flops_per_token(const nn::GPTConfig& cfg, autograd::Recompute mode) {
  const double L = static_cast<double>(cfg.n_layer), T = static_cast<double>(cfg.block_size),
               C = static_cast<double>(cfg.n_embd);
  const double attention = 4.0 * L * T * C;
  const double block_params = L * 12.0 * C * C;  // qkv, proj, fc, fc2 weights (biases and norms aside)
  switch (mode) {
    case autograd::Recompute::none: return 0;
    case autograd::Recompute::full: return 2.0 * block_params + attention;
    case autograd::Recompute::selective: return attention;
  }
  return 0;
}

PlanChoice evaluate(const PlannerInput& in, int stage, autograd::Recompute mode, int gas) {
  dist::ZeroOptions o = in.base;
  o.stage = stage;
  o.gradient_accumulation_steps = gas;
  o.link = {in.bandwidth, in.latency};
  if (stage == 0 || stage == 3) o.overlap_param_gather = false;
  if (stage == 0) o.quantized_gradients_block = 0, o.quantized_gradients_error_feedback = false;
  const dist::ZeroPlan plan = dist::plan_zero(in.entries, in.world_size, o);
  const dist::MemoryBreakdown m = plan.memory();
  PlanChoice c;
  c.stage = stage;
  c.recompute = mode;
  c.gradient_accumulation_steps = gas;
  c.micro_batch = in.batch / in.world_size / gas;
  c.reduce_bucket_size = plan.options.reduce_bucket_size;
  c.stage3_max_live_parameters = plan.options.stage3_max_live_parameters;
  c.persistent_bytes = m.model_states() + m.buckets + m.gathered + m.residual + m.recovery;
  c.activation_bytes = nn::activation_bytes(in.cfg, c.micro_batch, mode).total();
  c.memory_bytes = c.persistent_bytes + c.activation_bytes;
  c.transient_bytes =
      transient_bytes(in.cfg, c.micro_batch, stage == 0 ? plan.layout.padded_numel() : plan.layout.largest_partition_size());
  c.rss_bytes = c.memory_bytes + c.transient_bytes + in.runtime_overhead_bytes;
  const double psi = static_cast<double>(plan.layout.numel());
  const double tokens = static_cast<double>(in.batch / in.world_size * in.cfg.block_size);
  const double per_token =
      nn::flops_per_token(in.cfg, static_cast<std::int64_t>(psi)) + recompute_flops_per_token(in.cfg, mode);
  c.compute_s = tokens * per_token / in.flops_per_s;
  c.comm_s = in.bandwidth > 0 && in.world_size > 1 ? dist::step_comm_time_s(plan, in.bandwidth, in.latency) : 0.0;
  return c;
}

}  // namespace

std::vector<PlanChoice> plan_configurations(const PlannerInput& in) {
  ZERO_CHECK(in.batch >= in.world_size && in.batch % in.world_size == 0,
             "--batch {} does not split into {} rank(s)", in.batch, in.world_size);
  const std::int64_t per_rank = in.batch / in.world_size;
  std::vector<PlanChoice> all;
  for (int stage = 0; stage <= 3; ++stage)
    for (autograd::Recompute mode :
         {autograd::Recompute::none, autograd::Recompute::selective, autograd::Recompute::full})
      for (std::int64_t gas = 1; gas <= per_rank; ++gas)
        if (per_rank % gas == 0) all.push_back(evaluate(in, stage, mode, static_cast<int>(gas)));
  std::stable_sort(all.begin(), all.end(), [&](const PlanChoice& a, const PlanChoice& b) {
    if (fits(a, in) != fits(b, in)) return fits(a, in);
    if (!fits(a, in)) return a.rss_bytes < b.rss_bytes;
    if (a.step_s() != b.step_s()) return a.step_s() < b.step_s();
    // The same modelled time: fewer micro-steps first (a larger micro-batch runs the kernels more
    // efficiently, which the model does not see), then less memory.
    if (a.gradient_accumulation_steps != b.gradient_accumulation_steps)
      return a.gradient_accumulation_steps < b.gradient_accumulation_steps;
    return a.memory_bytes < b.memory_bytes;
  });
  return all;
}

namespace {

std::string describe(const PlanChoice& c) {
  return fmt::format("stage {}, recompute {}, GAS {} (micro-batch {}), bucket {} elements{}", c.stage,
                     autograd::recompute_name(c.recompute), c.gradient_accumulation_steps, c.micro_batch,
                     c.reduce_bucket_size,
                     c.stage == 3 ? fmt::format(", live bound {} elements", c.stage3_max_live_parameters) : "");
}

std::string sizes(double bytes) {
  return fmt::format("{:.2f} MiB ({:.2f} MB)", bytes / 1048576.0, bytes / 1e6);
}

}  // namespace

void print_plan(const PlannerInput& in, const std::vector<PlanChoice>& choices) {
  fmt::print("\n== memory budget {} per rank: configurations whose predicted peak RSS fits, by modelled step time "
             "(compute at {:.3g} FLOP/s per rank{}) ==\n",
             sizes(in.budget_bytes), in.flops_per_s,
             in.bandwidth > 0 ? fmt::format(" + communication at {:.3g} B/s, latency {:.3g} s", in.bandwidth,
                                            in.latency)
                              : ", no link given: communication not timed");
  fmt::print("peak RSS = persistent + activations (train_gpt's metrics count these two) + transient + runtime "
             "overhead {} (--runtime-overhead)\n",
             sizes(in.runtime_overhead_bytes));
  int shown = 0;
  for (const PlanChoice& c : choices) {
    if (!fits(c, in)) break;
    if (shown++ < 12)
      fmt::print("  {:>2}. {}: peak RSS {} = persistent {} + activations {} + transient {} + overhead; step {:.2f} "
                 "ms (compute {:.2f} + comm {:.2f})\n",
                 shown, describe(c), sizes(c.rss_bytes), sizes(c.persistent_bytes), sizes(c.activation_bytes),
                 sizes(c.transient_bytes), 1e3 * c.step_s(), 1e3 * c.compute_s, 1e3 * c.comm_s);
  }
  if (shown > 12) fmt::print("  ... {} more that fit\n", shown - 12);
  if (shown == 0) {
    const PlanChoice& c = choices.front();
    fmt::print("nothing fits: the smallest is {}, peak RSS {} (over the budget by {}); add ranks or shorten the "
               "batch or block\n",
               describe(c), sizes(c.rss_bytes), sizes(c.rss_bytes - in.budget_bytes));
    return;
  }
  const PlanChoice& best = choices.front();
  fmt::print("choice: {}: the lowest modelled step time among the {} that fit; predicted peak RSS {}, {} under the "
             "budget\n",
             describe(best), shown, sizes(best.rss_bytes), sizes(in.budget_bytes - best.rss_bytes));
}

}  // namespace zero::examples
