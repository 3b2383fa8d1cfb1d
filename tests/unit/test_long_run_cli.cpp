// Long runs through the real binaries (build/bin/train_gpt; mpirun for several ranks), on a tiny model:
// a stop request (SIGTERM, SIGINT, or SIGUSR1 through mpirun) at a random step saves that step once and
// the run resumed from it, with no flag but --resume, ends with the uninterrupted run's per-step log bit
// for bit; a second request abandons that save; a resumed run takes its settings from the checkpoint;
// a save that fails (a file-size limit set on the running process: a write error as a full disk gives
// one) stops the job with one line and leaves the previous checkpoint loadable. The reference in each
// test is an uninterrupted run, or the directory's files read directly.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Result = zero::testing::CommandResult;

std::string bin(const char* name) { return zero::testing::bin_dir() + "/" + name; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Per-step log lines keyed by step (evaluation lines apart, under "val").
struct Log {
  std::map<std::int64_t, nlohmann::json> steps, val;
};
Log read_log(const fs::path& path) {
  Log out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    auto& m = j.contains("loss") ? out.steps : out.val;
    EXPECT_FALSE(m.count(j["step"].get<std::int64_t>())) << "logged twice: " << line;
    m[j["step"].get<std::int64_t>()] = j;
  }
  return out;
}
std::size_t lines_in(const fs::path& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// Every step's loss, grad norm, lr and loss scale, and every validation loss, equal.
void expect_same_run(const Log& want, const Log& got) {
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (const auto& [s, j] : want.steps) {
    ASSERT_TRUE(got.steps.count(s)) << "step " << s;
    for (const char* key : {"loss", "grad_norm", "lr", "loss_scale", "skipped"})
      EXPECT_EQ(got.steps.at(s)[key], j[key]) << key << " at step " << s;
  }
  EXPECT_EQ(got.val.size(), want.val.size());
  for (const auto& [s, j] : want.val)
    if (got.val.count(s)) {
      EXPECT_EQ(got.val.at(s)["val_loss"], j["val_loss"]) << "val_loss at step " << s;
    }
}

// The checkpoint directories of `dir` (step_*), the name `latest` holds, and any temporary leftovers.
struct SaveDir {
  std::vector<std::string> steps, temporary;
  std::string latest;
};
SaveDir look_at(const fs::path& dir) {
  SaveDir d;
  if (!fs::exists(dir)) return d;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (std::regex_match(f, std::regex("step_[0-9]{8}"))) d.steps.push_back(f);
    if (f.rfind(".tmp-", 0) == 0 || f.rfind(".trash-", 0) == 0) d.temporary.push_back(f);
  }
  std::sort(d.steps.begin(), d.steps.end());
  std::ifstream(dir / "latest") >> d.latest;
  return d;
}

// The one "stopped by ..." line of a run's output, and the step it names (-1 if none or several).
std::int64_t stopped_step(const std::string& out, std::string* line = nullptr) {
  std::istringstream in(out);
  std::int64_t step = -1;
  int n = 0;
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, std::regex("^stopped by [A-Z0-9]+ after step ([0-9]+)/"))) {
      step = std::stoll(m[1]);
      ++n;
      if (line) *line = l;
    }
  }
  return n == 1 ? step : -1;
}

// A started job: `pid` is train_gpt's, or mpirun's (its ranks are its children).
struct Job {
  pid_t pid = -1;
  fs::path out;
};

// Starts `cmd` (a shell command line, exec'd so the pid is the program's) with its output in `out`.
Job start(const std::string& cmd, const fs::path& out) {
  const pid_t pid = fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // a terminal's Ctrl-C would not reach it: only what the test sends
    execl("/bin/sh", "sh", "-c", ("exec " + cmd + " >" + out.string() + " 2>&1").c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return {pid, out};
}

// Waits for `job`; its exit code (128 + signal if killed) and output.
Result finish(const Job& job) {
  int status = 0;
  waitpid(job.pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(job.out)};
}

// Waits until `pred` holds or the job ended; false if it ended.
template <typename Pred>
bool wait_until(const Job& job, Pred pred) {
  while (!pred()) {
    if (waitpid(job.pid, nullptr, WNOHANG) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// The pids of mpirun's ranks (its children).
std::vector<pid_t> children(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (pid_t c; in >> c;) out.push_back(c);
  return out;
}

class LongRunCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = zero::testing::make_text_dir("zero_longrun");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  // The tiny model (batch 24 splits over 1, 2, 3, 4 ranks).
  std::string tiny() const {
    return " --data " + p("text.txt") + " --n-layer 1 --n-head 2 --n-embd 16 --block 16 --batch 24 --eval-iters 1 "
           "--log-every 100000 --warmup 2 --threads 1 --sample 0 ";
  }
  static std::string launcher(int np) {
    return np == 1 ? bin("train_gpt") : std::string(ZERO_MPIRUN) + " -np " + std::to_string(np) + " " + bin("train_gpt");
  }
  fs::path dir_;
};

struct StopCase {
  const char* name;
  int np;
  int signal;
  bool to_one_rank;  // signal the last rank only (np > 1); else train_gpt or mpirun itself
  const char* flags;
};

TEST_F(LongRunCli, AStopRequestSavesThatStepOnceAndTheResumedRunIsBitwiseTheUninterruptedOne) {
  const std::vector<StopCase> cases = {
      {"SIGTERM, 1 rank", 1, SIGTERM, false, "--steps 1500 --eval-every 400 "},
      {"SIGINT, 1 rank, dropout", 1, SIGINT, false, "--steps 1500 --eval-every 400 --dropout 0.1 "},
      {"SIGUSR1 to mpirun, 4 ranks, stage 2", 4, SIGUSR1, false, "--steps 400 --eval-every 150 --zero-stage 2 "},
      {"SIGTERM to rank 3 only, 4 ranks, stage 0", 4, SIGTERM, true, "--steps 400 --eval-every 150 --zero-stage 0 "},
  };
  std::mt19937 rng(2024);
  for (const StopCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string tag = std::to_string(&c - cases.data());
    const Result ref = zero::testing::run_command(launcher(c.np) + tiny() + c.flags + "--log-file " + p("ref" + tag + ".jsonl"));
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    const auto total = static_cast<std::int64_t>(read_log(p("ref" + tag + ".jsonl")).steps.size());
    // Stop after a random number of logged steps.
    const auto at = std::uniform_int_distribution<std::size_t>(5, static_cast<std::size_t>(total / 4))(rng);
    const fs::path save = dir_ / ("ck" + tag), log = dir_ / ("log" + tag + ".jsonl");
    const Job job = start(launcher(c.np) + tiny() + c.flags + "--save-dir " + save.string() + " --log-file " +
                              log.string(), dir_ / ("out" + tag));
    ASSERT_TRUE(wait_until(job, [&] { return fs::exists(log) && lines_in(log) >= at; })) << slurp(job.out);
    if (c.to_one_rank) {
      const std::vector<pid_t> ranks = children(job.pid);
      ASSERT_EQ(ranks.size(), static_cast<std::size_t>(c.np));
      ::kill(ranks.back(), c.signal);
    } else {
      ::kill(job.pid, c.signal);
    }
    const Result r = finish(job);
    EXPECT_EQ(r.exit_code, 128 + c.signal) << r.output;
    std::string line;
    const std::int64_t step = stopped_step(r.output, &line);
    ASSERT_GE(step, static_cast<std::int64_t>(at)) << r.output;
    ASSERT_LT(step, total) << r.output;
    // Under mpirun its options (ZERO_MPIRUN's --oversubscribe, ...) are unknown to the program: a
    // placeholder stands for them rather than a bare "mpirun -np N" that drops them.
    const std::string how = c.np == 1 ? "resume with: " + bin("train_gpt") + " "
                                      : "resume with: mpirun [the options it was launched with; any -np] " +
                                            bin("train_gpt") + " ";
    EXPECT_NE(line.find(how), std::string::npos) << line;
    EXPECT_NE(line.find(" --resume " + save.string()), std::string::npos) << line;
    // Saved once: the one checkpoint is that step's, and it is the newest.
    const SaveDir d = look_at(save);
    EXPECT_EQ(d.steps, std::vector<std::string>{fmt::format("step_{:08d}", step)});
    EXPECT_EQ(d.latest, fmt::format("step_{:08d}", step));
    EXPECT_TRUE(d.temporary.empty());
    EXPECT_EQ(static_cast<std::int64_t>(read_log(log).steps.size()), step);
    // Resumed with nothing but where to: model, data, schedule and ZeRO settings come from the checkpoint.
    const Result resumed = zero::testing::run_command(launcher(c.np) + " --threads 1 --resume " + save.string() +
                                                      " --log-file " + log.string());
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_EQ(resumed.output.find("warning"), std::string::npos) << resumed.output;
    expect_same_run(read_log(p("ref" + tag + ".jsonl")), read_log(log));
    std::printf("%s: stopped after step %lld of %lld; resumed bitwise\n", c.name, static_cast<long long>(step),
                static_cast<long long>(total));
  }
}

TEST_F(LongRunCli, ASecondStopRequestAbandonsTheSaveAndThePreviousCheckpointStaysTheNewest) {
  for (const int np : {1, 2}) {
    SCOPED_TRACE(np);
    const fs::path save = dir_ / ("ck" + std::to_string(np)), log = dir_ / ("log" + std::to_string(np));
    const Job job = start(launcher(np) + tiny() + "--steps 3000 --save-every 40 --save-dir " + save.string() +
                              " --log-file " + log.string(), dir_ / "out");
    ASSERT_TRUE(wait_until(job, [&] { return lines_in(log) >= 60; })) << slurp(job.out);
    // Two different signals (two pending ones of one kind merge into one delivery), to every rank;
    // which one is delivered first is the kernel's choice, and the run exits with 128 + that one.
    const std::vector<pid_t> targets = np == 1 ? std::vector<pid_t>{job.pid} : children(job.pid);
    for (const int sig : {SIGTERM, SIGINT})
      for (const pid_t t : targets) ::kill(t, sig);
    const Result r = finish(job);
    EXPECT_TRUE(r.exit_code == 128 + SIGTERM || r.exit_code == 128 + SIGINT) << r.output;
    std::string line;
    const std::int64_t step = stopped_step(r.output, &line);
    ASSERT_GT(step, 0) << r.output;
    EXPECT_TRUE(line.find("no checkpoint saved") != std::string::npos || line.find("was abandoned") != std::string::npos)
        << line;
    // Nothing of step `step` beyond what --save-every wrote before the second request: the newest is
    // the last periodic checkpoint (that of `step` itself only if it was committed first).
    const SaveDir d = look_at(save);
    ASSERT_FALSE(d.steps.empty());
    EXPECT_EQ(d.latest, d.steps.back());
    const std::int64_t newest = std::stoll(d.latest.substr(5));
    EXPECT_EQ(newest % 40, 0) << d.latest;
    EXPECT_LE(newest, step);
    EXPECT_GE(newest, step - 40);
    EXPECT_TRUE(d.temporary.empty());
    EXPECT_NE(line.find(d.latest), std::string::npos) << "the line names the newest checkpoint: " << line;
  }
}

TEST_F(LongRunCli, AResumedRunTakesItsSettingsFromTheCheckpoint) {
  const std::string settings = " --data " + p("text.txt") + " --n-layer 2 --n-head 3 --n-embd 24 --block 12 --lr 3e-3 "
                               "--min-lr 2e-4 --warmup 3 --dropout 0.1 --beta2 0.95 --weight-decay 0.05 --eval-every 4 "
                               "--eval-iters 2 --batch 12 --grad-accum 2 --clip 0.5 --seed 5 --steps 12 --threads 1 "
                               "--sample 0 ";
  ASSERT_EQ(zero::testing::run_command(bin("train_gpt") + settings + "--save-every 6 --save-dir " + p("ck") +
                                       " --log-file " + p("a.jsonl")).exit_code, 0);
  const std::string from = p("ck/step_00000006");
  const Result r = zero::testing::run_command(bin("train_gpt") + " --threads 1 --resume " + from + " --log-file " + p("b.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model: 2 layers, 3 heads, 24 channels, block 12"), std::string::npos) << r.output;
  Log a = read_log(p("a.jsonl")), b = read_log(p("b.jsonl"));
  for (std::int64_t s = 1; s <= 6; ++s) a.steps.erase(s), a.val.erase(s);
  expect_same_run(a, b);
  EXPECT_EQ(b.val.size(), 2u);  // steps 8 and 12: --eval-every came from the checkpoint too

  // A given flag that repeats the checkpoint's value changes nothing; one that differs is a warning
  // naming both values.
  const Result same = zero::testing::run_command(bin("train_gpt") + settings + "--resume " + from);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(same.output.find("warning"), std::string::npos) << same.output;
  const Result lr = zero::testing::run_command(bin("train_gpt") + " --threads 1 --resume " + from + " --lr 4e-3 2>&1 >/dev/null | cat");
  EXPECT_EQ(lr.exit_code, 0) << lr.output;
  EXPECT_EQ(lr.output, "warning: --lr 0.004 differs from the checkpoint's 0.003 ('" + from +
                           "'); continuing with 0.004\n");
  const Result stage = zero::testing::run_command(bin("train_gpt") + " --threads 1 --resume " + from +
                                                  " --zero-stage 1 2>&1 >/dev/null | cat");
  EXPECT_EQ(stage.output, "warning: --zero-stage 1 differs from the checkpoint's 0 ('" + from +
                              "'); continuing with 1\n");
  // The model shape cannot change.
  const Result shape = zero::testing::run_command(bin("train_gpt") + " --resume " + from + " --n-head 4");
  EXPECT_EQ(shape.exit_code, 1);
  EXPECT_EQ(zero::testing::without_source_locations(shape.output),
            "error: --n-head 4 differs from the checkpoint's 3 ('" + from +
                "'): the model shape cannot change; leave --n-head out to take the checkpoint's\n");
  // --init-from a save directory: its newest weights, and its model shape.
  const Result init = zero::testing::run_command(bin("train_gpt") + " --data " + p("text.txt") + " --threads 1 "
                                                 "--sample 0 --steps 1 --lr 1e-30 --min-lr 0 --warmup 0 --eval-iters 1 "
                                                 "--save-dir " + p("ft") + " --init-from " + p("ck"));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  EXPECT_NE(init.output.find("model: 2 layers, 3 heads, 24 channels, block 12"), std::string::npos) << init.output;
}

// A checkpoint whose config was recorded before the optimizer's params and the warmup were keys of it
// ("optimizer": {"type": null, "params": null}, no "scheduler"; the values only in state.json's
// lr_schedule and adamw): the resumed run takes the values its run used, not the program's defaults, and
// continues it bitwise.
TEST_F(LongRunCli, ACheckpointRecordedBeforeTheOptimizerKeysResumesWithItsValues) {
  const std::string settings = " --data " + p("text.txt") + " --n-layer 2 --n-head 3 --n-embd 24 --block 12 --lr 3e-3 "
                               "--min-lr 2e-4 --warmup 3 --beta1 0.8 --beta2 0.95 --weight-decay 0.05 --eval-every 0 "
                               "--eval-iters 1 --batch 12 --seed 5 --steps 8 --threads 1 --sample 0 ";
  ASSERT_EQ(zero::testing::run_command(bin("train_gpt") + settings + "--save-every 4 --save-dir " + p("old") +
                                       " --log-file " + p("a.jsonl")).exit_code, 0);
  const fs::path state_path = fs::path(p("old/step_00000004")) / "state.json";
  nlohmann::json state = nlohmann::json::parse(slurp(state_path));
  state["config"]["optimizer"] = {{"type", nullptr}, {"params", nullptr}};  // as an older train_gpt wrote it
  state["config"].erase("scheduler");
  std::ofstream(state_path) << state.dump(1) << "\n";
  const Result r = zero::testing::run_command(bin("train_gpt") + " --threads 1 --resume " + p("old/step_00000004") +
                                              " --log-file " + p("b.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  Log a = read_log(p("a.jsonl")), b = read_log(p("b.jsonl"));
  for (std::int64_t s = 1; s <= 4; ++s) a.steps.erase(s), a.val.erase(s);
  expect_same_run(a, b);
}

// Sets the file-size limit (ulimit -f) of a running process: its next write past `bytes` fails (EFBIG),
// as a write to a full disk fails (ENOSPC).
void limit_file_size(pid_t pid, rlim_t bytes) {
  const rlimit limit{bytes, bytes};
  ASSERT_EQ(prlimit(pid, RLIMIT_FSIZE, &limit, nullptr), 0) << std::strerror(errno);
}

TEST_F(LongRunCli, ASaveThatFailsMidRunStopsWithOneLineAndThePreviousCheckpointLoads) {
  for (const int np : {1, 2}) {
    SCOPED_TRACE(np);
    const fs::path save = dir_ / ("ck" + std::to_string(np));
    const Job job = start(launcher(np) + tiny() + "--steps 100000 --save-every 30 --save-dir " + save.string(),
                          dir_ / "out");
    ASSERT_TRUE(wait_until(job, [&] { return fs::exists(save / "latest"); })) << slurp(job.out);
    // One rank's writes fail from now on (the last rank's: the others wait for it in a collective). The
    // limit is above the size of the output file (1 rank: it writes there too) and below a checkpoint
    // file's (model.safetensors alone is 16 KB).
    limit_file_size(np == 1 ? job.pid : children(job.pid).back(), 12000);
    const auto t0 = Clock::now();
    const Result r = finish(job);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 1) << r.output;
    std::vector<std::string> errors;
    std::istringstream in(r.output);
    for (std::string l; std::getline(in, l);)
      if (l.rfind("error:", 0) == 0) errors.push_back(l);
    ASSERT_EQ(errors.size(), 1u) << r.output;
    const SaveDir d = look_at(save);
    ASSERT_FALSE(d.steps.empty());
    for (const std::string& want : {std::string("--save-dir '") + save.string() + "'", std::string("File too large"),
                                    "the newest checkpoint is still " + (save / d.latest).string()})
      EXPECT_NE(errors[0].find(want), std::string::npos) << "should name " << want << ": " << errors[0];
    EXPECT_EQ(d.steps.back(), d.latest);
    std::printf("%d rank(s): the save failed and the job ended %.1f s later: %s\n", np, seconds, errors[0].c_str());
    // The previous checkpoint loads: a resumed run continues from it.
    const Result resumed = zero::testing::run_command(launcher(np) + " --threads 1 --steps " +
                                                      std::to_string(std::stoll(d.latest.substr(5)) + 2) +
                                                      " --resume " + save.string() + " 2>&1 | grep resumed");
    EXPECT_NE(resumed.output.find("resumed from " + (save / d.latest).string()), std::string::npos) << resumed.output;
  }
}

}  // namespace
