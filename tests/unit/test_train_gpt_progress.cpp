// train_gpt's progress and summary lines, and its runs on the example configs: progress lines carry an
// ETA (but the last one, with nothing left), the run ends by naming where --metrics went, and each file
// in examples/configs/ trains with the stage, dtype and batch split it declares. Runs the real binary
// (build/bin/train_gpt) on a tiny model and text made here.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

struct Output {
  int exit_code;
  std::vector<std::string> lines;
};

Output train_gpt(const std::string& args) {
  const std::string cmd = zero::testing::bin_dir() + "/train_gpt " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (pipe != nullptr && fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  Output r{WIFEXITED(status) ? WEXITSTATUS(status) : 128, {}};
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) r.lines.push_back(line);
  return r;
}

std::string joined(const Output& r) {
  std::string s;
  for (const auto& l : r.lines) s += l + "\n";
  return s;
}

class TrainGptProgress : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zero_progress_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "text.txt") << std::string(3000, 'a') + "hello world, hello zero\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A model small enough that a few steps take milliseconds.
  std::string tiny() const {
    return "--data " + (dir_ / "text.txt").string() +
           " --n-layer 1 --n-head 1 --n-embd 8 --block 8 --eval-iters 1 --sample 0 --threads 1";
  }
  fs::path dir_;
};

TEST_F(TrainGptProgress, EtaOnProgressLinesAndMetricsPathAtTheEnd) {
  const fs::path metrics = dir_ / "m.json";
  const Output r = train_gpt(tiny() + " --steps 6 --log-every 2 --metrics " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << joined(r);
  std::vector<std::string> progress;
  for (const auto& l : r.lines)
    if (l.rfind("step ", 0) == 0 && l.find("| loss ") != std::string::npos) progress.push_back(l);
  ASSERT_EQ(progress.size(), 3u) << joined(r);
  const std::regex eta(R"( \| ETA (\d+s|\d+m\d\ds|\d+h\d\dm)$)");
  EXPECT_TRUE(std::regex_search(progress[0], eta)) << progress[0];
  EXPECT_TRUE(std::regex_search(progress[1], eta)) << progress[1];
  EXPECT_EQ(progress[2].find("ETA"), std::string::npos) << "nothing is left after the last step: " << progress[2];
  ASSERT_FALSE(r.lines.empty());
  EXPECT_EQ(r.lines.back(), "metrics: " + metrics.string());
  EXPECT_TRUE(fs::exists(metrics));
}

TEST_F(TrainGptProgress, NoMetricsLineWithoutMetrics) {
  const Output r = train_gpt(tiny() + " --steps 2");
  ASSERT_EQ(r.exit_code, 0) << joined(r);
  for (const auto& l : r.lines) EXPECT_NE(l.rfind("metrics:", 0), 0u) << l;
}

// One rank: the batch split and ZeRO settings train_gpt reports for each example config.
TEST_F(TrainGptProgress, ExampleConfigsTrain) {
  struct Case {
    const char* file;
    const char* split;  // the "data parallel:" line for 1 rank (default --batch 12 where the file has none)
    const char* zero;   // the start of the "zero:" line
  };
  const Case cases[] = {
      {"zero1.json", "1 rank(s) x micro-batch 12 x 1 accumulation step(s) = global batch 12",
       "zero: stage 1, f32 (mpi), reduce_scatter true"},
      {"zero1_allreduce.json", "1 rank(s) x micro-batch 12 x 1 accumulation step(s) = global batch 12",
       "zero: stage 1, f32 (mpi), reduce_scatter false"},
      {"zero2_fp16.json", "1 rank(s) x micro-batch 12 x 1 accumulation step(s) = global batch 12",
       "zero: stage 2, f16 (mpi), reduce_scatter true"},
      {"zero2_bf16_accum.json", "1 rank(s) x micro-batch 3 x 2 accumulation step(s) = global batch 6",
       "zero: stage 2, bf16 (mpi), reduce_scatter true, overlap_comm true"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    const Output r = train_gpt(tiny() + " --steps 2 --config " + (fs::path(zero::testing::example_config_dir()) / c.file).string());
    ASSERT_EQ(r.exit_code, 0) << joined(r);
    const std::string out = joined(r);
    EXPECT_NE(out.find(std::string("data parallel: ") + c.split), std::string::npos) << out;
    EXPECT_NE(out.find(c.zero), std::string::npos) << out;
    EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  }
}

}  // namespace
