// docs/zero.md (section 10) and docs/tutorial.md (section 8) quote zero_explain's output for Muon: every
// quoted line must be a line that the quoted command prints today.
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

// The lines of `doc` quoted after the block holding `doc_line`: its closing fence, the quote's opening
// one, its closing one.
std::vector<std::string> quoted_after(const std::filesystem::path& doc, const std::string& doc_line) {
  std::ifstream in(doc);
  std::vector<std::string> quoted;
  bool seen_command = false;
  int fences = 0;
  for (std::string line; std::getline(in, line) && fences < 3;) {
    if (line == doc_line) seen_command = true;
    if (!seen_command) continue;
    if (line.rfind("```", 0) == 0) {
      ++fences;
    } else if (fences == 2) {
      quoted.push_back(line);
    }
  }
  EXPECT_TRUE(seen_command) << doc << " no longer quotes: " << doc_line;
  return quoted;
}

// Every line `doc` quotes after `doc_line` is a line that zero_explain `flags` prints today.
void expect_quotes_printed(const std::string& doc_name, const std::string& doc_line, const std::string& flags) {
  const std::filesystem::path doc = std::filesystem::path(zero::testing::docs_dir()) / doc_name;
  if (!std::filesystem::exists(doc)) GTEST_SKIP() << doc << " is not here";
  const std::vector<std::string> quoted = quoted_after(doc, doc_line);
  ASSERT_GT(quoted.size(), 4u);
  const auto r = zero::testing::run_command(zero::testing::bin_dir() + "/zero_explain " + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> printed;
  std::istringstream out(r.output);
  for (std::string line; std::getline(out, line);) printed.insert(line);
  for (const std::string& q : quoted) EXPECT_TRUE(printed.count(q)) << doc_name << " quotes a line zero_explain does not print: " << q;
}

TEST(MuonDocs, ZeroMdQuotesWhatZeroExplainPrints) {
  expect_quotes_printed("zero.md",
                        "build/bin/zero_explain --world-size 4 --zero-stage 2 --optimizer muon | grep -E "
                        "'^== (flat|partitions|Muon)|^rank|^  blocks\\.[0-9]\\.attn\\.qkv|imbalance'",
                        "--world-size 4 --zero-stage 2 --optimizer muon");
}

TEST(MuonDocs, TutorialQuotesWhatZeroExplainPrints) {
  expect_quotes_printed("tutorial.md",
                        "build/bin/zero_explain --world-size 2 --zero-stage 2 --optimizer muon | grep -E '^rank|imbalance'",
                        "--world-size 2 --zero-stage 2 --optimizer muon");
}

}  // namespace
