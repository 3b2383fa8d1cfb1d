#include "distributed/run/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/check.h"

namespace zero::dist {

namespace {

using json = nlohmann::json;

// Largest integer a JSON float (double) holds exactly; integer keys given as floats must stay below it.
constexpr double kMaxExactInt = 9007199254740992.0;  // 2^53

// Every invalid value ends here: one line naming the key and, when parsing a file, the file.
[[noreturn]] void fail(const std::string& source, const std::string& key, const std::string& msg) {
  if (source.empty()) throw Error(fmt::format("invalid config key '{}': {}", key, msg));
  throw Error(fmt::format("invalid config key '{}' in {}: {}", key, source, msg));
}

// Where validate() found the values: a file, and the keys command-line flags set ("--flag value").
struct Where {
  const std::string& file;
  const std::map<std::string, std::string>& flags;
};

// A rule broken after the merge names the flag that set the key, else the file.
[[noreturn]] void fail(const Where& where, const std::string& key, const std::string& msg) {
  if (const auto it = where.flags.find(key); it != where.flags.end())
    throw Error(fmt::format("invalid config key '{}' ({}): {}", key, it->second, msg));
  fail(where.file, key, msg);
}

// "number 1.5", "string \"auto\"", ... for error messages; long values are cut.
std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  // "auto" is a Hugging Face Trainer placeholder that DeepSpeed itself never sees.
  if (v.is_string() && v.get<std::string>() == "auto")
    return fmt::format("{} {} (a Hugging Face Trainer placeholder; give a value, or null for the default)",
                       v.type_name(), text);
  return fmt::format("{} {}", v.type_name(), text);
}

std::string join(const std::string& path, const std::string& key) {
  if (key.empty()) return path;
  return path.empty() ? key : path + "." + key;
}

// Note [Strict config keys]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// DeepSpeed's config models forbid fields they do not define (DeepSpeedConfigModel: pydantic
// `extra = "forbid"`), so a misspelt key is an error there, not a default silently applied. Here too,
// in every section we model (the top level, fp16, bf16, zero_optimization, optimizer, scheduler and
// their params): a key that is neither read by the parser nor listed below is an error naming the key
// and the file, with a "did you mean" for a near miss (at most two edits, a swap counting as one) or
// for a key that belongs to another section. DeepSpeed keys that change nothing about the numbers a
// run computes here (logging, monitoring, offloading, stage-3 tuning, ...) are accepted with one
// warning each (docs/config.md, "Ignored DeepSpeed keys"); DeepSpeed keys that would change the
// training and are not implemented are errors saying so. A section we do not model at all (say
// "tensorboard") is one ignored top-level key: its contents are not looked at.

// DeepSpeed keys accepted and ignored, by section path ("" = the top level).
const std::map<std::string, std::vector<std::string>>& ignored_keys() {
  static const std::map<std::string, std::vector<std::string>> keys = {
      {"",
       {"steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state", "tensorboard", "csv_monitor",
        "wandb", "comet", "comms_logger", "flops_profiler", "timers", "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer", "aio", "checkpoint", "compile",
        "graph_harvesting", "disable_allgather"}},
      {"fp16", {"auto_cast"}},
      {"bf16", {"immediate_grad_update", "check_grad_overflow"}},
      {"bfloat16", {"immediate_grad_update", "check_grad_overflow"}},
      {"zero_optimization",
       {"allgather_partitions", "use_multi_rank_bucket_allreduce", "load_from_fp32_weights", "elastic_checkpoint",
        "ignore_unused_parameters", "round_robin_gradients", "offload_optimizer", "offload_param", "cpu_offload",
        "cpu_offload_param", "cpu_offload_use_pin_memory", "sub_group_size",
        "stage3_param_persistence_threshold", "stage3_model_persistence_threshold", "stage3_max_reuse_distance",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save", "stage3_module_granularity_threshold",
        "stage3_use_all_reduce_for_fetch_params", "memory_efficient_linear", "pipeline_loading_checkpoint",
        "override_module_apply", "log_trace_cache_warnings"}},
      {"optimizer.params", {"torch_adam", "fused"}},
      {"scheduler.params", {"last_batch_iteration"}},
      {"activation_checkpointing", {"synchronize_checkpoint_boundary", "profile"}},
  };
  return keys;
}

// DeepSpeed keys that would change what is computed and that zero.cpp does not implement.
const std::map<std::string, std::vector<std::string>>& unsupported_keys() {
  static const std::map<std::string, std::vector<std::string>> keys = {
      {"",
       {"prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "amp", "data_types", "pipeline",
        "elasticity", "compression_training", "curriculum_learning", "data_efficiency", "progressive_layer_drop",
        "quantize_training", "sparse_attention", "eigenvalue", "hybrid_engine", "autotuning",
        "seq_parallel_communication_data_type", "torch_autocast"}},
      {"fp16", {"fp16_master_weights_and_grads"}},
      {"zero_optimization",
       {"zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
        "mics_shard_size", "mics_hierarchical_params_gather", "legacy_stage1"}},
      {"optimizer.params", {"amsgrad", "bias_correction"}},
  };
  return keys;
}

bool listed(const std::map<std::string, std::vector<std::string>>& table, const std::string& section,
            const std::string& key) {
  const auto it = table.find(section);
  return it != table.end() && std::find(it->second.begin(), it->second.end(), key) != it->second.end();
}

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two adjacent
// characters each cost 1 ("stgae" is one edit from "stage").
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The modelled keys of every section, recorded as the parser reads them (Section::find), for "did you
// mean 'zero_optimization.stage'?" when a key sits in the wrong section. complete_modelled_keys() first
// parses a config that has every section, so the record is complete before it is consulted.
std::map<std::string, std::set<std::string>>& modelled_keys() {
  static std::map<std::string, std::set<std::string>> keys;
  return keys;
}
TrainingConfig parse(const json& j, const std::string& src);
const std::map<std::string, std::set<std::string>>& complete_modelled_keys() {
  static std::once_flag once;
  std::call_once(once, [] {
    parse(json{{"fp16", json::object()},
               {"bf16", json::object()},
               {"zero_optimization", json::object()},
               {"activation_checkpointing", json::object()},
               {"optimizer", {{"type", "AdamW"}, {"params", json::object()}}},
               {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 1}}}}}},
          "");
  });
  return modelled_keys();
}

// One JSON object of the config. Every key read through it is "known"; check_keys() then judges the
// others (Note [Strict config keys]).
class Section {
 public:
  Section(const json& obj, std::string path, const std::string& source, std::vector<std::string>& warnings)
      : obj_(obj), path_(std::move(path)), source_(source), warnings_(warnings) {}

  const std::string& source() const { return source_; }
  std::string key_path(const std::string& key) const { return join(path_, key); }

  // The value of `key`, or nullptr when absent or null (DeepSpeed treats None as "not given").
  const json* find(const std::string& key) {
    known_.insert(key);
    modelled_keys()[path_].insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  bool has(const std::string& key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }

  std::optional<Section> section(const std::string& key) {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_object()) fail(source_, key_path(key), "expected an object, got " + describe(*v));
    return Section(*v, key_path(key), source_, warnings_);
  }

  void read(const std::string& key, bool& out) {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) fail(source_, key_path(key), "expected true or false, got " + describe(*v));
      out = v->get<bool>();
    }
  }

  void read(const std::string& key, double& out) {
    if (const json* v = find(key)) out = as_number(*v, key_path(key));
  }

  void read(const std::string& key, std::string& out) {
    if (const json* v = find(key)) {
      if (!v->is_string()) fail(source_, key_path(key), "expected a string, got " + describe(*v));
      out = v->get<std::string>();
    }
  }

  void read(const std::string& key, std::int64_t& out) {
    if (const json* v = find(key)) out = as_int(*v, key_path(key));
  }

  void read(const std::string& key, int& out) {
    if (const json* v = find(key)) {
      const std::int64_t x = as_int(*v, key_path(key));
      if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
        fail(source_, key_path(key), fmt::format("{} is out of range", x));
      out = static_cast<int>(x);
    }
  }

  template <typename V>
  void read(const std::string& key, std::optional<V>& out) {
    if (!has(key)) {
      find(key);  // a null is known too
      return;
    }
    V v{};
    read(key, v);
    out = v;
  }

  // A setting of the table (distributed/run/settings.h), whatever its field's type.
  void read(const std::string& key, const SettingField& field) {
    std::visit([&](auto* p) { read(key, *p); }, field);
  }

  // Element `element` of the array of `size` values at `key` (Setting::element), into a setting's field;
  // `form` ("[beta1, beta2]") names the array's form in the error.
  void read_element(const std::string& key, int element, std::size_t size, const char* form,
                    const SettingField& field) {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_array() || v->size() != size)
      fail(source_, key_path(key), fmt::format("expected {}, got {}", form, describe(*v)));
    const json one = {{key, (*v)[static_cast<std::size_t>(element)]}};
    Section(one, path_, source_, warnings_).read(key, field);
  }

  double as_number(const json& v, const std::string& key) const {
    if (!v.is_number()) fail(source_, key, "expected a number, got " + describe(v));
    return v.get<double>();
  }

  // An integer, given as a JSON integer or as a whole JSON float (5e8).
  std::int64_t as_int(const json& v, const std::string& key) const {
    if (v.is_number_unsigned()) {
      const std::uint64_t u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(source_, key, fmt::format("{} is out of range", u));
      return static_cast<std::int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d))
        fail(source_, key, fmt::format("expected a whole number, got {}", v.dump()));
      if (std::fabs(d) > kMaxExactInt) fail(source_, key, fmt::format("{} is out of range", v.dump()));
      return static_cast<std::int64_t>(d);
    }
    fail(source_, key, "expected an integer, got " + describe(v));
  }

  // Every key of this object that the parser did not read: a listed DeepSpeed key we ignore (one
  // warning), an unsupported one or an unknown one (an error, with a suggestion when one is near).
  void check_keys() const {
    for (const auto& [key, value] : obj_.items()) {
      if (known_.count(key)) continue;
      const std::string where = source_.empty() ? "" : " in " + source_;
      if (listed(ignored_keys(), path_, key)) {
        warnings_.push_back(fmt::format("warning: config key '{}'{} is a DeepSpeed key zero.cpp ignores (docs/config.md, "
                                        "\"Ignored DeepSpeed keys\")", key_path(key), where));
        continue;
      }
      if (listed(unsupported_keys(), path_, key))
        throw Error(fmt::format("config key '{}'{} is a DeepSpeed key zero.cpp does not implement; remove it",
                                key_path(key), where));
      throw Error(fmt::format("unknown config key '{}'{}{}", key_path(key), where, suggestion(key)));
    }
  }

  // ": did you mean 'stage'?" for the nearest known key of this section within two edits, else the
  // section where a known key of that exact name belongs; "" when nothing is near.
  std::string suggestion(const std::string& key) const {
    std::set<std::string> candidates = known_;
    if (const auto it = ignored_keys().find(path_); it != ignored_keys().end())
      candidates.insert(it->second.begin(), it->second.end());
    std::string best;
    std::size_t best_distance = 3;
    for (const std::string& c : candidates) {
      const std::size_t d = to_lower(c) == to_lower(key) ? 0 : edit_distance(key, c);
      if (d < best_distance) best_distance = d, best = c;
    }
    if (!best.empty()) return fmt::format("; did you mean '{}'?", key_path(best));
    for (const auto& [section, keys] : complete_modelled_keys())
      if (section != path_ && keys.count(key)) return fmt::format("; did you mean '{}'?", join(section, key));
    return "";
  }

 private:
  const json& obj_;
  std::string path_;
  const std::string& source_;
  std::vector<std::string>& warnings_;
  std::set<std::string> known_;
};

// Reads every setting of the table (distributed/run/settings.h) that lives in `section`.
void read_settings(Section& s, const std::string& section, TrainingConfig& c) {
  for (const Setting& setting : settings()) {
    if (setting.section() != section) continue;
    if (setting.element < 0) {
      s.read(setting.name(), setting.field(c));
      continue;
    }
    const auto size = std::count_if(settings().begin(), settings().end(),
                                    [&](const Setting& other) { return std::string_view(other.key) == setting.key; });
    s.read_element(setting.name(), setting.element, static_cast<std::size_t>(size), setting.array_form,
                   setting.field(c));
  }
}

// Sets one setting's field from one JSON value (a flag's, or a section default) by the setting's type;
// errors name `source`.
void set_setting(const Setting& s, const json& value, const std::string& source, TrainingConfig& c) {
  std::vector<std::string> unused;
  const json one = {{s.name(), value}};
  Section(one, s.section(), source, unused).read(s.name(), s.field(c));
}

// The "optimizer" section: a DeepSpeed section (`deepspeed`: its type required, the section defaults
// under its params: Note [Section defaults] in distributed/run/settings.cpp), or the recorded form of a
// config without one (Note [Optimizer type without a section]).
void parse_optimizer(Section s, TrainingConfig& c, bool deepspeed) {
  if (deepspeed) {
    if (!s.has("type")) fail(s.source(), s.key_path("type"), "is required (\"AdamW\", \"Adam\" or \"Muon\")");
    s.read("type", c.optimizer->type);
    c.optimizer_type = c.optimizer->type;
    c.optimizer.set_present(true);
    for (const Setting& row : settings())
      if (std::string_view(row.present_in) == "optimizer") set_setting(row, row.section_default, "", c);
  } else {
    s.read("type", c.optimizer_type);
  }
  if (auto p = s.section("params")) {
    read_settings(*p, "optimizer.params", c);
    p->check_keys();
  }
  s.check_keys();
}

// The "scheduler" section: DeepSpeed's (`deepspeed`: its type and total_num_steps required, the section
// defaults applied), or the recorded form of a config without one, {"type": null, "params":
// {"warmup_num_steps": N}} (Note [Section defaults] in distributed/run/settings.cpp).
void parse_scheduler(Section s, TrainingConfig& c, bool deepspeed) {
  SchedulerConfig& sc = *c.scheduler;
  if (deepspeed) {
    if (!s.has("type")) fail(s.source(), s.key_path("type"), "is required (\"WarmupCosineLR\")");
    s.read("type", sc.type);
    c.scheduler.set_present(true);
    for (const Setting& row : settings())
      if (std::string_view(row.present_in) == "scheduler") set_setting(row, row.section_default, "", c);
  } else {
    s.find("type");
  }
  bool total_given = false;
  if (auto p = s.section("params")) {
    read_settings(*p, "scheduler.params", c);
    if (deepspeed) {
      total_given = p->has("total_num_steps");
      p->read("total_num_steps", sc.total_num_steps);
      p->read("cos_min_ratio", sc.cos_min_ratio);
      double warmup_min_ratio = 0.0;
      p->read("warmup_min_ratio", warmup_min_ratio);
      if (warmup_min_ratio != 0.0)
        fail(s.source(), p->key_path("warmup_min_ratio"),
             fmt::format("only 0 is supported (warmup starts from lr / warmup_num_steps), got {}", warmup_min_ratio));
      std::string warmup_type = "linear";
      p->read("warmup_type", warmup_type);
      if (warmup_type != "linear")
        fail(s.source(), p->key_path("warmup_type"),
             fmt::format("only \"linear\" is supported, got \"{}\"", warmup_type));
    }
    p->check_keys();
  }
  if (deepspeed && !total_given && sc.type == "WarmupCosineLR")
    fail(s.source(), s.key_path("params.total_num_steps"), "is required for WarmupCosineLR");
  s.check_keys();
}

// The batch rule's check: train == micro * gas * world, every value >= 1. `how` labels each value
// ("", or ", derived") so the message says which ones came from the file; `source` is the file ("" none).
void check_batch(const std::string& source, std::int64_t train, std::int64_t micro, std::int64_t gas, int world,
                 const char* how_train, const char* how_micro, const char* how_gas) {
  std::int64_t product = 0;
  const bool overflow = __builtin_mul_overflow(micro, gas, &product) ||
                        __builtin_mul_overflow(product, static_cast<std::int64_t>(world), &product);
  if (train >= 1 && micro >= 1 && gas >= 1 && !overflow && product == train) return;
  fail(source, "train_batch_size",
       fmt::format("train_batch_size ({}{}) must equal train_micro_batch_size_per_gpu ({}{}) * "
                   "gradient_accumulation_steps ({}{}) * world_size ({}) = {}",
                   train, how_train, micro, how_micro, gas, how_gas, world,
                   overflow ? std::string("overflow") : std::to_string(product)));
}

// Each batch key that is set: >= 1.
void check_batch_keys(const TrainingConfig& c, const Where& src) {
  const auto batch_key = [&](const char* key, const std::optional<std::int64_t>& v) {
    if (v && *v < 1) fail(src, key, fmt::format("must be >= 1, got {}", *v));
  };
  batch_key("train_batch_size", c.train_batch_size);
  batch_key("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu);
  batch_key("gradient_accumulation_steps", c.gradient_accumulation_steps);
}

// The batch keys: each >= 1, and the batch rule once resolve_batch ran.
void validate_batch(const TrainingConfig& c, const Where& src) {
  check_batch_keys(c, src);
  if (c.world_size() > 0) {
    if (!c.train_batch_size || !c.train_micro_batch_size_per_gpu || !c.gradient_accumulation_steps)
      fail(src, "train_batch_size", "a batch key was unset after resolve_batch; call resolve_batch again");
    check_batch(src.file, *c.train_batch_size, *c.train_micro_batch_size_per_gpu, *c.gradient_accumulation_steps, c.world_size(),
                "", "", "");
  }
}

// Clipping, the collective timeout and the non-finite gradient policy.
void validate_top_level(const TrainingConfig& c, const Where& src) {
  if (!(c.gradient_clipping >= 0.0) || !std::isfinite(c.gradient_clipping))
    fail(src, "gradient_clipping", fmt::format("must be >= 0 (0 turns clipping off), got {}", c.gradient_clipping));

  if (c.collective_timeout_s && !(std::isfinite(*c.collective_timeout_s) && *c.collective_timeout_s > 0))
    fail(src, "collective_timeout_s", fmt::format("must be a number of seconds > 0, got {}", *c.collective_timeout_s));
  if (c.nonfinite_grads != "error" && c.nonfinite_grads != "skip")
    fail(src, "nonfinite_grads", fmt::format("must be \"error\" or \"skip\", got \"{}\"", c.nonfinite_grads));
  if (c.nonfinite_skip_limit < 0)
    fail(src, "nonfinite_skip_limit", fmt::format("must be >= 0 (0 = never stop), got {}", c.nonfinite_skip_limit));
  const std::string& r = c.activation_checkpointing.recompute_granularity;
  if (r != "none" && r != "full" && r != "selective")
    fail(src, "activation_checkpointing.recompute_granularity",
         fmt::format("must be \"none\", \"full\" or \"selective\", got \"{}\"", r));
}

// The fp16 section (the loss scaler) and the one-dtype rule.
void validate_precision(const TrainingConfig& c, const Where& src) {
  const Fp16Config& f = c.fp16;
  if (!(f.loss_scale >= 0.0) || !std::isfinite(f.loss_scale))
    fail(src, "fp16.loss_scale", fmt::format("must be >= 0 (0 = dynamic), got {}", f.loss_scale));
  if (f.initial_scale_power < 0 || f.initial_scale_power > 127)
    fail(src, "fp16.initial_scale_power", fmt::format("must be in [0, 127], got {}", f.initial_scale_power));
  if (f.loss_scale_window < 1)
    fail(src, "fp16.loss_scale_window", fmt::format("must be >= 1, got {}", f.loss_scale_window));
  if (f.hysteresis < 1) fail(src, "fp16.hysteresis", fmt::format("must be >= 1, got {}", f.hysteresis));
  if (!(f.min_loss_scale > 0.0) || !std::isfinite(f.min_loss_scale))
    fail(src, "fp16.min_loss_scale", fmt::format("must be > 0, got {}", f.min_loss_scale));
  if (f.min_scale_skip_limit < 1)
    fail(src, "fp16.min_scale_skip_limit", fmt::format("must be >= 1, got {}", f.min_scale_skip_limit));
  if (f.enabled && c.bf16.enabled)
    fail(src, "bf16.enabled", "fp16.enabled and bf16.enabled are both true; enable at most one");
}

// The stage, the settings that only some stages use, and the bucket sizes.
void validate_zero(const TrainingConfig& c, const Where& src) {
  const ZeroConfig& z = c.zero_optimization;
  if (z.stage < 0 || z.stage > 3)
    fail(src, "zero_optimization.stage", fmt::format("stage {} is not supported (stages 0, 1, 2, 3)", z.stage));
  if (z.overlap_param_gather && (z.stage == 0 || z.stage == 3))
    fail(src, "zero_optimization.overlap_param_gather",
         fmt::format("does nothing at stage {} ({}); it needs stage 1 or 2", z.stage,
                     z.stage == 0 ? "every rank updates every parameter: there is no all-gather"
                                  : "each module gathers its parameters when it runs"));
  if (z.stage3_prefetch_bucket_size < 0)
    fail(src, "zero_optimization.stage3_prefetch_bucket_size",
         fmt::format("must be >= 0 elements (0: no prefetch), got {}", z.stage3_prefetch_bucket_size));
  if (z.stage3_max_live_parameters < 1)
    fail(src, "zero_optimization.stage3_max_live_parameters",
         fmt::format("must be >= 1 element, got {}", z.stage3_max_live_parameters));
  if (z.reduce_bucket_size && *z.reduce_bucket_size <= 0)
    fail(src, "zero_optimization.reduce_bucket_size",
         fmt::format("must be > 0 elements, got {}", *z.reduce_bucket_size));
  if (z.allgather_bucket_size && (*z.allgather_bucket_size <= 0 || *z.allgather_bucket_size % 2 != 0))
    fail(src, "zero_optimization.allgather_bucket_size",
         fmt::format("must be an even number of elements > 0, got {}", *z.allgather_bucket_size));
}

// What gradient reductions send: the wire dtype, fp32 accumulation, int8 blocks and their residual.
void validate_wire(const TrainingConfig& c, const Where& src) {
  const ZeroConfig& z = c.zero_optimization;
  if (const auto& t = c.communication_data_type) {
    if (*t != "fp32" && *t != "fp16" && *t != "bf16")
      fail(src, "communication_data_type", fmt::format("must be \"fp32\", \"fp16\" or \"bf16\", got \"{}\"", *t));
    const DType model = c.model_dtype();
    if (*t != "fp32" && parse_float_dtype(*t) != model)
      fail(src, "communication_data_type",
           fmt::format("\"{}\" with a {} model is not supported; use \"fp32\" or the model dtype", *t,
                       dtype_name(model)));
  }

  if (z.reduce_scatter_with_fp32_accumulation.value_or(false)) {
    const bool fp32_wire = c.model_dtype() == DType::f32 || c.communication_data_type.value_or("") == "fp32";
    if (fp32_wire)
      fail(src, "zero_optimization.reduce_scatter_with_fp32_accumulation",
           c.model_dtype() == DType::f32
               ? "needs a 16-bit wire, but the model is fp32 (enable fp16 or bf16, or leave the key unset)"
               : "needs a 16-bit wire, but communication_data_type is \"fp32\" (reductions already add in fp32)");
  }

  if (z.zero_quantized_gradients_block_size < 1 || z.zero_quantized_gradients_block_size > kMaxQuantizationBlock)
    fail(src, "zero_optimization.zero_quantized_gradients_block_size",
         fmt::format("must be in [1, {}] elements, got {}", kMaxQuantizationBlock, z.zero_quantized_gradients_block_size));
  if (z.zero_quantized_gradients_error_feedback && !z.zero_quantized_gradients)
    fail(src, "zero_optimization.zero_quantized_gradients_error_feedback",
         "needs zero_optimization.zero_quantized_gradients = true");
  if (z.zero_quantized_gradients) {
    const char* key = "zero_optimization.zero_quantized_gradients";
    if (z.stage == 0)
      fail(src, key, "needs stage 1, 2 or 3 (stage 0 all-reduces its gradients; the int8 path is a reduce-scatter)");
    if (!z.reduce_scatter)
      fail(src, key, "needs reduce_scatter = true (the int8 path is a reduce-scatter, not an all-reduce)");
    if (z.reduce_scatter_with_fp32_accumulation.value_or(false))
      fail(src, key, "and reduce_scatter_with_fp32_accumulation are both on; choose one (int8 already adds in fp32)");
    if (c.model_dtype() != DType::f32 && c.communication_data_type.value_or("") == "fp32")
      fail(src, key, "and communication_data_type \"fp32\" are both set; the int8 wire replaces the fp32 one");
  }
}

// The optimizer and scheduler sections.
void validate_schedule(const TrainingConfig& c, const Where& src) {
  if (const auto& t = c.optimizer_type) {
    const std::string type = to_lower(*t);
    if (type != "adamw" && type != "adam" && type != "muon")
      fail(src, "optimizer.type", fmt::format("\"{}\" is not supported (AdamW, Adam, Muon)", *t));
  }
  if (c.uses_muon() && c.zero_optimization.zero_quantized_gradients)
    fail(src, "optimizer.type",
         "Muon with zero_optimization.zero_quantized_gradients is not supported (int8 gradients are tested with "
         "AdamW only); turn one off");
  const OptimizerConfig& o = *c.optimizer;  // the run's values, with or without the section
  if (o.momentum && !c.uses_muon())
    fail(src, "optimizer.params.momentum", "is Muon's; the optimizer is " + c.optimizer_type.value_or(o.type));
  if (o.ns_steps && !c.uses_muon())
    fail(src, "optimizer.params.ns_steps", "is Muon's; the optimizer is " + c.optimizer_type.value_or(o.type));
  if (o.momentum && !(*o.momentum >= 0.0 && *o.momentum < 1.0))
    fail(src, "optimizer.params.momentum", fmt::format("must be in [0, 1), got {}", *o.momentum));
  if (o.ns_steps && (*o.ns_steps < 1 || *o.ns_steps > 100))
    fail(src, "optimizer.params.ns_steps", fmt::format("must be in [1, 100], got {}", *o.ns_steps));
  if (!(o.lr >= 0.0) || !std::isfinite(o.lr)) fail(src, "optimizer.params.lr", fmt::format("must be >= 0, got {}", o.lr));
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0) || !(o.beta2 >= 0.0 && o.beta2 < 1.0))
    fail(src, "optimizer.params.betas", fmt::format("each beta must be in [0, 1), got [{}, {}]", o.beta1, o.beta2));
  if (!(o.eps >= 0.0) || !std::isfinite(o.eps))
    fail(src, "optimizer.params.eps", fmt::format("must be >= 0, got {}", o.eps));
  if (!(o.weight_decay >= 0.0) || !std::isfinite(o.weight_decay))
    fail(src, "optimizer.params.weight_decay", fmt::format("must be >= 0, got {}", o.weight_decay));
  if (!o.adam_w_mode)
    fail(src, "optimizer.params.adam_w_mode",
         "false (Adam with L2 regularisation) is not supported; only decoupled weight decay (AdamW)");

  if (c.scheduler->warmup_num_steps < 0)
    fail(src, "scheduler.params.warmup_num_steps", fmt::format("must be >= 0, got {}", c.scheduler->warmup_num_steps));
  if (const auto& s = c.scheduler) {
    if (s->type != "WarmupCosineLR")
      fail(src, "scheduler.type", fmt::format("\"{}\" is not supported (WarmupCosineLR)", s->type));
    if (s->total_num_steps < 1)
      fail(src, "scheduler.params.total_num_steps", fmt::format("must be >= 1, got {}", s->total_num_steps));
    if (!(s->cos_min_ratio >= 0.0 && s->cos_min_ratio <= 1.0))
      fail(src, "scheduler.params.cos_min_ratio", fmt::format("must be in [0, 1], got {}", s->cos_min_ratio));
  }
}

// Every rule of the config, once, on the merged result (a file, then flags): the first broken one
// throws, naming the key and the file or the flag that set it.
void validate_config(const TrainingConfig& c, const Where& src) {
  validate_batch(c, src);
  validate_top_level(c, src);
  validate_precision(c, src);
  validate_zero(c, src);
  validate_wire(c, src);
  validate_schedule(c, src);
}

// DeepSpeed's activation_checkpointing keys that partition or offload activations across the ranks of
// a tensor-parallel group: with data parallelism only (every rank holds the whole model) there is no
// such group, so they are refused when set, with the reason.
void parse_activation_checkpointing(Section& s, TrainingConfig& c, const std::string& src) {
  read_settings(s, "activation_checkpointing", c);
  for (const char* key : {"partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                          "number_checkpoints"}) {
    const json* v = s.find(key);
    if (v == nullptr || (v->is_boolean() && !v->get<bool>())) continue;  // absent, null or false
    fail(src, std::string("activation_checkpointing.") + key,
         "needs tensor parallelism (activations split across the ranks of a model-parallel group), which "
         "zero.cpp does not have; use \"recompute_granularity\" to save activation memory");
  }
  s.check_keys();
}

TrainingConfig parse(const json& j, const std::string& src) {
  if (!j.is_object()) {
    const std::string where = src.empty() ? "" : fmt::format(" in {}", src);
    throw Error(fmt::format("invalid config{}: expected a JSON object at the top level, got {}", where, describe(j)));
  }
  TrainingConfig c;
  Section root(j, "", src, c.warnings);
  read_settings(root, "", c);
  if (auto s = root.section("fp16")) {
    read_settings(*s, "fp16", c);
    s->check_keys();
  }

  // "bfloat16" is DeepSpeed's old name for "bf16" (runtime/config.py, get_bfloat16_config).
  if (root.has("bf16") && root.has("bfloat16"))
    fail(src, "bfloat16", "give \"bf16\" or its old name \"bfloat16\", not both");
  for (const char* name : {"bf16", "bfloat16"}) {
    if (auto s = root.section(name)) {
      read_settings(*s, "bf16", c);
      s->check_keys();
    }
  }

  // DeepSpeed still reads the deprecated boolean form: true means stage 1 (read_zero_config_deprecated).
  if (const json* z = root.find("zero_optimization"); z && z->is_boolean()) {
    c.zero_optimization.stage = z->get<bool>() ? 1 : 0;
    c.warnings.push_back(
        fmt::format("warning: config key 'zero_optimization' given as {} is deprecated; use {{\"stage\": {}}}",
                    z->dump(), c.zero_optimization.stage));
  } else if (auto s = root.section("zero_optimization")) {
    read_settings(*s, "zero_optimization", c);
    s->check_keys();
  }
  // Note [Optimizer type without a section]: a config without an "optimizer" section is recorded by
  // to_json as {"optimizer": {"type": null, "params": {...every param's value}}}; read back, "type": null
  // means no section: the program's defaults for any param left out. Before the params were rows of the
  // table (Note [Section defaults] in distributed/run/settings.cpp) it was recorded as {"type": T,
  // "params": null} (T null, or --optimizer's type), which still reads as the type alone, no section.
  // Any other "optimizer" object is DeepSpeed's section: its type is required and its defaults apply.
  const json* opt = root.find("optimizer");
  const auto null_at = [&](const char* key) { return opt->contains(key) && opt->at(key).is_null(); };
  const bool no_section = opt && opt->is_object() && (null_at("params") || null_at("type"));
  if (auto s = root.section("optimizer")) parse_optimizer(*s, c, !no_section);
  const json* sch = root.find("scheduler");
  const bool no_scheduler = sch && sch->is_object() && sch->contains("type") && sch->at("type").is_null();
  if (auto s = root.section("scheduler")) parse_scheduler(*s, c, !no_scheduler);
  if (auto s = root.section("activation_checkpointing")) parse_activation_checkpointing(*s, c, src);
  root.check_keys();
  return c;
}

// Parses text with DeepSpeed's duplicate-key rule (dict_raise_error_on_duplicate_keys): a key given
// twice in one object is an error, not "last one wins".
json parse_text(const std::string& text, const std::string& path) {
  struct Frame {
    std::string path;
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> stack;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        std::string p = stack.empty() ? "" : join(stack.back().path, stack.back().last_key);
        stack.push_back(Frame{std::move(p), {}, {}});
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        Frame& f = stack.back();
        f.last_key = parsed.get<std::string>();
        if (!f.keys.insert(f.last_key).second) fail(path, join(f.path, f.last_key), "given twice");
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line 2, ..."
    if (const auto pos = what.find("] "); what.rfind("[json.exception", 0) == 0 && pos != std::string::npos)
      what = what.substr(pos + 2);
    throw Error(fmt::format("config file {} is not valid JSON: {}", path, what));
  }
}

}  // namespace

nlohmann::json read_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(fmt::format("config file {} does not exist", path));
  if (fs::is_directory(path, ec)) throw Error(fmt::format("config file {} is a directory", path));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in || in.bad()) throw Error(fmt::format("config file {} cannot be read", path));
  return parse_text(text.str(), path);
}

TrainingConfig TrainingConfig::from_file(const std::string& path) {
  TrainingConfig c = parse_for_merge(read_config_file(path), path);
  c.validate();
  return c;
}

TrainingConfig TrainingConfig::from_json(const nlohmann::json& j) {
  TrainingConfig c = parse_for_merge(j, "");
  c.validate();
  return c;
}

TrainingConfig TrainingConfig::parse_for_merge(const nlohmann::json& j, const std::string& source) {
  TrainingConfig c = parse(j, source);
  c.source_ = source;
  return c;
}

TrainingConfig merge_config(const nlohmann::json& base, const std::string& source,
                            const std::vector<std::pair<std::string, std::string>>& flags,
                            const std::function<void(TrainingConfig&)>& program_flags) {
  TrainingConfig cfg = TrainingConfig::parse_for_merge(base, source);
  for (const auto& [flag, text] : flags) {
    const Setting* s = find_setting_by_flag(flag);
    ZERO_CHECK(s != nullptr, "merge_config: {} is not a flag of the settings table", flag);
    cfg.apply_flag(*s, text);
  }
  if (program_flags) program_flags(cfg);
  cfg.validate();
  return cfg;
}

void TrainingConfig::apply_flag(const Setting& s, const std::string& text) {
  set_setting(s, flag_json(s, text), s.flag, *this);
  flags_[s.key] = text == "true" && s.type == SettingType::boolean ? std::string(s.flag)
                                                                     : fmt::format("{} {}", s.flag, text);
}

nlohmann::json TrainingConfig::to_json() const {
  json j = json::object();
  // The table's fields are read only here; settings() hands out mutable pointers for the parser.
  auto& self = const_cast<TrainingConfig&>(*this);
  // Every row, the optimizer's params in full (Note [Section defaults] in distributed/run/settings.cpp);
  // without a section, "type" is null (Note [Optimizer type without a section]).
  for (const Setting& s : settings()) j[json::json_pointer(s.pointer())] = field_json(s.field(self));
  // The scheduler's warmup is a row, written above; without the section "type" is null.
  j["scheduler"]["type"] = scheduler ? json(scheduler->type) : json(nullptr);
  if (scheduler) {
    json& params = j["scheduler"]["params"];
    params["total_num_steps"] = scheduler->total_num_steps;
    params["cos_min_ratio"] = scheduler->cos_min_ratio;
    params["warmup_min_ratio"] = 0.0;
    params["warmup_type"] = "linear";
  }
  return j;
}

void TrainingConfig::resolve_batch(int world_size) {
  ZERO_CHECK(world_size >= 1, "resolve_batch: world_size must be >= 1, got {}", world_size);
  check_batch_keys(*this, Where{source_, flags_});  // a key below 1 would divide by zero below
  std::optional<std::int64_t> train = train_batch_size, micro = train_micro_batch_size_per_gpu,
                              gas = gradient_accumulation_steps;
  const std::int64_t ws = world_size;
  // Each value's label in the error message: given in the config, or derived here.
  const char* how_train = "";
  const char* how_micro = "";
  const char* how_gas = "";
  constexpr const char* derived = ", derived";
  if (train && micro && gas) {
    // all given: only checked
  } else if (train && micro) {
    gas = *train / *micro / ws;
    how_gas = derived;
  } else if (train && gas) {
    micro = *train / ws / *gas;
    how_micro = derived;
  } else if (micro && gas) {
    std::int64_t t = 0;
    if (__builtin_mul_overflow(*micro, *gas, &t) || __builtin_mul_overflow(t, ws, &t)) t = -1;
    train = t;
    how_train = derived;
  } else if (train) {
    gas = 1;
    micro = *train / ws;
    how_gas = how_micro = derived;
  } else if (micro) {
    gas = 1;
    std::int64_t t = 0;
    if (__builtin_mul_overflow(*micro, ws, &t)) t = -1;
    train = t;
    how_gas = how_train = derived;
  } else {
    fail(source_, "train_batch_size",
         "neither train_batch_size nor train_micro_batch_size_per_gpu is set; set at least one of them");
  }
  check_batch(source_, *train, *micro, *gas, world_size, how_train, how_micro, how_gas);
  train_batch_size = train;
  train_micro_batch_size_per_gpu = micro;
  gradient_accumulation_steps = gas;
  world_size_ = world_size;
}

void TrainingConfig::validate() const { validate_config(*this, Where{source_, flags_}); }

bool TrainingConfig::uses_muon() const { return to_lower(optimizer_type.value_or("AdamW")) == "muon"; }

DType TrainingConfig::model_dtype() const {
  if (fp16.enabled) return DType::f16;
  if (bf16.enabled) return DType::bf16;
  return DType::f32;
}

void TrainingConfig::set_model_dtype(DType t) {
  ZERO_CHECK(is_floating(t), "set_model_dtype: {} is not a floating-point dtype", dtype_name(t));
  fp16.enabled = t == DType::f16;
  bf16.enabled = t == DType::bf16;
}

ZeroOptions TrainingConfig::zero_options() const {
  ZeroOptions zo;
  zo.stage = zero_optimization.stage;
  zo.dtype = model_dtype();
  zo.reduce_bucket_size = zero_optimization.reduce_bucket_size.value_or(kAutoBucketSize);
  zo.allgather_bucket_size = zero_optimization.allgather_bucket_size.value_or(kAutoBucketSize);
  zo.reduce_in_fp32 = communication_data_type.value_or("") == "fp32";
  zo.overlap_param_gather = zero_optimization.overlap_param_gather;
  zo.stage3_prefetch_bucket_size = zero_optimization.stage3_prefetch_bucket_size;
  zo.stage3_max_live_parameters = zero_optimization.stage3_max_live_parameters;
  zo.reduce_scatter_with_fp32_accumulation = zero_optimization.reduce_scatter_with_fp32_accumulation.value_or(false);
  zo.reduce_scatter = zero_optimization.reduce_scatter;
  zo.quantized_gradients_block =
      zero_optimization.zero_quantized_gradients ? zero_optimization.zero_quantized_gradients_block_size : 0;
  zo.quantized_gradients_error_feedback = zero_optimization.zero_quantized_gradients_error_feedback;
  zo.overlap_comm = zero_optimization.overlap_comm;
  zo.contiguous_gradients = zero_optimization.contiguous_gradients;
  zo.gradient_accumulation_steps = static_cast<int>(gradient_accumulation_steps.value_or(1));
  zo.gradient_clipping = static_cast<float>(gradient_clipping);
  zo.fp16 = loss_scaler_config();
  zo.nonfinite_grads = nonfinite_grads == "skip" ? NonfiniteGrads::skip : NonfiniteGrads::error;
  zo.nonfinite_skip_limit = nonfinite_skip_limit;
  zo.muon = uses_muon();
  if (optimizer->momentum) zo.muon_momentum = static_cast<float>(*optimizer->momentum);
  if (optimizer->ns_steps) zo.muon_ns_steps = static_cast<int>(*optimizer->ns_steps);
  return zo;
}

optim::LossScalerConfig TrainingConfig::loss_scaler_config() const {
  optim::LossScalerConfig s;
  s.loss_scale = static_cast<float>(fp16.loss_scale);
  s.initial_scale_power = fp16.initial_scale_power;
  s.loss_scale_window = fp16.loss_scale_window;
  s.hysteresis = fp16.hysteresis;
  s.consecutive_hysteresis = fp16.consecutive_hysteresis;
  s.min_loss_scale = static_cast<float>(fp16.min_loss_scale);
  s.raise_error_at_min_scale = fp16.raise_error_at_min_scale;
  s.min_scale_skip_limit = fp16.min_scale_skip_limit;
  return s;
}

optim::LrSchedule TrainingConfig::lr_schedule(double lr) const {
  ZERO_CHECK(scheduler.has_value(), "lr_schedule: the config has no \"scheduler\" section");
  optim::LrSchedule s;
  s.lr = static_cast<float>(lr);
  s.min_lr = static_cast<float>(lr * scheduler->cos_min_ratio);
  s.warmup = scheduler->warmup_num_steps;
  s.total_steps = scheduler->total_num_steps;
  return s;
}

}  // namespace zero::dist
