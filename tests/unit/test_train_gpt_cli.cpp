// train_gpt's promise on bad input: one line naming the problem, a non-zero exit, no crash, and no
// metrics file left behind; and the job's promise under mpirun: one line for the whole job, and no
// hang when a rank leaves early (Note [No hang] in distributed/comm/job_runtime.cpp). Runs the real
// binaries (build/bin/train_gpt, build/bin/zero_leave_early) on small files made here.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/wait.h>

#ifdef ZERO_HAS_CUDA
#include "core/cuda/runtime.h"
#endif

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

using Result = zero::testing::CommandResult;
using zero::testing::run_command;

Result run_train_gpt(const std::string& args) { return run_command(zero::testing::bin_dir() + "/train_gpt " + args); }

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
  expect_clean_failure("--data " + path("text.txt") + " --n-embd 30 --n-head 4", "--n-embd 30 is not divisible by --n-head 4");
}
TEST_F(TrainGptCli, MissingCheckpointNamesTheFlag) {
  expect_clean_failure("--data " + path("text.txt") + " --resume " + path("gone"), "--resume: checkpoint '" + path("gone"));
  expect_clean_failure("--data " + path("text.txt") + " --init-from " + path("gone.safetensors"),
                       "--init-from '" + path("gone.safetensors") + "' does not exist");
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

// Every output path is tried before any work (a file created in --save-dir; the others opened, or
// their temporary file created, and removed again), and the directories they need are created.
TEST_F(TrainGptCli, OutputPathsAreProbedBeforeAnyWork) {
  const std::string base = "--data " + path("text.txt") + " --steps 2 --block 8 --batch 2 --n-layer 1 --n-head 2 "
                           "--n-embd 8 --eval-iters 1 --sample 0";
  struct Case {
    std::string flags, says;
  };
  for (const Case& c : std::vector<Case>{
           {"--save-dir /proc", "error: --save-dir '/proc': cannot create a file in it ("},
           {"--trace /proc/t.json", "error: --trace '/proc/t.json': cannot create a file in its directory ("},
           {"--metrics /proc/m.json", "error: --metrics '/proc/m.json': cannot create a file in its directory ("},
           {"--log-file /proc/x/log.jsonl", "error: --log-file '/proc/x/log.jsonl': cannot create the directory '/proc/x'"},
           {"--log-file " + path("text.txt") + "/log.jsonl", "error: --log-file '" + path("text.txt") + "/log.jsonl'"},
       }) {
    const Result r = run_train_gpt(base + " " + c.flags);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_EQ(r.output.rfind(c.says, 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  // The README's save / log example: out/ does not exist yet, and both go there.
  const Result ok = run_train_gpt(base + " --save-dir " + path("out") + " --log-file " + path("out/log.jsonl") +
                                  " --metrics " + path("m/deeper/metrics.json"));
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(fs::exists(dir_ / "out" / "log.jsonl"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "step_00000002"));
  EXPECT_TRUE(fs::exists(dir_ / "m" / "deeper" / "metrics.json"));
  for (const auto& e : fs::directory_iterator(dir_ / "out"))
    EXPECT_NE(e.path().filename().string().rfind(".probe", 0), 0u) << "probe left behind: " << e.path();
  // A failed probe leaves no file of its own behind.
  const Result bad = run_train_gpt(base + " --log-file " + path("new.jsonl") + " --save-dir /proc");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_FALSE(fs::exists(dir_ / "new.jsonl"));
}

TEST_F(TrainGptCli, TraceStepsBeyondTheRunAreAnError) {
  const Result r = run_train_gpt("--data " + path("text.txt") + " --steps 2 --sample 0 --trace " + path("t.json") +
                                 " --trace-steps 100:102");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(zero::testing::without_source_locations(r.output),
            "error: --trace-steps 100:102 ends after the run's last step (--steps 2); give A:B with B <= 2\n");
  EXPECT_FALSE(fs::exists(dir_ / "t.json"));
}

TEST_F(TrainGptCli, AMisspeltConfigKeyIsAnErrorWithASuggestion) {
  std::ofstream(dir_ / "ds.json") << R"({"zero_optimization": {"stgae": 2}})";
  const Result r = run_train_gpt("--data " + path("text.txt") + " --steps 2 --sample 0 --config " + path("ds.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(zero::testing::without_source_locations(r.output),
            "error: unknown config key 'zero_optimization.stgae' in " + path("ds.json") +
                "; did you mean 'zero_optimization.stage'?\n");
}

TEST_F(TrainGptCli, ConfigBatchKeysThatDisagreeNameTheFile) {
  // DeepSpeed derives GAS = 12 / 5 / 1 = 2 (integer division), and 12 != 5 x 2 x 1 rank: the batch rule,
  // broken by the file's own keys.
  std::ofstream(dir_ / "ds.json") << R"({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 5})";
  const Result r = run_train_gpt("--data " + path("text.txt") + " --steps 2 --sample 0 --config " + path("ds.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(zero::testing::without_source_locations(r.output),
            "error: invalid config key 'train_batch_size' in " + path("ds.json") +
                ": train_batch_size (12) must equal train_micro_batch_size_per_gpu (5) * gradient_accumulation_steps "
                "(2, derived) * world_size (1) = 10\n");
}

// README's start-up summary (4 ranks, stage 2, fp16, the default model on a 65-character vocabulary, as
// Tiny Shakespeare's) is what train_gpt prints: the block appears, line after line, in a real run's output.
TEST_F(TrainGptCli, ReadmeStartupSummaryIsWhatFourRanksPrint) {
  const fs::path readme = fs::path(zero::testing::docs_dir()).parent_path() / "README.md";
  if (!fs::exists(readme)) GTEST_SKIP() << "no README.md beside " << zero::testing::docs_dir();
  std::ifstream in(readme);
  const std::string doc{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::size_t intro = doc.find("Rank 0 prints a start-up summary");
  ASSERT_NE(intro, std::string::npos);
  const std::size_t begin = doc.find("```\n", intro) + 4, end = doc.find("```", begin);
  const std::string block = doc.substr(begin, end - begin);
  ASSERT_NE(block.find("data parallel:"), std::string::npos) << block;
  // 65 distinct characters, as Tiny Shakespeare has.
  std::string text;
  for (int i = 0; i < 20000; ++i) text += static_cast<char>(32 + (i * 37 + i / 65) % 65);
  std::ofstream(dir_ / "v65.txt") << text;
  const Result r = run_command(std::string(ZERO_MPIRUN) + " -np 4 " + zero::testing::bin_dir() + "/train_gpt --data " +
                               path("v65.txt") + " --zero-stage 2 --dtype fp16 --steps 1 --eval-iters 1 --sample 0 "
                               "--threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(block), std::string::npos) << "README's lines are not printed as they stand:\n"
                                                     << block << "output:\n" << r.output;
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
  EXPECT_NE(json.find("\"matmul_precision\": \"fp32\""), std::string::npos) << json;  // cpu: f32 GEMMs
  EXPECT_NE(r.output.find("val loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sample"), std::string::npos) << r.output;
  const Result one = run_train_gpt("--data " + path("text.txt") + " --steps 1 --block 8 --batch 2 --n-layer 1 "
                                   "--n-head 2 --n-embd 8 --eval-iters 1 --sample 0 --threads 1");
  EXPECT_NE(one.output.find(" 1 step, 1 thread/rank\n"), std::string::npos) << one.output;
}

// The config's "optimizer" and "scheduler" sections are the flags they correspond to: a run configured
// by the file logs, step for step, the same learning rates and losses as a run given the same values as
// flags (an independent path: no config), and a flag given on the command line overrides its key.
TEST_F(TrainGptCli, ConfigOptimizerAndSchedulerAreTheirFlags) {
  std::ofstream(dir_ / "opt.json") << R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.02, "betas": [0.8, 0.95],
                                            "eps": 1e-8, "weight_decay": 0.05}},
                                          "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2,
                                            "total_num_steps": 5, "cos_min_ratio": 0.5}}})";
  const std::string common = "--data " + path("text.txt") +
                             " --block 8 --batch 2 --n-layer 1 --n-head 2 --n-embd 8 --eval-every 0"
                             " --eval-iters 1 --sample 0 --threads 1 --log-file ";
  // step -> (lr, loss) of a --log-file's training lines.
  auto logged = [](const fs::path& log) {
    std::map<int, std::pair<double, double>> out;
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"loss\":") == std::string::npos) continue;
      auto number = [&](const std::string& key) {
        return std::stod(line.substr(line.find("\"" + key + "\":") + key.size() + 3));
      };
      out[static_cast<int>(number("step"))] = {number("lr"), number("loss")};
    }
    return out;
  };
  const Result by_config = run_train_gpt(common + path("config.jsonl") + " --steps 6 --config " + path("opt.json"));
  ASSERT_EQ(by_config.exit_code, 0) << by_config.output;
  const auto c = logged(dir_ / "config.jsonl");
  ASSERT_EQ(c.size(), 6u) << by_config.output;
  // Closed form: linear warm-up to 0.02 over 2 steps, cosine to 0.5 x 0.02 at step index 5, floor after
  // (a ratio of 0.5 keeps the floor exactly the float 0.01 that --min-lr 0.01 gives below).
  const double floor = 0.01, span = 0.01;
  const double want_lr[6] = {0.01, 0.02, 0.02, floor + 0.5 * (1 + std::cos(M_PI / 3)) * span,
                             floor + 0.5 * (1 + std::cos(2 * M_PI / 3)) * span, floor};
  for (int step = 1; step <= 6; ++step) EXPECT_NEAR(c.at(step).first, want_lr[step - 1], 1e-8) << "step " << step;
  // The same settings as flags (the schedule then ends at --steps 5): the same losses, bit for bit.
  const Result by_flags = run_train_gpt(common + path("flags.jsonl") +
                                        " --steps 5 --lr 0.02 --beta1 0.8 --beta2 0.95 --weight-decay 0.05"
                                        " --warmup 2 --min-lr 0.01");
  ASSERT_EQ(by_flags.exit_code, 0) << by_flags.output;
  const auto f = logged(dir_ / "flags.jsonl");
  ASSERT_EQ(f.size(), 5u) << by_flags.output;
  for (int step = 1; step <= 5; ++step) EXPECT_EQ(c.at(step), f.at(step)) << "step " << step;
  // --lr given overrides the optimizer's lr, and the floor follows it (cos_min_ratio x lr).
  const Result flag_wins =
      run_train_gpt(common + path("flag.jsonl") + " --steps 6 --config " + path("opt.json") + " --lr 0.04");
  ASSERT_EQ(flag_wins.exit_code, 0) << flag_wins.output;
  const auto w = logged(dir_ / "flag.jsonl");
  EXPECT_NEAR(w.at(2).first, 0.04, 1e-8);
  EXPECT_NEAR(w.at(6).first, 0.02, 1e-9);
}

// ---- every flag, by the rules of the config keys ----------------------------------------------------

TEST_F(TrainGptCli, EveryFlagsBadValueIsOneLineNamingTheFlag) {
  const fs::path metrics = dir_ / "metrics.json";
  const std::map<std::string, std::string> base = {
      {"--data", path("text.txt")}, {"--steps", "2"},     {"--sample", "0"},  {"--block", "8"},
      {"--batch", "2"},             {"--n-layer", "1"},   {"--n-head", "2"},  {"--n-embd", "8"},
      {"--eval-iters", "1"},        {"--metrics", metrics.string()}};
  struct Case {
    std::string flag, value, culprit;
    int exit_code;  // 1: our checks; 2: CLI11 could not parse it
  };
  const std::vector<Case> cases = {
      {"--data", path("nope.txt"), "nope.txt", 1},
      {"--steps", "0", "--steps", 1},
      {"--steps", "abc", "--steps", 2},
      {"--batch", "0", "--batch", 1},
      {"--block", "0", "--block", 1},
      {"--n-layer", "0", "--n-layer", 1},
      {"--n-head", "0", "--n-head", 1},
      {"--n-embd", "0", "--n-embd", 1},
      {"--dropout", "1", "--dropout", 1},
      {"--lr", "0", "--lr", 1},
      {"--lr", "nan", "--lr", 1},
      {"--min-lr", "-1", "--min-lr", 1},
      {"--warmup", "-1", "--warmup", 1},
      {"--weight-decay", "-0.5", "--weight-decay", 1},
      {"--beta1", "1", "--beta1", 1},
      {"--beta2", "-0.1", "--beta2", 1},
      {"--clip", "-1", "--clip", 1},
      {"--clip", "inf", "--clip", 1},
      {"--seed", "-1", "--seed", 2},
      {"--eval-every", "-1", "--eval-every", 1},
      {"--eval-iters", "0", "--eval-iters", 1},
      {"--log-every", "0", "--log-every", 1},
      {"--threads", "-1", "--threads", 1},
      {"--metrics", dir_.string(), "is a directory", 1},
      {"--sample", "-1", "--sample", 1},
      {"--config", path("nope.json"), "nope.json", 1},
      {"--zero-stage", "4", "--zero-stage", 1},
      {"--stage3-max-live-parameters", "0", "--stage3-max-live-parameters", 1},
      {"--stage3-prefetch-bucket-size", "-1", "--stage3-prefetch-bucket-size", 1},
      {"--dtype", "fp8", "--dtype", 1},
      {"--grad-accum", "0", "--grad-accum", 1},
      {"--reduce-bucket-size", "0", "--reduce-bucket-size", 1},
      {"--reduce-bucket-size", "1.5", "--reduce-bucket-size", 1},
      {"--overlap-comm=maybe", "", "--overlap-comm", 2},
      {"--device", "tpu", "--device", 2},
      {"--comm", "gloo", "--comm", 2},
      {"--collective-timeout", "0", "--collective-timeout", 1},
      {"--collective-timeout", "-2", "--collective-timeout", 1},
      {"--nonfinite-grads", "warn", "--nonfinite-grads", 1},
      {"--min-scale-skip-limit", "-1", "--min-scale-skip-limit", 1},
      {"--nonfinite-skip-limit", "-1", "--nonfinite-skip-limit", 1},
      {"--allow-non-finite-weights", "", "--allow-non-finite-weights needs --init-from", 1},
      {"--keep", "2", "--keep needs --save-dir", 1},
      {"--save-every", "1", "--save-every needs --save-dir", 1},
      {"--verbose=x", "", "--verbose", 2},
  };
  for (const Case& c : cases) {
    std::map<std::string, std::string> args = base;
    args[c.flag] = c.value;
    std::string line;
    for (const auto& [flag, value] : args) line += " " + flag + (value.empty() ? "" : " " + value);
    SCOPED_TRACE(line);
    const Result r = run_train_gpt(line);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(c.culprit), std::string::npos) << "should name '" << c.culprit << "': " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "expected one line: " << r.output;
#ifdef NDEBUG  // Debug builds always add the source location
    EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << "no source location by default: " << r.output;
#endif
    if (c.exit_code == 2) {
      EXPECT_NE(r.output.find("--help"), std::string::npos) << r.output;
    }
    EXPECT_FALSE(fs::exists(metrics));
  }
}

TEST_F(TrainGptCli, ParseErrorsAreOneLineWithExitCode2) {
  for (const std::string args : {"--no-such-flag", "--steps", "--steps 1 --steps 2", "positional"}) {
    const Result r = run_train_gpt("--data " + path("text.txt") + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find("(see --help)"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  const Result help = run_train_gpt("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--collective-timeout"), std::string::npos);
}

// Every flag of the settings table shows its default in --help, as README.md and docs/config.md give it
// (the section default beside it where the row has one), in train_gpt and zero_explain.
TEST_F(TrainGptCli, TableFlagsShowTheirDefaultInHelp) {
  const Result train = run_train_gpt("--help");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  for (const char* shown : {"--zero-stage NUMBER=0", "--clip NUMBER=1.0", "--reduce-bucket-size NUMBER=automatic",
                            "--overlap-comm=false", "--nonfinite-grads ENUM=error", "--lr NUMBER=0.001",
                            "--beta1 NUMBER=0.9", "--beta2 NUMBER=0.99", "--weight-decay NUMBER=0.1",
                            "--warmup NUMBER=100", "--stage3-prefetch-bucket-size NUMBER=50000000"})
    EXPECT_NE(train.output.find(shown), std::string::npos) << shown << " in:\n" << train.output;
  // A section default that differs is named in the help line: beta2 0.999, weight decay 0, warmup 1000.
  for (const char* flag : {"--beta2", "--weight-decay", "--warmup"}) {
    const auto at = train.output.find(std::string(flag) + " NUMBER=");
    ASSERT_NE(at, std::string::npos) << flag;
    const std::string line = train.output.substr(at, train.output.find("\n  --", at + 1) - at);
    EXPECT_NE(line.find("section in the config: "), std::string::npos) << line;
  }
  EXPECT_NE(train.output.find("section in the config: 0.999)"), std::string::npos);
  EXPECT_NE(train.output.find("section in the config: 1000)"), std::string::npos);
  const Result explain = run_command(zero::testing::bin_dir() + "/zero_explain --help");
  ASSERT_EQ(explain.exit_code, 0) << explain.output;
  for (const char* shown : {"--zero-stage NUMBER=0", "--overlap-comm=false", "--reduce-bucket-size NUMBER=automatic"})
    EXPECT_NE(explain.output.find(shown), std::string::npos) << shown << " in:\n" << explain.output;
}

// The other programs report their command-line errors the same way (examples/cli_errors.h), and an
// unsigned --seed refuses a negative value instead of wrapping it.
TEST_F(TrainGptCli, EveryProgramsParseErrorsAreOneLineWithExitCode2) {
  const std::string bin = zero::testing::bin_dir() + "/";
  for (const std::string command :
       {"zero_explain --no-such-flag", "zero_explain --n-layer", "sample_gpt --checkpoint x --seed -1",
        "zero_in_one_process --no-such-flag", "train_gpt --seed -1"}) {
    const Result r = run_command(bin + command);
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << command << ": " << r.output;
    EXPECT_NE(r.output.find("(see --help)"), std::string::npos) << command << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << command << ": " << r.output;
  }
  EXPECT_NE(run_command(bin + "sample_gpt --seed -1").output.find("non-negative integer"), std::string::npos);
}

TEST_F(TrainGptCli, SourceLocationOnlyWithVerbose) {
  const Result quiet = run_train_gpt("--data " + path("text.txt") + " --steps 0");
  const Result verbose = run_train_gpt("--data " + path("text.txt") + " --steps 0 --verbose");
  EXPECT_EQ(quiet.exit_code, 1);
  EXPECT_EQ(verbose.exit_code, 1);
#ifdef NDEBUG
  EXPECT_EQ(quiet.output.find(".cpp:"), std::string::npos) << quiet.output;
#endif
  EXPECT_NE(verbose.output.find("train_options.cpp:"), std::string::npos) << verbose.output;
  EXPECT_EQ(zero::testing::error_lines(verbose.output), 1) << verbose.output;
}

TEST_F(TrainGptCli, BadTimeoutInTheEnvironmentNamesTheVariable) {
  const Result r = run_command("ZERO_COLLECTIVE_TIMEOUT_S=soon " + zero::testing::bin_dir() + "/train_gpt --data " +
                               path("text.txt") + " --steps 1 --sample 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: ZERO_COLLECTIVE_TIMEOUT_S"), std::string::npos) << r.output;
}

// ---- under mpirun: one line for the whole job ------------------------------------------------------

std::string mpirun(int np) { return std::string(ZERO_MPIRUN) + " -np " + std::to_string(np) + " "; }

TEST_F(TrainGptCli, AnErrorEveryRankHitsIsPrintedOnceUnderMpirun) {
  const std::string exe = zero::testing::bin_dir() + "/train_gpt --data " + path("text.txt");
  // Found before MPI starts (flags), and after (the batch does not split over 4 ranks).
  for (const std::string bad : {" --zero-stage 5", " --steps abc", " --reduce-bucket-size 0", " --batch 10 --block 8"}) {
    const Result r = run_command(mpirun(4) + exe + bad + " --sample 0");
    EXPECT_NE(r.exit_code, 0) << bad << ": " << r.output;
    EXPECT_EQ(zero::testing::error_lines(r.output), 1) << bad << ": " << r.output;
    EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << bad << ": " << r.output;
  }
}

// Host memory that runs out (an address-space limit below what the model needs, `ulimit -v` as
// bench/stage3_memory_limit.sh sets with prlimit): one "error: out of memory" line, exit code 1, no
// crash, also under mpirun. The model (one block of 16384 channels: its 3C x C attention weight alone
// is 3.2 GB in fp32) cannot be built in 2000 MiB, which still holds the binary with its CUDA libraries
// and MPI.
TEST_F(TrainGptCli, OutOfMemoryIsOneLineAndExitCode1) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer reserves more address space than the limit";
#endif
  const std::string exe = zero::testing::bin_dir() + "/train_gpt --data " + path("text.txt") +
                          " --n-layer 1 --n-embd 16384 --n-head 8 --block 8 --batch 2 --steps 2 --sample 0";
  for (const std::string& launcher : {std::string(), mpirun(2)}) {
    const Result r = run_command(launcher + "bash -c 'ulimit -v 2048000; exec " + exe + "'");
    EXPECT_EQ(r.exit_code, 1) << launcher << r.output;
    EXPECT_EQ(zero::testing::error_lines(r.output), 1) << launcher << r.output;
    EXPECT_NE(r.output.find("error: out of memory: "), std::string::npos) << launcher << r.output;
    EXPECT_NE(r.output.find("address-space limit 2000.00 MiB"), std::string::npos) << launcher << r.output;
    EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << launcher << r.output;
  }
}

// ---- under mpirun: a rank that leaves early never hangs the job --------------------------------------

struct EarlyLeave {
  std::string mode;
  std::vector<std::string> expect;  // in the one error line; empty: Open MPI reports it (SIGKILL), not us
};

TEST_F(TrainGptCli, EveryWayOfLeavingEarlyEndsTheJobWithinTheTimeout) {
  constexpr double kTimeout = 2.0;
  const std::vector<EarlyLeave> modes = {
      {"return", {"all_reduce at step 3", "rank 3 left the job"}},
      {"exit", {"all_reduce at step 3", "rank 3 left the job"}},
      {"throw", {"rank 3: injected failure"}},
      {"stuck", {"all_reduce at step 3 timed out after 2 s", "rank(s) 3 did not arrive"}},
      {"crash", {"rank 3: crashed (signal 6)"}},
      {"kill", {}},
  };
  for (const EarlyLeave& m : modes) {
    const auto start = std::chrono::steady_clock::now();
    const Result r = run_command("ZERO_COLLECTIVE_TIMEOUT_S=2 " + mpirun(4) + zero::testing::bin_dir() +
                                 "/zero_leave_early " + m.mode);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(r.exit_code, 0) << m.mode << ": " << r.output;
    EXPECT_LT(seconds, kTimeout + 10.0) << m.mode << ": " << r.output;
    std::printf("leave early '%s': job ended after %.1f s (timeout %.0f s), exit code %d, %d error line(s)\n",
                m.mode.c_str(), seconds, kTimeout, r.exit_code, zero::testing::error_lines(r.output));
    if (m.expect.empty()) {
      EXPECT_LE(zero::testing::error_lines(r.output), 1) << m.mode << ": " << r.output;
      continue;
    }
    EXPECT_EQ(zero::testing::error_lines(r.output), 1) << m.mode << ": " << r.output;
    for (const std::string& text : m.expect) EXPECT_NE(r.output.find(text), std::string::npos) << m.mode << ": " << r.output;
  }
  const Result ok = run_command(mpirun(4) + zero::testing::bin_dir() + "/zero_leave_early none");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("done: 65536"), std::string::npos) << ok.output;
}

}  // namespace
