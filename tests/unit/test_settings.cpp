// The settings table (distributed/run/settings.h) and the one merge rule (dist::merge_config): a table of
// every flag x key pair that interacts, each merged both ways (the key in the file and the flag on the
// command line) and checked against the same settings written into one file; the flags' text; the
// table's round trip through the parser and to_json; docs/config.md's key tables against the table.
#include <gmock/gmock.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "distributed/run/config.h"
#include "distributed/run/settings.h"
#include "test_paths.h"

namespace {

using json = nlohmann::json;
using zero::dist::merge_config;
using zero::dist::Setting;
using zero::dist::TrainingConfig;
using ::testing::HasSubstr;

using Flags = std::vector<std::pair<std::string, std::string>>;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zero::Error& e) {
    return e.what();
  }
  return "";
}

// --dtype is not one key of the table (it sets fp16.enabled and bf16.enabled): a program flag.
TrainingConfig merge(const json& file, const Flags& flags, const std::string& dtype = "") {
  return merge_config(file, "q.json", flags, [&](TrainingConfig& c) {
    if (!dtype.empty()) c.set_model_dtype(zero::parse_float_dtype(dtype));
  });
}

// The same settings written into the file: each flag's value at its key, the dtype as its section.
json written_in(json file, const Flags& flags, const std::string& dtype) {
  for (const auto& [flag, text] : flags) {
    const Setting* s = zero::dist::find_setting_by_flag(flag);
    file[json::json_pointer(s->pointer())] = zero::dist::flag_json(*s, text);
  }
  if (dtype == "bf16" || dtype == "fp16") file[dtype]["enabled"] = true;
  if (!dtype.empty()) file[dtype == "bf16" ? "fp16" : "bf16"]["enabled"] = false;
  if (dtype == "fp32") file["fp16"]["enabled"] = file["bf16"]["enabled"] = false;
  return file;
}

struct MergeCase {
  const char* file;
  Flags flags;
  const char* dtype;
  const char* error;  // "" = valid; else a part of the one line
};

// Every flag x key pair whose validity depends on the other: defaults, then the file, then the flags,
// then validation of the result.
const std::vector<MergeCase>& merge_cases() {
  static const std::vector<MergeCase> cases = {
      // int8 gradients need a stage that reduce-scatters, whichever side gives which.
      {R"({"zero_optimization": {"zero_quantized_gradients": true}})", {{"--zero-stage", "2"}}, "", ""},
      {R"({"zero_optimization": {"stage": 2}})", {{"--zero-quantized-gradients", "true"}}, "", ""},
      {R"({"zero_optimization": {"zero_quantized_gradients": true}})", {{"--zero-stage", "0"}}, "",
       "needs stage 1, 2 or 3"},
      {R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})", {{"--zero-stage", "0"}}, "",
       "needs stage 1, 2 or 3"},
      // error feedback needs int8 gradients.
      {R"({"zero_optimization": {"stage": 1, "zero_quantized_gradients_error_feedback": true}})",
       {{"--zero-quantized-gradients", "true"}}, "", ""},
      {R"({"zero_optimization": {"stage": 1, "zero_quantized_gradients": true}})",
       {{"--zero-quantized-gradients-error-feedback", "true"}}, "", ""},
      {R"({"zero_optimization": {"stage": 1, "zero_quantized_gradients": true, "zero_quantized_gradients_error_feedback": true}})",
       {{"--zero-quantized-gradients", "false"}}, "", "needs zero_optimization.zero_quantized_gradients"},
      // the wire dtype against the model dtype.
      {R"({"communication_data_type": "bf16"})", {}, "bf16", ""},
      {R"({"bf16": {"enabled": true}})", {{"--communication-data-type", "bf16"}}, "", ""},
      {R"({"communication_data_type": "bf16"})", {}, "fp16", "with a f16 model is not supported"},
      {R"({"communication_data_type": "fp16"})", {{"--communication-data-type", "fp32"}}, "bf16", ""},
      // fp32 accumulation needs a 16-bit wire.
      {R"({"zero_optimization": {"reduce_scatter_with_fp32_accumulation": true}})", {}, "bf16", ""},
      {R"({"fp16": {"enabled": true}})", {{"--reduce-scatter-with-fp32-accumulation", "true"}}, "", ""},
      {R"({"zero_optimization": {"reduce_scatter_with_fp32_accumulation": true}})", {}, "fp32", "needs a 16-bit wire"},
      {R"({"bf16": {"enabled": true}, "zero_optimization": {"reduce_scatter_with_fp32_accumulation": true}})",
       {{"--communication-data-type", "fp32"}}, "", "needs a 16-bit wire"},
      // int8 against the other wires.
      {R"({"zero_optimization": {"stage": 1, "zero_quantized_gradients": true}})",
       {{"--reduce-scatter-with-fp32-accumulation", "true"}}, "bf16", "choose one"},
      {R"({"communication_data_type": "fp32", "zero_optimization": {"stage": 1}})",
       {{"--zero-quantized-gradients", "true"}}, "bf16", "the int8 wire replaces the fp32 one"},
      {R"({"communication_data_type": "fp32", "zero_optimization": {"stage": 1}})",
       {{"--zero-quantized-gradients", "true"}}, "fp32", ""},
      // a setting that does nothing at the chosen stage is refused.
      {R"({"zero_optimization": {"overlap_param_gather": true}})", {{"--zero-stage", "2"}}, "", ""},
      {R"({"zero_optimization": {"overlap_param_gather": true}})", {{"--zero-stage", "3"}}, "", "does nothing at stage 3"},
      {R"({"zero_optimization": {"stage": 3}})", {{"--overlap-param-gather", "true"}}, "", "does nothing at stage 3"},
      {"{}", {{"--overlap-param-gather", "true"}}, "", "does nothing at stage 0"},
      // a flag replaces the file's value, and a bad file value replaced by a flag is no error.
      {R"({"zero_optimization": {"stage": 4}})", {{"--zero-stage", "1"}}, "", ""},
      {R"({"zero_optimization": {"zero_quantized_gradients_block_size": 0}})",
       {{"--zero-quantized-gradients-block-size", "64"}}, "", ""},
      {R"({"nonfinite_skip_limit": -1})", {{"--nonfinite-skip-limit", "3"}}, "", ""},
      {R"({"gradient_clipping": -1})", {{"--clip", "0.5"}}, "", ""},
      {R"({"gradient_accumulation_steps": 0})", {{"--grad-accum", "2"}}, "", ""},
      {R"({"gradient_accumulation_steps": 2})", {{"--grad-accum", "0"}}, "", "must be >= 1"},
      {R"({"gradient_clipping": 0.5})", {{"--clip", "inf"}}, "", "must be >= 0"},
      {R"({"collective_timeout_s": 0})", {{"--collective-timeout", "60"}}, "", ""},
      {R"({"collective_timeout_s": 60})", {{"--collective-timeout", "-2"}}, "", "must be a number of seconds > 0"},
  };
  return cases;
}

TEST(SettingsMerge, EveryInteractingFlagAndKeyPair) {
  for (const MergeCase& c : merge_cases()) {
    const json file = json::parse(c.file);
    std::string flags;
    for (const auto& [f, v] : c.flags) flags += " " + f + " " + v;
    SCOPED_TRACE(std::string(c.file) + flags + (*c.dtype ? std::string(" --dtype ") + c.dtype : ""));
    const std::string merged = error_of([&] { merge(file, c.flags, c.dtype); });
    const std::string one_file = error_of([&] { TrainingConfig::from_json(written_in(file, c.flags, c.dtype)); });
    if (*c.error == '\0') {
      EXPECT_EQ(merged, "");
    } else {
      EXPECT_THAT(merged, HasSubstr(c.error));
      EXPECT_EQ(merged.find('\n'), std::string::npos) << "one line";
    }
    // The rule has no order of its own: flags merged over a file judge as the same settings in one file.
    EXPECT_EQ(merged.empty(), one_file.empty()) << merged << " | " << one_file;
  }
}

TEST(SettingsMerge, FlagsWinAndErrorsNameTheirSource) {
  const TrainingConfig c = merge(json::parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": true}})"),
                                 {{"--zero-stage", "1"}, {"--overlap-comm", "false"}});
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  // A key set by a flag: the flag and its value; a key from the file: the file.
  EXPECT_THAT(error_of([] { merge(json::object(), {{"--zero-stage", "4"}}); }),
              HasSubstr("invalid config key 'zero_optimization.stage' (--zero-stage 4): stage 4 is not supported"));
  EXPECT_THAT(error_of([] { merge(json::parse(R"({"zero_optimization": {"stage": 4}})"), {}); }),
              HasSubstr("invalid config key 'zero_optimization.stage' in q.json: stage 4"));
  // The file's types and keys are still judged at once, naming it.
  EXPECT_THAT(error_of([] { merge(json::parse(R"({"zero_optimization": {"stgae": 1}})"), {{"--zero-stage", "1"}}); }),
              HasSubstr("did you mean 'zero_optimization.stage'"));
}

TEST(SettingsFlags, TextIsReadByTheSettingsType) {
  using zero::dist::find_setting_by_flag;
  using zero::dist::flag_json;
  EXPECT_EQ(flag_json(*find_setting_by_flag("--reduce-bucket-size"), "5e8"), json(500000000));
  EXPECT_EQ(flag_json(*find_setting_by_flag("--overlap-comm"), "true"), json(true));
  EXPECT_EQ(flag_json(*find_setting_by_flag("--communication-data-type"), "fp32"), json("fp32"));
  // An allowed value in any case, as the table spells it (--help shows the optimizer's default as AdamW).
  EXPECT_EQ(flag_json(*find_setting_by_flag("--optimizer"), "AdamW"), json("adamw"));
  EXPECT_EQ(flag_json(*find_setting_by_flag("--optimizer"), "MUON"), json("muon"));
  EXPECT_EQ(flag_json(*find_setting_by_flag("--recompute"), "Full"), json("full"));
  EXPECT_THAT(error_of([] { flag_json(*find_setting_by_flag("--reduce-bucket-size"), "1.5"); }),
              HasSubstr("--reduce-bucket-size must be a whole number of elements, got 1.5"));
  EXPECT_THAT(error_of([] { flag_json(*find_setting_by_flag("--zero-stage"), "two"); }),
              HasSubstr("--zero-stage must be an integer, got 'two'"));
  EXPECT_THAT(error_of([] { flag_json(*find_setting_by_flag("--nonfinite-grads"), "warn"); }),
              HasSubstr("--nonfinite-grads must be error or skip, got 'warn'"));
  EXPECT_EQ(find_setting_by_flag("--no-such-flag"), nullptr);
}

// Every setting is read by the parser and written by to_json at its key, with its default.
TEST(SettingsTable, EveryKeyParsesAndRoundTrips) {
  const json defaults = TrainingConfig::from_json(json::object()).to_json();
  std::size_t flags = 0;
  for (const Setting& s : zero::dist::settings()) {
    SCOPED_TRACE(s.key);
    EXPECT_TRUE(defaults.contains(json::json_pointer(s.pointer())));
    EXPECT_NE(std::string(s.doc), "");
    if (*s.flag != '\0') {
      ++flags;
      EXPECT_EQ(zero::dist::find_setting_by_flag(s.flag), &s);
    }
    EXPECT_EQ(zero::dist::find_setting_by_pointer(s.pointer()), &s);
    if (s.element <= 0) {
      EXPECT_EQ(zero::dist::find_setting(s.key), &s);
    }
  }
  EXPECT_GE(flags, 16u);
}

// docs/config.md: each section's key table has one row per setting of the table, in the table's
// order within the section, with the table's default ("`0.1` (section: `0`)" for a row with a section
// default), and names the flag of every setting that has one. A row "params.lr" under "### `optimizer`"
// is the setting optimizer.params.lr.
TEST(SettingsDocs, ConfigMdKeyTablesMatchTheTable) {
  const std::filesystem::path doc = std::filesystem::path(zero::testing::docs_dir()) / "config.md";
  if (!std::filesystem::exists(doc)) GTEST_SKIP() << doc << " is not here";
  std::ifstream in(doc);
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> rows;  // section -> (key, row)
  std::string line, section;
  const std::regex heading(R"(^### (`([a-z0-9_]+)`|Top level|Batch size).*)");
  const std::regex row(R"(^\| `([a-z0-9_.]+)` \| ([^|]+) \|.*)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, heading)) {
      section = m[2].matched ? m[2].str() : "";
    } else if (line.rfind("## ", 0) == 0) {
      section = "-";
    } else if (section != "-" && std::regex_match(line, m, row)) {
      const std::string key = m[1].str();  // "params.lr": section "optimizer.params", name "lr"
      const auto dot = key.rfind('.');
      const std::string full_section = dot == std::string::npos ? section : section + "." + key.substr(0, dot);
      const std::string name = dot == std::string::npos ? key : key.substr(dot + 1);
      std::string row_text = line;  // "| `params.lr` |..." as "| `lr` |..."
      row_text.replace(2, key.size() + 2, "`" + name + "`");
      rows[full_section].emplace_back(name, row_text);
    }
  }
  std::map<std::string, std::vector<std::string>> want;
  for (const Setting& s : zero::dist::settings()) {
    SCOPED_TRACE(s.key);
    if (want[s.section()].empty() || want[s.section()].back() != s.name()) want[s.section()].push_back(s.name());
    const auto& in_section = rows[s.section()];
    const auto it = std::find_if(in_section.begin(), in_section.end(), [&](const auto& r) { return r.first == s.name(); });
    ASSERT_NE(it, in_section.end()) << "no row for " << s.key << " in docs/config.md";
    const std::string shown = s.has_section_default()
                                  ? std::string(s.default_text) + " (section: " + s.section_default_text + ")"
                                  : std::string(s.default_text);
    EXPECT_THAT(it->second, HasSubstr(std::string("| `") + s.name() + "` | " + shown + " |"));
    if (*s.flag != '\0') {
      EXPECT_THAT(it->second, HasSubstr(std::string("Flag: `") + s.flag + "`"));
    }
  }
  for (const auto& [sec, keys] : want) {
    std::vector<std::string> documented;  // the table's rows among them (scheduler.params has others)
    for (const auto& r : rows[sec])
      if (std::find(keys.begin(), keys.end(), r.first) != keys.end()) documented.push_back(r.first);
    EXPECT_EQ(documented, keys) << "docs/config.md's table of section '" << sec << "'";
  }
}

// ---- the optimizer's params: two defaults (Note [Section defaults] in distributed/run/settings.cpp) ----

// One moved key: where it sits in the file, its flag ("" for none), how to read the run's value, and its
// two defaults as the rule states them: train_gpt's own without the section (nanoGPT's), DeepSpeed's
// with it (FusedAdam / torch AdamW; WarmupCosineLR's warmup).
struct SectionKey {
  const char* pointer;
  const char* flag;
  double (*value)(const TrainingConfig&);
  double program_default, section_default;
  double a, b;  // two valid values, neither a default
};

const std::vector<SectionKey>& section_keys() {
  static const std::vector<SectionKey> keys = {
      {"/optimizer/params/lr", "--lr", [](const TrainingConfig& c) { return c.optimizer->lr; }, 1e-3, 1e-3, 6e-4, 2e-3},
      {"/optimizer/params/betas/0", "--beta1", [](const TrainingConfig& c) { return c.optimizer->beta1; }, 0.9, 0.9,
       0.8, 0.85},
      {"/optimizer/params/betas/1", "--beta2", [](const TrainingConfig& c) { return c.optimizer->beta2; }, 0.99, 0.999,
       0.95, 0.98},
      {"/optimizer/params/eps", "", [](const TrainingConfig& c) { return c.optimizer->eps; }, 1e-8, 1e-8, 1e-6, 1e-7},
      {"/optimizer/params/weight_decay", "--weight-decay", [](const TrainingConfig& c) { return c.optimizer->weight_decay; },
       0.1, 0.0, 0.05, 0.2},
      {"/scheduler/params/warmup_num_steps", "--warmup",
       [](const TrainingConfig& c) { return static_cast<double>(c.scheduler->warmup_num_steps); }, 100, 1000, 10, 20},
  };
  return keys;
}

// The key's section with nothing but what it requires (a type; the scheduler's total_num_steps).
json empty_section_of(const char* pointer) {
  if (std::string(pointer).rfind("/scheduler/", 0) == 0)
    return json::parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100}}})");
  return json::parse(R"({"optimizer": {"type": "AdamW", "params": {}}})");
}

// A file giving `value` at `pointer` (with the other beta, which the array needs, at its default for
// the section), inside an AdamW section.
json file_with(const char* pointer, double value) {
  json file = empty_section_of(pointer);
  const std::string p = pointer;
  if (p.rfind("/optimizer/params/betas/", 0) == 0) file["optimizer"]["params"]["betas"] = {0.9, 0.999};
  if (p.rfind("/scheduler/", 0) == 0)
    file[json::json_pointer(p)] = static_cast<std::int64_t>(value);
  else
    file[json::json_pointer(p)] = value;
  return file;
}

TEST(SettingsSectionDefaults, EveryMovedKeyByFlagAndFile) {
  const auto text = [](double v) { return fmt::format("{}", v); };
  const json no_section = json::parse(R"({"zero_optimization": {"stage": 1}})");
  for (const SectionKey& k : section_keys()) {
    SCOPED_TRACE(k.pointer);
    const json empty_section = empty_section_of(k.pointer);
    const auto run = [&](const json& file, const Flags& flags) { return k.value(merge(file, flags)); };
    // Neither: the program's default; a file without the section: still the program's.
    EXPECT_EQ(run(json::object(), {}), k.program_default);
    EXPECT_EQ(run(no_section, {}), k.program_default);
    // A file with the section that leaves the key out: the section's default.
    EXPECT_EQ(run(empty_section, {}), k.section_default);
    // The file gives it: the file's, whichever value.
    EXPECT_EQ(run(file_with(k.pointer, k.a), {}), k.a);
    EXPECT_EQ(run(file_with(k.pointer, k.b), {}), k.b);
    if (*k.flag == '\0') continue;
    // The flag alone, over no file, a file without the section and one with it: the flag's.
    EXPECT_EQ(run(json::object(), {{k.flag, text(k.a)}}), k.a);
    EXPECT_EQ(run(no_section, {{k.flag, text(k.a)}}), k.a);
    EXPECT_EQ(run(empty_section, {{k.flag, text(k.a)}}), k.a);
    // Both: the flag wins, both ways round.
    EXPECT_EQ(run(file_with(k.pointer, k.a), {{k.flag, text(k.b)}}), k.b);
    EXPECT_EQ(run(file_with(k.pointer, k.b), {{k.flag, text(k.a)}}), k.a);
  }
}

TEST(SettingsSectionDefaults, AFlagsBadValueNamesTheFlag) {
  EXPECT_THAT(error_of([] { merge(json::object(), {{"--beta2", "1"}}); }),
              HasSubstr("invalid config key 'optimizer.params.betas' (--beta2 1): each beta must be in [0, 1)"));
  EXPECT_THAT(error_of([] { merge(json::object(), {{"--weight-decay", "-0.5"}}); }),
              HasSubstr("'optimizer.params.weight_decay' (--weight-decay -0.5): must be >= 0"));
  // A bad file value that a flag replaces is no error (defaults, the file, the flags, then validation).
  EXPECT_EQ(error_of([] { merge(file_with("/optimizer/params/lr", -1.0), {{"--lr", "0.01"}}); }), "");
}

// The values a run uses, for comparing two configs: the optimizer's, then the warmup.
std::vector<double> optimizer_values(const TrainingConfig& c) {
  const auto& o = *c.optimizer;
  return {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.momentum.value_or(-1.0),
          static_cast<double>(o.ns_steps.value_or(-1)), c.uses_muon() ? 1.0 : 0.0,
          static_cast<double>(c.scheduler->warmup_num_steps)};
}

// A merged config, recorded (to_json) and read back, merges again to the same values: whichever defaults
// applied to it, the recorded one gives every value.
TEST(SettingsSectionDefaults, ARecordedConfigReadsBackToTheSameValues) {
  struct Case {
    const char* file;
    Flags flags;
    // lr, beta1, beta2, eps, weight_decay, momentum (-1 unset), ns_steps (-1), muon, warmup
    std::vector<double> want;
  };
  const std::vector<Case> cases = {
      {"{}", {}, {1e-3, 0.9, 0.99, 1e-8, 0.1, -1, -1, 0, 100}},
      {R"({"optimizer": {"type": "AdamW"}})", {}, {1e-3, 0.9, 0.999, 1e-8, 0.0, -1, -1, 0, 100}},
      {R"({"optimizer": {"type": "Adam", "params": {"lr": 6e-4, "eps": 1e-6}}})", {},
       {6e-4, 0.9, 0.999, 1e-6, 0.0, -1, -1, 0, 100}},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50}}})", {},
       {1e-3, 0.9, 0.99, 1e-8, 0.1, -1, -1, 0, 1000}},
      {"{}", {{"--lr", "0.002"}, {"--beta2", "0.95"}, {"--warmup", "7"}}, {2e-3, 0.9, 0.95, 1e-8, 0.1, -1, -1, 0, 7}},
      {R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": 0.01}},
           "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "warmup_num_steps": 5}}})",
       {{"--weight-decay", "0.2"}, {"--beta1", "0.8"}}, {1e-3, 0.8, 0.999, 1e-8, 0.2, -1, -1, 0, 5}},
      {"{}", {{"--optimizer", "muon"}}, {1e-3, 0.9, 0.99, 1e-8, 0.1, -1, -1, 1, 100}},
      {R"({"optimizer": {"type": "Muon", "params": {"momentum": 0.9, "ns_steps": 3}}})", {{"--lr", "0.02"}},
       {0.02, 0.9, 0.999, 1e-8, 0.0, 0.9, 3, 1, 100}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + " with " + std::to_string(c.flags.size()) + " flag(s)");
    const TrainingConfig first = merge(json::parse(c.file), c.flags);
    EXPECT_EQ(optimizer_values(first), c.want);
    const json recorded = first.to_json();
    const TrainingConfig back = merge(recorded, {});
    EXPECT_EQ(optimizer_values(back), c.want) << recorded.dump();
    EXPECT_EQ(back.to_json(), recorded);
    EXPECT_EQ(back.scheduler.has_value(), first.scheduler.has_value());  // the schedule's end and floor follow it
  }
}

// A config recorded before the params were rows of the table: the type alone, "params": null, is no
// section, so it reads back with the program's defaults, which its run used.
TEST(SettingsSectionDefaults, AConfigRecordedBeforeGetsTheProgramDefaults) {
  const TrainingConfig plain = merge(json::parse(R"({"optimizer": {"type": null, "params": null}})"), {});
  EXPECT_FALSE(plain.optimizer);
  EXPECT_EQ(optimizer_values(plain), (std::vector<double>{1e-3, 0.9, 0.99, 1e-8, 0.1, -1, -1, 0, 100}));
  EXPECT_FALSE(plain.scheduler);
  const TrainingConfig muon = merge(json::parse(R"({"optimizer": {"type": "muon", "params": null}})"), {});
  EXPECT_FALSE(muon.optimizer);
  EXPECT_EQ(optimizer_values(muon), (std::vector<double>{1e-3, 0.9, 0.99, 1e-8, 0.1, -1, -1, 1, 100}));
  // A section must still name its type: "type" left out is an error, "type": null the recorded form.
  EXPECT_THAT(error_of([] { merge(json::parse(R"({"optimizer": {"params": {"lr": 0.1}}})"), {}); }),
              HasSubstr("'optimizer.type' in q.json: is required"));
}

}  // namespace
