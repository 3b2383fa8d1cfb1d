// examples/zero_in_one_process must keep working as its header says: the mean loss over 4 in-process
// ranks at every step equals the loss of the same global batch trained on 1 rank (ZeRO is data
// parallelism: only the summation order differs), at stages 0, 2 and 3; every rank reports the partition
// it owns, and at stage 3 its gather units and all-gathers; bad flags get one line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "cli_util.h"
#include "test_paths.h"

namespace {

using zero::testing::CommandResult;
using zero::testing::run_command;

std::string example() { return zero::testing::bin_dir() + "/zero_in_one_process"; }

// The "step k: loss X (mean over N rank(s))" lines, in order.
std::vector<double> mean_losses(const std::string& output) {
  std::vector<double> losses;
  const std::regex line(R"(step (\d+): loss ([0-9.]+) \(mean over)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it)
    losses.push_back(std::strtod((*it)[2].str().c_str(), nullptr));
  return losses;
}

TEST(ZeroInOneProcess, FourRanksTrainLikeOne) {
  for (const char* stage : {"3", "2", "0"}) {
    const std::string flags = std::string(" --stage ") + stage + " --steps 4";
    const CommandResult four = run_command(example() + " --ranks 4" + flags);
    const CommandResult one = run_command(example() + " --ranks 1" + flags);
    ASSERT_EQ(four.exit_code, 0) << four.output;
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const std::vector<double> l4 = mean_losses(four.output), l1 = mean_losses(one.output);
    ASSERT_EQ(l4.size(), 4u) << four.output;
    ASSERT_EQ(l1.size(), 4u) << one.output;
    for (std::size_t s = 0; s < l1.size(); ++s)
      EXPECT_NEAR(l4[s], l1[s], 2e-5 * l1[s]) << "stage " << stage << ", step " << s + 1;
    EXPECT_LT(l1.back(), l1.front() - 0.1) << "stage " << stage << ": the model did not train\n" << one.output;
    for (int r = 0; r < 4; ++r) {
      const std::string owns = std::string(stage) == "0" ? ": keeps all " : ": owns [";
      EXPECT_NE(four.output.find("rank " + std::to_string(r) + owns), std::string::npos) << four.output;
      EXPECT_NE(four.output.find("rank " + std::to_string(r) + ": step 4 loss "), std::string::npos) << four.output;
      if (std::string(stage) != "3") continue;
      // The example's GPT (2 layers): units wte, wpe, blocks.0, blocks.1, lnf, each gathered before its
      // forward and again before its backward (the tied wte: twice in forward, still there for backward).
      EXPECT_NE(four.output.find("rank " + std::to_string(r) + ": keeps only these parameter values"),
                std::string::npos)
          << four.output;
      EXPECT_NE(four.output.find(" wte ("), std::string::npos) << four.output;
      EXPECT_NE(four.output.find(" blocks.1 ("), std::string::npos) << four.output;
      EXPECT_NE(four.output.find("rank " + std::to_string(r) + ": " + std::to_string(2 * 5 * 4) +
                                 " unit all-gathers in 4 step(s)"),
                std::string::npos)
          << four.output;
    }
  }
}

TEST(ZeroInOneProcess, BadFlagsAreOneLine) {
  for (const char* flags : {"--ranks 0", "--ranks 4 --batch 10", "--stage 4", "--steps 0"}) {
    const CommandResult r = run_command(example() + " " + flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << flags << ": " << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << flags << ": " << r.output;
  }
}

}  // namespace
