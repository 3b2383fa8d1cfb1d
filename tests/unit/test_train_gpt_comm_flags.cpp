// train_gpt's communication flags: the warning for a configured bucket that covers the whole model at
// stage 2, --communication-data-type validation, and --overlap-param-gather in the start-up summary;
// and the multi-node transport (Open MPI over TCP) against shared memory. Runs the real binary on a
// tiny model, one process or two under mpirun.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code;
  std::string output;
};

CliRun train_gpt(const std::string& args) {
  const std::string cmd = zero::testing::bin_dir() + "/train_gpt " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (pipe != nullptr && fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

class TrainGptCommFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zero_comm_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "text.txt") << std::string(2000, 'a') + "hello world, hello zero\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string tiny(const std::string& extra) const {
    return "--data " + (dir_ / "text.txt").string() +
           " --steps 2 --block 8 --batch 2 --n-layer 1 --n-head 2 --n-embd 8 --eval-iters 1 --sample 0 " + extra;
  }
  fs::path dir_;
};

const char* kWholeModel = "covers the whole model";

TEST_F(TrainGptCommFlags, WarnsWhenAConfiguredBucketCoversTheWholeModelAtStage2) {
  const CliRun big = train_gpt(tiny("--zero-stage 2 --reduce-bucket-size 5e8"));
  ASSERT_EQ(big.exit_code, 0) << big.output;
  EXPECT_NE(big.output.find(std::string("warning: reduce_bucket_size 500000000 ") + kWholeModel), std::string::npos)
      << big.output;
  // Several buckets, stage 1 (which keeps a full gradient anyway), or the automatic size: no warning.
  for (const char* flags : {"--zero-stage 2 --reduce-bucket-size 64", "--zero-stage 1 --reduce-bucket-size 5e8",
                            "--zero-stage 2"}) {
    const CliRun r = train_gpt(tiny(flags));
    ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.output;
    EXPECT_EQ(r.output.find(kWholeModel), std::string::npos) << flags << ": " << r.output;
  }
  EXPECT_NE(train_gpt(tiny("--zero-stage 2")).output.find("(automatic)"), std::string::npos);
}

// README "Several machines": ranks on different machines talk through Open MPI's TCP transport. Our
// collectives are rings of point-to-point messages, so the transport must not change a single bit:
// two ranks over TCP on the loopback (as on two machines, --mca btl tcp,self) against the same job over
// whatever Open MPI picks on one machine (shared memory), stage 2 with several buckets and both overlaps.
TEST_F(TrainGptCommFlags, TcpTransportGivesTheLossesOfSharedMemoryBitForBit) {
  const std::string job = std::string(ZERO_MPIRUN) + " -np 2 ";
  const std::string tcp = "--mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo ";
  const std::string flags = " --steps 4 --block 8 --batch 4 --n-layer 1 --n-head 2 --n-embd 16 --eval-iters 1 --sample 0 "
                            "--zero-stage 2 --reduce-bucket-size 200 --overlap-comm --overlap-param-gather --threads 1 ";
  nlohmann::json losses[2];
  for (int over_tcp = 0; over_tcp < 2; ++over_tcp) {
    const fs::path metrics = dir_ / ("metrics" + std::to_string(over_tcp) + ".json");
    const std::string cmd = job + (over_tcp ? tcp : "") + zero::testing::bin_dir() + "/train_gpt --data " +
                            (dir_ / "text.txt").string() + flags + "--metrics " + metrics.string();
    const zero::testing::CommandResult r = zero::testing::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    losses[over_tcp] = nlohmann::json::parse(std::ifstream(metrics));
    ASSERT_EQ(losses[over_tcp]["world_size"], 2) << r.output;
    // tokens_per_s counts the global batch; TFLOP/s is per rank, so half of it times the FLOPs a token.
    const nlohmann::json& m = losses[over_tcp];
    EXPECT_NEAR(m["tflops"].get<double>() * 1e12,
                m["tokens_per_s"].get<double>() / 2 * m["flops_per_token"].get<double>(),
                1e-9 * m["tflops"].get<double>() * 1e12)
        << "TFLOP/s per rank";
  }
  for (const char* key : {"train_loss", "val_loss"})
    EXPECT_EQ(losses[1][key].get<double>(), losses[0][key].get<double>()) << key << " over TCP vs shared memory";
}

TEST_F(TrainGptCommFlags, CommunicationDataTypeAndOverlapParamGather) {
  const CliRun fp32 =
      train_gpt(tiny("--dtype bf16 --zero-stage 2 --communication-data-type fp32 --overlap-param-gather"));
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_NE(fp32.output.find("overlap_param_gather true"), std::string::npos) << fp32.output;
  EXPECT_NE(fp32.output.find("reductions in f32 on the wire"), std::string::npos) << fp32.output;
  const CliRun model = train_gpt(tiny("--dtype bf16 --zero-stage 2"));
  EXPECT_NE(model.output.find("reductions in bf16 on the wire"), std::string::npos) << model.output;
  const CliRun bad = train_gpt(tiny("--dtype bf16 --communication-data-type fp16"));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("error: invalid config key 'communication_data_type'"), std::string::npos) << bad.output;
}

// --zero-quantized-gradients: in the start-up summary and the memory line (with error feedback), and one
// error line naming the flag for stage 0, a bad block size, and error feedback alone.
TEST_F(TrainGptCommFlags, ZeroQuantizedGradients) {
  const CliRun ef = train_gpt(
      tiny("--zero-stage 2 --zero-quantized-gradients --zero-quantized-gradients-block-size 16 "
           "--zero-quantized-gradients-error-feedback"));
  ASSERT_EQ(ef.exit_code, 0) << ef.output;
  EXPECT_NE(ef.output.find("reductions in int8 (blocks of 16) on the wire (all-to-all, summed in fp32, error feedback)"),
            std::string::npos)
      << ef.output;
  EXPECT_TRUE(std::regex_search(ef.output, std::regex("error-feedback residual [0-9.]+ MiB, peak RSS [0-9.]+ MiB")))
      << ef.output;
  // Stage 3 reduces as stage 2 does, int8 included; its memory line has the gathered parameters too.
  const CliRun s3 = train_gpt(tiny("--zero-stage 3 --zero-quantized-gradients --zero-quantized-gradients-error-feedback"));
  ASSERT_EQ(s3.exit_code, 0) << s3.output;
  EXPECT_TRUE(std::regex_search(s3.output, std::regex("gathered parameters at most [0-9.]+ MiB at once \\(bound [0-9.]+ "
                                                      "MiB\\), error-feedback residual [0-9.]+ MiB, peak RSS [0-9.]+ MiB")))
      << s3.output;
  const struct {
    const char* flags;
    const char* says;
  } bad[] = {
      {"--zero-stage 0 --zero-quantized-gradients", "error: --zero-quantized-gradients needs --zero-stage 1, 2 or 3"},
      {"--zero-stage 1 --zero-quantized-gradients --zero-quantized-gradients-block-size 0",
       "error: --zero-quantized-gradients-block-size must be in [1, 1048576] elements, got 0"},
      {"--zero-stage 1 --zero-quantized-gradients-error-feedback",
       "error: --zero-quantized-gradients-error-feedback needs --zero-quantized-gradients"},
  };
  for (const auto& b : bad) {
    const CliRun run = train_gpt(tiny(b.flags));
    EXPECT_EQ(run.exit_code, 1) << b.flags << "\n" << run.output;
    EXPECT_NE(run.output.find(b.says), std::string::npos) << b.flags << "\n" << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << "one line: " << run.output;
  }
}

// The merge rule (docs/config.md): defaults, then the --config file, then the flags, then validation of
// the result. Each of these was refused when the file was judged alone before the flags; each trains.
TEST_F(TrainGptCommFlags, FlagsCompleteTheConfigFileBeforeItIsJudged) {
  const auto file = [&](const char* name, const char* text) {
    std::ofstream(dir_ / name) << text;
    return " --config " + (dir_ / name).string();
  };
  const std::string q = file("q.json", R"({"zero_optimization": {"zero_quantized_gradients": true}})");
  const std::string ef = file("ef.json", R"({"zero_optimization": {"zero_quantized_gradients_error_feedback": true}})");
  const std::string wire = file("wire.json", R"({"communication_data_type": "bf16"})");
  const std::string acc = file("acc.json", R"({"zero_optimization": {"reduce_scatter_with_fp32_accumulation": true}})");
  const struct {
    std::string flags;
    const char* says;  // in the start-up summary
  } cases[] = {
      {"--zero-stage 2" + q, "int8"},
      {"--zero-stage 2 --zero-quantized-gradients" + ef, "error-feedback residual"},
      {"--dtype bf16" + wire, "reductions in bf16 on the wire"},
      {"--dtype bf16" + acc, "(all-to-all, summed in fp32)"},
  };
  for (const auto& c : cases) {
    const CliRun run = train_gpt(tiny(c.flags));
    EXPECT_EQ(run.exit_code, 0) << c.flags << "\n" << run.output;
    EXPECT_NE(run.output.find(c.says), std::string::npos) << c.flags << "\n" << run.output;
  }
  // A setting that does nothing at the chosen stage is refused with one line, never printed as on.
  const CliRun s3 = train_gpt(tiny("--zero-stage 3 --overlap-param-gather"));
  EXPECT_EQ(s3.exit_code, 1) << s3.output;
  EXPECT_NE(s3.output.find("error: invalid config key 'zero_optimization.overlap_param_gather' "
                           "(--overlap-param-gather): does nothing at stage 3"),
            std::string::npos)
      << s3.output;
  EXPECT_EQ(std::count(s3.output.begin(), s3.output.end(), '\n'), 1) << "one line: " << s3.output;
}

}  // namespace
