// The command-line flags of the settings table (distributed/run/settings.h), shared by train_gpt and
// zero_explain, and the one merge rule both apply: defaults, then the config file, then the flags,
// then validation of the result (merge_config).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "distributed/distributed.h"

namespace zero::examples {

/// What the table's flags received: the text of each option, the state of each switch, by flag name.
struct SettingFlags {
  std::map<std::string, std::string> text;  // "--zero-stage" -> "2"
  std::map<std::string, bool> on;           // "--overlap-comm" -> true
};

/// Which settings a program offers as flags: all of them (train_gpt), or those that shape the ZeRO plan,
/// its wire or the memory (dist::Setting::shapes_plan; zero_explain).
enum class FlagSet { all, layout };

/// Defines one CLI11 option per setting of the table that has a flag (its name, help line and, for a
/// boolean, a switch), writing into `values`.
void add_setting_flags(CLI::App& app, SettingFlags& values, FlagSet which);

/// Whether a flag was given on the command line ("--zero-stage").
using FlagGiven = std::function<bool(std::string_view)>;

/// dist::merge_config (the one merge rule: defaults, file, flags, validation) with every table flag
/// `given` on the command line, taken from `values`. `program_flags` applies the flags that are not
/// one key of the table (--dtype, --batch, ...) and may call resolve_batch. Throws zero::Error with one
/// line naming the key, and the file or the flag it came from.
dist::TrainingConfig merge_config(const nlohmann::json& base, const std::string& source, const SettingFlags& values,
                                  const FlagGiven& given,
                                  const std::function<void(dist::TrainingConfig&)>& program_flags);

/// train_gpt's batch rule, after the table's flags (--grad-accum already in `cfg`): `batch` (--batch,
/// sequences per optimizer step over all ranks) becomes train_batch_size when `batch_given` or when
/// the file set no batch key; the micro-batch is then derived again, as it is when --grad-accum is
/// given beside a file's batch keys. Throws zero::Error naming --batch when it is not a positive
/// multiple of world_size x the accumulation steps.
void apply_batch_flags(dist::TrainingConfig& cfg, std::int64_t batch, bool batch_given, bool accum_given,
                       int world_size);

}  // namespace zero::examples
