// train_gpt's promise on bad input: one line naming the problem, a non-zero exit, no crash, and no
// metrics file left behind. Runs the real binary (build/bin/train_gpt) on small files made here.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/wait.h>

#ifdef ZERO_HAS_CUDA
#include "core/cuda/runtime.h"
#endif

namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code;
  std::string output;
};

Result run_train_gpt(const std::string& args) {
  const std::string cmd = std::string(ZERO_BIN_DIR) + "/train_gpt " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

class TrainGptCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zero_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "text.txt") << std::string(2000, 'a') + "hello world, hello zero\n";
    std::ofstream(dir_ / "empty.txt");
    std::ofstream(dir_ / "short.txt") << "tiny text\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs with a metrics path and checks the failure contract.
  void expect_clean_failure(const std::string& args, const std::string& culprit) {
    const fs::path metrics = dir_ / "metrics.json";
    const Result r = run_train_gpt(args + " --metrics " + metrics.string() + " --steps 2 --sample 0");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_LT(r.exit_code, 128) << "crashed: " << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(culprit), std::string::npos) << "message should name '" << culprit << "': " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "expected one line: " << r.output;
    EXPECT_FALSE(fs::exists(metrics));
    EXPECT_FALSE(fs::exists(metrics.string() + ".tmp"));
  }

  std::string path(const char* name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(TrainGptCli, MissingDataFile) { expect_clean_failure("--data " + path("nope.txt"), "nope.txt"); }
TEST_F(TrainGptCli, EmptyDataFile) { expect_clean_failure("--data " + path("empty.txt"), "empty"); }
TEST_F(TrainGptCli, UnreadableDataFile) { expect_clean_failure("--data " + dir_.string(), "directory"); }
TEST_F(TrainGptCli, BlockLongerThanText) {
  expect_clean_failure("--data " + path("short.txt") + " --block 64", "--block 64");
}
TEST_F(TrainGptCli, EmbdNotDivisibleByHeads) {
  expect_clean_failure("--data " + path("text.txt") + " --n-embd 30 --n-head 4", "divisible");
}
TEST_F(TrainGptCli, NonPositiveSteps) {
  const Result r = run_train_gpt("--data " + path("text.txt") + " --steps 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--steps"), std::string::npos) << r.output;
}
TEST_F(TrainGptCli, NonPositiveBatch) { expect_clean_failure("--data " + path("text.txt") + " --batch -3", "--batch"); }

TEST_F(TrainGptCli, CudaWithoutADevice) {
#ifdef ZERO_HAS_CUDA
  if (zero::cuda::cuda_available()) GTEST_SKIP() << "a GPU is visible: --device cuda would train";
#endif
  expect_clean_failure("--data " + path("text.txt") + " --device cuda", "--device cuda");
}
TEST_F(TrainGptCli, GpuCommunicatorNeedsCuda) {
  expect_clean_failure("--data " + path("text.txt") + " --comm host-staged", "--comm host-staged");
}

TEST_F(TrainGptCli, ZeroGradAccum) { expect_clean_failure("--data " + path("text.txt") + " --grad-accum 0", "--grad-accum"); }
TEST_F(TrainGptCli, BatchNotDivisibleByAccumulation) {
  expect_clean_failure("--data " + path("text.txt") + " --batch 10 --grad-accum 4 --block 8", "--batch 10");
}
TEST_F(TrainGptCli, BlockTooLargeForMemory) {
  // 2000 text bytes allow this block length; the saved attention (L*B*H*T^2 floats) does not fit.
  std::ofstream(dir_ / "long.txt") << std::string(4'000'000, 'b') + "end\n";
  expect_clean_failure("--data " + path("long.txt") + " --block 300000", "--block 300000");
}
TEST_F(TrainGptCli, MetricsPathIsADirectory) {
  const Result r = run_train_gpt("--data " + path("text.txt") + " --steps 2 --metrics " + dir_.string());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("is a directory"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.string() + ".tmp"));
}

TEST_F(TrainGptCli, TinyRunWritesMetrics) {
  const fs::path metrics = dir_ / "ok.json";
  const Result r = run_train_gpt("--data " + path("text.txt") +
                                 " --steps 8 --block 8 --batch 2 --n-layer 1 --n-head 2 --n-embd 8 --eval-iters 2"
                                 " --log-every 4 --sample 20 --metrics " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(metrics));
  std::ifstream in(metrics);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"device\": \"cpu\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"tflops\""), std::string::npos) << json;
  EXPECT_NE(r.output.find("val loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sample"), std::string::npos) << r.output;
}

}  // namespace
