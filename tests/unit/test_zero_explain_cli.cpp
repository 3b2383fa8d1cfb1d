// zero_explain's promise: its JSON gives the memory per rank and the bytes per step that train_gpt
// measures for the same model and ZeRO configuration. Runs both real binaries (train_gpt under mpirun
// with 1-4 ranks) on a small text and compares zero_explain's memory_bytes / traffic_bytes_per_step
// with train_gpt's --metrics memory_bytes / comm_bytes_per_step, for stages 0-3 and
// reduce_scatter false. Stage 3's gather plan, memory ladder (with the ZeRO paper's 7.5B / N = 64
// example) and scale table against closed forms computed here. Also: its bad input gets one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "cli_util.h"
#include "nn/gpt.h"
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
                                            "--zero-stage 2 --config " + (dir_ / "no_rs.json").string(),
                                            "--zero-stage 3 --dtype bf16",
                                            // Uneven partitions: the memory is the largest rank's.
                                            "--zero-stage 1 --optimizer muon", "--zero-stage 3 --dtype bf16 --optimizer muon"};
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
      std::int64_t largest = 0;
      for (const auto& part : planned["partitions"])
        largest = std::max(largest, part["end"].get<std::int64_t>() - part["begin"].get<std::int64_t>());
      EXPECT_EQ(planned["partition_size"].get<std::int64_t>(), largest) << what;
      if (scheme.find("muon") == std::string::npos) {
        EXPECT_EQ(largest * n, planned["padded_numel"].get<std::int64_t>()) << what;
      }
      EXPECT_EQ(planned["model"]["params"], measured["params"]) << what;
      for (const char* k : {"params", "grads", "optimizer_states", "buckets"})
        EXPECT_EQ(planned["memory_bytes"][k].get<double>(), measured["memory_bytes"][k].get<double>())
            << what << ": memory " << k;
      // Stage 3's working memory: the plan's bound (every unit, as the bound holds them all) is what the
      // prefetching run reaches.
      EXPECT_EQ(planned["memory_bytes"]["gathered"].get<double>(), measured["memory_bytes"]["gathered"].get<double>())
          << what;
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
       {std::string("--world-size 0"), std::string("--zero-stage 4"), std::string("--n-embd 10 --n-head 4"),
        std::string("--format yaml"), std::string("--data /nonexistent.txt"), std::string("--reduce-bucket-size 0"),
        std::string("--zero-stage 3 --stage3-max-live-parameters 1000"),
        std::string("--stage3-prefetch-bucket-size -1"), std::string("--grad-accum 0"),
        std::string("--grad-accum 0 --batch 12"),
        // An SVG path that cannot be written stops before the explanation is printed.
        "--svg " + (dir_ / "text.txt" / "layout.svg").string(), "--svg " + dir_.string()}) {
    const CommandResult r = run_command(bin + " " + args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
  }
}

// Out-of-range sizes stop before any output with one line naming the flag and its range; the bounds
// themselves are accepted (AdamW: no gaps, so N = 4096 is quick).
TEST_F(ZeroExplainCli, OutOfRangeSizesNameTheFlagAndRange) {
  const std::string bin = zero::testing::bin_dir() + "/zero_explain";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"--world-size 4097", {"--world-size", "[1, 4096]", "4097"}},
      {"--optimizer muon --world-size 20000 --zero-stage 2", {"--world-size", "[1, 4096]", "20000"}},
      {"--world-size 10000000", {"--world-size", "10000000"}},
      {"--bandwidth 1e9 --params 1e19", {"--params", "1e+13", "1e+19"}},
      {"--bandwidth 1e9 --params 1e30", {"--params", "1e+30"}},
      {"--bandwidth 1e9 --params 0.5", {"--params", "0.5"}},
      {"--bandwidth 0", {"--bandwidth", "> 0"}},
      {"--bandwidth -5", {"--bandwidth", "> 0"}},
  };
  for (const auto& [args, culprits] : cases) {
    const CommandResult r = run_command(bin + " " + args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
    for (const std::string& c : culprits) EXPECT_NE(r.output.find(c), std::string::npos) << c << ": " << r.output;
  }
  for (const std::string args : {"--world-size 4096 --format json", "--bandwidth 1e9 --params 1e13 --format json"})
    EXPECT_EQ(run_command(bin + " " + args + " > /dev/null").exit_code, 0) << args;
}

// Muon at stage 0: every rank steps every matrix whole, and the layout, Muon rows and per-rank shares say
// so (Ψ of the default model in closed form: V·C + T·C + L·(12C² + 13C) + 2C).
TEST_F(ZeroExplainCli, MuonAtStageZeroIsSteppedWholeByEveryRank) {
  const CommandResult r =
      run_command(zero::testing::bin_dir() + "/zero_explain --optimizer muon --world-size 2 --zero-stage 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::int64_t C = 128, psi = 65 * C + 64 * C + 4 * (12 * C * C + 13 * C) + 2 * C;
  EXPECT_NE(r.output.find("== Muon at stage 0: every matrix stepped whole by every rank"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("by one rank"), std::string::npos) << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.output.find("rank " + std::to_string(rank) + ": Newton–Schulz 2348.8 MFLOP/step, " +
                            std::to_string(psi) + " real parameter elements"),
              std::string::npos)
        << r.output;
  std::istringstream in(r.output);
  int matrices = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find(".weight") == std::string::npos || line.find("[") == std::string::npos) continue;
    if (line.find("MFLOP") != std::string::npos) {  // a Muon row
      EXPECT_NE(line.find("every rank"), std::string::npos) << line;
      ++matrices;
    } else if (std::regex_search(line, std::regex("^ *[0-9]+  "))) {  // a layout row: "  4  blocks.0.attn..."
      EXPECT_NE(line.find("every rank"), std::string::npos) << "no element split at stage 0: " << line;
    }
  }
  EXPECT_EQ(matrices, 16);  // four per block
}

// With Muon's gaps the live bound's line says which numbers count the gaps: the largest unit's flat range
// (what stage3_max_live_parameters must hold) against its real elements, 12C² + 13C for a block.
TEST_F(ZeroExplainCli, LiveBoundLineSaysWhatCountsTheGaps) {
  const std::string cmd = zero::testing::bin_dir() +
                          "/zero_explain --optimizer muon --n-layer 1 --n-embd 255 --n-head 3 --world-size 8 "
                          "--zero-stage 3";
  const CommandResult j = run_command(cmd + " --format json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  std::int64_t largest = 0, all = 0;
  const nlohmann::json plan = nlohmann::json::parse(j.output);
  for (const auto& u : plan["gather_units"]) {
    const std::int64_t size = u["end"].get<std::int64_t>() - u["begin"].get<std::int64_t>();
    all += size;
    if (u["name"] == "blocks.0") largest = size;
  }
  // Odd widths: a matrix after an odd number of elements starts one later (Note [Whole-matrix partitions]).
  const std::int64_t C = 255, block = 12 * C * C + 13 * C, psi = 65 * C + 64 * C + block + 2 * C;
  ASSERT_GT(largest, block) << "the layout should leave gaps inside blocks.0";
  const CommandResult t = run_command(cmd + " | grep '^live bound'");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("largest unit blocks.0: " + std::to_string(largest) + " elements with its gaps, " +
                          std::to_string(block) + " real; all units: " + std::to_string(all) +
                          " elements with their gaps, " + std::to_string(psi) + " real)"),
            std::string::npos)
      << t.output;
}

// The default model (4 layers, 128 channels, block 64, vocabulary 65) at stage 3 on 4 ranks, bf16.
TEST_F(ZeroExplainCli, Stage3GatherPlanAndMemoryFollowTheClosedForms) {
  const std::string bin = zero::testing::bin_dir() + "/zero_explain --vocab-size 65 --world-size 4 --dtype bf16";
  const CommandResult r = run_command(bin + " --zero-stage 3 --format json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  const std::int64_t C = 128, V = 65, T = 64, L = 4, N = 4;
  // Units: wte, wpe, one per block (ln1, qkv, proj, ln2, fc, fc2 with biases: 12C² + 13C), lnf.
  std::vector<std::pair<std::string, std::int64_t>> want = {{"wte", V * C}, {"wpe", T * C}};
  for (int l = 0; l < L; ++l) want.push_back({"blocks." + std::to_string(l), 12 * C * C + 13 * C});
  want.push_back({"lnf", 2 * C});
  const auto& units = j["gather_units"];
  ASSERT_EQ(units.size(), want.size()) << units.dump();
  const std::int64_t psi = j["numel"].get<std::int64_t>(), padded = j["padded_numel"].get<std::int64_t>();
  const std::int64_t P = padded / N;
  std::int64_t begin = 0;
  for (std::size_t u = 0; u < want.size(); ++u) {
    EXPECT_EQ(units[u]["name"], want[u].first);
    EXPECT_EQ(units[u]["begin"].get<std::int64_t>(), begin) << want[u].first;
    EXPECT_EQ(units[u]["numel"].get<std::int64_t>(), want[u].second) << want[u].first;
    const std::int64_t end = begin + want[u].second;
    for (std::int64_t rank = 0; rank < N; ++rank)
      EXPECT_EQ(units[u]["counts"][rank].get<std::int64_t>(),
                std::max<std::int64_t>(0, std::min(end, (rank + 1) * P) - std::max(begin, rank * P)))
          << want[u].first << " rank " << rank;
    begin = end;
  }
  EXPECT_EQ(begin, psi);
  // 16Ψ/N of model states (2 + 2 + 12 bytes per padded element, each split N ways); the working memory
  // is every unit (the default bound, 1e9 elements, holds them all).
  const auto& m = j["memory_bytes"];
  EXPECT_EQ(m["params"].get<double>(), 2.0 * padded / N);
  EXPECT_EQ(m["grads"].get<double>(), 2.0 * padded / N);
  EXPECT_EQ(m["optimizer_states"].get<double>(), 12.0 * padded / N);
  EXPECT_EQ(m["model_states"].get<double>(), 16.0 * padded / N);
  EXPECT_EQ(m["gathered"].get<double>(), 2.0 * psi);
  EXPECT_EQ(j["memory_formula_bytes"]["model_states"].get<double>(), 16.0 * psi / N);
  // Traffic: reduce-scatter Ψ + two all-gathers of every unit = 3(N-1)/N·bΨ, 1.5x the baseline.
  const double ring = (N - 1.0) / N;
  EXPECT_NEAR(j["traffic_bytes_per_step"]["all_gather"].get<double>(), 2 * ring * 2.0 * psi, 1e-6);
  EXPECT_NEAR(j["traffic_bytes_per_step"]["total"].get<double>(), 3 * ring * 2.0 * psi, 1e-6);
  EXPECT_NEAR(j["baseline_bytes_per_step"].get<double>(), 2 * ring * 2.0 * padded, 1e-6);
  // The ZeRO paper's example: Ψ = 7.5e9 on 64 devices, 16-bit Adam.
  const double pp = 7.5e9, pn = 64;
  const double paper[4] = {16 * pp, 4 * pp + 12 * pp / pn, 2 * pp + 14 * pp / pn, 16 * pp / pn};
  ASSERT_EQ(j["paper_example"]["model_states_bytes"].size(), 4u);
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(j["paper_example"]["model_states_bytes"][s]["bytes"].get<double>(), paper[s]) << "stage " << s;
  EXPECT_EQ(paper[3], 1.875e9);

  // The text: the gather plan, and the ladder's stage-3 line with the paper's column (GB = 1e9 bytes:
  // 120, 31.4, 16.6, 1.88).
  const CommandResult t = run_command(bin + " --zero-stage 3");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("unit 2: blocks.0"), std::string::npos) << t.output;
  const char* gb[4] = {"paper 120 GB", "paper 31.4 GB", "paper 16.6 GB", "paper 1.88 GB"};
  for (int s = 0; s < 4; ++s) {
    char expect[64];
    std::snprintf(expect, sizeof expect, "paper %.3g GB", paper[s] / 1e9);
    EXPECT_EQ(std::string(expect), gb[s]);
    const std::size_t line = t.output.find(" stage " + std::to_string(s) + ": params");
    ASSERT_NE(line, std::string::npos) << t.output;
    const std::string text = t.output.substr(line, t.output.find('\n', line) - line);
    EXPECT_NE(text.find(gb[s]), std::string::npos) << text;
  }
  char stage3[256];
  const double mib = 1024.0 * 1024.0;
  std::snprintf(stage3, sizeof stage3, "* stage 3: params %.2f MiB | %.2f MiB", 2.0 * padded / N / mib,
                2.0 * psi / N / mib);
  EXPECT_NE(t.output.find(stage3), std::string::npos) << stage3 << "\n" << t.output;
}

// Seconds from the scale table's human_seconds ("0", "12.3 us", "4.56 ms", "1.234 s").
double seconds_of(const std::string& value, const std::string& unit) {
  const double v = std::stod(value);
  return unit == "us" ? v * 1e-6 : unit == "ms" ? v * 1e-3 : v;
}

// The scale table at the paper's example: stage 3's memory 16Ψ/N, its modelled communication 1.5x
// the baseline's (bandwidth-bound: Ψ = 7.5e9 on 25 GB/s links).
TEST_F(ZeroExplainCli, ScaleTableHasStage3) {
  const CommandResult r = run_command(zero::testing::bin_dir() +
                                      "/zero_explain --vocab-size 65 --world-size 4 --dtype bf16 --zero-stage 3 "
                                      "--bandwidth 25e9 --latency 5e-6 --params 7.5e9");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::size_t table = r.output.find("Psi = 7.5e+09");
  ASSERT_NE(table, std::string::npos) << r.output;
  const std::size_t row = r.output.find("\n     64 ", table);
  ASSERT_NE(row, std::string::npos) << r.output;
  std::istringstream in(r.output.substr(row + 1, r.output.find('\n', row + 1) - row - 1));
  int n = 0;
  in >> n;
  std::string v, u;
  std::vector<std::string> mem;
  for (int k = 0; k < 4; ++k) {
    in >> v >> u;
    mem.push_back(v + " " + u);
  }
  std::vector<double> comm;
  for (int k = 0; k < 4; ++k) {
    in >> v >> u;
    comm.push_back(seconds_of(v, u));
  }
  EXPECT_EQ(n, 64);
  const double gib = 1024.0 * 1024.0 * 1024.0, psi = 7.5e9;
  const double want[4] = {16 * psi, 4 * psi + 12 * psi / 64, 2 * psi + 14 * psi / 64, 16 * psi / 64};
  for (int s = 0; s < 4; ++s) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f GiB", want[s] / gib);
    EXPECT_EQ(mem[static_cast<std::size_t>(s)], text) << "stage " << s;
  }
  EXPECT_NEAR(comm[3] / comm[0], 1.5, 0.02) << r.output;
  EXPECT_NEAR(comm[2] / comm[0], 1.0, 0.01) << r.output;
}

// zero_explain shares train_gpt's merge rule: the file, then the flags, then validation of the result.
TEST_F(ZeroExplainCli, FlagsCompleteTheConfigFileBeforeItIsJudged) {
  const std::string bin = zero::testing::bin_dir() + "/zero_explain --vocab-size 65";
  const auto file = [&](const char* name, const char* text) {
    std::ofstream(dir_ / name) << text;
    return " --config " + (dir_ / name).string();
  };
  const struct {
    std::string flags;
    const char* says;
  } cases[] = {
      {"--zero-stage 2" + file("q.json", R"({"zero_optimization": {"zero_quantized_gradients": true}})"), "int8"},
      {"--zero-stage 2 --zero-quantized-gradients" +
           file("ef.json", R"({"zero_optimization": {"zero_quantized_gradients_error_feedback": true}})"),
       "error feedback"},
      {"--dtype bf16" + file("wire.json", R"({"communication_data_type": "bf16"})"), "zero: stage 0, bf16"},
      {"--dtype bf16" + file("acc.json", R"({"zero_optimization": {"reduce_scatter_with_fp32_accumulation": true}})"),
       "summed there in fp32"},
  };
  for (const auto& c : cases) {
    const CommandResult r = run_command(bin + " " + c.flags);
    EXPECT_EQ(r.exit_code, 0) << c.flags << ": " << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.flags << ": " << r.output;
  }
  const CommandResult s3 = run_command(bin + " --zero-stage 3 --overlap-param-gather");
  EXPECT_EQ(s3.exit_code, 1) << s3.output;
  EXPECT_NE(s3.output.find("does nothing at stage 3"), std::string::npos) << s3.output;
  EXPECT_EQ(std::count(s3.output.begin(), s3.output.end(), '\n'), 1) << s3.output;
}

}  // namespace

namespace zero {
namespace {

// GPT-3's shape (96 layers, 12288 channels, block 2048, vocabulary 50257) on 4096 ranks: 700 GB of fp32
// weights, explained under an address-space limit of 2000 MiB because the model is built shape only
// (Note [Meta tensors] in core/storage.h). Ψ against the closed form V·C + T·C + L(12C² + 13C) + 2C.
TEST_F(ZeroExplainCli, ThePapersScaleIsExplainedWithoutItsMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer reserves more address space than the limit";
#endif
  const std::int64_t V = 50257, T = 2048, L = 96, C = 12288;
  const CommandResult r = run_command(
      "bash -c 'ulimit -v 2048000; exec " + zero::testing::bin_dir() +
      "/zero_explain --n-layer 96 --n-head 96 --n-embd 12288 --block 2048 --vocab-size 50257 --world-size 4096 "
      "--zero-stage 2 --format json'");
  ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["model"]["params"].get<std::int64_t>(), V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);
}

// The order in which backward makes gradients final, which decides when each bucket can leave: what
// zero_explain prints (recorded on a narrow twin of the model) against the order recorded here, from
// hooks on the real model at full width.
TEST_F(ZeroExplainCli, HookOrderIsTheRealModelsBackwardOrder) {
  std::vector<nn::GPTConfig> configs(3);
  for (nn::GPTConfig& c : configs) c = {.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
  configs[1].norm = "rmsnorm";
  configs[2] = {.vocab_size = 30, .block_size = 16, .n_layer = 3, .n_head = 3, .n_embd = 24};
  for (const nn::GPTConfig& cfg : configs) {
    const std::string flags = fmt::format("--n-layer {} --n-head {} --n-embd {} --block {} --vocab-size {} --norm {}",
                                          cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size, cfg.norm);
    Generator gen(3);
    nn::GPT model(cfg, gen);
    std::vector<nn::NamedParameter> params = model.named_parameters();
    std::vector<std::string> want;
    for (auto& p : params)
      autograd::register_post_accumulate_grad_hook(p.tensor, [&want, name = p.name](Tensor&) { want.push_back(name); });
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(cfg.block_size));
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int64_t>(i) % cfg.vocab_size;
    const Tensor x = Tensor::from_indices(tokens, {1, cfg.block_size});
    model.loss(x, x).backward();
    const CommandResult r = run_command(zero::testing::bin_dir() + "/zero_explain " + flags + " --format json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(nlohmann::json::parse(r.output)["hook_order"].get<std::vector<std::string>>(), want) << flags;
  }
}

}  // namespace
}  // namespace zero

namespace {

void expect_buckets_shown_compactly(const std::string& bin);

// Many buckets on many ranks: the text shows the first and last 4 buckets with only the ranks that hold
// elements (checked against the JSON's full counts), and a bucket size whose per-rank counts would take
// gigabytes is one line naming it.
TEST_F(ZeroExplainCli, ManyBucketsOnManyRanksStayReadable) {
  // 8099 buckets inside one rank each; 8 buckets across 512 ranks each.
  for (const char* flags : {"--world-size 64 --reduce-bucket-size 100", "--world-size 4096 --zero-stage 2"}) {
    SCOPED_TRACE(flags);
    expect_buckets_shown_compactly(zero::testing::bin_dir() + "/zero_explain " + flags);
  }
  const CommandResult tiny = run_command(zero::testing::bin_dir() + "/zero_explain --world-size 256 --reduce-bucket-size 1");
  EXPECT_NE(tiny.exit_code, 0);
  EXPECT_EQ(zero::testing::error_lines(tiny.output), 1) << tiny.output;
  EXPECT_NE(tiny.output.find("reduce_bucket_size 1 cuts"), std::string::npos) << tiny.output;
}

void expect_buckets_shown_compactly(const std::string& bin) {
  const CommandResult j = run_command(bin + " --format json");
  ASSERT_EQ(j.exit_code, 0) << j.output.substr(0, 2000);
  const nlohmann::json buckets = nlohmann::json::parse(j.output)["buckets"];
  const CommandResult t = run_command(bin);
  ASSERT_EQ(t.exit_code, 0);
  std::istringstream lines(t.output);
  int shown = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("... buckets 4 to ", 0) == 0) {
      EXPECT_NE(line.find(std::to_string(buckets.size() - 8) + " more"), std::string::npos) << line;
      continue;
    }
    std::smatch m;
    if (!std::regex_search(line, m, std::regex("^bucket ([0-9]+): "))) continue;
    const std::size_t k = std::stoul(m[1]);
    EXPECT_TRUE(buckets.size() <= 16 || k < 4 || k >= buckets.size() - 4) << line;
    // The ranks with elements, equal neighbours as one run, from the JSON's full list.
    const auto counts = buckets[k]["counts"].get<std::vector<std::int64_t>>();
    std::string want;
    int zero = 0;
    for (std::size_t r = 0; r < counts.size();) {
      std::size_t end = r;
      while (end < counts.size() && counts[end] == counts[r]) ++end;
      if (counts[r] == 0) {
        zero += static_cast<int>(end - r);
      } else {
        want += want.empty() ? "" : ", ";
        want += end - r == 1 ? fmt::format("rank {}: {}", r, counts[r])
                             : fmt::format("ranks {}-{}: {} each", r, end - 1, counts[r]);
      }
      r = end;
    }
    EXPECT_NE(line.find("per-rank counts [" + want + "; the other " + std::to_string(zero) + " ranks 0]"),
              std::string::npos)
        << line;
    ++shown;
  }
  EXPECT_EQ(shown, buckets.size() > 16 ? 8 : static_cast<int>(buckets.size())) << "beyond 16 buckets, the first and last 4";
}

}  // namespace
