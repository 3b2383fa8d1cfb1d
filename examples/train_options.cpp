#include "examples/train_options.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "examples/cli_errors.h"
#include "examples/model_options.h"
#include "examples/output_paths.h"

namespace zero::examples {

namespace fs = std::filesystem;

void add_options(CLI::App& app, Args& a) {
  app.add_option("--data", a.data, "text file to train on (default: data/tinyshakespeare.txt, or the checkpoint's "
                 "with --resume)");
  app.add_option("--steps", a.steps, "optimizer steps")->capture_default_str();
  app.add_option("--batch", a.batch, "global batch: sequences per optimizer step over all ranks")->capture_default_str();
  app.add_option("--block", a.block, "sequence length (T)")->capture_default_str();
  app.add_option("--n-layer", a.n_layer, "transformer blocks (L)")->capture_default_str();
  app.add_option("--n-head", a.n_head, "attention heads (H)")->capture_default_str();
  app.add_option("--n-embd", a.n_embd, "channels (C)")->capture_default_str();
  app.add_option("--dropout", a.dropout, "dropout probability")->capture_default_str();
  add_model_option_flags(app, a.variant);
  app.add_option("--min-lr", a.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  app.add_option("--seed", a.seed, "random seed (init, batches, sampling)")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  app.add_option("--eval-every", a.eval_every, "validate every N steps (0 = only at the end)")->capture_default_str();
  app.add_option("--eval-iters", a.eval_iters, "validation batches per evaluation")->capture_default_str();
  app.add_option("--log-every", a.log_every, "progress line every N steps")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads per rank (0 = up to cores / ranks, fewer while cores are busy)")->capture_default_str();
  app.add_option("--metrics", a.metrics, "write a JSON summary to this path");
  app.add_option("--trace", a.trace, "write a Chrome trace (Perfetto, chrome://tracing) of every rank to this path");
  app.add_option("--trace-steps", a.trace_steps, "with --trace: record only steps A:B (from 1, inclusive)");
  app.add_option("--sample", a.sample, "characters to generate at the end (0 = none)")->capture_default_str();
  app.add_option("--config", a.config, "DeepSpeed-style JSON config (docs/config.md); flags below override it");
  app.add_option("--dtype", a.dtype, "model dtype: fp32, fp16 (dynamic loss scaling) or bf16")->capture_default_str();
  add_setting_flags(app, a.settings, FlagSet::all);
  app.add_option("--device", a.device, "where to train: cpu or cuda (one GPU per rank, by local rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--comm", a.comm, "communicator: auto (cpu: mpi; cuda: nccl if there are several ranks and each has "
                 "its own GPU, else host-staged), mpi, nccl, host-staged (MPI through pinned host memory)")
      ->check(CLI::IsMember({"auto", "mpi", "nccl", "host-staged"}))
      ->capture_default_str();
  app.add_flag("--tf32", a.tf32, "let fp32 matmuls use TF32 tensor cores (cuda)");
  app.add_option("--save-dir", a.save_dir, "write checkpoints to DIR/step_XXXXXXXX (always one at the end, and one "
                 "when SIGTERM/SIGINT/SIGUSR1 stops the run)");
  app.add_option("--save-every", a.save_every, "also checkpoint every N steps (0 = only at the end)")
      ->capture_default_str();
  app.add_option("--keep", a.keep, "keep only the K newest checkpoints (0 = all)")->capture_default_str();
  app.add_option("--resume", a.resume, "continue from a checkpoint directory, or from a save dir's newest one; model, "
                 "data, schedule and ZeRO settings come from it unless given");
  app.add_option("--init-from", a.init_from, "start from the weights of a model.safetensors or of a checkpoint "
                 "(directory) with a fresh optimizer; the model shape comes from a checkpoint unless given");
  app.add_option("--log-file", a.log_file, "write every step's loss, lr, grad norm, ... as JSON lines");
  app.add_option("--min-scale-skip-limit", a.min_scale_skip_limit,
                 "fp16: stop after N consecutive steps that overflow at the minimum loss scale (0 = never stop; "
                 "config fp16.min_scale_skip_limit / raise_error_at_min_scale)")
      ->capture_default_str();
  app.add_flag("--allow-non-finite-weights", a.allow_non_finite_weights,
               "--init-from: load weights that hold NaN or inf (refused by default, naming the tensor)");
  app.add_flag("--verbose", a.verbose, "add the C++ source location to error messages");
}

Given given_flags(const CLI::App& app) {
  Given g;
  for (const CLI::Option* o : app.get_options())
    if (o->count() > 0)
      for (const std::string& name : o->get_lnames()) g.flags.insert("--" + name);
  return g;
}

void apply_step_cap(Args& a) {
  const char* text = std::getenv("ZERO_MAX_STEPS");
  if (text == nullptr || *text == '\0') return;
  char* end = nullptr;
  errno = 0;
  const long long cap = std::strtoll(text, &end, 10);
  ZERO_CHECK(errno == 0 && *end == '\0' && cap > 0, "ZERO_MAX_STEPS must be a positive integer, got '{}'", text);
  const std::int64_t old_steps = a.steps;
  a.steps = std::min<std::int64_t>(a.steps, cap);
  a.eval_iters = std::min<std::int64_t>(a.eval_iters, cap);
  a.sample = std::min<std::int64_t>(a.sample, cap);
  if (a.trace_steps.empty() || a.steps == old_steps) return;
  const auto colon = a.trace_steps.find(':');
  try {
    const std::int64_t first = std::stoll(a.trace_steps.substr(0, colon));
    const std::int64_t last = std::stoll(a.trace_steps.substr(colon + 1));
    if (last > a.steps && last >= first) {  // the same number of steps, ending at the last one
      const std::int64_t n = std::min(last - first + 1, a.steps);
      a.trace_steps = std::to_string(a.steps - n + 1) + ":" + std::to_string(a.steps);
    }
  } catch (const std::exception&) {
    // malformed: trace_range reports it
  }
}

std::pair<std::int64_t, std::int64_t> trace_range(const Args& a) {
  if (a.trace_steps.empty()) return {1, a.steps};
  const auto colon = a.trace_steps.find(':');
  std::int64_t first = 0, last = 0;
  bool ok = colon != std::string::npos;
  try {
    std::size_t used = 0;
    if (ok) first = std::stoll(a.trace_steps.substr(0, colon), &used);
    ok = ok && used == colon;
    if (ok) last = std::stoll(a.trace_steps.substr(colon + 1), &used);
    ok = ok && used == a.trace_steps.size() - colon - 1;
  } catch (const std::exception&) {
    ok = false;
  }
  ZERO_CHECK(ok && first >= 1 && last >= first, "--trace-steps must be A:B with 1 <= A <= B (steps counted from 1), "
             "got '{}'", a.trace_steps);
  ZERO_CHECK(last <= a.steps, "--trace-steps {} ends after the run's last step (--steps {}); give A:B with B <= {}",
             a.trace_steps, a.steps, a.steps);
  return {first, last};
}

void probe_output_paths(const Args& a) {
  if (!a.save_dir.empty()) {
    ZERO_CHECK(!fs::exists(a.save_dir) || fs::is_directory(a.save_dir), "--save-dir '{}' exists and is not a directory",
               a.save_dir);
    make_directory("--save-dir", a.save_dir, fs::absolute(a.save_dir));  // every rank may try: it is idempotent
    // A file of this process's own: ranks on one machine probe side by side.
    const fs::path probe = fs::absolute(a.save_dir) / (".probe-" + std::to_string(::getpid()));
    probe_write("--save-dir", a.save_dir, probe, "create a file in it");
  }
  if (!a.log_file.empty()) probe_file("--log-file", a.log_file, false);
  if (!a.metrics.empty()) probe_file("--metrics", a.metrics, true);
  if (!a.trace.empty()) probe_file("--trace", a.trace, true);
}

void validate(const Args& a) {
  ZERO_CHECK(a.steps > 0, "--steps must be positive, got {}", a.steps);
  ZERO_CHECK(a.n_layer > 0, "--n-layer must be positive, got {}", a.n_layer);
  ZERO_CHECK(a.n_head > 0, "--n-head must be positive, got {}", a.n_head);
  ZERO_CHECK(a.n_embd > 0, "--n-embd must be positive, got {}", a.n_embd);
  ZERO_CHECK(a.n_embd % a.n_head == 0, "--n-embd {} is not divisible by --n-head {} (each head gets n_embd / n_head "
             "channels)", a.n_embd, a.n_head);
  ZERO_CHECK(a.batch > 0, "--batch must be positive, got {}", a.batch);
  ZERO_CHECK(a.block > 0, "--block must be positive, got {}", a.block);
  ZERO_CHECK(a.eval_every >= 0, "--eval-every must be >= 0, got {}", a.eval_every);
  ZERO_CHECK(a.eval_iters > 0, "--eval-iters must be positive, got {}", a.eval_iters);
  ZERO_CHECK(a.log_every > 0, "--log-every must be positive, got {}", a.log_every);
  ZERO_CHECK(a.sample >= 0, "--sample must be >= 0, got {}", a.sample);
  ZERO_CHECK(a.threads >= 0, "--threads must be >= 0 (0 = up to cores / ranks, fewer while cores are busy), got {}", a.threads);
  ZERO_CHECK(std::isfinite(a.min_lr) && a.min_lr >= 0, "--min-lr must be >= 0 (and at most the peak lr), got {}",
             a.min_lr);
  ZERO_CHECK(a.dtype == "fp32" || a.dtype == "fp16" || a.dtype == "bf16", "--dtype must be fp32, fp16 or bf16, got '{}'",
             a.dtype);
  ZERO_CHECK(a.min_scale_skip_limit >= 0, "--min-scale-skip-limit must be >= 0 (0 = never stop), got {}",
             a.min_scale_skip_limit);
  ZERO_CHECK(a.dropout >= 0 && a.dropout < 1, "--dropout must be in [0, 1), got {}", a.dropout);
  ZERO_CHECK(a.trace_steps.empty() || !a.trace.empty(), "--trace-steps needs --trace PATH");
  trace_range(a);
  ZERO_CHECK(a.save_every >= 0, "--save-every must be >= 0 (0 = only at the end), got {}", a.save_every);
  ZERO_CHECK(a.keep >= 0, "--keep must be >= 0 (0 = keep every checkpoint), got {}", a.keep);
  ZERO_CHECK(a.resume.empty() || a.init_from.empty(), "--resume and --init-from exclude each other (--resume restores "
             "the weights and the optimizer; --init-from only the weights)");
  ZERO_CHECK(!a.save_every || !a.save_dir.empty(), "--save-every needs --save-dir");
  ZERO_CHECK(!a.keep || !a.save_dir.empty(), "--keep needs --save-dir");
  ZERO_CHECK(!a.allow_non_finite_weights || !a.init_from.empty(), "--allow-non-finite-weights needs --init-from");
  probe_output_paths(a);
}

namespace {

// Copies every non-null value of `top` over `base`, object by object (null means "not given": the
// value below stays).
void overlay(nlohmann::json& base, const nlohmann::json& top) {
  for (const auto& [key, value] : top.items()) {
    if (value.is_null()) continue;
    if (value.is_object() && base.contains(key) && base[key].is_object())
      overlay(base[key], value);
    else
      base[key] = value;
  }
}

// The layer below the flags: the checkpoint's config when resuming, with the --config file's keys on
// top, or the file alone, or nothing (the defaults). Returns the JSON and the file it came from.
std::pair<nlohmann::json, std::string> config_base(const Args& a, const nlohmann::json* resumed,
                                                   const std::string& resumed_dir) {
  nlohmann::json file = a.config.empty() ? nlohmann::json::object() : dist::read_config_file(a.config);
  if (resumed == nullptr) return {file, a.config};
  // An invalid key names where it came from: the checkpoint's recorded config, with the file over it.
  const std::string saved = fmt::format("checkpoint '{}' (state.json \"config\")", resumed_dir);
  const std::string source = a.config.empty() ? saved : fmt::format("{} over {}", a.config, saved);
  nlohmann::json base = *resumed;
  base["train_micro_batch_size_per_gpu"] = nullptr;  // derived again: the world size may differ
  // The file's batch keys replace the checkpoint's as a whole (the ones it leaves out are derived).
  const auto given = [&](const char* k) { return file.is_object() && file.contains(k) && !file[k].is_null(); };
  if (given("train_batch_size") || given("train_micro_batch_size_per_gpu") || given("gradient_accumulation_steps"))
    for (const char* k : {"train_batch_size", "gradient_accumulation_steps"}) base[k] = nullptr;
  if (file.is_object()) overlay(base, file);
  return {base, source};
}

// The rules between keys, worded for the flags that broke them (validate() words them for the keys).
void check_flag_rules(const dist::TrainingConfig& cfg, const Given& given) {
  const dist::ZeroConfig& z = cfg.zero_optimization;
  if (given.has("--reduce-scatter-with-fp32-accumulation") && z.reduce_scatter_with_fp32_accumulation.value_or(false))
    ZERO_CHECK(cfg.model_dtype() != DType::f32 && cfg.communication_data_type.value_or("") != "fp32",
               "--reduce-scatter-with-fp32-accumulation needs a 16-bit wire (--dtype fp16 or bf16, without "
               "--communication-data-type fp32)");
  if (given.has("--zero-quantized-gradients") && z.zero_quantized_gradients)
    ZERO_CHECK(z.stage != 0,
               "--zero-quantized-gradients needs --zero-stage 1, 2 or 3 (stage 0 all-reduces its gradients)");
  if (given.has("--zero-quantized-gradients-block-size"))
    ZERO_CHECK(z.zero_quantized_gradients_block_size >= 1 &&
                   z.zero_quantized_gradients_block_size <= dist::kMaxQuantizationBlock,
               "--zero-quantized-gradients-block-size must be in [1, {}] elements, got {}", dist::kMaxQuantizationBlock,
               z.zero_quantized_gradients_block_size);
  if (given.has("--zero-quantized-gradients-error-feedback") && z.zero_quantized_gradients_error_feedback)
    ZERO_CHECK(z.zero_quantized_gradients, "--zero-quantized-gradients-error-feedback needs --zero-quantized-gradients");
}

}  // namespace

dist::TrainingConfig make_config(const Args& a, const Given& given, int world_size, const nlohmann::json* resumed,
                                 const std::string& resumed_dir) {
  const auto [base, source] = config_base(a, resumed, resumed_dir);
  // The flags that are not one key of the table: the dtype (two keys), the batch (three), the fp16 limit (two).
  const auto program_flags = [&](dist::TrainingConfig& cfg) {
    if (given.has("--dtype")) cfg.set_model_dtype(parse_float_dtype(a.dtype));
    apply_batch_flags(cfg, a.batch, given.has("--batch"), given.has("--grad-accum"), world_size);
    if (given.has("--min-scale-skip-limit")) {
      cfg.fp16.raise_error_at_min_scale = a.min_scale_skip_limit > 0;
      if (a.min_scale_skip_limit > 0) cfg.fp16.min_scale_skip_limit = a.min_scale_skip_limit;
    }
    check_flag_rules(cfg, given);
    // A resumed run's batch that no flag or file set is the checkpoint's: say so, and which flag fixes it.
    const bool checkpoint_batch = resumed != nullptr && !given.has("--batch") && a.config.empty();
    const std::int64_t per_step = static_cast<std::int64_t>(world_size) * cfg.gradient_accumulation_steps.value_or(1);
    ZERO_CHECK(!checkpoint_batch || !cfg.train_batch_size || per_step < 1 || *cfg.train_batch_size % per_step == 0,
               "--resume: the checkpoint's global batch {} does not split into {} rank(s) x {} accumulation step(s); "
               "give --batch B (a positive multiple of {})", *cfg.train_batch_size, world_size, per_step / world_size,
               per_step);
    cfg.resolve_batch(world_size);
  };
  return merge_config(base, source, a.settings, [&](std::string_view f) { return given.has(f); }, program_flags);
}

OptimizerSettings resolve_optimizer(Args& a, const Given& given, const dist::TrainingConfig& tc) {
  const dist::OptimizerConfig& o = *tc.optimizer;  // defaults, the file, the flags (rows of the settings table)
  const float lr = static_cast<float>(o.lr);
  std::int64_t total_steps = a.steps;
  // The flags' floor (--min-lr's default) never exceeds a smaller peak that the optimizer section sets.
  if (tc.optimizer && !tc.scheduler && !given.has("--min-lr")) a.min_lr = std::min(a.min_lr, lr);
  if (tc.scheduler) {
    if (!given.has("--min-lr")) a.min_lr = static_cast<float>(lr * tc.scheduler->cos_min_ratio);
    total_steps = tc.scheduler->total_num_steps;
  }
  ZERO_CHECK(a.min_lr <= lr, "the final learning rate {} (--min-lr, or the scheduler's cos_min_ratio x lr) exceeds "
             "the peak learning rate {} (--lr, or the optimizer's lr)", a.min_lr, lr);
  return {optim::AdamWOptions{lr, static_cast<float>(o.beta1), static_cast<float>(o.beta2), static_cast<float>(o.eps)},
          static_cast<float>(o.weight_decay), optim::LrSchedule{lr, a.min_lr, tc.scheduler->warmup_num_steps, total_steps}};
}

}  // namespace zero::examples
