// train_gpt --trace: a 2-rank stage-2 run with overlap_comm writes one Chrome trace holding both ranks,
// and its events account for everything the step did: one hook per parameter per micro-step, one
// issued bucket and one reduce-scatter on the communication thread per bucket per reduction (with the
// bucket's bytes, as zero_explain plans them), forward and backward spans for every block, and only
// the requested steps. Bad --trace-steps values get one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

using zero::testing::CommandResult;
using zero::testing::run_command;

class TraceCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = zero::testing::make_test_dir("zero_trace");
    std::string text;
    for (int i = 0; i < 300; ++i) text += "now is the winter of our discontent " + std::to_string(i % 5) + "\n";
    std::ofstream(dir_ / "text.txt") << text;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

const std::string kModel = " --n-layer 2 --n-head 2 --n-embd 16 --block 8 --reduce-bucket-size 900";

TEST_F(TraceCli, TwoRankStage2TraceAccountsForTheSteps) {
  const std::string bin = zero::testing::bin_dir();
  const std::string data = " --data " + (dir_ / "text.txt").string();
  const fs::path path = dir_ / "trace.json";
  const CommandResult train =
      run_command(std::string(ZERO_MPIRUN) + " -np 2 " + bin + "/train_gpt" + data + kModel +
                  " --zero-stage 2 --overlap-comm --batch 4 --steps 4 --eval-iters 1 --sample 0 --threads 1 "
                  "--trace " +
                  path.string() + " --trace-steps 2:3");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("hidden behind compute"), std::string::npos) << train.output;
  const CommandResult explain =
      run_command(bin + "/zero_explain" + data + kModel + " --zero-stage 2 --world-size 2 --format json");
  ASSERT_EQ(explain.exit_code, 0) << explain.output;
  const nlohmann::json plan = nlohmann::json::parse(explain.output);
  const std::size_t n_params = plan["params"].size();
  std::multiset<double> bucket_bytes;
  for (const auto& b : plan["buckets"])
    bucket_bytes.insert(4.0 * static_cast<double>(b["end"].get<std::int64_t>() - b["begin"].get<std::int64_t>()));

  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  const auto& events = trace["traceEvents"];
  const int traced_steps = 2;
  for (int pid : {0, 1}) {
    std::map<std::string, int> count;
    std::multiset<double> rs_bytes;
    std::map<std::string, std::string> thread_names;
    for (const auto& e : events) {
      if (e["pid"] != pid) continue;
      const std::string name = e["name"], ph = e["ph"];
      if (ph == "M") {
        if (name == "thread_name") thread_names[std::to_string(e["tid"].get<int>())] = e["args"]["name"];
        continue;
      }
      EXPECT_GE(e["ts"].get<double>(), 0.0) << e.dump();
      if (ph == "X") {
        EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
      }
      ++count[name];
      if (name == "reduce_scatter") {
        EXPECT_EQ(e["tid"], 1) << "collectives run on the communication thread: " << e.dump();
        rs_bytes.insert(e["args"]["bytes"].get<double>());
      }
      if (name == "step") {
        const int s = e["args"]["step"];
        EXPECT_TRUE(s == 2 || s == 3) << "outside --trace-steps: " << e.dump();
      }
    }
    EXPECT_EQ(thread_names["0"], "compute");
    EXPECT_EQ(thread_names["1"], "communication");
    EXPECT_EQ(count["step"], traced_steps) << "rank " << pid;
    EXPECT_EQ(count["hook"], static_cast<int>(n_params) * traced_steps) << "rank " << pid;
    EXPECT_EQ(count["bucket issued"], static_cast<int>(bucket_bytes.size()) * traced_steps) << "rank " << pid;
    EXPECT_EQ(count["bucket done"], static_cast<int>(bucket_bytes.size()) * traced_steps) << "rank " << pid;
    std::multiset<double> want;
    for (int s = 0; s < traced_steps; ++s) want.insert(bucket_bytes.begin(), bucket_bytes.end());
    EXPECT_EQ(rs_bytes, want) << "rank " << pid;
    for (int b = 0; b < 2; ++b) {
      const std::string block = "block " + std::to_string(b);
      EXPECT_EQ(count["forward " + block], traced_steps) << "rank " << pid;
      EXPECT_GE(count["backward " + block], traced_steps) << "rank " << pid;
    }
    EXPECT_EQ(count["adamw"], traced_steps);
    EXPECT_EQ(count["all_gather params"], traced_steps);
    EXPECT_EQ(count["evaluate"], 0) << "the evaluation at step 4 is outside the traced steps";
  }
}

TEST_F(TraceCli, BadTraceStepsIsOneLine) {
  const std::string cmd = zero::testing::bin_dir() + "/train_gpt --data " + (dir_ / "text.txt").string() + kModel +
                          " --steps 2 --sample 0 ";
  for (const std::string& args :
       {std::string("--trace-steps 1:2"), "--trace " + (dir_ / "t.json").string() + " --trace-steps 3:2",
        "--trace " + (dir_ / "t.json").string() + " --trace-steps x", "--trace " + dir_.string()}) {
    const CommandResult r = run_command(cmd + args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << args << ": " << r.output;
    EXPECT_NE(r.output.find("--trace"), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "t.json"));
  }
}

}  // namespace
