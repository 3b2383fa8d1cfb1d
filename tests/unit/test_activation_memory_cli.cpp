// Activation memory: zero_explain's prediction (nn/activation_memory.h, the closed form of docs/zero.md
// section 9) against what train_gpt measures from its allocator (metrics memory_bytes.activations,
// examples/activation_meter.h), on the same configurations: every recompute mode, with and without
// dropout, stages 0-3, one and two ranks, fp32 and bf16, GAS 1 and 2: byte for byte (at stage 3 the
// meter leaves the gathered parameters out, as the formula does). At stage 3 also zero_explain's count
// of unit all-gathers per step against the number issued. The recompute modes must give train_gpt the
// same training loss. And the config keys that need tensor parallelism are refused with one line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

using zero::testing::CommandResult;
using zero::testing::run_command;

class ActivationMemoryCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = zero::testing::make_test_dir("activation_memory");
    std::string text;
    for (int i = 0; i < 400; ++i) text += "to be or not to be, that is the question " + std::to_string(i % 7) + "\n";
    std::ofstream(dir_ / "text.txt") << text;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

const std::string kModel = " --n-layer 2 --n-head 2 --n-embd 16 --block 16 --batch 8";

struct Case {
  int ranks;
  std::string flags;  // train_gpt and zero_explain alike
};

TEST_F(ActivationMemoryCli, PredictionEqualsMeasurement) {
  const std::string bin = zero::testing::bin_dir();
  const std::string data = " --data " + (dir_ / "text.txt").string();
  const std::vector<Case> cases = {
      {1, "--recompute none --dropout 0.1"},
      {1, "--recompute full --dropout 0.1 --dtype bf16"},
      {1, "--recompute selective --dropout 0"},
      {2, "--recompute selective --dropout 0.1 --zero-stage 2 --grad-accum 2"},
      {2, "--recompute full --dropout 0 --zero-stage 1"},
      {2, "--recompute none --dropout 0.1 --zero-stage 3 --dtype bf16"},
      {2, "--recompute full --dropout 0.1 --zero-stage 3"},
      {1, "--recompute none --dropout 0.1 --norm rmsnorm"},
      {1, "--recompute selective --dropout 0.1 --norm rmsnorm"},
      // A norm composed of ops has backward nodes after its weight's gradient: they must not gather
      // its unit again (Note [Nodes after the last gradient]).
      {2, "--recompute none --dropout 0.1 --zero-stage 3 --norm rmsnorm"},
      {2, "--recompute full --dropout 0 --zero-stage 3 --norm rmsnorm --dtype bf16"},
  };
  for (const Case& c : cases) {
    const std::string what = "np " + std::to_string(c.ranks) + " " + c.flags;
    const fs::path metrics = dir_ / "m.json";
    fs::remove(metrics);
    const CommandResult train =
        run_command(std::string(ZERO_MPIRUN) + " -np " + std::to_string(c.ranks) + " " + bin + "/train_gpt" + data +
                    kModel + " " + c.flags + " --steps 3 --eval-iters 1 --sample 0 --threads 1 --metrics " +
                    metrics.string());
    ASSERT_EQ(train.exit_code, 0) << what << "\n" << train.output;
    std::ifstream in(metrics);
    const nlohmann::json run = nlohmann::json::parse(in), measured = run["memory_bytes"];
    const CommandResult explain = run_command(bin + "/zero_explain" + data + kModel + " " + c.flags +
                                              " --world-size " + std::to_string(c.ranks) + " --format json");
    ASSERT_EQ(explain.exit_code, 0) << what << "\n" << explain.output;
    const nlohmann::json predicted = nlohmann::json::parse(explain.output)["activations_bytes"];
    const double held = measured["activations_held"].get<double>(), rerun = measured["activations_recompute"].get<double>();
    EXPECT_GT(held, 0) << what;
    EXPECT_EQ(predicted["held_for_backward"].get<double>(), held) << what;
    EXPECT_EQ(predicted["recompute_working_set"].get<double>(), rerun) << what;
    const nlohmann::json plan = nlohmann::json::parse(explain.output);
    EXPECT_EQ(predicted["total"].get<double>(), plan["memory_bytes"]["activations"].get<double>());
    // Stage 3: the unit all-gathers per step zero_explain counts (recompute adds none) are those issued.
    if (c.flags.find("--zero-stage 3") != std::string::npos) {
      EXPECT_EQ(plan["stage3_all_gathers_per_step"].get<double>(), run["stage3_all_gathers_per_step"].get<double>())
          << what;
    }
  }
}

// The same run with each mode: the same losses (bitwise, as printed to 17 digits in the metrics), and
// less memory held with recompute.
TEST_F(ActivationMemoryCli, ModesTrainTheSameAndFullHoldsLeast) {
  const std::string bin = zero::testing::bin_dir();
  const std::string data = " --data " + (dir_ / "text.txt").string();
  std::vector<nlohmann::json> runs;
  for (const char* mode : {"none", "full", "selective"}) {
    const fs::path metrics = dir_ / (std::string(mode) + ".json");
    const CommandResult train = run_command(bin + "/train_gpt" + data + kModel + " --dropout 0.2 --recompute " + mode +
                                            " --steps 3 --eval-iters 1 --sample 0 --threads 1 --metrics " +
                                            metrics.string());
    ASSERT_EQ(train.exit_code, 0) << mode << "\n" << train.output;
    std::ifstream in(metrics);
    runs.push_back(nlohmann::json::parse(in));
  }
  for (std::size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i]["train_loss"], runs[0]["train_loss"]);
    EXPECT_EQ(runs[i]["val_loss"], runs[0]["val_loss"]);
    EXPECT_EQ(runs[i]["config"]["activation_checkpointing"]["recompute_granularity"],
              i == 1 ? "full" : "selective");
  }
  const auto held = [&](std::size_t i) { return runs[i]["memory_bytes"]["activations_held"].get<double>(); };
  EXPECT_LT(held(1), held(2));
  EXPECT_LT(held(2), held(0));
}

TEST_F(ActivationMemoryCli, TensorParallelKeysAreRefusedWithOneLine) {
  const std::string bin = zero::testing::bin_dir();
  const fs::path config = dir_ / "ac.json";
  std::ofstream(config) << R"({"activation_checkpointing": {"partition_activations": true}})";
  const CommandResult r = run_command(bin + "/train_gpt --data " + (dir_ / "text.txt").string() + " --config " +
                                      config.string() + " --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("activation_checkpointing.partition_activations"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensor parallelism"), std::string::npos) << r.output;
  const CommandResult bad = run_command(bin + "/train_gpt --data " + (dir_ / "text.txt").string() +
                                        " --recompute some --steps 1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--recompute"), std::string::npos) << bad.output;
}

}  // namespace
