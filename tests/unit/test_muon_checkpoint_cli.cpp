// Muon end to end through build/bin/train_gpt (mpirun for several ranks), on a tiny model. Checkpoints: the
// reference is an uninterrupted run: a resume at the same world size (and stage) must reproduce its per-step
// log bit for bit; at another world size within 1e-5 relative (the gradient sums run in another order).
// At stage 0 the flat layout has no gaps; at stages 1-3 a model of odd widths has them, and uneven
// partitions (zero_explain says so, checked first), and the checkpoint's state.json records each parameter at its logical offset,
// where model.safetensors' own header puts it. A resume that changes the optimizer gets one line. The
// trace: each matrix's Newton–Schulz runs once per optimizer step, on one rank only, with gradient
// accumulation.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using Result = zero::testing::CommandResult;

// Per-step losses of a --log-file.
std::map<std::int64_t, double> losses(const fs::path& path) {
  std::map<std::int64_t, double> out;
  for (const auto& [step, j] : zero::testing::read_step_log(path)) out[step] = j["loss"].get<double>();
  return out;
}

class MuonCheckpointCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = zero::testing::make_text_dir("zero_muon_ckpt");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  // Batch 12 splits over 1, 2, 3 and 4 ranks; Muon unless `args` names an optimizer or a config.
  Result train(const std::string& args, int np = 1) const {
    const std::string mpirun = np == 1 ? std::string() : fmt::format("{} -np {} ", ZERO_MPIRUN, np);
    return zero::testing::run_command(fmt::format(
        "{}{}/train_gpt --data {} {} --batch 12 --eval-every 0 "
        "--eval-iters 1 --log-every 1000 --warmup 2 --threads 1 --sample 0 {}{}",
        mpirun, zero::testing::bin_dir(), p("text.txt"), model_,
        args.find("--optimizer") == std::string::npos && args.find("--config") == std::string::npos
            ? "--optimizer muon "
            : "",
        args));
  }
  fs::path dir_;
  std::string model_ = "--n-layer 1 --n-head 2 --n-embd 16 --block 16";
};

TEST_F(MuonCheckpointCli, ResumesBitwiseAtTheSameWorldSizeAndClosePastIt) {
  ASSERT_EQ(train("--steps 12 --save-every 6 --save-dir " + p("ck") + " --log-file " + p("a.jsonl"), 2).exit_code, 0);
  const auto straight = losses(p("a.jsonl"));
  const Result same = train("--steps 12 --resume " + p("ck/step_00000006") + " --log-file " + p("b.jsonl"), 2);
  ASSERT_EQ(same.exit_code, 0) << same.output;
  const auto resumed = losses(p("b.jsonl"));
  ASSERT_EQ(resumed.size(), 6u);
  for (const auto& [s, l] : resumed) EXPECT_EQ(l, straight.at(s)) << "step " << s;
  for (int np : {1, 3}) {
    const std::string log = fmt::format("c{}.jsonl", np);
    const Result other = train("--steps 12 --resume " + p("ck/step_00000006") + " --log-file " + p(log), np);
    ASSERT_EQ(other.exit_code, 0) << other.output;
    const auto moved = losses(p(log));
    ASSERT_EQ(moved.size(), 6u);
    for (const auto& [s, l] : moved) EXPECT_NEAR(l, straight.at(s), 1e-5 * straight.at(s)) << np << " ranks, step " << s;
  }
}

TEST_F(MuonCheckpointCli, ChangingTheOptimizerOnResumeIsOneLine) {
  ASSERT_EQ(train("--steps 4 --save-every 4 --save-dir " + p("ck")).exit_code, 0);
  const Result r = train("--steps 8 --optimizer adamw --resume " + p("ck/step_00000004"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(zero::testing::error_lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("holds muon optimizer state and this run uses adamw"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("continuing with \"adamw\""), std::string::npos) << "a warning that it goes on:\n" << r.output;
}

// The same optimizer spelt another way (the config's "Muon", the flag's muon; AdamW by default, recorded
// without a type) resumes without a warning about it.
TEST_F(MuonCheckpointCli, TheSameOptimizerSpeltAnotherWayIsNoWarning) {
  {
    std::ofstream(p("muon.json")) << R"({"optimizer": {"type": "Muon"}})";
  }
  ASSERT_EQ(train("--steps 2 --save-every 2 --config " + p("muon.json") + " --save-dir " + p("ck_m")).exit_code, 0);
  ASSERT_EQ(train("--steps 2 --save-every 2 --optimizer adamw --save-dir " + p("ck_a")).exit_code, 0);
  // The AdamW run was started with the flag; a run recorded without it resumes with it too.
  for (const auto& [resume, flags] : std::vector<std::pair<std::string, std::string>>{
           {"ck_m/step_00000002", "--optimizer muon"}, {"ck_a/step_00000002", "--optimizer adamw"}}) {
    const Result r = train("--steps 3 " + flags + " --resume " + p(resume));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("--optimizer \""), std::string::npos) << resume << ":\n" << r.output;
    EXPECT_EQ(r.output.find("optimizer.type"), std::string::npos) << resume << ":\n" << r.output;
  }
}

// Odd widths: a Muon matrix after an odd number of elements starts one later, a gap between parameters
// (Note [Whole-matrix partitions]), and the partitions are uneven.
const std::string kModelWithGaps = "--n-layer 1 --n-head 3 --n-embd 9 --block 9";

// Elements of gaps between parameters in the Muon layout of `model` at `stage` on `np` ranks, as
// zero_explain reports them.
std::int64_t gaps(const std::string& text, const std::string& model, int stage, int np) {
  const Result r = zero::testing::run_command(fmt::format(
      "{}/zero_explain --data {} {} --batch 12 --optimizer muon --zero-stage {} --world-size {} --format json",
      zero::testing::bin_dir(), text, model, stage, np));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output)["muon"]["interior_padding"].get<std::int64_t>();
}

// Stages 1-3 on layouts with gaps: saved at N, resumed at N (bitwise) and at other world sizes (1e-5),
// each of which but one rank has gaps too. state.json's offsets are where model.safetensors puts each
// tensor (back to back: the logical offsets), and the shards tile [0, Ψ).
TEST_F(MuonCheckpointCli, StagesOneToThreeWithGapsResumeBitwiseAndAtOtherWorldSizes) {
  struct Case {
    int stage, np;
    std::vector<int> others;
  };
  model_ = kModelWithGaps;
  for (const Case& c : {Case{1, 3, {2, 1}}, Case{2, 2, {3}}, Case{3, 4, {3}}}) {
    const std::string tag = fmt::format("s{}n{}", c.stage, c.np), stage = fmt::format("--zero-stage {} ", c.stage);
    ASSERT_GT(gaps(p("text.txt"), model_, c.stage, c.np), 0) << tag << ": the test needs a layout with gaps";
    for (int np : c.others) {
      if (np > 1) {
        ASSERT_GT(gaps(p("text.txt"), model_, c.stage, np), 0) << tag << " resumed on " << np;
      }
    }
    const Result saved = train(stage + "--steps 12 --save-every 6 --save-dir " + p(tag) + " --log-file " +
                               p(tag + ".jsonl"), c.np);
    ASSERT_EQ(saved.exit_code, 0) << saved.output;
    const auto straight = losses(p(tag + ".jsonl"));
    const fs::path ckpt = p(tag + "/step_00000006");
    std::ifstream state_in(ckpt / "state.json");
    const nlohmann::json state = nlohmann::json::parse(state_in);
    const nlohmann::json model = zero::testing::safetensors_header(ckpt / "model.safetensors");
    for (const auto& param : state["params"])
      EXPECT_EQ(4 * param["offset"].get<std::int64_t>(),
                model[param["name"].get<std::string>()]["data_offsets"][0].get<std::int64_t>())
          << tag << " " << param["name"];
    std::int64_t covered = 0;
    for (const auto& shard : state["shards"]) {
      EXPECT_EQ(shard["flat_begin"].get<std::int64_t>(), covered) << tag;
      covered = shard["flat_end"].get<std::int64_t>();
    }
    EXPECT_EQ(covered, state["numel"].get<std::int64_t>()) << tag;

    const Result same = train(stage + "--steps 12 --resume " + ckpt.string() + " --log-file " + p(tag + "b.jsonl"),
                              c.np);
    ASSERT_EQ(same.exit_code, 0) << same.output;
    const auto resumed = losses(p(tag + "b.jsonl"));
    ASSERT_EQ(resumed.size(), 6u) << tag;
    for (const auto& [s, l] : resumed) EXPECT_EQ(l, straight.at(s)) << tag << ", step " << s;
    for (int np : c.others) {
      const std::string log = fmt::format("{}c{}.jsonl", tag, np);
      const Result other = train(stage + "--steps 12 --resume " + ckpt.string() + " --log-file " + p(log), np);
      ASSERT_EQ(other.exit_code, 0) << other.output;
      const auto moved = losses(p(log));
      ASSERT_EQ(moved.size(), 6u) << tag;
      double worst = 0;
      for (const auto& [s, l] : moved) {
        EXPECT_NEAR(l, straight.at(s), 1e-5 * straight.at(s)) << tag << " resumed on " << np << ", step " << s;
        worst = std::max(worst, std::abs(l - straight.at(s)));
      }
      std::printf("[ resume   ] %s -> %d ranks: max |loss difference| %.3g\n", tag.c_str(), np, worst);
    }
  }
}

// The Chrome trace's "newton_schulz" spans (one per matrix a rank steps, argument "param"): over both
// ranks, each of the 4 matrices of the 1-layer model exactly once per traced step, GAS 2 notwithstanding.
TEST_F(MuonCheckpointCli, NewtonSchulzRunsOncePerStepOnTheOwnerOnly) {
  const Result r = train("--steps 3 --zero-stage 2 --grad-accum 2 --trace " + p("t.json") + " --trace-steps 2:3", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(p("t.json"));
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> runs;
  std::map<std::string, std::set<int>> ranks;
  for (const auto& e : trace["traceEvents"]) {
    if (e["name"] != "newton_schulz" || e["ph"] == "M") continue;
    const std::string param = e["args"]["param"];
    ++runs[param];
    ranks[param].insert(e["pid"].get<int>());
  }
  ASSERT_EQ(runs.size(), 4u) << trace.dump().substr(0, 400);
  for (const auto& [param, n] : runs) {
    EXPECT_EQ(n, 2) << param << ": once per traced step";
    EXPECT_EQ(ranks[param].size(), 1u) << param << ": on its owner only";
  }
}

}  // namespace
