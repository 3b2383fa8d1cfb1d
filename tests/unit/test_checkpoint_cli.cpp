// Checkpoints end to end through the real binaries (build/bin/train_gpt, sample_gpt; mpirun for several
// ranks), on a tiny model so every run takes a fraction of a second. The reference in every test is
// an uninterrupted run: resumed runs must reproduce its per-step log bitwise (same world size) or to
// fp32 summation noise (another world size / stage), whatever instant a kill -9 came at.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/safetensors.h"

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

using Result = zero::testing::CommandResult;
Result run(const std::string& cmd) { return zero::testing::run_command(cmd); }

std::string bin(const char* name) { return zero::testing::bin_dir() + "/" + name; }
std::string mpirun(int np) { return fmt::format("{} -np {} ", ZERO_MPIRUN, np); }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every file under `dir` with its contents: a failed load must leave this unchanged.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = slurp(e.path());
  return out;
}

class CheckpointCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = zero::testing::make_text_dir("zero_ckpt");
  }
  void TearDown() override {
    fs::remove_all(dir_);
    if (!scratch_.empty()) fs::remove_all(scratch_);
  }

  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  // The tiny model and schedule every run here shares (batch 24 splits over 1, 2, 3, 4 and 8 ranks);
  // `args` adds flags or overrides these ("--eval-every 4" replaces "--eval-every 0").
  std::string tiny(const std::string& args = "") const {
    std::map<std::string, std::string> f{{"--data", p("text.txt")}, {"--n-layer", "1"}, {"--n-head", "2"},
                                         {"--n-embd", "16"},        {"--block", "16"},  {"--batch", "24"},
                                         {"--eval-every", "0"},     {"--eval-iters", "1"}, {"--log-every", "1000"},
                                         {"--warmup", "2"},         {"--threads", "1"}, {"--sample", "0"}};
    std::istringstream in(args);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    std::string extra;
    for (std::size_t i = 0; i < words.size(); ++i) {
      const bool has_value = i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0;
      if (f.count(words[i]) && has_value) {
        f[words[i]] = words[i + 1];
        ++i;
      } else {
        extra += words[i] + " ";
      }
    }
    std::string out;
    for (const auto& [k, v] : f) out += k + " " + v + " ";
    return out + extra;
  }
  Result train(const std::string& args, int np = 1) {
    return run((np == 1 ? std::string() : mpirun(np)) + bin("train_gpt") + " " + tiny(args));
  }
  // Failure contract: non-zero exit, no crash, one line "error: ..." naming the culprit.
  void expect_one_line_error(const Result& r, const std::vector<std::string>& culprits) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_LT(r.exit_code, 128) << "crashed: " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "expected one line: " << r.output;
    for (const std::string& c : culprits) EXPECT_NE(r.output.find(c), std::string::npos) << "should name " << c << ": " << r.output;
  }
  fs::path dir_, scratch_;
  double rest_ms_ = 0;
};

// Same world size: N steps + resume + N steps gives the per-step log of 2N straight steps, bit for bit.
void expect_bitwise(const std::map<std::int64_t, nlohmann::json>& straight,
                    const std::map<std::int64_t, nlohmann::json>& resumed, std::int64_t from, std::int64_t to) {
  ASSERT_EQ(resumed.size(), static_cast<std::size_t>(to - from));
  for (std::int64_t s = from + 1; s <= to; ++s) {
    ASSERT_TRUE(resumed.count(s)) << "step " << s;
    for (const char* key : {"loss", "grad_norm", "lr", "loss_scale", "skipped"})
      EXPECT_EQ(resumed.at(s)[key], straight.at(s)[key]) << key << " at step " << s;
  }
}

TEST_F(CheckpointCli, BitwiseResumeOneRank) {
  // Dropout on, so the dropout stream must be restored too.
  const std::string flags = "--steps 12 --dropout 0.1 --eval-every 4 ";
  ASSERT_EQ(train(flags + "--save-every 6 --save-dir " + p("ck") + " --log-file " + p("a.jsonl")).exit_code, 0);
  const Result r = train(flags + "--resume " + p("ck/step_00000006") + " --log-file " + p("b.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise(zero::testing::read_step_log(p("a.jsonl")), zero::testing::read_step_log(p("b.jsonl")), 6, 12);
  // Validation losses too (steps 8 and 12 are after the resume).
  auto val_lines = [&](const std::string& f) {
    std::vector<std::string> out;
    std::ifstream in(p(f));
    for (std::string l; std::getline(in, l);)
      if (l.find("val_loss") != std::string::npos && nlohmann::json::parse(l)["step"].get<int>() > 6) out.push_back(l);
    return out;
  };
  EXPECT_EQ(val_lines("a.jsonl"), val_lines("b.jsonl"));
  EXPECT_EQ(val_lines("b.jsonl").size(), 2u);
}

TEST_F(CheckpointCli, BitwiseResumeFourRanksStage2Fp16) {
  // A scaler that moves: overflow at 2^40 halves the scale (after hysteresis), a 3-step window doubles it.
  std::ofstream(dir_ / "fp16.json") << R"({"fp16": {"enabled": true, "initial_scale_power": 40,
                                         "loss_scale_window": 3, "hysteresis": 2}})";
  const std::string flags = "--steps 16 --zero-stage 2 --config " + p("fp16.json") + " ";
  ASSERT_EQ(train(flags + "--save-every 8 --save-dir " + p("ck") + " --log-file " + p("a.jsonl"), 4).exit_code, 0);
  const Result r = train(flags + "--resume " + p("ck/step_00000008") + " --log-file " + p("b.jsonl"), 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = zero::testing::read_step_log(p("a.jsonl"));
  expect_bitwise(a, zero::testing::read_step_log(p("b.jsonl")), 8, 16);
  int skipped = 0;
  for (const auto& [s, j] : a) skipped += j["skipped"].get<bool>();
  EXPECT_GT(skipped, 0) << "the test should exercise overflow steps";
}

// int8 gradients with error feedback (Note [Error-feedback checkpoints] in distributed/run/checkpoint.cpp):
// each rank's residual is in the checkpoint, so a resume at the same world size, stage and dtype is bit
// for bit the straight run; at another world size the residual starts from zero, which rank 0 says in
// one warning line.
TEST_F(CheckpointCli, ErrorFeedbackResumesBitwiseAndWarnsOnceElsewhere) {
  const std::string flags =
      "--steps 8 --zero-stage 2 --dtype bf16 --zero-quantized-gradients --zero-quantized-gradients-error-feedback ";
  ASSERT_EQ(train(flags + "--save-every 4 --save-dir " + p("ck") + " --log-file " + p("a.jsonl"), 2).exit_code, 0);
  const Result same = train(flags + "--resume " + p("ck/step_00000004") + " --log-file " + p("b.jsonl"), 2);
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(same.output.find("error-feedback residual starts from zero"), std::string::npos) << same.output;
  expect_bitwise(zero::testing::read_step_log(p("a.jsonl")), zero::testing::read_step_log(p("b.jsonl")), 4, 8);
  const Result other = train(flags + "--resume " + p("ck/step_00000004") + " --log-file " + p("c.jsonl"), 3);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  std::istringstream in(other.output);
  int warnings = 0;
  for (std::string line; std::getline(in, line);)
    if (line.find("error-feedback residual starts from zero") != std::string::npos) {
      ++warnings;
      EXPECT_EQ(line.rfind("warning: checkpoint '", 0), 0u) << line;
      EXPECT_NE(line.find("the checkpoint has world size 2, this run 3"), std::string::npos) << line;
    }
  EXPECT_EQ(warnings, 1) << other.output;
  EXPECT_EQ(zero::testing::read_step_log(p("c.jsonl")).size(), 4u);
}

// Resharding: a 4-rank stage-2 fp32 checkpoint continued at 1 (stage 0), 2 (stage 1), 3 and 8 (stage 2);
// and a 2-rank stage-1 one at 4 ranks (stage 2). 20 continued steps within 1e-5 relative.
TEST_F(CheckpointCli, ReshardAcrossWorldSizesAndStages) {
  const std::string flags = "--steps 25 ";
  ASSERT_EQ(train(flags + "--zero-stage 2 --save-every 5 --save-dir " + p("ck4") + " --log-file " + p("s4.jsonl"), 4)
                .exit_code,
            0);
  ASSERT_EQ(train(flags + "--zero-stage 1 --save-every 5 --save-dir " + p("ck2") + " --log-file " + p("s2.jsonl"), 2)
                .exit_code,
            0);
  struct Case {
    int np, stage;
    const char* from;
    const char* straight;
  };
  for (const Case c : {Case{1, 0, "ck4", "s4.jsonl"}, Case{2, 1, "ck4", "s4.jsonl"}, Case{3, 2, "ck4", "s4.jsonl"},
                       Case{8, 2, "ck4", "s4.jsonl"}, Case{4, 2, "ck2", "s2.jsonl"}}) {
    const std::string log = fmt::format("r{}_{}.jsonl", c.np, c.from);
    const Result r = train(flags + fmt::format("--zero-stage {} --resume {} --log-file {}", c.stage,
                                               p(std::string(c.from) + "/step_00000005"), p(log)),
                           c.np);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto straight = zero::testing::read_step_log(p(c.straight)), resumed = zero::testing::read_step_log(p(log));
    ASSERT_EQ(resumed.size(), 20u);
    double worst = 0.0;
    for (const auto& [s, j] : resumed) {
      const double want = straight.at(s)["loss"].get<double>(), got = j["loss"].get<double>();
      worst = std::max(worst, std::abs(got - want) / std::abs(want));
    }
    EXPECT_LT(worst, 1e-5) << c.from << " -> " << c.np << " ranks stage " << c.stage;
    std::printf("reshard %s -> %d ranks (stage %d): max relative loss difference %.3g over 20 steps\n", c.from, c.np,
                c.stage, worst);
  }
}

// Stage 3 against stage 2 (bitwise: the same reductions and updates, parameters kept elsewhere), its
// own resume (bitwise), and checkpoints crossing stage 3 both ways at other world sizes (1e-5).
TEST_F(CheckpointCli, Stage3EqualsStage2AndReshardsBothWays) {
  const std::string flags = "--steps 12 ";
  ASSERT_EQ(train(flags + "--zero-stage 3 --save-every 6 --save-dir " + p("ck3") + " --log-file " + p("s3.jsonl"), 4)
                .exit_code,
            0);
  ASSERT_EQ(train(flags + "--zero-stage 2 --save-every 6 --save-dir " + p("ck2") + " --log-file " + p("s2.jsonl"), 4)
                .exit_code,
            0);
  const auto s3 = zero::testing::read_step_log(p("s3.jsonl")), s2 = zero::testing::read_step_log(p("s2.jsonl"));
  expect_bitwise(s2, s3, 0, 12);
  const Result same = train(flags + "--zero-stage 3 --resume " + p("ck3/step_00000006") + " --log-file " + p("r3.jsonl"), 4);
  ASSERT_EQ(same.exit_code, 0) << same.output;
  expect_bitwise(s3, zero::testing::read_step_log(p("r3.jsonl")), 6, 12);
  struct Case {
    int np, stage;
    const char* from;
  };
  for (const Case c : {Case{2, 2, "ck3"}, Case{1, 0, "ck3"}, Case{3, 3, "ck2"}}) {
    const std::string log = fmt::format("x{}_{}.jsonl", c.np, c.from);
    const Result r = train(flags + fmt::format("--zero-stage {} --resume {} --log-file {}", c.stage,
                                               p(std::string(c.from) + "/step_00000006"), p(log)),
                           c.np);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto resumed = zero::testing::read_step_log(p(log));
    ASSERT_EQ(resumed.size(), 6u);
    double worst = 0.0;
    for (const auto& [s, j] : resumed) {
      const double want = s2.at(s)["loss"].get<double>(), got = j["loss"].get<double>();
      worst = std::max(worst, std::abs(got - want) / std::abs(want));
    }
    EXPECT_LT(worst, 1e-5) << c.from << " -> " << c.np << " ranks stage " << c.stage;
  }
}

// kill -9 at random instants of a run that saves every step; --resume of the save dir must always find
// the newest complete checkpoint and finish with the uninterrupted run's log.
TEST_F(CheckpointCli, KillNineAtRandomInstantsThenResume) {
  // On the real disk: every save's fsyncs make it the larger part of a step, so most kills land inside one.
  scratch_ = dir_ / "scratch";
  fs::create_directories(scratch_);
  const std::string flags = "--steps 10 --save-every 1 --keep 2 ";
  ASSERT_EQ(train(flags + "--save-dir " + p("ref") + " --log-file " + p("ref.jsonl")).exit_code, 0);
  const auto reference = zero::testing::read_step_log(p("ref.jsonl"));
  ASSERT_EQ(reference.size(), 10u);
  // Starts a saving run; returns its pid once its first checkpoint exists (or it ended).
  auto start = [&](const fs::path& save, const fs::path& log) {
    std::vector<std::string> args{bin("train_gpt")};
    std::istringstream words(tiny(flags + "--save-dir " + save.string() + " --log-file " + log.string()));
    for (std::string w; words >> w;) args.push_back(w);
    const pid_t pid = fork();
    if (pid == 0) {
      std::freopen("/dev/null", "w", stdout);
      std::freopen("/dev/null", "w", stderr);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    while (pid > 0 && !fs::exists(save / "latest") && waitpid(pid, nullptr, WNOHANG) == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    return pid;
  };
  // How long a run lives after its first checkpoint, to spread the kills over that time.
  {
    const pid_t pid = start(scratch_ / "timing", dir_ / "timing.jsonl");
    ASSERT_GT(pid, 0);
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    waitpid(pid, &status, 0);
    rest_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  std::mt19937 rng(12345);
  int kills = 0, before_first = 0, in_save = 0;  // before_first: finished or had no checkpoint yet
  for (int trial = 0; trial < 80 && kills < 20; ++trial) {
    const fs::path save = scratch_ / fmt::format("kill{}", trial), log = dir_ / fmt::format("kill{}.jsonl", trial);
    const pid_t pid = start(save, log);
    ASSERT_GT(pid, 0);
    const double at_ms = std::uniform_real_distribution<double>(0.0, 0.8)(rng) * rest_ms_;
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(1000 * at_ms)));
    ::kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status)) {
      ++before_first;  // it finished first: not a kill
      continue;
    }
    // The newest complete checkpoint, found independently: the highest step_ directory (a directory
    // gets that name only once complete).
    std::string newest;
    bool mid_save = false;  // a temporary directory left: the kill came inside a save
    if (fs::exists(save))
      for (const auto& e : fs::directory_iterator(save)) {
        const std::string f = e.path().filename().string();
        if (std::regex_match(f, std::regex("step_[0-9]{8}"))) newest = std::max(newest, f);
        mid_save |= f.rfind(".tmp-", 0) == 0 || f.rfind(".trash-", 0) == 0;
      }
    in_save += mid_save;
    const Result r = train(flags + "--save-dir " + save.string() + " --log-file " + log.string() + " --resume " +
                           save.string());
    if (newest.empty()) {
      ++before_first;
      EXPECT_NE(r.exit_code, 0) << r.output;  // nothing to resume yet: a clean refusal
      continue;
    }
    ++kills;
    ASSERT_EQ(r.exit_code, 0) << "trial " << trial << " killed at " << at_ms << " ms: " << r.output;
    EXPECT_NE(r.output.find("resumed from " + (save / newest).string() + " "), std::string::npos)
        << "newest is " << newest << ": " << r.output;
    // The log continues cleanly: every step once, with the uninterrupted run's values.
    const auto got = zero::testing::read_step_log(log);
    ASSERT_EQ(got.size(), 10u) << slurp(log);
    for (const auto& [s, j] : got) EXPECT_EQ(j["loss"], reference.at(s)["loss"]) << "trial " << trial << " step " << s;
  }
  std::printf("kill -9: %d kills within %.0f ms after the first checkpoint, %d of them inside a save (all resumed "
              "and finished), %d other\n", kills, rest_ms_, in_save, before_first);
  EXPECT_GE(kills, 20);
}

TEST_F(CheckpointCli, BadCheckpointsGiveOneLine) {
  ASSERT_EQ(train("--steps 2 --save-dir " + p("ck")).exit_code, 0);
  const fs::path good = dir_ / "ck" / "step_00000002";
  auto copy = [&](const std::string& name) {
    const fs::path d = dir_ / name;
    fs::copy(good, d, fs::copy_options::recursive);
    return d;
  };
  auto expect_refused = [&](const fs::path& ckpt, const std::string& extra, const std::vector<std::string>& culprits) {
    const auto before = snapshot(ckpt);
    const Result r = train("--steps 4 --resume " + ckpt.string() + " --log-file " + p("log.jsonl") + " " + extra);
    expect_one_line_error(r, culprits);
    EXPECT_EQ(snapshot(ckpt), before) << "a failed load modified the checkpoint";
    EXPECT_FALSE(fs::exists(p("log.jsonl")));
  };
  {  // one flipped byte in the middle of an optimizer shard
    const fs::path d = copy("corrupt");
    std::fstream f(d / "optimizer_rank00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(d / "optimizer_rank00000.safetensors") / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(d / "optimizer_rank00000.safetensors") / 2));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
    f.close();
    expect_refused(d, "", {"optimizer_rank00000.safetensors", "corrupt"});
  }
  {  // model.safetensors cut short
    const fs::path d = copy("truncated");
    fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 100);
    expect_refused(d, "", {"model.safetensors", "truncated"});
  }
  {  // a shard gone
    const fs::path d = copy("missing");
    fs::remove(d / "optimizer_rank00000.safetensors");
    expect_refused(d, "", {"optimizer_rank00000.safetensors", "missing"});
  }
  {  // state.json damaged
    const fs::path d = copy("badstate");
    std::ofstream(d / "state.json") << "{\"version\": 1, \"step\": ";
    expect_refused(d, "", {"state.json", "corrupt"});
  }
  {  // a format version this build does not know
    const fs::path d = copy("version");
    std::string s = slurp(d / "state.json");
    s = std::regex_replace(s, std::regex("\"version\": 1"), "\"version\": 99");
    std::ofstream(d / "state.json") << s;
    expect_refused(d, "", {"format version 99", "version 1"});
  }
  // A state.json value of the wrong type, or not one this program knows, names the checkpoint, state.json
  // and the key.
  const auto edited = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path d = copy(name);
    nlohmann::json state = nlohmann::json::parse(slurp(d / "state.json"));
    edit(state);
    std::ofstream(d / "state.json") << state.dump();
    return d;
  };
  {
    const fs::path d = edited("optnull", [](nlohmann::json& s) { s["optimizer_type"] = nullptr; });
    expect_refused(d, "", {d.string(), "state.json \"optimizer_type\"", "wrong type (null)"});
  }
  {
    const fs::path d = edited("optsgd", [](nlohmann::json& s) { s["optimizer_type"] = "sgd"; });
    expect_refused(d, "", {d.string(), "state.json \"optimizer_type\" is \"sgd\"", "not an optimizer this program knows"});
  }
  {
    const fs::path d = edited("badconfig", [](nlohmann::json& s) {
      s["config"]["optimizer"] = {{"type", "muon"}, {"params", {{"momentum", "x"}}}};
    });
    expect_refused(d, "", {"'optimizer.params.momentum'", d.string(), "state.json \"config\""});
  }
  {
    const fs::path d = edited("badstep", [](nlohmann::json& s) { s["zero_stage"] = "two"; });
    expect_refused(d, "", {d.string(), "state.json \"zero_stage\"", "wrong type"});
  }
  // Mismatched model or data, on the intact checkpoint.
  expect_refused(good, "--n-embd 32", {"--n-embd 32", "the checkpoint's 16", "model shape"});
  expect_refused(good, "--n-layer 2", {"--n-layer 2", "the checkpoint's 1"});
  std::ofstream(dir_ / "other.txt") << std::string(3000, 'x') + "yz\n";
  const auto before = snapshot(good);
  const Result r = train("--steps 4 --data " + p("other.txt") + " --resume " + good.string());
  expect_one_line_error(r, {"character set"});
  EXPECT_EQ(snapshot(good), before);
  expect_one_line_error(train("--steps 4 --resume " + p("nowhere")), {"nowhere", "does not exist"});
  expect_one_line_error(train("--steps 4 --resume " + p("text.txt")), {"not a directory"});
  fs::create_directories(dir_ / "emptysave");
  expect_one_line_error(train("--steps 4 --resume " + p("emptysave")), {"emptysave", "no checkpoint"});
}

TEST_F(CheckpointCli, ResumedBatchThatDoesNotSplitNamesTheCheckpointAndBatch) {
  ASSERT_EQ(train("--steps 2 --save-dir " + p("a")).exit_code, 0);
  // The checkpoint's global batch 24 does not split into 5 ranks; no batch flag was given (tiny() gives one).
  const std::string resume = mpirun(5) + bin("train_gpt") + " --threads 1 --sample 0 --resume " + p("a");
  const Result r = run(resume);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: --resume: the checkpoint's global batch 24 does not split into 5 rank(s) x 1 "
                          "accumulation step(s); give --batch B (a positive multiple of 5)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("train_batch_size"), std::string::npos) << r.output;
  // --batch as the message says: the run goes on.
  const Result fixed = run(resume + " --batch 25 --steps 3");
  EXPECT_EQ(fixed.exit_code, 0) << fixed.output;
  // --grad-accum 0 with the checkpoint's batch: the key's one line, not a division by zero.
  const Result zero_accum = run(resume + " --grad-accum 0");
  EXPECT_EQ(zero_accum.exit_code, 1) << zero_accum.output;
  EXPECT_EQ(zero::testing::error_lines(zero_accum.output), 1) << zero_accum.output;
  EXPECT_NE(zero_accum.output.find("gradient_accumulation_steps"), std::string::npos) << zero_accum.output;
}

TEST_F(CheckpointCli, ResumingAFinishedRunHasNothingToDo) {
  ASSERT_EQ(train("--steps 3 --eval-every 3 --save-dir " + p("a") + " --log-file " + p("a/log.jsonl")).exit_code, 0);
  const std::string log = slurp(p("a/log.jsonl"));
  ASSERT_NE(log.find("\"val_loss\""), std::string::npos) << log;
  for (int np : {1, 2}) {
    const Result r = train("--resume " + p("a") + " --save-dir " + p("a") + " --log-file " + p("a/log.jsonl"), np);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("nothing to do: the checkpoint is already at step 3 of 3\n"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("done:"), std::string::npos) << r.output;
    EXPECT_EQ(slurp(p("a/log.jsonl")), log) << "the log holds every step once";
  }
  // Into another save dir: the final checkpoint is copied there.
  const Result other = train("--resume " + p("a") + " --save-dir " + p("b"));
  EXPECT_EQ(other.exit_code, 0) << other.output;
  EXPECT_TRUE(fs::exists(p("b/step_00000003/model.safetensors"))) << other.output;
}

TEST_F(CheckpointCli, SampleGptPrintsTrainGptsSample) {
  // fp16, so sample_gpt must round the fp32 weights as train_gpt's model holds them.
  const Result t = train("--sample 120 --steps 6 --dtype fp16 --seed 7 --save-dir " + p("ck"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::string begin = "---- sample ----\n", end = "\n----------------";
  const auto b = t.output.find(begin), e = t.output.find(end);
  ASSERT_NE(b, std::string::npos) << t.output;
  const std::string expected = t.output.substr(b + begin.size(), e - b - begin.size());
  ASSERT_EQ(expected.size(), 120u);
  const Result s = run(bin("sample_gpt") + " --checkpoint " + p("ck") + " --tokens 120 --seed 7");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.output, expected + "\n");
  // Another seed, a prompt, temperature and top-k: the prompt comes first, then 50 characters.
  const Result q = run(bin("sample_gpt") + " --checkpoint " + p("ck") +
                       " --prompt 'To be' --tokens 50 --temperature 0.8 --top-k 5 --seed 1");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_EQ(q.output.rfind("To be", 0), 0u) << q.output;
  EXPECT_EQ(q.output.size(), 5u + 50u + 1u) << q.output;
  expect_one_line_error(run(bin("sample_gpt") + " --checkpoint " + p("ck") + " --prompt 'To beZ'"), {"'Z'"});
  expect_one_line_error(run(bin("sample_gpt") + " --checkpoint " + p("nothing")), {"nothing"});
}

TEST_F(CheckpointCli, InitFromStartsFromTheWeights) {
  ASSERT_EQ(train("--steps 30 --save-dir " + p("a")).exit_code, 0);
  // A learning rate so small that one step cannot move any weight measurably: the saved weights must
  // then be the file's.
  const std::string weights = p("a/step_00000030/model.safetensors");
  ASSERT_EQ(train("--steps 1 --lr 1e-30 --min-lr 0 --warmup 0 --seed 99 --init-from " + weights + " --save-dir " +
                  p("b"))
                .exit_code,
            0);
  const zero::safetensors::Reader ra(weights), rb(p("b/step_00000001/model.safetensors"));
  ASSERT_EQ(ra.tensors().size(), rb.tensors().size());
  double worst = 0.0;
  for (const auto& t : ra.tensors()) {
    std::vector<float> x(static_cast<std::size_t>(t.numel())), y(x.size());
    ra.read_f32(t, 0, t.numel(), x.data());
    rb.read_f32(*rb.find(t.name), 0, t.numel(), y.data());
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double{x[i]} - y[i]) / (std::abs(x[i]) + 1e-6));
  }
  EXPECT_LT(worst, 1e-5);
  // A file that does not fit the model names the tensor.
  expect_one_line_error(train("--steps 1 --n-embd 32 --init-from " + weights), {"wte.weight"});
  // A deeper file is refused, not loaded in part: a 2-layer file holds blocks.1.* that a 1-layer model
  // lacks; a 1-layer file lacks the blocks.1.* of a 2-layer model.
  ASSERT_EQ(train("--steps 1 --n-layer 2 --save-dir " + p("c")).exit_code, 0);
  expect_one_line_error(train("--steps 1 --init-from " + p("c/step_00000001/model.safetensors")),
                        {"model.safetensors' holds", "'blocks.1.ln1.weight'", "this model lacks"});
  expect_one_line_error(train("--steps 1 --n-layer 2 --init-from " + weights),
                        {"model.safetensors' lacks", "'blocks.1.ln1.weight'", "of this model"});
}

TEST_F(CheckpointCli, InitFromSaysWhatItLoaded) {
  ASSERT_EQ(train("--steps 1 --n-layer 2 --save-dir " + p("a")).exit_code, 0);
  const std::string weights = p("a/step_00000001/model.safetensors");
  const Result r = train("--steps 1 --n-layer 2 --init-from " + weights);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The parameter count of the file, summed independently of the program.
  const zero::safetensors::Reader file(weights);
  std::int64_t n = 0;
  for (const auto& t : file.tensors()) n += t.numel();
  EXPECT_NE(r.output.find(fmt::format("init-from: {} parameters of a 2-layer model from {}\n", n, weights)),
            std::string::npos)
      << r.output;
}

// Weights that break training, made from a real run's model.safetensors: every value times `scale`,
// and element `nan_at` of tensor `nan_in` (if given) set to NaN.
std::string broken_weights(const std::string& from, const std::string& to, float scale, const std::string& nan_in = "",
                           std::size_t nan_at = 0) {
  const zero::safetensors::Reader r(from);
  std::vector<std::string> names;
  std::vector<zero::Shape> shapes;
  std::vector<std::vector<float>> values;
  for (const auto& t : r.tensors()) {
    names.push_back(t.name);
    shapes.push_back(t.shape);
    auto& v = values.emplace_back(static_cast<std::size_t>(t.numel()));
    r.read_f32(t, 0, t.numel(), v.data());
    for (float& x : v) x *= scale;
    if (t.name == nan_in) v.at(nan_at) = std::nanf("");
  }
  std::vector<const float*> data;
  for (const auto& v : values) data.push_back(v.data());
  zero::safetensors::write_f32_file(to, names, shapes, data);
  return to;
}

// fp16 whose gradients overflow at every step (weights 10^6 times a trained model's: the layer norms'
// 1.0 becomes inf in f16) reaches the minimum loss scale and stops there (Note [Stopping at the
// minimum scale]). The step it stops at follows from
// DeepSpeed's scaler rules alone: one overflow spends the hysteresis (2), 16 halve 2^16 down to 1, and
// the limit-th overflow at 1 stops the run: 17 + limit.
TEST_F(CheckpointCli, Fp16StopsAtTheMinimumLossScale) {
  ASSERT_EQ(train("--steps 1 --save-dir " + p("a")).exit_code, 0);
  const std::string huge = broken_weights(p("a/step_00000001/model.safetensors"), p("huge.safetensors"), 1e6f);
  for (const int np : {1, 2}) {
    for (const int limit : {1, 3}) {
      SCOPED_TRACE(fmt::format("{} rank(s), limit {}", np, limit));
      const Result r = train(fmt::format("--dtype fp16 --steps 40 --init-from {} --min-scale-skip-limit {}", huge,
                                         limit), np);
      EXPECT_EQ(r.exit_code, 1) << r.output;
      EXPECT_EQ(zero::testing::error_lines(r.output), 1) << r.output;
      const int stop = 17 + limit;
      EXPECT_NE(r.output.find(fmt::format("error: step {}: fp16: the gradients overflowed at the minimum loss scale 1 "
                                          "on {} consecutive step(s)", stop, limit)),
                std::string::npos) << r.output;
      EXPECT_NE(r.output.find(fmt::format("({} of {} steps skipped;", stop, stop)), std::string::npos) << r.output;
    }
  }
  // 0 keeps skipping at the floor (the earlier behaviour); the summary says how many were skipped.
  const fs::path metrics = dir_ / "m.json";
  const Result r = train("--dtype fp16 --steps 20 --init-from " + huge + " --min-scale-skip-limit 0 --metrics " +
                         metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fp16: final loss scale 1, 20 skipped step(s)"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  EXPECT_EQ(nlohmann::json::parse(in).at("skipped_steps"), 20);
}

// bf16 with --nonfinite-grads skip, on weights that make every gradient NaN: the run stops at the
// --nonfinite-skip-limit-th skipped step with one error line naming the step and the limit and exit
// code 1, on one rank and under mpirun alike (Note [Non-finite gradients] in
// distributed/zero/zero_optimizer.cpp); the default limit is fp16's (1); 0 keeps skipping to the end.
TEST_F(CheckpointCli, Bf16SkipModeStopsAtTheSkipLimit) {
  ASSERT_EQ(train("--steps 1 --save-dir " + p("a")).exit_code, 0);
  const std::string bad =
      broken_weights(p("a/step_00000001/model.safetensors"), p("nan.safetensors"), 1.0f, "blocks.0.attn.qkv.weight", 5);
  const std::string flags = "--dtype bf16 --steps 10 --nonfinite-grads skip --allow-non-finite-weights --init-from " + bad;
  for (const int np : {1, 2})
    for (const int limit : {0, 1, 3}) {  // 0: the flag not given (the default, 1)
      SCOPED_TRACE(fmt::format("{} rank(s), limit {}", np, limit));
      const Result r = train(flags + (limit > 0 ? fmt::format(" --nonfinite-skip-limit {}", limit) : ""), np);
      const int stop = limit > 0 ? limit : 1;
      EXPECT_EQ(r.exit_code, 1) << r.output;
      EXPECT_EQ(zero::testing::error_lines(r.output), 1) << r.output;
      EXPECT_NE(r.output.find(fmt::format("error: step {}: non-finite gradient (inf or NaN) on {} consecutive step(s), "
                                          "all skipped (nonfinite_skip_limit {})", stop, stop, stop)),
                std::string::npos)
          << r.output;
      EXPECT_NE(r.output.find(fmt::format("({} of {} steps skipped; --nonfinite-skip-limit 0 keeps skipping)", stop,
                                          stop)),
                std::string::npos)
          << r.output;
    }
  const Result never = train(flags + " --nonfinite-skip-limit 0");
  EXPECT_EQ(never.exit_code, 0) << never.output;
  EXPECT_EQ(zero::testing::error_lines(never.output), 0) << never.output;
}

// NaN in a weights file is named with its tensor before any work (Note [Bounded header] covers the
// header; this is the data), unless allowed.
TEST_F(CheckpointCli, NonFiniteWeightsAreRefusedByName) {
  ASSERT_EQ(train("--steps 1 --save-dir " + p("a")).exit_code, 0);
  const std::string bad =
      broken_weights(p("a/step_00000001/model.safetensors"), p("nan.safetensors"), 1.0f, "blocks.0.attn.qkv.weight", 5);
  expect_one_line_error(train("--steps 1 --init-from " + bad), {"tensor 'blocks.0.attn.qkv.weight'", "nan at element 5",
                                                                 "--allow-non-finite-weights"});
  const Result two = train("--steps 1 --init-from " + bad, 2);
  EXPECT_EQ(two.exit_code, 1) << two.output;
  EXPECT_EQ(zero::testing::error_lines(two.output), 1) << two.output;
  // Allowed: it loads, and fp32 then stops at step 1 on the non-finite gradient (its own check).
  const Result allowed = train("--steps 1 --init-from " + bad + " --allow-non-finite-weights");
  EXPECT_EQ(allowed.exit_code, 1) << allowed.output;
  EXPECT_NE(allowed.output.find("step 1"), std::string::npos) << allowed.output;
  EXPECT_EQ(allowed.output.find("holds a non-finite value"), std::string::npos) << allowed.output;
}

// Note [One writer] (distributed/run/checkpoint.cpp): a second job saving into a directory another job
// holds stops at start-up with one line naming the lock and its owner's pid; a lock whose owner is
// gone is taken over with a warning; the lock goes at exit.
TEST_F(CheckpointCli, ASaveDirectoryHasOneWriter) {
  const std::string save = p("s");
  const std::string cmd = bin("train_gpt") + " " + tiny("--steps 100000 --save-every 1 --save-dir " + save);
  FILE* first = popen((cmd + " > " + p("first.txt") + " 2>&1 & echo $!").c_str(), "r");
  ASSERT_NE(first, nullptr);
  long pid = 0;
  ASSERT_EQ(fscanf(first, "%ld", &pid), 1);
  pclose(first);
  for (int i = 0; i < 600 && !fs::exists(fs::path(save) / "step_00000001"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(fs::path(save) / ".lock"));
  for (const int np : {1, 2}) {
    const Result second = train("--steps 2 --save-dir " + save, np);
    EXPECT_EQ(second.exit_code, 1) << second.output;
    EXPECT_EQ(zero::testing::error_lines(second.output), 1) << second.output;
    EXPECT_NE(second.output.find("error: --save-dir '" + save + "' is being written by another job: '" + save +
                                 "/.lock' names pid " + std::to_string(pid) + " on host "),
              std::string::npos) << second.output;
  }
  ::kill(static_cast<pid_t>(pid), SIGTERM);  // it stops after a step, saving it, and releases the lock
  for (int i = 0; i < 600 && ::kill(static_cast<pid_t>(pid), 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(fs::exists(fs::path(save) / ".lock"));
  // A lock left by a process that is gone (a finished child's pid) is taken over, with a warning.
  const Result gone = run("sh -c 'echo $$'");
  const std::string dead = gone.output.substr(0, gone.output.find('\n'));
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::ofstream(fs::path(save) / ".lock") << nlohmann::json{{"host", host}, {"pid", std::stol(dead)},
                                                            {"started", "then"}, {"command", "train_gpt"}}.dump();
  std::string latest;
  std::ifstream(fs::path(save) / "latest") >> latest;  // "step_00000012"
  const Result after =
      train(fmt::format("--resume {} --steps {} --save-dir {}", save, std::stol(latest.substr(5)) + 1, save));
  EXPECT_EQ(after.exit_code, 0) << after.output;
  EXPECT_NE(after.output.find("warning: --save-dir '" + save + "': taking over the lock '" + save + "/.lock' of pid " +
                              dead),
            std::string::npos) << after.output;
  EXPECT_FALSE(fs::exists(fs::path(save) / ".lock"));
}

// --keep prunes only the checkpoints this job wrote: a resumed job keeps the run it came from.
TEST_F(CheckpointCli, KeepNeverDeletesAnotherJobsCheckpoints) {
  ASSERT_EQ(train("--steps 3 --save-every 1 --save-dir " + p("s")).exit_code, 0);
  ASSERT_EQ(train("--resume " + p("s") + " --steps 7 --save-every 1 --keep 2 --save-dir " + p("s")).exit_code, 0);
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(p("s"))) dirs.push_back(e.path().filename().string());
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(dirs, (std::vector<std::string>{"latest", "step_00000001", "step_00000002", "step_00000003",
                                            "step_00000006", "step_00000007"}));
}

// Note [Never cancel a collective] (distributed/comm/mpi_communicator.cpp): rank 0's rename of `latest`
// fails (a directory is in its way) while rank 1 waits in the save's closing all-reduce; the job ends
// with the filesystem's error in one line, never with Open MPI's MPI_Cancel abort (exit code 7).
TEST_F(CheckpointCli, AFailedRenameOnOneRankEndsWithItsOwnError) {
  fs::create_directories(dir_ / "s" / "latest" / "x");
  const Result r = train("--steps 2 --save-dir " + p("s"), 2);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(zero::testing::error_lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("error: --save-dir '" + p("s") + "': the checkpoint of step 2 failed: cannot rename: Is a "
                          "directory"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_Cancel"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
}

}  // namespace
