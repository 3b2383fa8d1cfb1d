// train_gpt's settings: its command-line flags (Args), which of them were given (Given), the checks
// every flag gets before any work (validate), the probe of every output path, and the DeepSpeed-style
// config the flags override (make_config, resolve_optimizer). examples/train_gpt.cpp uses them; the
// flags and their defaults are in README.md.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "distributed/distributed.h"
#include "examples/setting_flags.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

namespace zero::examples {

struct Args {
  std::string data;
  std::int64_t steps = 2000, batch = 12, block = 64, n_layer = 4, n_head = 4, n_embd = 128;
  nn::GPTConfig variant;  // the fields of nn::model_options() (--norm, ...); the shape is in the fields above
  // --lr, --beta1, --beta2, --weight-decay and --warmup are rows of the settings table (`settings`).
  float dropout = 0.0f, min_lr = 1e-4f;
  std::int64_t eval_every = 500, eval_iters = 200, log_every = 100, sample = 500;
  std::uint64_t seed = 1337;
  int threads = 0;
  std::string metrics;
  std::string trace, trace_steps;  // Chrome trace file; steps A:B (1-based, inclusive) to record
  // Distributed / mixed precision (override the --config file).
  std::string config;
  std::string dtype = "fp32";
  // The flags of the settings table (--zero-stage, --overlap-comm, ...: distributed/run/settings.h).
  SettingFlags settings;
  // Device and communicator.
  std::string device = "cpu";  // cpu | cuda
  std::string comm = "auto";   // auto | mpi | nccl | host-staged
  bool tf32 = false;
  // Checkpoints and the per-step log.
  std::string save_dir, resume, init_from, log_file;
  std::int64_t save_every = 0, keep = 0;
  // Reliability and error reports.
  int min_scale_skip_limit = 1;  // fp16: 0 = never stop at the minimum loss scale
  bool allow_non_finite_weights = false;  // --init-from a file holding NaN / inf
  bool verbose = false;
};

/// The flags given on the command line ("--batch", ...): they override the --config file and the
/// checkpoint a run resumes from.
struct Given {
  std::set<std::string, std::less<>> flags;
  bool has(std::string_view flag) const { return flags.count(flag) > 0; }
};

/// Defines every flag of train_gpt on `app`, writing into `a`.
void add_options(CLI::App& app, Args& a);

/// The flags `app` saw on its command line (after parsing).
Given given_flags(const CLI::App& app);

/// ZERO_MAX_STEPS=N (for quick runs of documented commands, e.g. the doc test): at most N optimizer
/// steps, N validation batches and N sampled characters; a --trace-steps window past the last step
/// moves onto the last steps. No-op when unset. Throws zero::Error naming the variable when it is
/// not a positive integer.
void apply_step_cap(Args& a);

/// The inclusive 1-based step range of --trace-steps "A:B" (all steps when empty). Throws zero::Error
/// naming the flag for anything else, or for a range that lies beyond --steps.
std::pair<std::int64_t, std::int64_t> trace_range(const Args& a);

/// Every flag by the rule of the config key it overrides (distributed/run/config.cpp), naming the flag;
/// then every output path probed (probe_output_paths). Throws zero::Error with one line.
void validate(const Args& a);

/// Checks before any work that every output can be written: --save-dir (created, with its parents, and
/// a file created and removed in it), --log-file, --metrics and --trace (parent directories created;
/// the file opened for appending, and removed again when it did not exist). Throws zero::Error naming
/// the flag, the path and the reason, e.g. "--save-dir '/proc': cannot create a file in it (No such
/// file or directory)".
void probe_output_paths(const Args& a);

/// The DeepSpeed-style config of the run, by the one merge rule (merge_config): the defaults, the
/// config of the checkpoint the run resumes from (`resumed`, state.json's "config"; nullptr when not
/// resuming) with the --config file's keys on top, then the command-line flags; resolved for
/// `world_size` (a resumed config's micro-batch is derived again, so the world size may change); then
/// validated once. Throws zero::Error naming the flag or key (and the file, or the checkpoint
/// `resumed_dir` whose recorded config holds it).
dist::TrainingConfig make_config(const Args& a, const Given& given, int world_size, const nlohmann::json* resumed,
                                 const std::string& resumed_dir);

/// The optimizer and learning-rate schedule of a run.
struct OptimizerSettings {
  optim::AdamWOptions adam;  // peak lr, betas, eps
  float weight_decay;        // matrices only (nn decay groups)
  optim::LrSchedule schedule;
};

/// The optimizer and learning-rate schedule of a run: lr, betas, eps, weight decay and the warmup are the
/// merged config's (rows of the settings table: --lr, --beta1, --beta2, --weight-decay, --warmup over the
/// file's optimizer.params and scheduler.params over their defaults, Note [Section defaults] in
/// distributed/run/settings.cpp). --min-lr, which has no config key: with a scheduler its default is
/// cos_min_ratio × lr, written back into `a` (which a checkpoint records); with an optimizer section and no
/// scheduler, its default is lowered to an lr below it. The schedule ends at
/// scheduler.params.total_num_steps when the config has a scheduler, else at --steps. Throws zero::Error
/// when the resulting min_lr exceeds lr.
OptimizerSettings resolve_optimizer(Args& a, const Given& given, const dist::TrainingConfig& tc);

}  // namespace zero::examples
