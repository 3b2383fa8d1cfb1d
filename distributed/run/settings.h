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

  /// The section ("zero_optimization", "" for the top level) and the key's own name ("stage").
  std::string section() const;
  std::string name() const;
};

/// Every setting, top level first, then fp16, bf16, zero_optimization and optimizer; in docs/config.md's
/// order.
const std::vector<Setting>& settings();

/// The setting of a key path or a flag; nullptr when there is none.
const Setting* find_setting(std::string_view key);
const Setting* find_setting_by_flag(std::string_view flag);

/// A flag's text as the JSON value its key would hold: "true" for a boolean flag given without a
/// value, a number for integer/elements/number settings (5e8 is a whole number), the text otherwise.
/// Throws zero::Error naming the flag when the text is not of the setting's type or not one of its
/// allowed values: "--zero-stage must be an integer, got 'two'".
nlohmann::json flag_json(const Setting& s, const std::string& text);

/// The value `field` holds, as JSON (null when unset).
nlohmann::json field_json(const SettingField& field);

}  // namespace zero::dist
