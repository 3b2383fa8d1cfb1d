// nn::GPTConfig's JSON (GPTConfig::to_json / from_json): the one description of a model that a
// checkpoint records and every program reads. The references are literal JSON objects written here
// (the fields, an older checkpoint's config) and the models the configs build; the CLI test checks that
// sample_gpt rebuilds an RMSNorm model from its checkpoint alone, against the sample train_gpt printed
// from the model in its memory, and that train_gpt resumes it with no model flags, against a run that was
// never interrupted.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "nn/gpt.h"
#include "test_paths.h"

namespace zero {
namespace {

using nlohmann::json;

// name: shape of every parameter the config's model has.
std::vector<std::string> parameter_list(const nn::GPTConfig& cfg) {
  Generator gen(1);
  const nn::GPT model(cfg, gen);
  std::vector<std::string> out;
  for (const auto& p : model.named_parameters()) out.push_back(p.name + ": " + shape_str(p.tensor.shape()));
  return out;
}

std::string error_of(const json& j) {
  try {
    nn::GPTConfig::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// `j` with every model option it does not name at its default: a model option added later
// (nn::model_options()) leaves the literal configs of these tests as they are.
json with_other_options(json j) {
  for (const nn::ModelOption& o : nn::model_options())
    if (!j.contains(o.key)) j[o.key] = o.allowed.front();
  return j;
}

json small_config() {
  return with_other_options(json::parse(R"({"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_head": 2,
                                             "n_embd": 8, "dropout": 0.0, "bias": true, "norm": "layernorm"})"));
}

TEST(GPTConfigJson, WritesEveryField) {
  const nn::GPTConfig c{.vocab_size = 97, .block_size = 48, .n_layer = 3, .n_head = 6, .n_embd = 96,
                        .dropout = 0.25f, .bias = false, .norm = "rmsnorm"};
  const json want = with_other_options(json::parse(R"({"vocab_size": 97, "block_size": 48, "n_layer": 3,
                                                       "n_head": 6, "n_embd": 96, "dropout": 0.25, "bias": false,
                                                       "norm": "rmsnorm"})"));
  EXPECT_EQ(c.to_json(), want);
  // And back: the same fields, so the same model.
  const nn::GPTConfig back = nn::GPTConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), want);
  EXPECT_EQ(parameter_list(back), parameter_list(c));
}

TEST(GPTConfigJson, RoundTripKeepsANonRepresentableDropout) {
  nn::GPTConfig c;
  c.dropout = 0.1f;  // not a double value: JSON holds its f32 value widened, which reads back exactly
  EXPECT_EQ(nn::GPTConfig::from_json(json::parse(c.to_json().dump())).dropout, 0.1f);
}

TEST(GPTConfigJson, AnOlderCheckpointsConfigIsALayerNormModel) {
  // What checkpoints recorded before "norm" existed.
  const json old = json::parse(R"({"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 8,
                                   "dropout": 0.0, "bias": true})");
  const nn::GPTConfig c = nn::GPTConfig::from_json(old);
  EXPECT_EQ(c.norm, "layernorm");
  const std::vector<std::string> params = parameter_list(c);
  EXPECT_NE(std::find(params.begin(), params.end(), "lnf.bias: [8]"), params.end());
  // Only the sizes are required: dropout and bias default as well.
  json sizes = old;
  sizes.erase("dropout");
  sizes.erase("bias");
  EXPECT_EQ(nn::GPTConfig::from_json(sizes).to_json(), small_config());
}

TEST(GPTConfigJson, RMSNormModelHasNoNormBiases) {
  json j = small_config();
  j["norm"] = "rmsnorm";
  const std::vector<std::string> rms = parameter_list(nn::GPTConfig::from_json(j));
  const std::vector<std::string> ln = parameter_list(nn::GPTConfig::from_json(small_config()));
  // 2 blocks x (ln1, ln2) + lnf: five LayerNorm biases fewer.
  EXPECT_EQ(ln.size() - rms.size(), 5u);
  EXPECT_EQ(std::find(rms.begin(), rms.end(), "lnf.bias: [8]"), rms.end());
}

TEST(GPTConfigJson, MissingUnknownAndMistypedFieldsAreNamed) {
  for (const char* field : {"vocab_size", "block_size", "n_layer", "n_head", "n_embd"}) {
    json j = small_config();
    j.erase(field);
    const std::string e = error_of(j);
    EXPECT_NE(e.find(std::string("'") + field + "' is missing"), std::string::npos) << e;
  }
  json unknown = small_config();
  unknown["swiglu"] = true;  // a variant this build does not know must not load as another model
  EXPECT_NE(error_of(unknown).find("unknown field 'swiglu'"), std::string::npos) << error_of(unknown);
  json text = small_config();
  text["n_layer"] = "2";
  EXPECT_NE(error_of(text).find("'n_layer' must be an integer"), std::string::npos) << error_of(text);
  json fraction = small_config();
  fraction["n_embd"] = 8.5;
  EXPECT_NE(error_of(fraction).find("'n_embd' must be an integer"), std::string::npos) << error_of(fraction);
  json flag = small_config();
  flag["bias"] = 1;
  EXPECT_NE(error_of(flag).find("'bias' must be true or false"), std::string::npos) << error_of(flag);
  json norm = small_config();
  norm["norm"] = "batchnorm";
  EXPECT_NE(error_of(norm).find("batchnorm"), std::string::npos) << error_of(norm);
  json heads = small_config();
  heads["n_head"] = 3;  // 8 channels do not split into 3 heads: validate() runs
  EXPECT_NE(error_of(heads).find("divisible"), std::string::npos) << error_of(heads);
  EXPECT_NE(error_of(json::array()).find("expected a JSON object"), std::string::npos);
}

// Each model option: every value it lists reads back, an unknown one is refused naming the key, its
// default is GPTConfig's, and README.md's train_gpt table has its flag's row with
// the default (zero_explain takes the same flags: its table points there).
TEST(GPTModelOptions, EveryOptionIsValidatedAndDocumented) {
  std::ifstream in(std::filesystem::path(testing::docs_dir()) / ".." / "README.md");
  const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(readme.empty());
  for (const nn::ModelOption& o : nn::model_options()) {
    SCOPED_TRACE(o.key);
    EXPECT_EQ(nn::GPTConfig{}.*o.field, o.allowed.front());
    EXPECT_GE(o.allowed.size(), 2u);
    for (const std::string& v : o.allowed) {
      json j = small_config();
      j[o.key] = v;
      EXPECT_EQ(nn::GPTConfig::from_json(j).*o.field, v);
    }
    json bad = small_config();
    bad[o.key] = "no-such-variant";
    EXPECT_NE(error_of(bad).find(std::string(o.key) + " must be"), std::string::npos) << error_of(bad);
    const std::regex row(std::string("\\| `") + o.flag + " [A-Z]+` \\| " + o.allowed.front() + " \\|");
    EXPECT_TRUE(std::regex_search(readme, row)) << "README.md has no row '| `" << o.flag << " X` | "
                                                << o.allowed.front() << " | ...'";
  }
}

// A checkpoint of an RMSNorm model samples with no model flags: sample_gpt builds the model from
// state.json's "model" and prints the sample train_gpt printed from the model it trained.
TEST(GPTConfigCli, RMSNormCheckpointSamplesWithoutModelFlags) {
  namespace fs = std::filesystem;
  const fs::path dir = testing::make_test_dir("zero_gpt_config");
  std::string text;
  for (int i = 0; i < 60; ++i) text += "To be, or not to be, that is the question " + std::to_string(i) + "\n";
  std::ofstream(dir / "text.txt") << text;
  const std::string bin = testing::bin_dir();
  const testing::CommandResult t = testing::run_command(
      bin + "/train_gpt --data " + (dir / "text.txt").string() +
      " --n-layer 1 --n-head 2 --n-embd 16 --block 16 --batch 8 --steps 4 --eval-every 0 --eval-iters 1"
      " --threads 1 --norm rmsnorm --sample 60 --seed 3 --save-dir " +
      (dir / "ck").string());
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::string begin = "---- sample ----\n", end = "\n----------------";
  const auto b = t.output.find(begin), e = t.output.find(end);
  ASSERT_NE(b, std::string::npos) << t.output;
  const std::string expected = t.output.substr(b + begin.size(), e - b - begin.size());

  const testing::CommandResult s =
      testing::run_command(bin + "/sample_gpt --checkpoint " + (dir / "ck").string() + " --tokens 60 --seed 3");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.output, expected + "\n");
  fs::remove_all(dir);
}

// The training lines of a --log-file ({"step": n, "loss": x, ...}; evaluations are lines of their own):
// step -> loss.
std::vector<std::pair<int, double>> logged_losses(const std::filesystem::path& log) {
  std::vector<std::pair<int, double>> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (!j.contains("loss")) continue;
    out.emplace_back(j.at("step").get<int>(), j.at("loss").get<double>());
  }
  return out;
}

// A checkpoint of an RMSNorm model resumes with no model flags, and the resumed steps are bitwise those
// of a run that was never interrupted (the warm-up's learning rate does not depend on --steps).
TEST(GPTConfigCli, RMSNormCheckpointResumesWithoutModelFlags) {
  namespace fs = std::filesystem;
  const fs::path dir = testing::make_test_dir("zero_gpt_config_resume");
  std::string text;
  for (int i = 0; i < 60; ++i) text += "Now is the winter of our discontent " + std::to_string(i) + "\n";
  std::ofstream(dir / "text.txt") << text;
  const std::string train = testing::bin_dir() + "/train_gpt --data " + (dir / "text.txt").string() +
                            " --batch 8 --eval-every 0 --eval-iters 1 --threads 1 --sample 0 --warmup 100";
  const std::string model = " --n-layer 1 --n-head 2 --n-embd 16 --block 16 --norm rmsnorm";
  const testing::CommandResult whole =
      testing::run_command(train + model + " --steps 6 --log-file " + (dir / "whole.jsonl").string());
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const testing::CommandResult first =
      testing::run_command(train + model + " --steps 3 --save-dir " + (dir / "ck").string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const testing::CommandResult resumed = testing::run_command(
      train + " --steps 6 --resume " + (dir / "ck").string() + " --log-file " + (dir / "resumed.jsonl").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto want = logged_losses(dir / "whole.jsonl"), got = logged_losses(dir / "resumed.jsonl");
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(got.size(), 3u) << resumed.output;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i + 3].first);
    EXPECT_EQ(got[i].second, want[i + 3].second) << "step " << got[i].first;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zero
