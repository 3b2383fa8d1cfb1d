#include "distributed/run/settings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iterator>

#include "core/check.h"
#include "distributed/run/config.h"

namespace zero::dist {

namespace {

using T = TrainingConfig;
using S = SettingType;

// The table, one section at a time. A row: DeepSpeed key, flag ("" = none), type, default as
// docs/config.md shows it, allowed values, the flag's help line, and the field. Keep docs/config.md's rows
// in this order.
std::vector<Setting> top_level_settings() {
  return {
      {"train_batch_size", "", S::integer, "derived", {}, "sequences per optimizer step, all ranks",
       [](T& c) -> SettingField { return &c.train_batch_size; }},
      {"train_micro_batch_size_per_gpu", "", S::integer, "derived", {}, "sequences per forward/backward, one rank",
       [](T& c) -> SettingField { return &c.train_micro_batch_size_per_gpu; }},
      {"gradient_accumulation_steps", "--grad-accum", S::integer, "derived", {},
       "gradient accumulation steps (micro-batches per optimizer step)",
       [](T& c) -> SettingField { return &c.gradient_accumulation_steps; }, true},
      {"communication_data_type", "--communication-data-type", S::text, "model dtype", {"fp32", "fp16", "bf16"},
       "dtype gradient reductions travel in: fp32, fp16 or bf16 (default: the model dtype; fp32 is more accurate "
       "for a 16-bit model, at twice the bytes)",
       [](T& c) -> SettingField { return &c.communication_data_type; }, true},
      {"gradient_clipping", "--clip", S::number, "`1.0`", {}, "max global gradient norm (0 = off)",
       [](T& c) -> SettingField { return &c.gradient_clipping; }},
      {"collective_timeout_s", "--collective-timeout", S::number, "`300`", {},
       "seconds one collective may take before the job ends with a message naming it (default: "
       "$ZERO_COLLECTIVE_TIMEOUT_S, else the config's collective_timeout_s, else 300)",
       [](T& c) -> SettingField { return &c.collective_timeout_s; }},
      {"nonfinite_grads", "--nonfinite-grads", S::text, "`\"error\"`", {"error", "skip"},
       "fp32/bf16 step with an inf/NaN gradient: error (stop, naming the step) or skip",
       [](T& c) -> SettingField { return &c.nonfinite_grads; }},
      {"nonfinite_skip_limit", "--nonfinite-skip-limit", S::integer, "`1`", {},
       "fp32/bf16 with --nonfinite-grads skip: stop after N consecutive skipped steps (0 = never stop; config "
       "nonfinite_skip_limit)",
       [](T& c) -> SettingField { return &c.nonfinite_skip_limit; }},
  };
}

std::vector<Setting> precision_settings() {
  return {
      {"fp16.enabled", "", S::boolean, "`false`", {}, "f16 weights and gradients with loss scaling",
       [](T& c) -> SettingField { return &c.fp16.enabled; }},
      {"fp16.loss_scale", "", S::number, "`0`", {}, "0: dynamic; > 0: this static scale",
       [](T& c) -> SettingField { return &c.fp16.loss_scale; }},
      {"fp16.initial_scale_power", "", S::integer, "`16`", {}, "dynamic: start at 2^power",
       [](T& c) -> SettingField { return &c.fp16.initial_scale_power; }},
      {"fp16.loss_scale_window", "", S::integer, "`1000`", {}, "clean steps between doublings",
       [](T& c) -> SettingField { return &c.fp16.loss_scale_window; }},
      {"fp16.hysteresis", "", S::integer, "`2`", {}, "overflows tolerated before the scale halves",
       [](T& c) -> SettingField { return &c.fp16.hysteresis; }},
      {"fp16.consecutive_hysteresis", "", S::boolean, "`false`", {}, "refill hysteresis on every clean step",
       [](T& c) -> SettingField { return &c.fp16.consecutive_hysteresis; }},
      {"fp16.min_loss_scale", "", S::number, "`1`", {}, "the scale never halves below this",
       [](T& c) -> SettingField { return &c.fp16.min_loss_scale; }},
      {"fp16.raise_error_at_min_scale", "", S::boolean, "`true`", {}, "stop after overflows at the minimum scale",
       [](T& c) -> SettingField { return &c.fp16.raise_error_at_min_scale; }},
      {"fp16.min_scale_skip_limit", "", S::integer, "`1`", {}, "overflows in a row at the minimum that stop",
       [](T& c) -> SettingField { return &c.fp16.min_scale_skip_limit; }},
      {"bf16.enabled", "", S::boolean, "`false`", {}, "bf16 weights and gradients",
       [](T& c) -> SettingField { return &c.bf16.enabled; }},
  };
}

// Every ZeRO key shapes the plan (Setting::shapes_plan), marked below.
std::vector<Setting> zero_settings() {
  std::vector<Setting> rows = {
      {"zero_optimization.stage", "--zero-stage", S::integer, "`0`", {}, "ZeRO stage: 0 (data parallel), 1, 2 or 3",
       [](T& c) -> SettingField { return &c.zero_optimization.stage; }},
      {"zero_optimization.reduce_bucket_size", "--reduce-bucket-size", S::elements, "automatic", {},
       "elements per gradient bucket (default: automatic)",
       [](T& c) -> SettingField { return &c.zero_optimization.reduce_bucket_size; }},
      {"zero_optimization.allgather_bucket_size", "", S::elements, "automatic", {}, "elements per all-gather chunk",
       [](T& c) -> SettingField { return &c.zero_optimization.allgather_bucket_size; }},
      {"zero_optimization.reduce_scatter", "", S::boolean, "`true`", {}, "reduce-scatter, not all-reduce",
       [](T& c) -> SettingField { return &c.zero_optimization.reduce_scatter; }},
      {"zero_optimization.contiguous_gradients", "", S::boolean, "`true`", {}, "accepted and ignored",
       [](T& c) -> SettingField { return &c.zero_optimization.contiguous_gradients; }},
      {"zero_optimization.overlap_comm", "--overlap-comm", S::boolean, "`false`", {},
       "reduce buckets while backward continues",
       [](T& c) -> SettingField { return &c.zero_optimization.overlap_comm; }},
      {"zero_optimization.reduce_scatter_with_fp32_accumulation", "--reduce-scatter-with-fp32-accumulation",
       S::boolean, "`false`", {},
       "16-bit reductions: send each rank its slice directly (all-to-all) and add the contributions in fp32, "
       "rounding once, instead of rounding at every hop of the ring; the same bytes",
       [](T& c) -> SettingField { return &c.zero_optimization.reduce_scatter_with_fp32_accumulation; }},
      {"zero_optimization.stage3_prefetch_bucket_size", "--stage3-prefetch-bucket-size", S::elements, "`5e7`", {},
       "stage 3: elements of the layers gathered ahead of the one computing (0 = no prefetch; default 5e7)",
       [](T& c) -> SettingField { return &c.zero_optimization.stage3_prefetch_bucket_size; }},
      {"zero_optimization.stage3_max_live_parameters", "--stage3-max-live-parameters", S::elements, "`1e9`", {},
       "stage 3: the most gathered parameter elements alive at once (default 1e9)",
       [](T& c) -> SettingField { return &c.zero_optimization.stage3_max_live_parameters; }},
      {"zero_optimization.zero_quantized_gradients", "--zero-quantized-gradients", S::boolean, "`false`", {},
       "stages 1-3: reduce-scatter gradients as int8 with one fp32 scale per block (all-to-all, summed in fp32 by "
       "the owner): about 1/4 of an fp32 wire's bytes",
       [](T& c) -> SettingField { return &c.zero_optimization.zero_quantized_gradients; }},
      {"zero_optimization.zero_quantized_gradients_block_size", "--zero-quantized-gradients-block-size", S::integer,
       "`256`", {}, "with --zero-quantized-gradients: elements per int8 block (one fp32 scale each)",
       [](T& c) -> SettingField { return &c.zero_optimization.zero_quantized_gradients_block_size; }},
      {"zero_optimization.zero_quantized_gradients_error_feedback", "--zero-quantized-gradients-error-feedback",
       S::boolean, "`false`", {},
       "with --zero-quantized-gradients: carry each step's quantization error into the next (an int8 residual of "
       "every element this rank sends)",
       [](T& c) -> SettingField { return &c.zero_optimization.zero_quantized_gradients_error_feedback; }},
      {"zero_optimization.overlap_param_gather", "--overlap-param-gather", S::boolean, "`false`", {},
       "stages 1, 2: all-gather the updated parameters while the next forward runs",
       [](T& c) -> SettingField { return &c.zero_optimization.overlap_param_gather; }},
  };
  for (Setting& s : rows) s.shapes_plan = true;
  return rows;
}

std::vector<Setting> activation_checkpointing_settings() {
  return {
      {"activation_checkpointing.recompute_granularity", "--recompute", S::text, "`\"none\"`",
       {"none", "full", "selective"},
       "activation recompute per transformer block: none, full (keep only block inputs) or selective (keep also "
       "the GEMM outputs, recompute norms, attention scores, GELU, dropout)",
       [](T& c) -> SettingField { return &c.activation_checkpointing.recompute_granularity; }, true},
  };
}

std::vector<Setting> optimizer_settings() {
  return {
      {"optimizer.type", "--optimizer", S::text, "`\"AdamW\"`", {"adamw", "muon"},
       "adamw, or muon: Muon (Newton–Schulz orthogonalised momentum) for the hidden matrices and AdamW for "
       "embeddings, norms and biases, with the same lr and weight decay (docs/zero.md)",
       [](T& c) -> SettingField { return &c.optimizer_type; }, true},
  };
}

// Note [Section defaults]
// ~~~~~~~~~~~~~~~~~~~~~~~
// train_gpt had its optimizer flags, with nanoGPT's defaults (weight decay 0.1, beta2 0.99, warmup 100),
// before it read DeepSpeed configs; a DeepSpeed "optimizer" section means DeepSpeed's defaults (FusedAdam's,
// torch's AdamW's: weight decay 0, beta2 0.999) for the params it leaves out, and a "scheduler" section
// WarmupCosineLR's warmup_num_steps 1000. Both meanings are kept, in the table:
// such a row has a program default (the file has no section) and a section default (the file has the
// section Setting::present_in names). The merge is
//   program defaults -> the section defaults, when the file has the section -> the file -> the flags,
// and the result is what the run uses. to_json writes every row's value, so a recorded config reads back
// to the same values whichever defaults would apply: without a section it is written with "type": null,
// which reads back as no section (Note [Optimizer type without a section] in config.cpp). A config
// recorded before these rows were in the table (optimizer {"type": T, "params": null}, no scheduler)
// reads back with the program defaults, which its run used unless a flag replaced them (train_gpt then
// adds the values from its state.json: examples/resume_settings.h, recorded_config). --min-lr has no row:
// DeepSpeed has no absolute floor (cos_min_ratio is a fraction of lr); it stays train_gpt's flag.
std::vector<Setting> optimizer_params_settings() {
  const auto section = [](Setting s, nlohmann::json value, const char* text) {
    s.present_in = "optimizer";
    s.section_default = std::move(value);
    s.section_default_text = text;
    return s;
  };
  const auto beta = [&](int i, const char* flag, double in_section) {
    Setting s = section({"optimizer.params.betas", flag, S::number, "`[0.9, 0.99]`", {},
                         i == 0 ? "AdamW beta1 (config optimizer.params.betas[0])"
                                : "AdamW beta2 (config optimizer.params.betas[1])",
                         i == 0 ? +[](T& c) -> SettingField { return &c.optimizer->beta1; }
                                : +[](T& c) -> SettingField { return &c.optimizer->beta2; }},
                        in_section, "`[0.9, 0.999]`");
    s.element = i;
    s.array_form = "[beta1, beta2]";
    return s;
  };
  return {
      section({"optimizer.params.lr", "--lr", S::number, "`1e-3`", {}, "peak learning rate (config optimizer.params.lr)",
               [](T& c) -> SettingField { return &c.optimizer->lr; }},
              1e-3, "`1e-3`"),
      beta(0, "--beta1", 0.9),
      beta(1, "--beta2", 0.999),
      section({"optimizer.params.eps", "", S::number, "`1e-8`", {}, "added to Adam's denominator",
               [](T& c) -> SettingField { return &c.optimizer->eps; }},
              1e-8, "`1e-8`"),
      section({"optimizer.params.weight_decay", "--weight-decay", S::number, "`0.1`", {},
               "AdamW decoupled weight decay, matrices only (config optimizer.params.weight_decay)",
               [](T& c) -> SettingField { return &c.optimizer->weight_decay; }},
              0.0, "`0`"),
      {"optimizer.params.adam_w_mode", "", S::boolean, "`true`", {}, "only true: decoupled weight decay",
       [](T& c) -> SettingField { return &c.optimizer->adam_w_mode; }},
      {"optimizer.params.momentum", "", S::number, "`0.95`", {}, "Muon only: momentum of the Muon matrices",
       [](T& c) -> SettingField { return &c.optimizer->momentum; }},
      {"optimizer.params.ns_steps", "", S::integer, "`5`", {}, "Muon only: Newton–Schulz iterations per step",
       [](T& c) -> SettingField { return &c.optimizer->ns_steps; }},
  };
}

std::vector<Setting> scheduler_params_settings() {
  Setting warmup = {"scheduler.params.warmup_num_steps", "--warmup", S::integer, "`100`", {},
                    "linear warm-up steps (config scheduler.params.warmup_num_steps)",
                    [](T& c) -> SettingField { return &c.scheduler->warmup_num_steps; }};
  warmup.present_in = "scheduler";  // Note [Section defaults]
  warmup.section_default = 1000;
  warmup.section_default_text = "`1000`";
  return {warmup};
}

std::vector<Setting> make_table() {
  std::vector<Setting> table = top_level_settings();
  for (auto section : {precision_settings, zero_settings, activation_checkpointing_settings, optimizer_settings,
                       optimizer_params_settings, scheduler_params_settings}) {
    std::vector<Setting> rows = section();
    table.insert(table.end(), std::make_move_iterator(rows.begin()), std::make_move_iterator(rows.end()));
  }
  return table;
}

}  // namespace

std::string Setting::section() const {
  const std::string k = key;
  const auto dot = k.rfind('.');
  return dot == std::string::npos ? "" : k.substr(0, dot);
}

std::string Setting::name() const {
  const std::string k = key;
  const auto dot = k.rfind('.');
  return dot == std::string::npos ? k : k.substr(dot + 1);
}

std::string Setting::pointer() const {
  std::string p = std::string("/") + key;
  std::replace(p.begin(), p.end(), '.', '/');
  return element < 0 ? p : p + "/" + std::to_string(element);
}

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = make_table();
  return table;
}

const Setting* find_setting(std::string_view key) {
  for (const Setting& s : settings())
    if (key == s.key) return &s;
  return nullptr;
}

const Setting* find_setting_by_flag(std::string_view flag) {
  for (const Setting& s : settings())
    if (*s.flag != '\0' && flag == s.flag) return &s;
  return nullptr;
}

const Setting* find_setting_by_pointer(std::string_view pointer) {
  for (const Setting& s : settings())
    if (pointer == s.pointer()) return &s;
  return nullptr;
}

std::string to_lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

nlohmann::json flag_json(const Setting& s, const std::string& text) {
  const auto number = [&](const char* what) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    ZERO_CHECK(!text.empty() && *end == '\0', "{} must be {}, got '{}'", s.flag, what, text);
    return v;
  };
  switch (s.type) {
    case S::boolean:
      ZERO_CHECK(text == "true" || text == "false", "{} must be true or false, got '{}'", s.flag, text);
      return text == "true";
    case S::integer:
    case S::elements: {
      const double v = number(s.type == S::integer ? "an integer" : "a whole number of elements");
      ZERO_CHECK(std::isfinite(v) && std::floor(v) == v && std::fabs(v) <= 9.0e15, "{} must be {}, got {}", s.flag,
                 s.type == S::integer ? "an integer" : "a whole number of elements", text);
      return static_cast<std::int64_t>(v);
    }
    case S::number: return number("a number");
    case S::text: break;
  }
  // An allowed value in any case ("AdamW" for adamw, as --help shows the default), stored as the table spells it.
  for (const std::string& a : s.allowed)
    if (to_lower(a) == to_lower(text)) return a;
  ZERO_CHECK(s.allowed.empty(), "{} must be {}, got '{}'", s.flag, fmt::join(s.allowed, " or "), text);
  return text;
}

nlohmann::json field_json(const SettingField& field) {
  return std::visit(
      [](auto* p) -> nlohmann::json {
        using V = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<V, std::optional<std::int64_t>> || std::is_same_v<V, std::optional<double>> ||
                      std::is_same_v<V, std::optional<std::string>> || std::is_same_v<V, std::optional<bool>>)
          return *p ? nlohmann::json(**p) : nlohmann::json(nullptr);
        else
          return nlohmann::json(*p);
      },
      field);
}

}  // namespace zero::dist
