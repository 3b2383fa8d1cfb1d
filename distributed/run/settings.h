// The settings table: every scalar key of the training config (distributed/run/config.h) declared once,
// with its DeepSpeed key, the command-line flag that overrides it, its type, default, allowed values
// and one line of documentation.
//
// From this one table come: the config parser's reading of those keys (TrainingConfig::from_json),
// TrainingConfig::to_json, the flags of train_gpt and zero_explain (examples/setting_flags.h), the
// merge of flags over a file (apply_flag), and the key tables of docs/config.md (checked against the
// table by tests/unit/test_settings.cpp). Rules that relate several keys (fp16 and bf16 both on,
// int8 gradients at stage 0, ...) are in validate_config (distributed/run/config.cpp), which runs once on
// the merged result.
//
// The merge rule, used by every program that takes a config file and flags:
//   defaults  ->  the file (or a resumed checkpoint's config with the file on top)  ->  the flags given
//             ->  validation of the result.
// A file is therefore never judged alone: `--zero-stage 2` with a file that only sets
// zero_quantized_gradients is valid, as is the same file with the flag's stage written into it.
//
// A row may carry a second default, its section default (Note [Section defaults] in settings.cpp): the
// default when the file has the row's DeepSpeed section ("optimizer"), where the first one, the program
// default, applies without it. So
//   defaults (the section's when the file has the section)  ->  the file  ->  the flags  ->  validation.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace zero::dist {

struct TrainingConfig;

/// How a setting's value is written, in the file and on the command line.
enum class SettingType {
  boolean,   // JSON true/false; a flag without a value (--overlap-comm)
  integer,   // a JSON integer
  elements,  // a count of elements: a JSON integer or a whole float (5e8), the same on the command line
  number,    // any JSON number
  text,      // a JSON string, one of `allowed` when that is not empty
};

/// Where a setting lives in a TrainingConfig. An optional field is unset (nullopt) when the key is
/// absent or null: the default then depends on other settings (the model dtype, Ψ).
using SettingField = std::variant<bool*, int*, std::int64_t*, std::optional<std::int64_t>*, double*,
                                  std::optional<double>*, std::string*, std::optional<std::string>*,
                                  std::optional<bool>*>;

/// One setting of the training config.
struct Setting {
  const char* key;           // DeepSpeed key path: "zero_optimization.stage"
  const char* flag;          // the command-line flag that overrides it, "" for none
  SettingType type;
  const char* default_text;  // the default as docs/config.md shows it: "`0`", "automatic"
  std::vector<std::string> allowed;  // a text setting's values; empty: any
  const char* doc;           // one line: the flag's help text
  SettingField (*field)(TrainingConfig&);
  bool shapes_plan = false;  // it changes the ZeRO plan, its wire or the memory: zero_explain offers its flag
  // The default when the file has the section that `present_in` names ("optimizer"; "" for none): its value
  // (null: none) and as docs/config.md shows it ("`0`"). Note [Section defaults] in settings.cpp.
  const char* present_in = "";
  nlohmann::json section_default = nullptr;
  const char* section_default_text = "";
  // >= 0: the row is this element of a JSON array at `key` ("optimizer.params.betas": [beta1, beta2]),
  // whose form `array_form` ("[beta1, beta2]") names in errors.
  int element = -1;
  const char* array_form = "";

  /// The section ("zero_optimization", "" for the top level) and the key's own name ("stage").
  std::string section() const;
  std::string name() const;
  /// Where the value sits in the config's JSON: "/zero_optimization/stage", "/optimizer/params/betas/1".
  std::string pointer() const;
  /// Whether the row has a section default.
  bool has_section_default() const { return *present_in != '\0'; }
};

/// Every setting, top level first, then fp16, bf16, zero_optimization, activation_checkpointing, optimizer,
/// optimizer.params and scheduler.params; in docs/config.md's order.
const std::vector<Setting>& settings();

/// The setting of a key path or a flag; nullptr when there is none.
const Setting* find_setting(std::string_view key);
const Setting* find_setting_by_flag(std::string_view flag);
/// The setting at a JSON pointer (Setting::pointer): "/optimizer/params/betas/1" is --beta2's; nullptr
/// when there is none.
const Setting* find_setting_by_pointer(std::string_view pointer);

/// A flag's text as the JSON value its key would hold: "true" for a boolean flag given without a
/// value, a number for integer/elements/number settings (5e8 is a whole number), the text otherwise (an
/// allowed value matches in any case and comes back as the table spells it: "AdamW" gives "adamw").
/// Throws zero::Error naming the flag when the text is not of the setting's type or not one of its
/// allowed values: "--zero-stage must be an integer, got 'two'".
nlohmann::json flag_json(const Setting& s, const std::string& text);

/// `s` in lower case (ASCII): config values and flag values compare case-insensitively ("AdamW", "adamw").
std::string to_lower(std::string s);

/// The value `field` holds, as JSON (null when unset).
nlohmann::json field_json(const SettingField& field);

}  // namespace zero::dist
