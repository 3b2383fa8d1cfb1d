// zero_explain's promise: its JSON gives the memory per rank and the bytes per step that train_gpt
// measures for the same model and ZeRO configuration. Runs both real binaries (train_gpt under mpirun
// with 1-4 ranks) on a small text and compares zero_explain's memory_bytes / traffic_bytes_per_step
// with train_gpt's --metrics memory_bytes / comm_bytes_per_step, for stages 0/1/2 and
// reduce_scatter false. Also: its bad input gets one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

using zero::testing::CommandResult;
using zero::testing::run_command;

class ZeroExplainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = zero::testing::make_test_dir("zero_explain");
    std::string text;
    for (int i = 0; i < 400; ++i) text += "to be or not to be, that is the question " + std::to_string(i % 7) + "\n";
    std::ofstream(dir_ / "text.txt") << text;
    std::ofstream(dir_ / "no_rs.json") << R"({"zero_optimization": {"reduce_scatter": false}})";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

const std::string kModel = " --n-layer 1 --n-head 2 --n-embd 16 --block 8 --reduce-bucket-size 700";

TEST_F(ZeroExplainCli, JsonEqualsWhatTrainGptMeasures) {
  const std::string bin = zero::testing::bin_dir();
  const std::string data = " --data " + (dir_ / "text.txt").string();
  const std::vector<std::string> schemes = {"--zero-stage 0", "--zero-stage 1 --dtype bf16", "--zero-stage 2",
                                            "--zero-stage 2 --config " + (dir_ / "no_rs.json").string()};
  for (int n = 1; n <= 4; ++n) {
    for (const std::string& scheme : schemes) {
      const std::string what = "np " + std::to_string(n) + " " + scheme;
      const fs::path metrics = dir_ / "m.json";
      fs::remove(metrics);
      const CommandResult train = run_command(
          std::string(ZERO_MPIRUN) + " -np " + std::to_string(n) + " " + bin + "/train_gpt" + data + kModel + " " +
          scheme + " --batch 12 --steps 2 --eval-iters 1 --sample 0 " + "--threads 1 --metrics " + metrics.string());
      ASSERT_EQ(train.exit_code, 0) << what << "\n" << train.output;
      std::ifstream in(metrics);
      const nlohmann::json measured = nlohmann::json::parse(in);
      const CommandResult explain = run_command(bin + "/zero_explain" + data + kModel + " " + scheme +
                                                " --world-size " + std::to_string(n) + " --format json");
      ASSERT_EQ(explain.exit_code, 0) << what << "\n" << explain.output;
      const nlohmann::json planned = nlohmann::json::parse(explain.output);
      EXPECT_EQ(planned["partition_size"].get<std::int64_t>() * n, planned["padded_numel"].get<std::int64_t>());
      EXPECT_EQ(planned["model"]["params"], measured["params"]) << what;
      for (const char* k : {"params", "grads", "optimizer_states", "buckets"})
        EXPECT_EQ(planned["memory_bytes"][k].get<double>(), measured["memory_bytes"][k].get<double>())
            << what << ": memory " << k;
      for (const char* k : {"all_reduce", "reduce_scatter", "all_gather", "total"})
        EXPECT_NEAR(planned["traffic_bytes_per_step"][k].get<double>(),
                    measured["comm_bytes_per_step"][k].get<double>(), 1e-6)
            << what << ": traffic " << k;
      // The buckets' reduce-scatter counts split each bucket among the ranks.
      for (const auto& b : planned["buckets"]) {
        std::int64_t sum = 0;
        for (const auto& c : b["counts"]) sum += c.get<std::int64_t>();
        EXPECT_EQ(sum, b["end"].get<std::int64_t>() - b["begin"].get<std::int64_t>()) << what;
      }
    }
  }
}

TEST_F(ZeroExplainCli, BadInputIsOneLine) {
  const std::string bin = zero::testing::bin_dir() + "/zero_explain";
  for (const std::string& args :
       {std::string("--world-size 0"), std::string("--zero-stage 3"), std::string("--n-embd 10 --n-head 4"),
        std::string("--format yaml"), std::string("--data /nonexistent.txt"), std::string("--reduce-bucket-size 0")}) {
    const CommandResult r = run_command(bin + " " + args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
  }
}

}  // namespace
