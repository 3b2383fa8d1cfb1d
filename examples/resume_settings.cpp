#include "examples/resume_settings.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include "core/check.h"
#include "distributed/distributed.h"

namespace zero::examples {

// Note [Settings from the checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A resumed run continues the run that wrote the checkpoint, so what that run was (nanoGPT takes its
// model arguments from the checkpoint the same way) comes from state.json unless a flag says
// otherwise: the model shape, the data file, the seed, the learning-rate schedule and --steps, AdamW's
// betas and weight decay, the evaluation cadence (evaluations draw from the batch stream, so it shapes
// the trajectory) and the DeepSpeed-style config (ZeRO stage, dtype, batch, buckets, clipping, loss
// scaler). A flag that repeats the checkpoint's value changes nothing; one that differs is applied
// with a one-line warning naming both values, since the run then no longer continues the saved one
// bitwise (a new world size or ZeRO stage is a supported change all the same: docs/checkpoint.md). The
// model shape cannot change: a differing --n-layer, --n-head, --n-embd, --block or model option (every row
// of nn::model_options(): --norm, ...) is an error.
// Settings that do not touch the numbers (--save-dir, --log-file, --threads, ...) are never stored.

namespace fs = std::filesystem;

namespace {

// One setting of Args that state.json holds, at `pointer` (a JSON pointer into state.json).
struct Setting {
  std::string flag;
  std::string pointer;
  bool shape;  // model shape: a given differing value is an error
  // Reads the setting from JSON into Args (throws nlohmann::json::exception on a wrong type), and
  // compares / prints the Args value.
  std::function<void(Args&, const nlohmann::json&)> set;
  std::function<bool(const Args&, const nlohmann::json&)> same;
  std::function<std::string(const Args&)> show;
};

template <typename T>
Setting make_setting(const char* flag, const char* pointer, bool shape, T Args::*member) {
  return {flag, pointer, shape, [member](Args& a, const nlohmann::json& j) { a.*member = j.get<T>(); },
          [member](const Args& a, const nlohmann::json& j) { return a.*member == j.get<T>(); },
          [member](const Args& a) { return fmt::format("{}", a.*member); }};
}

// A row of nn::model_options(): part of the model's shape, at "/model/<key>".
Setting model_option_setting(const nn::ModelOption& o) {
  std::string nn::GPTConfig::*field = o.field;
  return {o.flag, std::string("/model/") + o.key, true,
          [field](Args& a, const nlohmann::json& j) { a.variant.*field = j.get<std::string>(); },
          [field](const Args& a, const nlohmann::json& j) { return a.variant.*field == j.get<std::string>(); },
          [field](const Args& a) { return a.variant.*field; }};
}

std::vector<Setting> make_settings() {
  std::vector<Setting> list = {
      make_setting("--n-layer", "/model/n_layer", true, &Args::n_layer),
      make_setting("--n-head", "/model/n_head", true, &Args::n_head),
      make_setting("--n-embd", "/model/n_embd", true, &Args::n_embd),
      make_setting("--block", "/model/block_size", true, &Args::block),
      make_setting("--dropout", "/model/dropout", false, &Args::dropout),
      make_setting("--seed", "/seed", false, &Args::seed),
      make_setting("--steps", "/lr_schedule/steps", false, &Args::steps),
      make_setting("--min-lr", "/lr_schedule/min_lr", false, &Args::min_lr),
      make_setting("--eval-every", "/evaluation/every", false, &Args::eval_every),
      make_setting("--eval-iters", "/evaluation/iters", false, &Args::eval_iters),
  };
  for (const nn::ModelOption& o : nn::model_options()) list.push_back(model_option_setting(o));
  return list;
}

const std::vector<Setting>& settings() {
  static const std::vector<Setting> list = make_settings();
  return list;
}

// The same file, however it is spelt.
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// Applies `s` (shape-only or all) from `state`; returns the warnings.
void take(Args& a, const Given& given, const CheckpointSettings& c, bool shape_only, std::vector<std::string>& warnings) {
  for (const Setting& s : settings()) {
    if (shape_only && !s.shape) continue;
    const nlohmann::json::json_pointer ptr(s.pointer);
    if (!c.state.contains(ptr)) continue;  // written by an older train_gpt: the flag's value stands
    const nlohmann::json& saved = c.state.at(ptr);
    try {
      if (!given.has(s.flag)) {
        s.set(a, saved);
        continue;
      }
      if (s.same(a, saved)) continue;
    } catch (const nlohmann::json::exception&) {
      throw Error(fmt::format("checkpoint '{}': state.json \"{}\" has the wrong type ({})", c.dir, s.pointer.substr(1),
                              saved.dump()));
    }
    Args as_saved = a;  // the saved value printed as the flag's type prints it (a float lr as 0.001)
    s.set(as_saved, saved);
    const std::string saved_text = s.show(as_saved);
    ZERO_CHECK(!s.shape, "{} {} differs from the checkpoint's {} ('{}'): the model shape cannot change; leave {} out "
               "to take the checkpoint's", s.flag, s.show(a), saved_text, c.dir, s.flag);
    warnings.push_back(fmt::format("warning: {} {} differs from the checkpoint's {} ('{}'); continuing with {}", s.flag,
                                   s.show(a), saved_text, c.dir, s.show(a)));
  }
}

}  // namespace

nlohmann::json settings_json(const Args& a, const dist::TrainingConfig& config, const nlohmann::json& model) {
  // lr_schedule and adamw as the run used them (f32), for readers of state.json; the config has them too.
  const auto as_float = [](double v) { return static_cast<float>(v); };
  const dist::OptimizerConfig& o = *config.optimizer;
  const float lr = as_float(o.lr);
  return {{"config", config.to_json()},
          {"model", model},
          {"data", fs::absolute(a.data).string()},
          {"seed", a.seed},
          {"lr_schedule", {{"lr", lr}, {"min_lr", a.min_lr}, {"warmup", config.scheduler->warmup_num_steps}, {"steps", a.steps}}},
          {"adamw", {{"beta1", as_float(o.beta1)}, {"beta2", as_float(o.beta2)}, {"weight_decay", as_float(o.weight_decay)}}},
          {"evaluation", {{"every", a.eval_every}, {"iters", a.eval_iters}}}};
}

nlohmann::json recorded_config(const nlohmann::json& state) {
  if (!state.is_object() || !state.contains("config")) return nullptr;
  nlohmann::json config = state.at("config");
  const auto at = [&](const char* pointer) { return state.value(nlohmann::json::json_pointer(pointer), nlohmann::json()); };
  // No "scheduler" at all: recorded before the warmup was a row, when it was written only with the section.
  if (const nlohmann::json warmup = at("/lr_schedule/warmup");
      config.is_object() && !config.contains("scheduler") && warmup.is_number_integer())
    config["scheduler"] = {{"type", nullptr}, {"params", {{"warmup_num_steps", warmup}}}};
  const nlohmann::json lr = at("/lr_schedule/lr"), beta1 = at("/adamw/beta1"), beta2 = at("/adamw/beta2"),
                       weight_decay = at("/adamw/weight_decay");
  const bool recorded_before = config.is_object() && config.contains("optimizer") && config["optimizer"].is_object() &&
                               config["optimizer"].value("params", nlohmann::json()).is_null();
  if (!recorded_before || !lr.is_number() || !beta1.is_number() || !beta2.is_number() || !weight_decay.is_number())
    return config;
  nlohmann::json& opt = config["optimizer"];
  // The type alone was recorded, so there was no section: "type": null keeps it so (with --optimizer's
  // type, the params are all given, so the section's defaults change nothing but eps, equal in both).
  if (!opt.contains("type")) opt["type"] = nullptr;
  opt["params"] = {{"lr", lr}, {"betas", {beta1, beta2}}, {"weight_decay", weight_decay}};
  return config;
}

std::string checkpoint_path(const Args& a) {
  if (!a.resume.empty()) return a.resume;
  // --init-from takes a model.safetensors file or a checkpoint (or save) directory.
  return !a.init_from.empty() && fs::is_directory(a.init_from) ? a.init_from : "";
}

CheckpointSettings take_checkpoint_settings(Args& a, const Given& given, const std::string& resolved) {
  CheckpointSettings c;
  const bool resume = !a.resume.empty();
  ZERO_CHECK(a.init_from.empty() || fs::exists(a.init_from), "--init-from '{}' does not exist (give a model.safetensors "
             "file, or a checkpoint or save directory)", a.init_from);
  const std::string path = checkpoint_path(a);
  if (path.empty()) return c;
  try {
    c.dir = resolved.empty() ? dist::resolve_checkpoint(path) : resolved;
    c.state = dist::read_state(c.dir);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", resume ? "--resume" : "--init-from", e.what()), e.location());
  }
  take(a, given, c, /*shape_only=*/!resume, c.warnings);
  if (resume) (void)dist::saved_optimizer_type(c.state, c.dir);  // an unknown optimizer fails before any work
  if (!resume) {
    a.init_from = (fs::path(c.dir) / "model.safetensors").string();
    return c;
  }
  if (c.state.contains("data") && c.state["data"].is_string()) {
    const std::string saved = c.state["data"].get<std::string>();
    if (!given.has("--data")) {
      ZERO_CHECK(fs::exists(saved), "checkpoint '{}' was trained on '{}', which is not there; give --data PATH (a "
                 "file with the same characters)", c.dir, saved);
      a.data = saved;
    } else if (!same_file(a.data, saved)) {
      c.warnings.push_back(fmt::format("warning: --data '{}' differs from the checkpoint's '{}' ('{}'); continuing with "
                                       "'{}'", a.data, saved, c.dir, a.data));
    }
  }
  return c;
}

std::vector<std::string> config_warnings(const dist::TrainingConfig& now, const nlohmann::json& saved,
                                         const Given& given, const std::string& dir) {
  std::vector<std::string> out;
  if (!saved.is_object()) return out;
  const nlohmann::json mine = now.to_json();
  // The dtype is two keys in the config and one flag.
  const auto dtype_of = [](const nlohmann::json& c) -> std::string {
    if (c.value("/fp16/enabled"_json_pointer, false)) return "fp16";
    if (c.value("/bf16/enabled"_json_pointer, false)) return "bf16";
    return "fp32";
  };
  if (dtype_of(mine) != dtype_of(saved))
    out.push_back(fmt::format("warning: {} {} differs from the checkpoint's {} ('{}'); continuing with {}",
                              given.has("--dtype") ? "--dtype" : "the config's dtype", dtype_of(mine), dtype_of(saved),
                              dir, dtype_of(mine)));
  // The flag of each key: the settings table's, and the flags that are not one key of it.
  const std::map<std::string, const char*> program_flags = {
      {"/train_batch_size", "--batch"},
      {"/fp16/raise_error_at_min_scale", "--min-scale-skip-limit"},
      {"/fp16/min_scale_skip_limit", "--min-scale-skip-limit"},
  };
  const auto flag_of = [&](const std::string& pointer, const std::string& dotted) -> const char* {
    if (const auto it = program_flags.find(pointer); it != program_flags.end()) return it->second;
    const dist::Setting* s = dist::find_setting(dotted);
    return s != nullptr && *s->flag != '\0' ? s->flag : nullptr;
  };
  const nlohmann::json a = mine.flatten(), b = saved.flatten();
  for (const auto& [key, value] : a.items()) {
    // The optimizer's type is not a setting a resume may change: load_checkpoint refuses another one
    // with its own line (its spelling, "Muon" or "muon", or null for the default AdamW, may differ).
    if (key == "/train_micro_batch_size_per_gpu" || key == "/collective_timeout_s" || key == "/fp16/enabled" ||
        key == "/bf16/enabled" || key == "/optimizer/type")
      continue;
    if (!b.contains(key)) continue;  // a key newer than the build that wrote the checkpoint
    const nlohmann::json other = b[key];
    if (value == other || (value.is_number() && other.is_number() && value.get<double>() == other.get<double>()))
      continue;
    std::string dotted = key.substr(1);  // "/zero_optimization/stage" -> "zero_optimization.stage"
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    const char* flag = flag_of(key, dotted);
    const std::string name = flag != nullptr && given.has(flag) ? std::string(flag)
                                                                : fmt::format("config key '{}'", dotted);
    out.push_back(fmt::format("warning: {} {} differs from the checkpoint's {} ('{}'); continuing with {}", name,
                              value.dump(), other.dump(), dir, value.dump()));
  }
  return out;
}

}  // namespace zero::examples
