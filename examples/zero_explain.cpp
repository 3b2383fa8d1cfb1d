// zero_explain: shows, without training and without mpirun, what ZeRO does with train_gpt's model on N
// ranks: who owns which bytes of the flat buffer, how it is cut into buckets and in which order they
// leave, at stage 3 which parameters are gathered together (the per-module gather plan), what each rank
// holds (beside the ZeRO paper's formulas and its 7.5B-parameter example), what each step sends, and,
// given a link's bandwidth and latency, what that costs up to 1,024 ranks; with --read-plan, which byte
// ranges of a checkpoint's files each rank reads when resuming from it at this world size and stage.
//
//   build/bin/zero_explain --data data/tinyshakespeare.txt --world-size 4 --zero-stage 2 --dtype fp16
//   build/bin/zero_explain --vocab-size 65 --world-size 4 --format json
//   build/bin/zero_explain --world-size 4 --zero-stage 3 --stage3-max-live-parameters 200000
//   build/bin/zero_explain --world-size 8 --bandwidth 25e9 --latency 5e-6 --params 124e6 --params 1.5e9
//   build/bin/zero_explain --world-size 4 --svg layout.svg
//   build/bin/zero_explain --world-size 3 --zero-stage 1 --read-plan out   (out: a train_gpt --save-dir)
//
// Model and ZeRO flags have train_gpt's names and defaults (--config, then the flags over it). The
// numbers come from distributed/zero/zero_plan.h: layout arithmetic, checked by the tests against what a
// real ZeroOptimizer allocates and its ledger counts. The bucket order and the stage-2 pool follow the
// real hook order, recorded from one backward of a narrow twin of the model on a dummy batch (no
// optimizer step). The model itself is built shape only (Note [Meta tensors]), so any size can be explained.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "distributed/distributed.h"
#include "examples/cli_errors.h"
#include "examples/memory_planner.h"
#include "examples/muon_explain.h"
#include "examples/output_paths.h"
#include "examples/model_options.h"
#include "examples/setting_flags.h"
#include "examples/text_data.h"
#include "nn/activation_memory.h"
#include "nn/gpt.h"

namespace {

using namespace zero;
using dist::Collective;
using nlohmann::json;

// The largest --world-size: every bucket holds N reduce-scatter counts and every plan is laid out once
// per table row; at 4,096 ranks the default model's explanation takes under 0.1 s and 10 MB, GPT-3's
// (175B parameters, built shape only) 0.2 s and 0.1 GB.
constexpr int kMaxWorldSize = 4096;
// The largest --params: the scale table lays each size out at up to 1,024 ranks, in buckets of at most
// 5e8 elements by default that hold 1,024 counts each; 1e13 parameters take about 1 s and 0.2 GB.
constexpr double kMaxScaleParams = 1e13;

struct Args {
  std::string data, config, dtype = "fp32", format = "text", svg;
  std::int64_t vocab_size = 0;
  nn::GPTConfig model;  // all but vocab_size from the model flags (examples/model_options.h)
  int world_size = 1;
  std::int64_t batch = 12;  // train_gpt's --batch and its default: sequences per step over all ranks
  std::string memory_budget;  // --memory-budget: the planner (examples/memory_planner.h)
  std::string runtime_overhead;  // --runtime-overhead: the planner's per-process overhead
  std::string read_plan;         // --read-plan: a checkpoint whose load at this world size and stage is shown
  double compute_flops = 1e11;
  examples::SettingFlags settings;  // the ZeRO flags of the settings table (distributed/run/settings.h)
  double bandwidth = 0, latency = 0;
  std::vector<double> params;
};

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }
// Bytes in binary and decimal units side by side: "3.00 MiB (3.15 MB)".
std::string bytes_gib_gb(double bytes) {
  return bytes >= 1e9 ? fmt::format("{:.2f} GiB ({:.2f} GB)", bytes / (1024.0 * 1024.0 * 1024.0), bytes / 1e9)
                      : fmt::format("{} ({:.2f} MB)", mib(bytes), bytes / 1e6);
}

// Human units for the scale table (params can reach TB totals at stage 0).
std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string human_seconds(double s) {
  if (s == 0.0) return "0";
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.3f} s", s);
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The ZeRO options train_gpt would run with, by its merge rule (examples/setting_flags.h): the
// defaults, the --config file, the flags given, then validation of the result.
dist::TrainingConfig make_config(const Args& a, const CLI::App& app) {
  const json file = a.config.empty() ? json::object() : dist::read_config_file(a.config);
  const auto given = [&](std::string_view flag) {
    const CLI::Option* o = app.get_option_no_throw(std::string(flag));
    return o != nullptr && o->count() > 0;
  };
  const dist::TrainingConfig tc =
      examples::merge_config(file, a.config, a.settings, given, [&](dist::TrainingConfig& c) {
        if (given("--dtype")) c.set_model_dtype(parse_float_dtype(a.dtype));
        // train_gpt's batch rule; only train_gpt's default --batch, when it does not split into the ranks
        // and micro-steps, becomes one sequence per micro-step (only the activations use the batch).
        const bool default_batch = !given("--batch") && !c.train_batch_size && !c.train_micro_batch_size_per_gpu;
        const std::int64_t split = static_cast<std::int64_t>(a.world_size) * c.gradient_accumulation_steps.value_or(1);
        const std::int64_t batch = default_batch && split >= 1 && a.batch % split != 0 ? split : a.batch;
        examples::apply_batch_flags(c, batch, given("--batch"), given("--grad-accum"), a.world_size);
        c.resolve_batch(a.world_size);
      });
  for (const auto& w : tc.warnings) fmt::print(stderr, "{}\n", w);
  return tc;
}

// One bucket's reduction in the alpha-beta model: its collective, bus bytes, and the latency and
// bandwidth terms of ring_time_s.
struct BucketTime {
  Collective collective;
  double bus_bytes = 0, latency_s = 0, bandwidth_s = 0;
};
BucketTime bucket_time(const dist::ZeroPlan& plan, const dist::Bucket& b, double bandwidth, double latency) {
  const dist::ZeroOptions& o = plan.options;
  const int n = plan.layout.world_size();
  BucketTime t;
  t.collective = o.stage == 0 || !o.reduce_scatter ? Collective::all_reduce : Collective::reduce_scatter;
  const double elems = static_cast<double>(b.size()), model = static_cast<double>(dtype_size(o.dtype));
  const bool wide = o.reduce_in_fp32 && o.dtype != DType::f32;
  // Note [Wire dtype]: a widened all-reduce moves fp32 in its reduce-scatter half, 16 bits in its gather.
  if (t.collective == Collective::all_reduce && wide)
    t.bus_bytes = (n - 1.0) / n * elems * (4.0 + model);
  else
    t.bus_bytes = dist::Ledger::bus_bytes(t.collective, elems * (wide ? 4.0 : model), n);
  t.latency_s = dist::ring_time_s(t.collective, 0.0, n, bandwidth, latency);
  t.bandwidth_s = t.bus_bytes / bandwidth;
  return t;
}

// The model's trainable parameters (name, shape, weight-decay flag) in named_parameters() order, from a
// model built under a MetaTensorScope: no memory for its weights, whatever its size (Note [Meta tensors]).
std::vector<dist::FlatLayout::Entry> parameter_entries(const nn::GPTConfig& cfg) {
  MetaTensorScope meta;
  Generator gen(1337);
  nn::GPT model(cfg, gen);
  std::vector<dist::FlatLayout::Entry> entries;
  for (const auto& p : model.named_parameters())
    if (p.tensor.requires_grad()) entries.push_back({p.name, p.tensor.shape(), p.decay});
  return entries;
}

// Parameter indices in the order backward makes their gradients final (Note [Hook order]): one
// forward + backward on a [1, T] batch of token 0 of a narrow twin of the model (one head of one channel,
// a vocabulary and a block of at most 8), which has the same modules in the same order, so the same order
// of gradients, at a few kilobytes whatever the model's size. Throws zero::Error if the twin's trainable
// parameters are not `entries`' names in order.
std::vector<std::size_t> record_hook_order(const nn::GPTConfig& cfg, const std::vector<dist::FlatLayout::Entry>& entries) {
  nn::GPTConfig narrow = cfg;
  narrow.n_head = 1;
  narrow.n_embd = 1;
  narrow.vocab_size = std::min<std::int64_t>(cfg.vocab_size, 8);
  narrow.block_size = std::min<std::int64_t>(cfg.block_size, 8);
  Generator gen(1337);
  nn::GPT model(narrow, gen);
  std::vector<nn::NamedParameter> params;
  for (auto& p : model.named_parameters())
    if (p.tensor.requires_grad()) params.push_back(p);
  bool same = params.size() == entries.size();
  for (std::size_t i = 0; same && i < params.size(); ++i) same = params[i].name == entries[i].name;
  ZERO_CHECK(same, "zero_explain: the narrow twin of the model has other parameters than the model ({} against {})",
             params.size(), entries.size());
  std::vector<std::size_t> order;
  std::vector<int> ids;
  for (std::size_t i = 0; i < params.size(); ++i)
    ids.push_back(
        autograd::register_post_accumulate_grad_hook(params[i].tensor, [&order, i](Tensor&) { order.push_back(i); }));
  const std::int64_t T = narrow.block_size;
  const Tensor x = Tensor::from_indices(std::vector<std::int64_t>(static_cast<std::size_t>(T), 0), {1, T});
  model.loss(x, x).backward();
  for (std::size_t i = 0; i < params.size(); ++i) {
    autograd::remove_post_accumulate_grad_hook(params[i].tensor, ids[i]);
    params[i].tensor.set_grad(Tensor());
  }
  // Parameters that got no gradient (none in this model) reduce last, in reverse list order.
  std::vector<char> seen(params.size(), 0);
  for (std::size_t i : order) seen[i] = 1;
  for (std::size_t i = params.size(); i-- > 0;)
    if (!seen[i]) order.push_back(i);
  return order;
}

json traffic_json(const dist::StepTraffic& t) {
  json j;
  for (int c = 0; c < dist::kNumCollectives; ++c)
    j[std::string(dist::collective_name(static_cast<Collective>(c)))] = t.bytes[c];
  j["total"] = t.total();
  return j;
}

json memory_json(const dist::MemoryBreakdown& m) {
  return {{"params", m.params},
          {"grads", m.grads},
          {"optimizer_states", m.optimizer_states},
          {"buckets", m.buckets},
          {"gathered", m.gathered},
          {"residual", m.residual},
          {"model_states", m.model_states()}};
}

// The ZeRO paper's worked example (§1 and Fig. 1): a 7.5B-parameter model with mixed-precision Adam
// (b = 2, K = 12) on 64 devices, printed in the paper's GB of 1e9 bytes: 120, 31.4, 16.6 and 1.88 GB.
constexpr double kPaperPsi = 7.5e9;
constexpr int kPaperN = 64;
double paper_example_bytes(int stage) {
  return dist::expected_memory(stage, DType::f16, kPaperPsi, kPaperN).model_states();
}

// A collective's per-rank counts for the text output: all of them up to 16 ranks ("[8320, 0, 0, 0]"),
// beyond that only the ranks with elements, runs of equal counts as one ("[rank 3: 107328, ranks 16-56:
// 42627994 each; the other 4054 ranks 0]").
std::string counts_text(const std::vector<std::size_t>& counts) {
  if (counts.size() <= 16) return fmt::format("[{}]", fmt::join(counts, ", "));
  std::string text;
  std::size_t zero = 0;
  for (std::size_t r = 0, end = 0; r < counts.size(); r = end) {
    for (end = r + 1; end < counts.size() && counts[end] == counts[r];) ++end;
    if (counts[r] == 0) {
      zero += end - r;
      continue;
    }
    text += text.empty() ? "" : ", ";
    text += end - r == 1 ? fmt::format("rank {}: {}", r, counts[r])
                         : fmt::format("ranks {}-{}: {} each", r, end - 1, counts[r]);
  }
  return fmt::format("[{}; the other {} ranks 0]", text, zero);
}

// The schemes compared side by side: every stage, and the reduce_scatter = false variant of 1 and 2.
struct Scheme {
  std::string name;
  int stage;
  bool reduce_scatter;
};
const std::vector<Scheme> kSchemes = {{"stage 0", 0, true},
                                      {"stage 1", 1, true},
                                      {"stage 2", 2, true},
                                      {"stage 3", 3, true},
                                      {"stage 1, reduce_scatter false", 1, false},
                                      {"stage 2, reduce_scatter false", 2, false}};

dist::ZeroOptions with_scheme(dist::ZeroOptions zo, const Scheme& s) {
  zo.stage = s.stage;
  zo.reduce_scatter = s.reduce_scatter;
  return zo;
}

// ---- the SVG: the flat buffer as one bar, parameters as segments coloured by the owning rank ----
void write_svg(const std::string& path, const dist::ZeroPlan& plan) {
  const dist::FlatLayout& L = plan.layout;
  const double width = 1400, left = 20, bar_w = width - 2 * left, bar_y = 150, bar_h = 60;
  const double padded = static_cast<double>(L.padded_numel());
  auto x_of = [&](std::int64_t e) { return left + bar_w * static_cast<double>(e) / padded; };
  const char* colours[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"};
  const int n = L.world_size();
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, 330);
  s += fmt::format(
      "<text x=\"{}\" y=\"20\" font-size=\"14\">flat buffer: {} elements ({} parameters + {} padding), {} ranks x "
      "partition {}; stage {}, {} bucket(s) of &lt;= {} elements</text>\n",
      left, L.padded_numel(), L.numel(), L.padding(), n, examples::partition_sizes(L), plan.options.stage, plan.buckets.size(),
      plan.options.reduce_bucket_size);
  // Partitions as a band above the bar.
  for (int r = 0; r < n; ++r) {
    const double x0 = x_of(L.partition_begin(r)), x1 = x_of(L.partition_end(r));
    s += fmt::format("<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"14\" fill=\"{}\"/>\n", x0, bar_y - 22,
                     x1 - x0, colours[r % 8]);
    if (x1 - x0 > 60)
      s += fmt::format("<text x=\"{:.2f}\" y=\"{}\" fill=\"white\">rank {}</text>\n", x0 + 4, bar_y - 11, r);
  }
  // Parameter slices, coloured by owner, outlined per parameter; names of the wider ones above.
  double last_label_end = -1e9;
  for (const dist::ParamRange& p : L.params()) {
    if (p.numel == 0) continue;
    for (const dist::ParamSlice& sl : p.slices) {
      const double x0 = x_of(sl.flat_offset), x1 = x_of(sl.flat_offset + sl.length);
      s += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" fill-opacity=\"0.55\"/>\n", x0, bar_y,
          x1 - x0, bar_h, colours[sl.rank % 8]);
    }
    const double x0 = x_of(p.offset), x1 = x_of(p.end());
    s += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"none\" stroke=\"#333\" "
        "stroke-width=\"0.5\"><title>{} {} [{}, {})</title></rect>\n",
        x0, bar_y, x1 - x0, bar_h, p.name, shape_str(p.shape), p.offset, p.end());
    const double mid = (x0 + x1) / 2;
    if (x1 - x0 > 6 && mid - last_label_end > 12) {
      s += fmt::format("<text transform=\"translate({:.2f},{}) rotate(-50)\" font-size=\"9\">{}</text>\n", mid,
                       bar_y - 26, p.name);
      last_label_end = mid;
    }
  }
  if (L.padding() > 0) {
    const double x0 = x_of(L.numel());
    s += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"#ccc\"><title>padding {} "
        "elements</title></rect>\n",
        x0, bar_y, std::max(1.0, x_of(L.padded_numel()) - x0), bar_h, L.padding());
  }
  // Bucket boundaries below the bar, with the issue order.
  for (const dist::Bucket& b : plan.buckets) {
    const double x0 = x_of(b.begin), x1 = x_of(b.end);
    s += fmt::format("<line x1=\"{:.2f}\" y1=\"{}\" x2=\"{:.2f}\" y2=\"{}\" stroke=\"#c00\" stroke-width=\"1.5\"/>\n",
                     x0, bar_y - 4, x0, bar_y + bar_h + 30);
    if (x1 - x0 > 14)
      s += fmt::format("<text x=\"{:.2f}\" y=\"{}\" fill=\"#c00\" text-anchor=\"middle\">b{}</text>\n", (x0 + x1) / 2,
                       bar_y + bar_h + 22, b.index);
  }
  s += fmt::format("<line x1=\"{:.2f}\" y1=\"{}\" x2=\"{:.2f}\" y2=\"{}\" stroke=\"#c00\" stroke-width=\"1.5\"/>\n",
                   x_of(L.padded_numel()), bar_y - 4, x_of(L.padded_numel()), bar_y + bar_h + 30);
  s += fmt::format(
      "<text x=\"{}\" y=\"{}\">segments: parameters in named_parameters() order, coloured by the rank "
      "owning each slice; red lines: bucket boundaries, b0 leaves first (Note [Bucket order]); grey: "
      "padding. Hover a segment for its name and range.</text>\n",
      left, bar_y + bar_h + 60);
  s += "</svg>\n";
  std::ofstream out(path);
  ZERO_CHECK(out.good(), "--svg: cannot write '{}'", path);
  out << s;
}

// What zero_explain explains: the model, the ZeRO options by train_gpt's merge rule, and the plan of
// their layout, buckets and gathers on N ranks, with the hook order that decides when buckets leave.
// --read-plan: the checkpoint (a step directory, or a save directory's newest), and what each of the N
// ranks of this plan would read from it on a resume (dist::read_plan). One rank's region: the logical
// range of the plan's region, its real elements (Note [Checkpoint ranges] in distributed/run/checkpoint.cpp).
struct RankReads {
  std::int64_t begin = 0, end = 0;  // logical elements of [0, Ψ)
  std::vector<dist::ReadRange> reads;
};

struct Explained {
  nn::GPTConfig cfg;
  dist::ZeroOptions zo;
  int N = 1;
  std::vector<dist::FlatLayout::Entry> entries;
  std::vector<std::size_t> order;        // parameter indices in hook order
  dist::ZeroPlan plan;
  std::vector<std::size_t> ready_after;  // per bucket: the hook position it waits for (1-based; 0 = at once)
  double psi = 0.0;
  dist::StepTraffic traffic;
  double baseline = 0.0;  // stage 0's traffic, bytes per step
  std::int64_t largest_unit = 0;  // elements of the largest stage-3 gather unit of this layout
  bool timed = false;     // --bandwidth given: the alpha-beta time model is on
  std::int64_t micro_batch = 1;  // sequences per forward on one rank (train_gpt's rule from --batch)
  autograd::Recompute recompute = autograd::Recompute::none;
  nn::ActivationBytes activations;  // per rank, one micro-step (nn/activation_memory.h)
  std::int64_t batch = 1;           // global batch (train_gpt's rule)
  double budget_bytes = 0;          // --memory-budget; 0: no planner
  dist::Checkpoint resume;          // --read-plan's checkpoint (dir empty without it)
  std::vector<RankReads> reads;     // ... and what each rank reads from it
};

// The options of a comparison row (another stage or scheme than the one explained). When the explained
// plan is not stage 3, its stage3_max_live_parameters was no choice for stage 3, so the stage-3 rows
// use at least the largest gather unit, the least bound that runs; print_memory says so when it raised it.
dist::ZeroOptions row_options(const Explained& e, int stage, bool reduce_scatter) {
  dist::ZeroOptions o = e.zo;
  o.stage = stage;
  o.reduce_scatter = reduce_scatter;
  if (stage == 3 && e.zo.stage != 3) o.stage3_max_live_parameters = std::max(o.stage3_max_live_parameters, e.largest_unit);
  return o;
}

// When each bucket can leave: after the hook of the last of its parameters to deliver.
std::vector<std::size_t> ready_after_hooks(const dist::ZeroPlan& plan, const std::vector<std::size_t>& order) {
  std::vector<std::size_t> position(order.size());
  for (std::size_t j = 0; j < order.size(); ++j) position[order[j]] = j;
  std::vector<std::size_t> ready_after(plan.buckets.size(), 0);  // hook position (1-based; 0 = at once)
  std::size_t running = 0;
  for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
    for (std::size_t i : plan.buckets[k].params) running = std::max(running, position[i] + 1);
    ready_after[k] = running;  // a bucket also waits for the ones before it (Note [Bucket order])
  }
  return ready_after;
}

// The flags checked, the model built, its hook order recorded and its ZeRO plan made.
std::vector<RankReads> resume_reads(const Explained& e, const dist::Checkpoint& c) {
  const std::int64_t numel = c.state.value("numel", std::int64_t{-1});
  ZERO_CHECK(numel == e.plan.layout.numel(), "--read-plan: checkpoint '{}' holds {} parameter elements, the model "
             "given here {}; pass the model flags it was trained with", c.dir, numel, e.plan.layout.numel());
  // A resume keeps the optimizer, and Muon's layout differs from AdamW's (Note [Whole-matrix partitions]).
  const std::string saved = dist::saved_optimizer_type(c.state, c.dir), mine = e.zo.muon ? "muon" : "adamw";
  ZERO_CHECK(saved == mine, "--read-plan: checkpoint '{}' holds {} optimizer state, and a resume keeps its optimizer; "
             "pass --optimizer {}", c.dir, saved, saved);
  std::vector<RankReads> out;
  for (int r = 0; r < e.N; ++r) {
    RankReads rr;
    rr.begin = e.plan.layout.to_logical(e.plan.region_begin(r));  // Note [Checkpoint ranges]
    rr.end = e.plan.layout.to_logical(e.plan.region_begin(r) + e.plan.region_size(r));
    rr.reads = dist::read_plan(c, rr.begin, rr.end);
    out.push_back(std::move(rr));
  }
  return out;
}

// --runtime-overhead in bytes: a size, or 0.
double runtime_overhead_bytes(const Args& a) {
  if (a.runtime_overhead == "0") return 0;
  return examples::parse_size(a.runtime_overhead, "--runtime-overhead");
}

Explained explain(const Args& a, const CLI::App& app) {
  ZERO_CHECK(a.world_size >= 1 && a.world_size <= kMaxWorldSize, "--world-size must be in [1, {}], got {}",
             kMaxWorldSize, a.world_size);
  ZERO_CHECK(a.format == "text" || a.format == "json", "--format must be text or json, got '{}'", a.format);
  const CLI::Option* bandwidth = app.get_option_no_throw("--bandwidth");
  ZERO_CHECK(a.bandwidth > 0 || (a.bandwidth == 0 && (bandwidth == nullptr || bandwidth->count() == 0)),
             "--bandwidth must be > 0 bytes/s, got {}", a.bandwidth);
  ZERO_CHECK(a.latency >= 0, "--latency must be >= 0 seconds, got {}", a.latency);
  for (double p : a.params)
    ZERO_CHECK(p >= 1 && p <= kMaxScaleParams, "--params must be in [1, {:g}] parameters, got {:g}", kMaxScaleParams, p);
  ZERO_CHECK(a.data.empty() || a.vocab_size == 0, "give --data or --vocab-size, not both");
  Explained e;
  e.cfg = a.model;
  e.cfg.vocab_size = a.vocab_size > 0 ? a.vocab_size : 65;
  e.cfg.validate();
  if (!a.data.empty()) e.cfg.vocab_size = examples::TextData::load(a.data, e.cfg.block_size).vocab_size();
  const dist::TrainingConfig tc = make_config(a, app);
  e.zo = tc.zero_options();
  e.zo.link = {a.bandwidth, a.latency};  // Note [Automatic bucket size]: with a link model, buckets grow with N
  e.micro_batch = *tc.train_micro_batch_size_per_gpu;
  e.recompute = autograd::parse_recompute(tc.activation_checkpointing.recompute_granularity);
  e.activations = nn::activation_bytes(e.cfg, e.micro_batch, e.recompute);
  e.batch = *tc.train_batch_size;
  if (!a.memory_budget.empty()) e.budget_bytes = examples::parse_size(a.memory_budget, "--memory-budget");
  if (!a.runtime_overhead.empty()) (void)runtime_overhead_bytes(a);  // a bad size fails before any work
  ZERO_CHECK(a.compute_flops > 0, "--compute-flops must be > 0 FLOP/s, got {}", a.compute_flops);
  e.entries = parameter_entries(e.cfg);
  // Every bucket keeps a count per rank (dist::Bucket::counts), and the plan is laid out once per table
  // row: refuse tiny buckets on many ranks before their counts take a gigabyte. The automatic size never
  // comes near.
  if (const auto& size = tc.zero_optimization.reduce_bucket_size) {
    constexpr double kMaxCounts = 1e7;
    double psi = 0;
    for (const auto& en : e.entries) psi += static_cast<double>(shape_numel(en.shape));
    const double buckets = std::ceil(psi / static_cast<double>(*size));
    ZERO_CHECK(buckets * a.world_size <= kMaxCounts, "reduce_bucket_size {} cuts {:.4g} elements into {:.4g} buckets, "
               "{:.3g} per-rank counts on {} ranks, more than zero_explain lays out ({:.0e}); give at least {:.0f} elements",
               *size, psi, buckets, buckets * a.world_size, a.world_size, kMaxCounts,
               std::ceil(psi * a.world_size / kMaxCounts));
  }
  e.order = record_hook_order(e.cfg, e.entries);
  e.N = a.world_size;
  e.plan = dist::plan_zero(e.entries, e.N, e.zo);
  e.psi = static_cast<double>(e.plan.layout.numel());
  e.traffic = e.plan.traffic();
  e.baseline = dist::plan_zero(e.entries, e.N, with_scheme(e.zo, kSchemes[0])).traffic().total();
  // Stage 3's units lie in the same layout as stages 1 and 2 (which check no live bound).
  for (const dist::GatherUnit& u : dist::make_gather_units(dist::plan_zero(e.entries, e.N, row_options(e, 1, true)).layout))
    e.largest_unit = std::max(e.largest_unit, u.size());
  e.timed = a.bandwidth > 0;
  e.ready_after = ready_after_hooks(e.plan, e.order);
  if (!a.read_plan.empty()) {
    const std::string dir = dist::resolve_checkpoint(a.read_plan);
    e.resume = {dir, dist::read_state(dir)};
    e.reads = resume_reads(e, e.resume);
  }
  return e;
}

// Stage 3's unit all-gathers per optimizer step for the GPT, once the schedule is learned: per
// micro-step U + 1 in the forward (the tied wte twice) and U - 1 in the backward (Note [One schedule]).
std::int64_t stage3_all_gathers_per_step(const Explained& e) {
  return static_cast<std::int64_t>(e.zo.gradient_accumulation_steps) * 2 *
         static_cast<std::int64_t>(e.plan.units.size());
}

json json_at_scale(const Explained& e, const Args& a);

// --format json: the run's settings.
void json_settings(const Explained& e, json& j) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  const dist::ZeroOptions& zo = e.zo;
  const int N = e.N;
  const nn::GPTConfig& cfg = e.cfg;
  j["model"] = cfg.to_json();  // what a checkpoint of this model records (nn::GPTConfig)
  j["model"]["params"] = L.numel();
  j["world_size"] = N;
  j["zero_stage"] = zo.stage;
  j["dtype"] = std::string(dtype_name(zo.dtype));
  j["reduce_scatter"] = zo.reduce_scatter;
  j["reduce_in_fp32"] = zo.reduce_in_fp32;
  j["reduce_scatter_with_fp32_accumulation"] = zo.reduce_scatter_with_fp32_accumulation;
  j["zero_quantized_gradients_block_size"] = zo.quantized_gradients_block;  // 0: off
  j["zero_quantized_gradients_error_feedback"] = zo.quantized_gradients_error_feedback;
  j["overlap_comm"] = zo.overlap_comm;
  j["gradient_accumulation_steps"] = zo.gradient_accumulation_steps;
  j["reduce_bucket_size"] = plan.options.reduce_bucket_size;
  j["allgather_bucket_size"] = plan.options.allgather_bucket_size;
  j["stage3_prefetch_bucket_size"] = zo.stage3_prefetch_bucket_size;
  j["stage3_max_live_parameters"] = zo.stage3_max_live_parameters;
  j["numel"] = L.numel();
  j["padded_numel"] = L.padded_numel();
  j["padding"] = L.padding();
  j["partition_size"] = L.largest_partition_size();  // the largest; "partitions" lists each
}

// --format json: every parameter with its owners, and every rank's partition.
void json_layout(const Explained& e, json& j) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  const int N = e.N;
  json params = json::array();
  for (const auto& p : L.params()) {
    json owners = json::array();
    for (const auto& s : p.slices)
      owners.push_back(
          {{"rank", s.rank}, {"flat_offset", s.flat_offset}, {"param_offset", s.param_offset}, {"length", s.length}});
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"offset", p.offset},
                      {"numel", p.numel},
                      {"decay", p.decay},
                      {"owners", owners}});
  }
  j["params"] = params;
  json parts = json::array();
  for (int r = 0; r < N; ++r) {
    json slices = json::array();
    for (const auto& s : L.owned(r))
      slices.push_back({{"param", L.params()[s.param].name}, {"flat_offset", s.flat_offset}, {"length", s.length}});
    parts.push_back({{"rank", r},
                     {"begin", L.partition_begin(r)},
                     {"end", L.partition_end(r)},
                     {"real", L.partition_real_numel(r)},
                     {"padding", L.partition_size(r) - L.partition_real_numel(r)},
                     {"slices", slices}});
  }
  j["partitions"] = parts;
}

// --format json: the buckets (with their modelled time), the hook order and the bucket pool.
void json_buckets(const Explained& e, const Args& a, json& j) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  const int N = e.N;
  const std::vector<std::size_t>& order = e.order;
  const std::vector<std::size_t>& ready_after = e.ready_after;
  const bool timed = e.timed;
  json buckets = json::array();
  for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
    const auto& b = plan.buckets[k];
    json names = json::array();
    for (std::size_t i : b.params) names.push_back(L.params()[i].name);
    buckets.push_back({{"index", b.index},
                       {"begin", b.begin},
                       {"end", b.end},
                       {"counts", b.counts},
                       {"params", names},
                       {"ready_after_hooks", ready_after[k]}});
    if (timed && N > 1) {
      const BucketTime t = bucket_time(plan, b, a.bandwidth, a.latency);
      buckets.back()["modelled_latency_s"] = t.latency_s;
      buckets.back()["modelled_bandwidth_s"] = t.bandwidth_s;
      buckets.back()["bus_bytes"] = t.bus_bytes;
    }
  }
  j["buckets"] = buckets;
  json hooks = json::array();
  for (std::size_t i : order) hooks.push_back(L.params()[i].name);
  j["hook_order"] = hooks;
  j["pool_buffers"] = plan.pool_buffers;
}

// --format json: stage 3's gather units (empty at stages 0-2).
void json_gather_units(const Explained& e, json& j) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  json units = json::array();  // stage 3's per-module gather plan (empty at stages 0-2)
  for (const dist::GatherUnit& u : plan.units) {
    json names = json::array();
    for (std::size_t i = u.first_param; i < u.end_param; ++i) names.push_back(L.params()[i].name);
    units.push_back({{"name", u.name},
                     {"begin", u.begin},
                     {"end", u.end},
                     {"numel", u.size()},
                     {"counts", L.range_counts(u.begin, u.end)},
                     {"params", names}});
  }
  j["gather_units"] = units;
}

// --format json: memory and traffic, beside the formulas, for this scheme and every other.
void json_costs(const Explained& e, const Args& a, json& j) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::ZeroOptions& zo = e.zo;
  const int N = e.N;
  const double psi = e.psi;
  const bool timed = e.timed;
  const dist::StepTraffic& traffic = e.traffic;
  const double baseline = e.baseline;
  const std::vector<dist::FlatLayout::Entry>& entries = e.entries;
  j["memory_bytes"] = memory_json(plan.memory());
  j["memory_bytes"]["activations"] = e.activations.total();  // as train_gpt's metrics measure it
  if (e.zo.stage == 3) j["stage3_all_gathers_per_step"] = stage3_all_gathers_per_step(e);
  j["activations_bytes"] = {{"recompute", autograd::recompute_name(e.recompute)},
                            {"micro_batch", e.micro_batch},
                            {"held_for_backward", e.activations.held},
                            {"recompute_working_set", e.activations.recompute},
                            {"total", e.activations.total()}};
  j["memory_formula_bytes"] = memory_json(dist::expected_memory(zo.stage, zo.dtype, psi, N));
  j["traffic_bytes_per_step"] = traffic_json(traffic);
  j["baseline_bytes_per_step"] = baseline;
  json schemes = json::array();
  for (const Scheme& s : kSchemes) {
    const dist::ZeroPlan p = dist::plan_zero(entries, N, row_options(e, s.stage, s.reduce_scatter));
    json row = {{"scheme", s.name},
                {"zero_stage", s.stage},
                {"reduce_scatter", s.reduce_scatter},
                {"memory_bytes", memory_json(p.memory())},
                {"memory_formula_bytes", memory_json(dist::expected_memory(s.stage, zo.dtype, psi, N))},
                {"traffic_bytes_per_step", traffic_json(p.traffic())}};
    if (s.stage == 3) row["stage3_max_live_parameters"] = p.options.stage3_max_live_parameters;  // row_options
    if (timed) row["comm_time_s_per_step"] = dist::step_comm_time_s(p, a.bandwidth, a.latency);
    schemes.push_back(row);
  }
  j["schemes"] = schemes;
  json paper = {{"params", kPaperPsi}, {"world_size", kPaperN}, {"dtype", "f16"}};
  for (int stage = 0; stage <= 3; ++stage)
    paper["model_states_bytes"].push_back({{"zero_stage", stage}, {"bytes", paper_example_bytes(stage)}});
  j["paper_example"] = paper;
  if (timed) {
    j["bandwidth"] = a.bandwidth;
    j["latency"] = a.latency;
    j["comm_time_s_per_step"] = dist::step_comm_time_s(plan, a.bandwidth, a.latency);
    j["at_scale"] = json_at_scale(e, a);
  }
}

// The text's scale table as JSON (with --bandwidth): for this model and every --params size, at N = 1, 2,
// 4, ..., 1024 and stages 0-3, the model states per rank, the modelled communication time, and the
// plan's bucket count and calls per collective per step (reduce-scatter / all-reduce buckets,
// all-gather chunks or stage-3 units).
json json_at_scale(const Explained& e, const Args& a) {
  std::vector<double> sizes{e.psi};
  sizes.insert(sizes.end(), a.params.begin(), a.params.end());
  json out = json::array();
  for (double P : sizes) {
    const std::vector<dist::FlatLayout::Entry> one{{"params", {static_cast<std::int64_t>(P)}, true}};
    json rows = json::array();
    for (int n = 1; n <= 1024; n *= 2)
      for (int stage = 0; stage <= 3; ++stage) {
        dist::ZeroOptions o = e.zo;
        o.stage = stage;
        o.reduce_scatter = true;
        o.stage3_max_live_parameters = std::max(o.stage3_max_live_parameters, static_cast<std::int64_t>(P));
        const dist::ZeroPlan p = dist::plan_zero(one, n, o);
        const dist::StepTraffic t = p.traffic();
        json calls = json::object();
        for (int c = 0; c < dist::kNumCollectives; ++c)
          if (t.calls[c] > 0) calls[std::string(dist::collective_name(static_cast<Collective>(c)))] = t.calls[c];
        rows.push_back({{"world_size", n},
                        {"zero_stage", stage},
                        {"model_states_bytes", dist::expected_memory(stage, e.zo.dtype, P, n).model_states()},
                        {"comm_time_s_per_step", dist::step_comm_time_s(p, a.bandwidth, a.latency)},
                        {"buckets", p.buckets.size()},
                        {"calls_per_step", calls}});
      }
    out.push_back({{"params", P}, {"rows", rows}});
  }
  return out;
}

// The planner's input: this model, ranks, batch and ZeRO options, with --memory-budget and the link.
examples::PlannerInput planner_input(const Explained& e, const Args& a) {
  examples::PlannerInput in;
  in.cfg = e.cfg;
  in.entries = e.entries;
  in.world_size = e.N;
  in.batch = e.batch;
  in.base = e.zo;
  in.budget_bytes = e.budget_bytes;
  if (!a.runtime_overhead.empty()) in.runtime_overhead_bytes = runtime_overhead_bytes(a);
  in.flops_per_s = a.compute_flops;
  in.bandwidth = a.bandwidth;
  in.latency = a.latency;
  return in;
}

// --memory-budget in the JSON: every configuration, those that fit first, fastest first.
json json_memory_plan(const Explained& e, const Args& a) {
  const examples::PlannerInput in = planner_input(e, a);
  json rows = json::array();
  for (const examples::PlanChoice& c : examples::plan_configurations(in))
    rows.push_back({{"zero_stage", c.stage},
                    {"recompute", autograd::recompute_name(c.recompute)},
                    {"gradient_accumulation_steps", c.gradient_accumulation_steps},
                    {"micro_batch", c.micro_batch},
                    {"reduce_bucket_size", c.reduce_bucket_size},
                    {"stage3_max_live_parameters", c.stage3_max_live_parameters},
                    {"memory_bytes", c.memory_bytes},
                    {"activations_bytes", c.activation_bytes},
                    {"transient_bytes", c.transient_bytes},
                    {"peak_rss_bytes", c.rss_bytes},
                    {"fits", examples::fits(c, in)},
                    {"step_s", c.step_s()}});
  return {{"budget_bytes", e.budget_bytes}, {"runtime_overhead_bytes", in.runtime_overhead_bytes},
          {"configurations", rows},
          {"choice", !rows.empty() && rows[0]["fits"].get<bool>() ? rows[0] : json()}};
}

json json_read_plan(const Explained& e) {
  const dist::Checkpoint& c = e.resume;
  json ranks = json::array();
  for (const RankReads& rr : e.reads) {
    json reads = json::array();
    for (const dist::ReadRange& r : rr.reads)
      reads.push_back({{"file", r.file}, {"tensor", r.tensor}, {"offset", r.offset}, {"bytes", r.bytes},
                       {"flat_begin", r.flat_begin}, {"flat_end", r.flat_end}});
    ranks.push_back({{"region_begin", rr.begin}, {"region_end", rr.end}, {"reads", reads}});
  }
  return {{"checkpoint", c.dir}, {"world_size", e.N}, {"zero_stage", e.plan.options.stage}, {"ranks", ranks}};
}

void print_read_plan(const Explained& e) {
  const dist::Checkpoint& c = e.resume;
  const std::vector<RankReads>& plan = e.reads;
  fmt::print("\n== resume read plan: loading {} (saved by {} rank(s)) on {} rank(s) at stage {}; per rank, "
             "file tensor [first byte, end byte) ==\n",
             c.dir, c.state.value("world_size", 0), e.N, e.plan.options.stage);
  for (std::size_t r = 0; r < plan.size(); ++r) {
    std::uint64_t total = 0;
    std::string line;
    for (const dist::ReadRange& x : plan[r].reads) {
      line += fmt::format("{}{} {} [{}, {})", line.empty() ? "" : "; ", x.file, x.tensor, x.offset,
                          x.offset + x.bytes);
      total += x.bytes;
    }
    fmt::print("rank {}: elements [{}, {}), {} bytes: {}\n", r, plan[r].begin, plan[r].end, total,
               line.empty() ? "nothing" : line);
  }
}

void print_json(const Explained& e, const Args& a) {
  json j;
  json_settings(e, j);
  json_layout(e, j);
  j["muon"] = examples::json_muon(e.plan);
  json_buckets(e, a, j);
  json_gather_units(e, j);
  json_costs(e, a, j);
  if (e.budget_bytes > 0) j["memory_plan"] = json_memory_plan(e, a);
  if (!a.read_plan.empty()) j["read_plan"] = json_read_plan(e);
  std::cout << j.dump(2) << "\n";
}

// The model and ZeRO settings, and how reductions travel.
void print_header(const Explained& e) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  const dist::ZeroOptions& zo = e.zo;
  const int N = e.N;
  const nn::GPTConfig& cfg = e.cfg;
  std::vector<std::string> variant;  // the model options' values: "layernorm", ...
  for (const nn::ModelOption& o : nn::model_options()) variant.push_back(cfg.*o.field);
  fmt::print("model: {} layers, {} heads, {} channels, {}, block {}, vocab {}: Psi = {} parameters ({} tensors)\n",
             cfg.n_layer, cfg.n_head, cfg.n_embd, fmt::join(variant, ", "), cfg.block_size, cfg.vocab_size, L.numel(),
             L.params().size());
  fmt::print(
      "zero: stage {}, {}, {} rank(s), reduce_scatter {}, overlap_comm {}, GAS {}, reduce_bucket_size {}, "
      "allgather_bucket_size {}{}\n\n",
      zo.stage, dtype_name(zo.dtype), N, zo.reduce_scatter, zo.overlap_comm, zo.gradient_accumulation_steps,
      plan.options.reduce_bucket_size, plan.options.allgather_bucket_size,
      zo.stage == 3 ? fmt::format(", stage3_prefetch_bucket_size {}, stage3_max_live_parameters {}",
                                  zo.stage3_prefetch_bucket_size, zo.stage3_max_live_parameters)
                    : "");
  if (zo.reduce_scatter_with_fp32_accumulation && zo.dtype != DType::f32 && !zo.reduce_in_fp32)
    fmt::print("reductions: {} slices sent straight to their owner (all-to-all) and summed there in fp32, rounded "
               "once; the same bytes as the ring\n\n",
               dtype_name(zo.dtype));
  if (zo.quantized_gradients_block > 0)
    fmt::print("reductions: int8 blocks of {} elements with one fp32 scale each, sent straight to their owner "
               "(all-to-all) and summed there in fp32{}\n\n",
               zo.quantized_gradients_block,
               zo.quantized_gradients_error_feedback ? "; error feedback keeps an int8 residual of every element sent"
                                                     : "");
}

// The flat buffer, parameter by parameter, and each rank's partition.
void print_layout(const Explained& e) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  const int N = e.N;
  fmt::print("== flat layout: {} elements + {} padding = {} (a multiple of 2N = {}) ==\n", L.numel(), L.padding(),
             L.padded_numel(), L.alignment());
  // Stage 0 partitions nothing: every rank holds and steps every parameter whole.
  const bool stage0 = plan.options.stage == 0;
  fmt::print("{:>3}  {:<22} {:<12} {:>21}  {}\n", "#", "parameter", "shape", "flat range",
             stage0 ? "owners (stage 0: every rank holds and steps all)" : "owners (rank: elements)");
  for (std::size_t i = 0; i < L.params().size(); ++i) {
    const auto& p = L.params()[i];
    std::string owners = stage0 && !p.slices.empty() ? "every rank" : "";
    if (!stage0)
      for (const auto& s : p.slices) owners += fmt::format("{}{}: {}", owners.empty() ? "" : ", ", s.rank, s.length);
    fmt::print("{:>3}  {:<22} {:<12} {:>21}  {}\n", i, p.name, shape_str(p.shape),
               fmt::format("[{}, {})", p.offset, p.end()), owners.empty() ? "-" : owners);
  }

  const bool uneven = L.largest_partition_size() * N != L.padded_numel();
  fmt::print("\n== partitions: {}{} elements per rank{} ==\n", uneven ? "" : "P = ", examples::partition_sizes(L),
             stage0   ? " (stage 0 shards nothing: every rank holds every element)"
             : uneven ? " (the boundaries moved to the edges of Muon's matrices)"
                      : "");
  for (int r = 0; r < N; ++r) {
    if (examples::elided(static_cast<std::size_t>(r), static_cast<std::size_t>(N), "ranks", "partitions")) continue;
    const auto& owned = L.owned(r);
    std::string names;
    if (!owned.empty()) {
      const auto& f = L.params()[owned.front().param];
      const auto& l = L.params()[owned.back().param];
      names = fmt::format("{} slice(s): {} .. {}", owned.size(), f.name, l.name);
    } else {
      names = L.partition_size(r) == 0 ? "no slices (empty)" : "no slices (padding only)";
    }
    fmt::print("rank {}: [{}, {}), {} real + {} padding; {}\n", r, L.partition_begin(r), L.partition_end(r),
               L.partition_real_numel(r), L.partition_size(r) - L.partition_real_numel(r), names);
  }
}

// The buckets: ranges, per-rank counts, when each can leave, their modelled time; the bucket pool.
void print_buckets(const Explained& e, const Args& a) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  const dist::ZeroOptions& zo = e.zo;
  const int N = e.N;
  const std::vector<std::size_t>& order = e.order;
  const std::vector<std::size_t>& ready_after = e.ready_after;
  const bool timed = e.timed;
  fmt::print("\n== buckets: {} of <= {} elements, cut from the end; issued 0, 1, 2, ... on every rank ==\n",
             plan.buckets.size(), plan.options.reduce_bucket_size);
  fmt::print("reductions: {} per optimizer step ({}), by {}\n", zo.stage >= 2 ? zo.gradient_accumulation_steps : 1,
             zo.stage >= 2 ? "every micro-step" : "at the accumulation boundary",
             zo.stage == 0 || !zo.reduce_scatter ? "all_reduce" : "reduce_scatter");
  for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
    if (examples::elided(k, plan.buckets.size(), "buckets", "buckets")) continue;
    const auto& b = plan.buckets[k];
    const std::string covers = b.params.empty()
                                   ? "padding only"
                                   : fmt::format("{} .. {} ({} params)", L.params()[b.params.front()].name,
                                                 L.params()[b.params.back()].name, b.params.size());
    fmt::print("bucket {}: [{}, {}) {} elements; {}; per-rank counts {}; ready after hook {} of {}\n", b.index,
               b.begin, b.end, b.size(), covers, counts_text(b.counts), ready_after[k], order.size());
    if (timed && N > 1) {
      const BucketTime t = bucket_time(plan, b, a.bandwidth, a.latency);
      fmt::print("          modelled {}: latency {} + bandwidth {} (latency {:.1f}% of bandwidth), bus bandwidth "
                 "{:.3g} B/s\n",
                 dist::collective_name(t.collective), human_seconds(t.latency_s), human_seconds(t.bandwidth_s),
                 t.bandwidth_s > 0 ? 100.0 * t.latency_s / t.bandwidth_s : 0.0,
                 t.bus_bytes / (t.latency_s + t.bandwidth_s));
    }
  }
  if (zo.stage >= 2)
    fmt::print("stage-{} bucket pool: {} buffer(s) of {} elements{}\n", zo.stage, plan.pool_buffers,
               plan.pool_buffer_numel,
               zo.overlap_comm ? " (double buffer: one bucket reducing while the next is filled)" : "");
}

// Stage 3's per-module gather plan (Note [Gather units] and Note [Gathering on use]).
void print_gather_plan(const Explained& e) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  const dist::ZeroOptions& zo = e.zo;
  if (zo.stage == 3) {
    // The per-module gather plan (Note [Gather units] and Note [Gathering on use]).
    const auto largest = std::max_element(plan.units.begin(), plan.units.end(),
                                          [](const dist::GatherUnit& x, const dist::GatherUnit& y) {
                                            return x.size() < y.size();
                                          });
    fmt::print("\n== gather plan (stage 3): {} units; each rank keeps only its partition of the parameters "
               "({} elements) and all-gathers a unit before its forward and again before its backward, freeing it "
               "after ==\n",
               plan.units.size(), examples::partition_sizes(L));
    const std::size_t U = plan.units.size();
    fmt::print("all-gathers per step: {} = GAS {} x ({} in the forward: every unit, and wte again for the tied LM "
               "head; {} in the backward: every unit but wte, which the forward's last read left gathered); "
               "recompute adds none (a block's re-run reads the unit its backward gathers)\n",
               stage3_all_gathers_per_step(e), zo.gradient_accumulation_steps, U + 1, U - 1);
    // The bound counts a unit's flat range, Muon's gaps inside it included (dist::GatherUnit::size()).
    const auto real = [&](const dist::GatherUnit& g) {
      std::int64_t n = 0;
      for (std::size_t i = g.first_param; i < g.end_param; ++i) n += L.params()[i].numel;
      return n;
    };
    std::int64_t all = 0;
    for (const dist::GatherUnit& g : plan.units) all += g.size();
    const bool gaps = all != L.numel();
    fmt::print("live bound: stage3_max_live_parameters {} elements (largest unit {}: {} elements{}; all units: {} "
               "elements{}); prefetch: stage3_prefetch_bucket_size {} elements of the next units in last step's order\n",
               zo.stage3_max_live_parameters, largest->name, largest->size(),
               gaps ? fmt::format(" with its gaps, {} real", real(*largest)) : "", all,
               gaps ? fmt::format(" with their gaps, {} real", L.numel()) : "", zo.stage3_prefetch_bucket_size);
    for (std::size_t u = 0; u < plan.units.size(); ++u) {
      const dist::GatherUnit& g = plan.units[u];
      const std::string covers = g.end_param - g.first_param == 1
                                     ? L.params()[g.first_param].name
                                     : fmt::format("{} .. {} ({} params)", L.params()[g.first_param].name,
                                                   L.params()[g.end_param - 1].name, g.end_param - g.first_param);
      fmt::print("unit {}: {:<10} {:>21} {:>9} elements; {}; per-rank counts {}\n", u,
                 g.name.empty() ? "(root)" : g.name, fmt::format("[{}, {})", g.begin, g.end), g.size(), covers,
                 counts_text(L.range_counts(g.begin, g.end)));
    }
  }
}

// Activation memory per rank, every recompute mode, the chosen one marked (docs/zero.md, section 9).
void print_activations(const Explained& e) {
  fmt::print("\n== activations per rank: micro-batch {} x {} tokens, one forward and backward (f32 on cpu; "
             "docs/zero.md, section 9) ==\n",
             e.micro_batch, e.cfg.block_size);
  for (autograd::Recompute m : {autograd::Recompute::none, autograd::Recompute::full, autograd::Recompute::selective}) {
    const nn::ActivationBytes b = nn::activation_bytes(e.cfg, e.micro_batch, m);
    fmt::print("{} recompute {:<9}: {} = held for backward {} + recompute working set {}\n",
               m == e.recompute ? "*" : " ", autograd::recompute_name(m), bytes_gib_gb(b.total()), mib(b.held),
               mib(b.recompute));
  }
}

// Memory per rank at every stage, beside the ZeRO paper's formula and its worked example.
void print_memory(const Explained& e) {
  const dist::ZeroPlan& plan = e.plan;
  const dist::FlatLayout& L = plan.layout;
  const dist::ZeroOptions& zo = e.zo;
  const int N = e.N;
  const double psi = e.psi;
  const std::vector<dist::FlatLayout::Entry>& entries = e.entries;
  fmt::print("\n== memory per rank (this layout | ZeRO paper formula, Psi = {}, N = {}; last column: the paper's "
             "example, Psi = 7.5e9 with 16-bit Adam on N = 64, in GB of 1e9 bytes) ==\n",
             L.numel(), N);
  for (int stage = 0; stage <= 3; ++stage) {
    const auto have = dist::plan_zero(entries, N, row_options(e, stage, zo.reduce_scatter)).memory();
    const auto want = dist::expected_memory(stage, zo.dtype, psi, N);
    fmt::print("{} stage {}: params {} | {}, grads {} | {}, optimizer {} | {}, model states {} | {}, buckets {}, "
               "gathered {}{}; paper {:.3g} GB\n",
               stage == zo.stage ? "*" : " ", stage, mib(have.params), mib(want.params), mib(have.grads),
               mib(want.grads), mib(have.optimizer_states), mib(want.optimizer_states), mib(have.model_states()),
               mib(want.model_states()), mib(have.buckets), mib(have.gathered),
               have.residual > 0 ? fmt::format(", error-feedback residual {}", mib(have.residual)) : "",
               paper_example_bytes(stage) / 1e9);
  }
  const bool raised = zo.stage != 3 && e.largest_unit > zo.stage3_max_live_parameters;
  fmt::print("(gathered: stage 3's working memory, the most gathered parameters alive at once, at most "
             "stage3_max_live_parameters = {} elements{}; not a model state)\n",
             zo.stage3_max_live_parameters,
             raised ? fmt::format(", which is less than the largest gather unit: the stage-3 row uses {}, the least "
                                  "that runs", e.largest_unit)
                    : "");
  print_activations(e);
}

// Traffic per step of every scheme, against stage 0.
void print_traffic(const Explained& e, const Args& a) {
  const dist::ZeroOptions& zo = e.zo;
  const int N = e.N;
  const double baseline = e.baseline;
  const bool timed = e.timed;
  const std::vector<dist::FlatLayout::Entry>& entries = e.entries;
  fmt::print("\n== traffic per optimizer step per rank (bus bytes; baseline = stage 0 = {:.0f} bytes) ==\n",
             baseline);
  for (const Scheme& s : kSchemes) {
    const dist::ZeroPlan p = dist::plan_zero(entries, N, row_options(e, s.stage, s.reduce_scatter));
    const auto t = p.traffic();
    const bool chosen = s.stage == zo.stage && (s.stage == 0 || s.reduce_scatter == zo.reduce_scatter);
    fmt::print(
        "{} {:<30} all_reduce {:>10.0f}  reduce_scatter {:>10.0f}  all_gather {:>10.0f}  total {:>10.0f}  "
        "{:.3f}x{}\n",
        chosen ? "*" : " ", s.name, t[Collective::all_reduce], t[Collective::reduce_scatter],
        t[Collective::all_gather], t.total(), baseline > 0 ? t.total() / baseline : 0.0,
        timed ? fmt::format("  ~{}", human_seconds(dist::step_comm_time_s(p, a.bandwidth, a.latency))) : "");
  }
  fmt::print("(stage 3: the gradients reduce-scattered, Psi, and every gather unit all-gathered before its forward "
             "and again before its backward, 2 Psi, every micro-step: 3 Psi, the ZeRO paper's 1.5x, section 7.2.2)\n");
  if (N == 1) fmt::print("(one rank sends nothing: every factor has (N-1)/N)\n");
}

// With --bandwidth: memory and modelled communication time of every stage as N and Psi grow.
void print_at_scale(const Explained& e, const Args& a) {
  const dist::ZeroOptions& zo = e.zo;
  const double psi = e.psi;
  fmt::print("\n== at scale: alpha-beta ring model, {:.3g} bytes/s per link, latency {:.3g} s ==\n", a.bandwidth,
             a.latency);
  std::vector<double> sizes{psi};
  sizes.insert(sizes.end(), a.params.begin(), a.params.end());
  const double b = static_cast<double>(dtype_size(zo.dtype));
  for (double P : sizes) {
    // A model of P parameters as one tensor: padding and bucket edges matter little at scale.
    const std::vector<dist::FlatLayout::Entry> one{{"params", {static_cast<std::int64_t>(P)}, true}};
    fmt::print("Psi = {:.4g} ({} = {:.2f} GB of {} weights; memory below in GiB of 2^30 bytes = 1.074 GB, the ZeRO "
               "paper's formula{}):\n",
               P, human_bytes(b * P), b * P / 1e9, dtype_name(zo.dtype),
               zo.muon && zo.stage > 0 ? ", equal partitions: Muon's largest one holds more (the memory table above)"
                                       : "");
    fmt::print("  {:>5}  {:>12} {:>12} {:>12} {:>12}   {:>10} {:>10} {:>10} {:>10} {:>13} {:>12}\n", "N",
               "mem stage 0", "stage 1", "stage 2", "stage 3", "comm s0", "s1", "s2", "s3", "s1/2 no-rs",
               "s2 Psi/8 bk");
    for (int n = 1; n <= 1024; n *= 2) {
      std::string mem, comm;
      for (int stage = 0; stage <= 3; ++stage) {
        dist::ZeroOptions o = zo;
        o.stage = stage;
        o.reduce_scatter = true;
        // Stage 3's one gather unit is the whole tensor here; the bound must hold it (it changes no byte).
        o.stage3_max_live_parameters = std::max(o.stage3_max_live_parameters, static_cast<std::int64_t>(P));
        const auto m = dist::expected_memory(stage, zo.dtype, P, n);
        mem += fmt::format(" {:>12}", human_bytes(m.model_states()));
        comm += fmt::format(
            " {:>10}", human_seconds(dist::step_comm_time_s(dist::plan_zero(one, n, o), a.bandwidth, a.latency)));
      }
      dist::ZeroOptions no_rs = zo;  // the reduce_scatter = false scheme (stage 1 or 2: the same traffic at GAS 1)
      no_rs.stage = 1;
      no_rs.reduce_scatter = false;
      comm += fmt::format(
          " {:>13}", human_seconds(dist::step_comm_time_s(dist::plan_zero(one, n, no_rs), a.bandwidth, a.latency)));
      // Stage 2 with the buckets of before Note [Automatic bucket size] grew them with N: Psi/8.
      dist::ZeroOptions fixed = zo;
      fixed.stage = 2;
      fixed.reduce_scatter = true;
      fixed.link = {};
      comm += fmt::format(
          " {:>12}", human_seconds(dist::step_comm_time_s(dist::plan_zero(one, n, fixed), a.bandwidth, a.latency)));
      fmt::print("  {:>5} {}  {}\n", n, mem, comm);
    }
  }
}

void print_text(const Explained& e, const Args& a) {
  print_header(e);
  print_layout(e);
  examples::print_muon(e.plan);
  print_buckets(e, a);
  print_gather_plan(e);
  print_memory(e);
  print_traffic(e, a);
  if (e.timed) print_at_scale(e, a);
  if (e.budget_bytes > 0) {
    const examples::PlannerInput in = planner_input(e, a);
    examples::print_plan(in, examples::plan_configurations(in));
  }
  if (!a.read_plan.empty()) print_read_plan(e);
}

int run(const Args& a, const CLI::App& app) {
  if (!a.svg.empty()) examples::probe_file("--svg", a.svg, false);  // before any work, as train_gpt
  const Explained e = explain(a, app);
  if (a.format == "json")
    print_json(e, a);
  else
    print_text(e, a);
  if (!a.svg.empty()) write_svg(a.svg, e.plan);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "Explain a ZeRO layout: ownership, buckets, memory and traffic per rank, for train_gpt's model "
      "(no training, no mpirun)"};
  app.add_option("--data", a.data, "text file whose distinct bytes are the vocabulary");
  app.add_option("--vocab-size", a.vocab_size, "vocabulary size instead of --data (default 65)");
  examples::add_model_options(app, a.model);
  app.add_option("--config", a.config, "DeepSpeed-style JSON config (docs/config.md); flags below override it");
  app.add_option("--dtype", a.dtype, "model dtype: fp32, fp16 or bf16")->capture_default_str();
  app.add_option("--batch", a.batch, "train_gpt's global batch: sequences per optimizer step over all ranks (for "
                 "the activation memory; not given and not splitting into the ranks: one sequence per micro-step)")
      ->capture_default_str();
  examples::add_setting_flags(app, a.settings, examples::FlagSet::layout);
  app.add_option("--world-size", a.world_size, "number of data-parallel ranks (N), 1 to 4096")->capture_default_str();
  app.add_option("--memory-budget", a.memory_budget,
                 "per-rank memory budget (2GiB, 1.5GB, 800MiB): list the configurations that fit and choose one");
  app.add_option("--runtime-overhead", a.runtime_overhead,
                 "the planner's per-process memory beside what it counts (the program, libraries, data, allocator "
                 "cache); default 64MiB, measured (docs/zero.md section 9); 0 to count tensors only");
  app.add_option("--read-plan", a.read_plan,
                 "a checkpoint (step or save directory): which byte ranges of which files each of the --world-size "
                 "ranks reads when resuming from it at --zero-stage (docs/checkpoint.md)");
  app.add_option("--compute-flops", a.compute_flops, "FLOP/s of one rank, for the planner's step time")
      ->capture_default_str();
  app.add_option("--bandwidth", a.bandwidth, "link bandwidth in bytes/s for the alpha-beta time model");
  app.add_option("--latency", a.latency, "per-message latency in seconds for the time model")->capture_default_str();
  app.add_option("--params", a.params, "more model sizes (parameters, 1 to 1e13) for the scale table, e.g. 124e6 1.5e9");
  app.add_option("--format", a.format, "text or json")->capture_default_str();
  app.add_option("--svg", a.svg, "draw the flat buffer, partitions and buckets into this SVG file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return examples::parse_error_exit(app, e);
  }
  try {
    return run(a, app);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
