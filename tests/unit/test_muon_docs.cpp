// docs/zero.md, section 9, quotes zero_explain's output for Muon: every quoted line must be a line that the
// quoted command prints today.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "test_paths.h"

namespace {

TEST(MuonDocs, ZeroMdQuotesWhatZeroExplainPrints) {
  const std::filesystem::path doc = std::filesystem::path(zero::testing::docs_dir()) / "zero.md";
  if (!std::filesystem::exists(doc)) GTEST_SKIP() << doc << " is not here";
  std::ifstream in(doc);
  const std::string command = "build/bin/zero_explain --world-size 4 --zero-stage 2 --optimizer muon";
  std::vector<std::string> quoted;
  bool seen_command = false;
  int fences = 0;  // after the command: its block's closing fence, the quote's opening one, its closing one
  for (std::string line; std::getline(in, line) && fences < 3;) {
    if (line == command) seen_command = true;
    if (!seen_command) continue;
    if (line.rfind("```", 0) == 0) {
      ++fences;
    } else if (fences == 2) {
      quoted.push_back(line);
    }
  }
  ASSERT_TRUE(seen_command) << "docs/zero.md no longer quotes: " << command;
  ASSERT_GT(quoted.size(), 5u);
  const auto r = zero::testing::run_command(zero::testing::bin_dir() + "/zero_explain --world-size 4 --zero-stage 2 "
                                            "--optimizer muon");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> printed;
  std::istringstream out(r.output);
  for (std::string line; std::getline(out, line);) printed.insert(line);
  for (const std::string& q : quoted) EXPECT_TRUE(printed.count(q)) << "docs/zero.md quotes a line zero_explain does not print: " << q;
}

}  // namespace
