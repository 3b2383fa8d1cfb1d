#include "examples/setting_flags.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"

#include "distributed/distributed.h"

namespace zero::examples {

namespace {

bool in_set(const dist::Setting& s, FlagSet which) { return which == FlagSet::all || s.shapes_plan; }

// A JSON value as a flag's text: 0.001, fp32, true.
std::string as_text(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// The default --help shows for a row's flag: its value without a config file, or, for a setting unset
// by default, its default as docs/config.md words it ("automatic", "model dtype").
std::string help_default(const dist::Setting& s) {
  dist::TrainingConfig defaults;
  const nlohmann::json v = dist::field_json(s.field(defaults));
  if (!v.is_null()) return as_text(v);
  std::string text = s.default_text;
  text.erase(std::remove_if(text.begin(), text.end(), [](char c) { return c == '`' || c == '"'; }), text.end());
  return text;
}

// The flag's help line: the row's, and its section default when that differs from the default shown.
std::string help_line(const dist::Setting& s) {
  dist::TrainingConfig defaults;
  if (!s.has_section_default() || s.section_default == dist::field_json(s.field(defaults))) return s.doc;
  return fmt::format("{} (default with an \"{}\" section in the config: {})", s.doc, s.present_in,
                     as_text(s.section_default));
}

}  // namespace

void add_setting_flags(CLI::App& app, SettingFlags& values, FlagSet which) {
  for (const dist::Setting& s : dist::settings()) {
    if (*s.flag == '\0' || !in_set(s, which)) continue;
    if (s.type == dist::SettingType::boolean) {
      app.add_flag(s.flag, values.on[s.flag], help_line(s))->default_str(help_default(s));
    } else {
      // Checked by flag_json when merged (exit code 1, naming the flag), as a config key would be.
      CLI::Option* o = app.add_option(s.flag, values.text[s.flag], help_line(s));
      o->type_name(s.allowed.empty() ? (s.type == dist::SettingType::text ? "TEXT" : "NUMBER") : "ENUM");
      o->default_str(help_default(s));
    }
  }
}

dist::TrainingConfig merge_config(const nlohmann::json& base, const std::string& source, const SettingFlags& values,
                                  const FlagGiven& given,
                                  const std::function<void(dist::TrainingConfig&)>& program_flags) {
  std::vector<std::pair<std::string, std::string>> flags;
  for (const dist::Setting& s : dist::settings()) {
    if (*s.flag == '\0' || !given(s.flag)) continue;
    if (const auto on = values.on.find(s.flag); on != values.on.end())
      flags.emplace_back(s.flag, on->second ? "true" : "false");
    else if (const auto text = values.text.find(s.flag); text != values.text.end())
      flags.emplace_back(s.flag, text->second);
  }
  return dist::merge_config(base, source, flags, program_flags);
}

void apply_batch_flags(dist::TrainingConfig& cfg, std::int64_t batch, bool batch_given, bool accum_given,
                       int world_size) {
  const bool base_has_batch = cfg.train_batch_size || cfg.train_micro_batch_size_per_gpu;
  const std::int64_t accum = accum_given ? cfg.gradient_accumulation_steps.value_or(1) : 1;
  if ((batch_given || !base_has_batch) && accum >= 1) {  // accum < 1: resolve_batch names it
    const std::int64_t per_step = static_cast<std::int64_t>(world_size) * accum;
    ZERO_CHECK(batch % per_step == 0 && batch >= per_step,
               "--batch {} does not split into {} rank(s) x {} accumulation step(s) (it must be a positive multiple of {})",
               batch, world_size, per_step / world_size, per_step);
    cfg.train_batch_size = batch;
    cfg.train_micro_batch_size_per_gpu.reset();
    if (!cfg.gradient_accumulation_steps) cfg.gradient_accumulation_steps = 1;
  }
  if (accum_given && cfg.train_micro_batch_size_per_gpu && cfg.train_batch_size)
    cfg.train_micro_batch_size_per_gpu.reset();
}

}  // namespace zero::examples
