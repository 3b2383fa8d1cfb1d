// The settings table (distributed/run/settings.h) and the one merge rule (dist::merge_config): a table of
// every flag x key pair that interacts, each merged both ways (the key in the file and the flag on the
// command line) and checked against the same settings written into one file; the flags' text; the
// table's round trip through the parser and to_json; docs/config.md's key tables against the table.
#include <gmock/gmock.h>
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
    std::string pointer = std::string("/") + s->key;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    file[json::json_pointer(pointer)] = zero::dist::flag_json(*s, text);
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
    std::string pointer = std::string("/") + s.key;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    EXPECT_TRUE(defaults.contains(json::json_pointer(pointer)));
    EXPECT_NE(std::string(s.doc), "");
    if (*s.flag != '\0') {
      ++flags;
      EXPECT_EQ(zero::dist::find_setting_by_flag(s.flag), &s);
    }
    EXPECT_EQ(zero::dist::find_setting(s.key), &s);
  }
  EXPECT_GE(flags, 16u);
}

// docs/config.md: each section's key table has one row per setting of the table, in the table's
// order within the section, with the table's default, and names the flag of every setting that has one.
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
      rows[section].emplace_back(m[1].str(), line);
    }
  }
  std::map<std::string, std::vector<std::string>> want;
  for (const Setting& s : zero::dist::settings()) {
    SCOPED_TRACE(s.key);
    want[s.section()].push_back(s.name());
    const auto& in_section = rows[s.section()];
    const auto it = std::find_if(in_section.begin(), in_section.end(), [&](const auto& r) { return r.first == s.name(); });
    ASSERT_NE(it, in_section.end()) << "no row for " << s.key << " in docs/config.md";
    EXPECT_THAT(it->second, HasSubstr(std::string("| `") + s.name() + "` | " + s.default_text + " |"));
    if (*s.flag != '\0') {
      EXPECT_THAT(it->second, HasSubstr(std::string("Flag: `") + s.flag + "`"));
    }
  }
  for (const auto& [sec, keys] : want) {
    std::vector<std::string> documented;
    for (const auto& r : rows[sec])  // nested keys (optimizer's params.lr) are the section parser's, not the table's
      if (r.first.find('.') == std::string::npos) documented.push_back(r.first);
    EXPECT_EQ(documented, keys) << "docs/config.md's table of section '" << sec << "'";
  }
}

}  // namespace
