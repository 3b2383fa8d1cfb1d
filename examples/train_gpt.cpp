// train_gpt: trains a character-level GPT on a text file (Tiny Shakespeare by default) on the CPU,
// in one process or data-parallel under mpirun with ZeRO stage 0, 1, 2 or 3.
//
//   build/bin/train_gpt --data data/tinyshakespeare.txt
//   mpirun -np 4 build/bin/train_gpt --data data/tinyshakespeare.txt --zero-stage 2 --dtype fp16
//
// Defaults are nanoGPT's CPU recipe (4 layers, 4 heads, 128 channels, block 64, batch 12, 2000 steps,
// AdamW lr 1e-3 -> 1e-4 cosine after 100 warm-up steps). Prints a progress line every --log-every
// steps, validation loss every --eval-every steps and at the end, then a generated sample; --metrics
// writes a JSON summary. Bad flags or files stop with one line naming the problem, before any work.
// --batch is the global batch (DeepSpeed's train_batch_size): every rank draws the same global batch
// and trains on its own micro-batch slices of it, so a run's trajectory does not depend on the number
// of ranks beyond floating-point summation order.
// Checkpoints (docs/checkpoint.md): --save-dir DIR [--save-every N] [--keep K] writes DIR/step_XXXXXXXX;
// --resume PATH continues a run (any world size and ZeRO stage) with the checkpoint's own settings
// (examples/resume_settings.h); --init-from PATH starts from the weights of a model.safetensors or a
// checkpoint; --log-file PATH writes one JSON object per step. SIGTERM, SIGINT or SIGUSR1 stop every
// rank after the same step, with a checkpoint of it (examples/preemption.h). The flags and the checks
// they get before any work are in examples/train_options.h.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <optional>
#include <thread>
#include <tuple>

#include "core/backend.h"
#include "core/cpu/kernels.h"
#include "core/gemm_precision.h"
#include "core/storage.h"
#include "core/trace.h"
#include "distributed/distributed.h"
#include "examples/activation_meter.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#endif
#include "examples/muon_explain.h"
#include "examples/gpt_sampling.h"
#include "examples/model_options.h"
#include "examples/preemption.h"
#include "examples/resume_settings.h"
#include "examples/text_data.h"
#include "examples/train_options.h"
#include "nn/gpt.h"
#include "optim/lr_schedule.h"

namespace {

using namespace zero;
using examples::Args;
using examples::Given;
using Clock = std::chrono::steady_clock;

Device device_of(const Args& a) { return a.device == "cuda" ? Device::cuda : Device::cpu; }

// Dense peak FLOP/s of the device for the precision its GEMMs run in (matmul_precision(), the same
// decision the ops take: Note [Tensor cores for 16-bit models]; 0 when unknown: cpu). NVIDIA H100
// datasheet, SXM (the H200 has the same compute): bf16/fp16 tensor cores 989 TFLOP/s, TF32 495, plain
// fp32 67 (without sparsity). Used as the MFU denominator, as the PaLM paper's appendix does with the
// A100's peak.
double peak_flops(Device device, MatmulPrecision precision) {
  if (device != Device::cuda) return 0.0;
  switch (precision) {
    case MatmulPrecision::fp16:
    case MatmulPrecision::bf16: return 989e12;
    case MatmulPrecision::tf32: return 495e12;
    case MatmulPrecision::fp32: break;
  }
  return 67e12;
}

// What the device line says about the GEMMs (cuda only): " (TF32 matmuls)", " (bf16 tensor-core matmuls)", ...
std::string matmul_note(Device device, MatmulPrecision precision) {
  if (device != Device::cuda) return "";
  if (precision == MatmulPrecision::tf32) return " (TF32 matmuls)";
  if (precision == MatmulPrecision::fp32) return " (fp32 matmuls)";
  return fmt::format(" ({} tensor-core matmuls)", matmul_precision_name(precision));
}

// The world's communicator for --comm on --device (Note [ZeRO on cuda] in distributed/zero/zero_optimizer.cpp).
// For cuda, selects this rank's GPU first (local rank modulo the visible devices), before any allocation.
std::shared_ptr<dist::Communicator> make_communicator(const Args& a, std::shared_ptr<dist::Communicator> world) {
  if (a.device == "cpu") {
    ZERO_CHECK(a.comm == "auto" || a.comm == "mpi", "--comm {} needs --device cuda", a.comm);
    return world;
  }
#ifdef ZERO_HAS_CUDA
  ZERO_CHECK(cuda::cuda_available(), "--device cuda: no usable CUDA device on this machine (no GPU, or the driver is "
             "too old for this build)");
  const auto [local_rank, local_size] = dist::local_rank_and_size(world->rank(), world->world_size());
  (void)local_size;
  cuda::set_device(local_rank % cuda::device_count());
  cuda::set_allow_tf32(a.tf32);
  ZERO_CHECK(a.comm != "mpi", "--comm mpi cannot reduce device buffers; use nccl or host-staged with --device cuda");
  std::string comm = a.comm;
  // One rank has nothing to exchange: host-staged, which is then local copies only, needs no NCCL bootstrap.
  if (comm == "auto")
    comm = world->world_size() > 1 && dist::nccl_usable(world->rank(), world->world_size()) ? "nccl" : "host-staged";
  if (comm == "nccl") return std::make_shared<dist::NcclCommunicator>(world);
  return dist::make_host_staged(world);
#else
  (void)world;
  throw Error("--device cuda: this build has no CUDA (configure with -DZERO_CUDA=ON on a machine with the toolkit)");
#endif
}


// Rewrites the per-step log of a resumed run so it ends at `step`: lines of later steps (written
// before a crash) and a partial last line are dropped, so the appended lines continue it cleanly.
void truncate_log(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline: a line cut short by a crash
    try {
      if (nlohmann::json::parse(line).at("step").get<std::int64_t>() > step) continue;
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    kept += line + "\n";
  }
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << kept;
  std::filesystem::rename(tmp, path);
}

// Refuses a --block whose saved attention probabilities (L·B·H·T² floats, kept for backward) would not
// fit in this machine's memory, before the model is built.
void check_attention_memory(const Args& a, std::int64_t micro) {
  const double bytes = 4.0 * static_cast<double>(a.n_layer * micro * a.n_head) * static_cast<double>(a.block) *
                       static_cast<double>(a.block);
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  ZERO_CHECK(bytes < 0.5 * physical,
             "--block {}: attention would keep {:.1f} GiB of probabilities per rank (L*B*H*T^2 floats), more than half "
             "of this machine's {:.1f} GiB; use a shorter --block or a smaller --batch",
             a.block, bytes / (1 << 30), physical / (1 << 30));
}

// Mean validation loss over eval_iters global batches; each rank evaluates its slice of every batch.
float evaluate(const nn::GPT& model, const std::vector<std::int64_t>& split, const Args& a, Generator& gen,
               dist::Communicator& comm) {
  autograd::NoGradGuard no_grad;
  trace::Span span("evaluate", "eval");
  const std::int64_t per_rank = a.batch / comm.world_size();
  double total = 0.0;
  for (std::int64_t i = 0; i < a.eval_iters; ++i) {
    auto [x, y] = examples::TextData::batch(split, a.batch, a.block, gen);
    const std::int64_t first = comm.rank() * per_rank;
    const Device dev = device_of(a);
    total += model.loss(x.narrow(0, first, per_rank).to(dev), y.narrow(0, first, per_rank).to(dev)).item();
  }
  return static_cast<float>(comm.all_reduce_sum(total) / static_cast<double>(a.eval_iters * comm.world_size()));
}

// Moves what `ledger` counted in its collectives since `before` into `into`: the training traffic then
// leaves out the parameter all-gathers of stage 3's evaluation forwards (control scalars stay).
void move_since(dist::Ledger& ledger, const dist::Ledger& before, dist::Ledger& into) {
  for (int c = 0; c < dist::kNumCollectives; ++c) {
    into.bytes[c] += ledger.bytes[c] - before.bytes[c];
    into.calls[c] += ledger.calls[c] - before.calls[c];
    into.seconds[c] += ledger.seconds[c] - before.seconds[c];
    ledger.bytes[c] = before.bytes[c];
    ledger.calls[c] = before.calls[c];
    ledger.seconds[c] = before.seconds[c];
  }
  into.cpu_seconds += ledger.cpu_seconds - before.cpu_seconds;
  ledger.cpu_seconds = before.cpu_seconds;
}

// Gradient + parameter traffic per optimizer step in parameter copies (before the (n-1)/n factor):
// stage 0 all-reduces once (2); stage 1 reduce-scatters once and all-gathers (1 + 1); stage 2 reduces
// every micro-step (GAS + 1); stage 3 reduces and gathers every unit twice every micro-step (3 GAS, the
// ZeRO paper's 1.5x, §7.2.2); reduce_scatter=false all-reduces instead (2 per reduction).
double expected_traffic_copies(const dist::ZeroOptions& zo, int gas) {
  // With communication_data_type fp32 a 16-bit model's reduce-scatter moves 4 bytes per b-byte element,
  // and an all-reduce is that reduce-scatter plus a 16-bit all-gather (Note [Wire dtype]).
  const bool wide = zo.reduce_in_fp32 && zo.dtype != DType::f32;
  const double reduce_scatter = wide ? 4.0 / static_cast<double>(dtype_size(zo.dtype)) : 1.0;
  const double all_reduce = reduce_scatter + 1.0;
  if (zo.stage == 0) return all_reduce;
  const double reduce = zo.reduce_scatter ? reduce_scatter : all_reduce;
  if (zo.stage == 3) return gas * (reduce + 2.0);
  return (zo.stage == 2 ? gas : 1) * reduce + 1.0;
}

std::size_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::size_t>(usage.ru_maxrss) * 1024;  // ru_maxrss is in KiB on Linux
}

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

// The most bytes the device's caching allocator had in use at once since the start (metrics
// memory_bytes.allocator_peak: tensors only, not its cache; docs/zero.md section 9, Note [Peak RSS]).
std::size_t allocator_peak_bytes(Device device) {
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) return cuda::allocator_stats().peak_in_use;
#endif
  (void)device;
  return cpu_allocator_stats().peak_in_use;
}

// What a rank says when host memory ran out (std::bad_alloc from a tensor or anything else): the peak
// RSS so far and the address-space limit, if one is set (prlimit --as, ulimit -v), and what helps.
std::string out_of_memory_message() {
  rlimit as{};
  const bool limited = getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY;
  return fmt::format("out of memory: an allocation failed (std::bad_alloc) at peak RSS {}{}; a higher "
                     "--zero-stage (3 partitions the parameters too), more ranks or a smaller model needs less per rank",
                     mib(static_cast<double>(peak_rss_bytes())),
                     limited ? fmt::format(", address-space limit {}", mib(static_cast<double>(as.rlim_cur))) : "");
}

// A time left for progress lines: "42s", "3m07s", "1h02m".
std::string eta(double seconds) {
  const auto s = static_cast<std::int64_t>(std::max(0.0, seconds) + 0.5);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
}

// What main() settled before MPI started: the flags, which were given, the checkpoint named by --resume
// or --init-from (its settings already taken), and the command line (for the resume hint).
struct Setup {
  Args args;
  Given given;
  examples::CheckpointSettings from;
  std::vector<std::string> argv;
};

// Note [A training run]
// ~~~~~~~~~~~~~~~~~~~~~
// One run of train_gpt, phase by phase: its setup (the merged config, the save-directory lock, the
// data, the checkpoint to resume, the model, the optimizer and its restored state, the per-step log,
// the trace), its loop (one optimizer step, its log line, progress, evaluation, checkpoint, stop
// requests), its end (the final evaluation, the trace file) and its report (the summary, a sample,
// --metrics). A run resumed from a checkpoint of its last step has none of them: it copies that
// checkpoint into --save-dir when it is not there and says there is nothing to do. Every rank runs
// the same phases and so issues the same collectives in the same order.
class TrainingRun {
 public:
  TrainingRun(const Setup& setup, dist::Communicator& comm);
  /// Resumed from a checkpoint of the last step: there is nothing to train.
  bool at_end() const { return resume_.has_value() && first_step_ >= a_.steps; }
  /// For a run at_end(): copies the checkpoint into --save-dir when it is not there already, and says
  /// that there is nothing to do. The log, the metrics and the trace are left untouched.
  void finish_at_end();
  /// The training loop. An exit code when every rank agreed to stop early (after its checkpoint).
  std::optional<int> train();
  /// After the last step: the final evaluation, and the trace of every rank.
  void finish();
  /// The summary lines, the sample and the --metrics file.
  void report();

 private:
  // What one optimizer step did.
  struct StepResult {
    float lr;
    double loss_sum;  // this rank's micro-batch losses, summed
    bool applied;     // false: skipped (overflow, or a non-finite gradient with nonfinite_grads "skip")
    double seconds;
  };
  // Throughput, traffic and memory of the run, for the summary and --metrics.
  struct Summary {
    double tokens_per_s, ms_per_step, tflops, peak, mfu;
    MatmulPrecision precision;
    nlohmann::json traffic;  // bytes per step per collective
    double per_step, baseline, expected, comm_ms_per_step, comm_cpu_ms_per_step, steps;
    dist::MemoryBreakdown mem;
    std::size_t rss;
  };

  void configure();
  void open_resume();
  void build_model();
  void build_optimizer();
  void make_activation_meter();
  void restore();
  void open_log();
  void print_setup(const dist::MemoryBreakdown& have) const;
  dist::MemoryBreakdown largest_memory() const;
  void print_zero_setup(const dist::MemoryBreakdown& have) const;

  StepResult train_step(std::int64_t step);
  void log_progress(std::int64_t step, const StepResult& r);
  void evaluate_and_log(std::int64_t step);
  float evaluate_counted();
  void log_line(const nlohmann::json& j);

  std::string newest_checkpoint() const;
  dist::SaveResult save(std::int64_t done);
  int stop_run(const examples::StopDecision& d, std::int64_t done);

  Summary summarize() const;
  void print_summary(const Summary& s) const;
  void write_metrics(const Summary& s) const;

  Args a_;
  const Setup& setup_;
  const Given& given_;
  dist::Communicator& comm_;
  const int rank_, world_;
  const bool lead_;
  const nlohmann::json saved_config_;  // the resumed checkpoint's config (recorded_config), null when not resuming
  dist::TrainingConfig tc_;
  std::int64_t micro_ = 0;
  int gas_ = 1;
  std::optional<dist::SaveDirLock> save_lock_;
  std::optional<examples::TextData> data_;
  std::optional<dist::Checkpoint> resume_;
  double verify_seconds_ = 0.0;
  nn::GPTConfig cfg_;
  // The model keeps init_gen_ for its dropout masks after initialisation (every rank draws the same).
  Generator init_gen_, data_gen_, sample_gen_;
  std::optional<nn::GPT> model_;
  std::int64_t num_params_ = 0;
  Device device_;
  dist::ZeroOptions zo_;
  std::optional<examples::OptimizerSettings> optimizer_;
  std::optional<dist::ZeroOptimizer> opt_;
  std::optional<examples::ActivationMeter> meter_;  // memory_bytes.activations
  std::int64_t stage3_gathers_ = 0;                  // stage 3: unit all-gathers issued by training steps
  std::int64_t first_step_ = 0;
  std::ofstream log_;
  std::int64_t saved_step_ = -1;      // the step of the last checkpoint this run committed
  std::vector<std::string> written_;  // the checkpoints this job wrote: the only ones --keep may delete
  std::int64_t trace_first_ = 0, trace_last_ = 0;
  dist::Ledger eval_traffic_;         // Evaluation moves no gradient, but at stage 3 its forwards gather
  std::int64_t steps_run_ = 0, warmup_steps_ = 0;
  double train_seconds_ = 0.0, window_seconds_ = 0.0;
  std::int64_t window_steps_ = 0;  // steps since the last progress line
  float train_loss_ = NAN, val_loss_ = NAN;
  Clock::time_point run_start_;
  bool evaluated_last_ = false;
  dist::OverlapSummary overlap_;
};

TrainingRun::TrainingRun(const Setup& setup, dist::Communicator& comm)
    : a_(setup.args),
      setup_(setup),
      given_(setup.given),
      comm_(comm),
      rank_(comm.rank()),
      world_(comm.world_size()),
      lead_(rank_ == 0),
      saved_config_(a_.resume.empty() ? nlohmann::json() : examples::recorded_config(setup.from.state)),
      init_gen_(a_.seed),
      data_gen_(a_.seed + 1),
      sample_gen_(examples::sampling_generator(a_.seed)),
      device_(device_of(a_)) {
  configure();
  data_.emplace(examples::TextData::load(a_.data, a_.block));
  open_resume();
  build_model();
  build_optimizer();
  restore();
  if (at_end()) return;  // finish_at_end: nothing to log, trace or summarise
  comm_.ledger().reset();  // count training traffic only (not the initial broadcast of the weights)
  open_log();
  std::tie(trace_first_, trace_last_) = examples::trace_range(a_);
  if (!a_.trace.empty()) {
    comm_.barrier();  // a common clock origin for every rank's events
    trace::enable();
    trace::set_active(false);  // the loop turns it on for the traced steps
  }
  const dist::MemoryBreakdown have = largest_memory();  // a collective: every rank
  if (lead_) print_setup(have);
}

// The merged config, the collective timeout, and the lock on --save-dir.
void TrainingRun::configure() {
  tc_ = examples::make_config(a_, given_, world_, saved_config_.is_null() ? nullptr : &saved_config_, setup_.from.dir);
  a_.batch = *tc_.train_batch_size;
  micro_ = *tc_.train_micro_batch_size_per_gpu;
  check_attention_memory(a_, micro_);
  gas_ = static_cast<int>(*tc_.gradient_accumulation_steps);
  // Collective timeout: the flag, else $ZERO_COLLECTIVE_TIMEOUT_S (the communicator's default), else
  // the config key, else 300 s.
  if (given_.has("--collective-timeout"))
    comm_.set_timeout(*tc_.collective_timeout_s);
  else if (tc_.collective_timeout_s && std::getenv("ZERO_COLLECTIVE_TIMEOUT_S") == nullptr)
    comm_.set_timeout(*tc_.collective_timeout_s);
  // One writer per save directory (Note [One writer] in distributed/run/checkpoint.cpp): rank 0 takes the
  // lock before any work, and every rank stops with its message if it cannot.
  if (a_.save_dir.empty()) return;
  std::string error;
  if (lead_) {
    try {
      save_lock_.emplace(a_.save_dir, fmt::format("{}", fmt::join(setup_.argv, " ")));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (comm_.all_reduce_max(error.empty() ? 0.0 : 1.0) > 0.0)
    throw Error(lead_ ? error : fmt::format("rank 0 could not lock --save-dir '{}'", a_.save_dir));
  if (save_lock_ && !save_lock_->warning().empty()) fmt::print(stderr, "{}\n", save_lock_->warning());
}

// A checkpoint to resume: found, verified (files, checksums) and matched before any work.
void TrainingRun::open_resume() {
  if (a_.resume.empty()) return;
  const auto t_verify = Clock::now();
  resume_ = dist::open_checkpoint(setup_.from.dir, &comm_);
  ZERO_CHECK(resume_->state == setup_.from.state, "checkpoint '{}' changed between reading its settings and loading "
             "it: it was rewritten while this job started; is another job saving there?", resume_->dir);
  verify_seconds_ = std::chrono::duration<double>(Clock::now() - t_verify).count();
  const auto vocab = dist::state_value<std::vector<unsigned char>>(resume_->state, "vocab", resume_->dir);
  ZERO_CHECK(vocab == data_->itos,
             "checkpoint '{}' was trained on a different character set: {} characters there, {} in '{}'",
             resume_->dir, vocab.size(), data_->itos.size(), a_.data);
  const auto step = dist::state_value<std::int64_t>(resume_->state, "step", resume_->dir);
  // What restore() reads after loading, checked now: a wrong type fails before any work.
  const auto rng = dist::state_value<nlohmann::json>(resume_->state, "rng", resume_->dir);
  for (const char* key : {"init_and_dropout", "batches", "sampling"})
    (void)dist::state_value<std::string>(rng, key, resume_->dir);
  for (const char* key : {"world_size", "zero_stage"}) (void)dist::state_value<int>(resume_->state, key, resume_->dir);
  (void)dist::state_value<std::string>(resume_->state, "dtype", resume_->dir);
  ZERO_CHECK(step <= a_.steps, "checkpoint '{}' is at step {}, beyond --steps {}", resume_->dir, step, a_.steps);
  ZERO_CHECK(a_.trace.empty() || examples::trace_range(a_).second > step, "--trace-steps {}: this run resumes after "
             "step {}, past them", a_.trace_steps, step);
}

// The model's shape, the threads, the warnings, and the model itself (initialised, or loaded weights).
void TrainingRun::build_model() {
  cfg_.vocab_size = data_->vocab_size();
  cfg_.block_size = a_.block;
  cfg_.n_layer = a_.n_layer;
  cfg_.n_head = a_.n_head;
  cfg_.n_embd = a_.n_embd;
  cfg_.dropout = a_.dropout;
  examples::copy_model_options(a_.variant, cfg_);
  cfg_.validate();
  // 0 = share this machine's cores among the ranks (mpirun starts them all on one node here).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  a_.threads > 0 ? cpu::set_num_threads(a_.threads) : cpu::set_adaptive_threads(std::max(1, cores / world_));
  if (lead_) {
    for (const auto& w : tc_.warnings) fmt::print(stderr, "{}\n", w);
    for (const auto& w : setup_.from.warnings) fmt::print(stderr, "{}\n", w);
    if (!saved_config_.is_null())
      for (const auto& w : examples::config_warnings(tc_, saved_config_, given_, setup_.from.dir))
        fmt::print(stderr, "{}\n", w);
  }
  model_.emplace(cfg_, init_gen_);
  model_->set_recompute(autograd::parse_recompute(tc_.activation_checkpointing.recompute_granularity));
  if (resume_) dist::check_parameters(*resume_, model_->named_parameters());
  num_params_ = model_->num_parameters();
  if (!a_.init_from.empty()) {
    dist::load_weights(a_.init_from, model_->named_parameters(), a_.allow_non_finite_weights);
    if (lead_) fmt::print("init-from: {} parameters of a {}-layer model from {}\n", num_params_, a_.n_layer, a_.init_from);
  }
  model_->to(device_);  // before the optimizer builds its flat buffers (on the same device)
}

void TrainingRun::build_optimizer() {
  zo_ = tc_.zero_options();
  optimizer_ = examples::resolve_optimizer(a_, given_, tc_);
  zo_.adam = optimizer_->adam;
  zo_.weight_decay = optimizer_->weight_decay;
  opt_.emplace(model_->named_parameters(), std::shared_ptr<dist::Communicator>(&comm_, [](auto*) {}), zo_);
  // Stage 3 has just freed the fp32 model it was built from and the full flat buffer (8Ψ bytes): give
  // them back to the system rather than keep them cached for blocks of other sizes.
  if (zo_.stage == 3) empty_cpu_cache();
  make_activation_meter();
}

// The activation meter (examples/activation_meter.h) over this device's allocator. At stage 3 the
// parameters a forward or a re-run gathers, and for a 16-bit model their f32 compute copies, are not
// activations: the meter leaves them out.
void TrainingRun::make_activation_meter() {
  std::function<std::size_t()> in_use = [] { return cpu_allocator_stats().in_use; };
#ifdef ZERO_HAS_CUDA
  if (device_ == Device::cuda) in_use = [] { return cuda::allocator_stats().in_use; };
#endif
  std::function<std::size_t()> gathered;
  if (const dist::PartitionedParameters* p = opt_->partitioned()) {
    // The compute copies as they are, not assumed: a re-run that gathers a unit makes them inside it.
    const std::size_t per_element = dtype_size(zo_.dtype);
    gathered = [p, per_element] {
      return static_cast<std::size_t>(p->live_elements()) * per_element + p->live_compute_copy_bytes();
    };
  }
  meter_.emplace(std::move(in_use), std::move(gathered));  // also this thread's recompute probe
}

// A resumed run's optimizer state, generators and step.
void TrainingRun::restore() {
  if (!resume_) return;
  const auto t_load = Clock::now();
  const dist::LoadResult loaded = dist::load_checkpoint(*resume_, *opt_, comm_);
  if (lead_ && !loaded.warning.empty()) fmt::print(stderr, "{}\n", loaded.warning);
  const std::string& dir = resume_->dir;
  const auto rng = dist::state_value<nlohmann::json>(resume_->state, "rng", dir);
  dist::set_generator_state(init_gen_, dist::state_value<std::string>(rng, "init_and_dropout", dir));
  dist::set_generator_state(data_gen_, dist::state_value<std::string>(rng, "batches", dir));
  dist::set_generator_state(sample_gen_, dist::state_value<std::string>(rng, "sampling", dir));
  first_step_ = dist::state_value<std::int64_t>(resume_->state, "step", dir);
  const double load_seconds = std::chrono::duration<double>(Clock::now() - t_load).count();
  if (lead_)
    fmt::print("resumed from {} at step {} (saved by {} rank(s), stage {}, {}) in {:.1f} ms (verify {:.1f} + load "
               "{:.1f})\n", dir, first_step_, dist::state_value<int>(resume_->state, "world_size", dir),
               dist::state_value<int>(resume_->state, "zero_stage", dir),
               dist::state_value<std::string>(resume_->state, "dtype", dir),
               1000.0 * (verify_seconds_ + load_seconds), 1000.0 * verify_seconds_, 1000.0 * load_seconds);
}

// The per-step log (rank 0): JSON lines; a resumed run continues the file after its step.
void TrainingRun::open_log() {
  if (a_.log_file.empty() || !lead_) return;
  if (resume_)
    truncate_log(a_.log_file, first_step_);
  else
    std::ofstream(a_.log_file, std::ios::trunc);
  log_.open(a_.log_file, std::ios::app);
  ZERO_CHECK(log_.good(), "cannot write --log-file '{}'", a_.log_file);
}

void TrainingRun::log_line(const nlohmann::json& j) {
  if (!log_.is_open()) return;
  log_ << j.dump() << "\n";  // nlohmann writes the shortest text that reads back to the same double
  log_.flush();
  ZERO_CHECK(log_.good(), "--log-file '{}': writing failed ({})", a_.log_file, std::strerror(errno));
}

// The run's shape: data, model, ranks and batch, device, ZeRO layout, memory.
// What the rank holding the most holds of each part, over all ranks (a collective). Ranks differ only
// where their partitions do, with Muon's uneven ones (Note [Whole-matrix partitions]); "per rank" in the
// output means this.
dist::MemoryBreakdown TrainingRun::largest_memory() const {
  dist::MemoryBreakdown m = opt_->memory();
  for (double* part : {&m.params, &m.grads, &m.optimizer_states, &m.buckets, &m.recovery, &m.gathered, &m.residual})
    *part = comm_.all_reduce_max(*part);
  return m;
}

void TrainingRun::print_setup(const dist::MemoryBreakdown& have) const {
  fmt::print("train_gpt: {} ({} train / {} val tokens, vocab {})\n", a_.data, data_->train.size(), data_->val.size(),
             cfg_.vocab_size);
  fmt::print("model: {} layers, {} heads, {} channels, block {}: {} parameters; {} step{}, {} thread{}/rank\n",
             cfg_.n_layer, cfg_.n_head, cfg_.n_embd, cfg_.block_size, num_params_, a_.steps, a_.steps == 1 ? "" : "s",
             cpu::num_threads(), cpu::num_threads() == 1 ? "" : "s");
  fmt::print("data parallel: {} rank(s) x micro-batch {} x {} accumulation step(s) = global batch {}\n", world_,
             micro_, gas_, a_.batch);
  fmt::print("device: {}{}\n", device_name(device_),
             matmul_note(device_, matmul_precision(device_, zo_.dtype, a_.tf32)));
  print_zero_setup(have);
  std::fflush(stdout);
}

// The ZeRO lines of the setup: stage, buckets, wire, flat layout, model states (measured and formula).
void TrainingRun::print_zero_setup(const dist::MemoryBreakdown& have) const {
  const auto& layout = opt_->layout();
  const dist::ZeroOptions& used = opt_->options();  // bucket sizes resolved
  const auto buckets = layout.make_buckets(used.reduce_bucket_size).size();
  fmt::print("zero: stage {}, {} ({}), reduce_scatter {}, overlap_comm {}, overlap_param_gather {}, {} bucket(s) "
             "of <= {} elements{}, reductions in {} on the wire{}\n",
             zo_.stage, dtype_name(zo_.dtype), comm_.backend_name(), zo_.reduce_scatter, zo_.overlap_comm,
             zo_.overlap_param_gather, buckets, used.reduce_bucket_size,
             tc_.zero_optimization.reduce_bucket_size ? "" : " (automatic)",
             comm_.quantized_gradients() > 0 ? fmt::format("int8 (blocks of {})", comm_.quantized_gradients())
                                             : std::string(dtype_name(comm_.reduce_in_fp32() ? DType::f32 : zo_.dtype)),
             comm_.quantized_gradients() > 0 || comm_.accumulates_in_fp32(zo_.dtype)
                 ? fmt::format(" (all-to-all, summed in fp32{})",
                               zo_.quantized_gradients_error_feedback ? ", error feedback" : "")
                 : "");
  if (zo_.stage == 2 && tc_.zero_optimization.reduce_bucket_size && buckets == 1)
    fmt::print(stderr,
               "warning: reduce_bucket_size {} covers the whole model ({} elements): stage 2 then holds a full-size "
               "gradient bucket (no memory saved over stage 1) and cannot overlap reduction with backward; leave "
               "it unset for the automatic size ({})\n",
               used.reduce_bucket_size, layout.padded_numel(), dist::default_bucket_size(layout.numel()));
  fmt::print("flat layout: {} parameters + {} padding = {} elements; partition {} elements per rank\n",
             layout.numel(), layout.padding(), layout.padded_numel(), examples::partition_sizes(layout));
  if (zo_.muon) {
    const auto owners = examples::muon_owners(opt_->plan());
    const examples::MuonShare share = examples::muon_share(opt_->plan());
    const auto busiest = std::max_element(share.flops.begin(), share.flops.end());
    fmt::print("optimizer: Muon for {} hidden matrices (Newton–Schulz {:.1f} MFLOP/step on rank {}, the most, "
               "imbalance {:.3f}), AdamW for the other {} parameters; {}\n",
               owners.size(), *busiest / 1e6, busiest - share.flops.begin(), examples::MuonShare::imbalance(share.flops),
               layout.params().size() - owners.size(),
               zo_.stage == 0 ? std::string("every matrix stepped whole by every rank (stage 0)")
                              : fmt::format("each matrix in one partition, the largest {:.3f}x the mean",
                                            static_cast<double>(layout.largest_partition_size() * world_) /
                                                static_cast<double>(layout.padded_numel())));
  }
  const auto want = dist::expected_memory(zo_.stage, zo_.dtype, static_cast<double>(num_params_), world_);
  fmt::print("model states per rank (measured | ZeRO formula): params {} | {}, grads {} | {}, optimizer {} | {}, "
             "total {} | {}\n",
             mib(have.params), mib(want.params), mib(have.grads), mib(want.grads), mib(have.optimizer_states),
             mib(want.optimizer_states), mib(have.model_states()), mib(want.model_states()));
  if (zo_.stage == 3)
    fmt::print("stage 3: {} gather units, each all-gathered before its forward and its backward and freed after; "
               "gathered parameters alive at once at most {} (stage3_max_live_parameters {} elements), prefetch "
               "{} elements\n",
               opt_->plan().units.size(), mib(opt_->plan().memory().gathered), used.stage3_max_live_parameters,
               used.stage3_prefetch_bucket_size);
}

std::optional<int> TrainingRun::train() {
  steps_run_ = a_.steps - first_step_;  // in this process
  warmup_steps_ = std::max<std::int64_t>(0, std::min<std::int64_t>(5, steps_run_ - 1));
  run_start_ = Clock::now();  // the ETA extrapolates wall time, evaluations included
  for (std::int64_t step = first_step_; step < a_.steps; ++step) {
    const StepResult r = train_step(step);
    if (step - first_step_ >= warmup_steps_) train_seconds_ += r.seconds;
    window_seconds_ += r.seconds;
    ++window_steps_;
    const bool last = step + 1 == a_.steps;
    if (!a_.log_file.empty()) {
      const double mean_loss = comm_.all_reduce_sum(r.loss_sum) / (gas_ * world_);
      log_line({{"step", step + 1}, {"loss", mean_loss}, {"lr", r.lr}, {"grad_norm", opt_->last_grad_norm()},
                {"loss_scale", opt_->loss_scale()}, {"skipped", !r.applied}, {"ms", 1000.0 * r.seconds},
                {"tokens_per_s", static_cast<double>(a_.batch * a_.block) / r.seconds}});
    }
    if ((step + 1) % a_.log_every == 0 || last) log_progress(step, r);
    if (a_.eval_every > 0 && (step + 1) % a_.eval_every == 0) {
      evaluate_and_log(step + 1);
      evaluated_last_ = last;
    }
    // After the periodic evaluation (which the data stream of an uninterrupted run also went through)
    // and before the final one (which it did not), so a resumed run draws the same batches.
    if (!a_.save_dir.empty() && ((a_.save_every > 0 && (step + 1) % a_.save_every == 0) || last)) save(step + 1);
    if (const examples::StopDecision stop = examples::agree_to_stop(comm_); stop.stop) return stop_run(stop, step + 1);
  }
  return std::nullopt;
}

// One optimizer step: GAS micro-batches forward and backward, then the step.
TrainingRun::StepResult TrainingRun::train_step(std::int64_t step) {
  backend(device_).synchronize();  // the clock measures finished work
  if (!a_.trace.empty()) trace::set_active(step + 1 >= trace_first_ && step + 1 <= trace_last_);
  std::optional<trace::Span> step_span;
  step_span.emplace("step", "step");
  step_span->arg("step", step + 1);
  const auto t0 = Clock::now();
  StepResult r{optim::lr_at(step, optimizer_->schedule), 0.0, false, 0.0};
  opt_->set_lr(r.lr);
  // Global batch rows [(i·world + rank)·micro, +micro) are this rank's micro-step i.
  auto [x_host, y_host] = examples::TextData::batch(data_->train, a_.batch, a_.block, data_gen_);
  const Tensor x = x_host.to(device_), y = y_host.to(device_);
  const dist::PartitionedParameters* stage3 = opt_->partitioned();
  const std::int64_t gathers_before = stage3 != nullptr ? stage3->gathers() : 0;
  // The first step makes the persistent caches (compute copies): activations are measured after it.
  meter_->set_counting(step > first_step_ || a_.steps == first_step_ + 1);
  for (int i = 0; i < gas_; ++i) {
    const std::int64_t first = (static_cast<std::int64_t>(i) * world_ + rank_) * micro_;
    Tensor loss;
    {
      trace::Span span("forward", "forward");
      meter_->begin_forward();
      loss = model_->loss(x.narrow(0, first, micro_), y.narrow(0, first, micro_));
      meter_->end_forward();
    }
    opt_->backward(loss);
    r.loss_sum += loss.item();
  }
  try {
    r.applied = opt_->step();
  } catch (const optim::MinLossScaleError& e) {
    // Every rank saw the same overflow (Note [Stopping at the minimum scale] in optim/loss_scaler.cpp).
    throw Error(fmt::format("step {}: {} ({} of {} steps skipped; --min-scale-skip-limit 0 keeps skipping)", step + 1,
                            e.what(), opt_->skipped_steps(), opt_->steps() + opt_->skipped_steps()));
  } catch (const dist::NonfiniteSkipLimitError& e) {
    // Every rank saw the same non-finite norm (Note [Non-finite gradients] in distributed/zero/zero_optimizer.cpp).
    throw Error(fmt::format("{} ({} of {} steps skipped; --nonfinite-skip-limit 0 keeps skipping)", e.what(),
                            opt_->skipped_steps(), opt_->steps() + opt_->skipped_steps()));
  }
  backend(device_).synchronize();
  step_span.reset();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (stage3 != nullptr) stage3_gathers_ += stage3->gathers() - gathers_before;
  return r;
}

// The progress line every --log-every steps and at the last one.
void TrainingRun::log_progress(std::int64_t step, const StepResult& r) {
  const bool last = step + 1 == a_.steps;
  train_loss_ = static_cast<float>(comm_.all_reduce_sum(r.loss_sum) / (gas_ * world_));
  const std::int64_t n = window_steps_;
  if (lead_) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - run_start_).count();
    const double per_step = elapsed / static_cast<double>(step + 1 - first_step_);
    fmt::print("step {:5d}/{} | loss {:.4f} | lr {:.2e} | {:.1f} ms/step | {:.0f} tokens/s{}{}\n", step + 1,
               a_.steps, train_loss_, r.lr, 1000.0 * window_seconds_ / n, n * a_.batch * a_.block / window_seconds_,
               last ? "" : " | ETA " + eta(per_step * static_cast<double>(a_.steps - step - 1)),
               opt_->skipped_steps() > 0 ? fmt::format(" | loss scale {:g}, {} skipped", opt_->loss_scale(),
                                                       opt_->skipped_steps())
                                         : "");
    std::fflush(stdout);
  }
  window_seconds_ = 0.0;
  window_steps_ = 0;
}

// The validation loss after step `step`, logged and printed.
void TrainingRun::evaluate_and_log(std::int64_t step) {
  model_->eval();
  val_loss_ = evaluate_counted();
  model_->train();
  log_line({{"step", step}, {"val_loss", val_loss_}});
  if (lead_) {
    fmt::print("step {:5d}/{} | val loss {:.4f}\n", step, a_.steps, val_loss_);
    std::fflush(stdout);
  }
}

// Evaluation moves no gradient, but at stage 3 its forwards gather the parameters: counted apart.
float TrainingRun::evaluate_counted() {
  const dist::Ledger before = comm_.ledger();
  const float loss = evaluate(*model_, data_->val, a_, data_gen_, comm_);
  move_since(comm_.ledger(), before, eval_traffic_);
  return loss;
}

// The newest complete checkpoint in --save-dir, for messages ("none" if there is none).
std::string TrainingRun::newest_checkpoint() const {
  try {
    return dist::resolve_checkpoint(a_.save_dir);
  } catch (const std::exception&) {
    return "none";
  }
}

// A checkpoint of step `done` in --save-dir, with the run's settings and generators.
dist::SaveResult TrainingRun::save(std::int64_t done) {
  nlohmann::json extra = examples::settings_json(a_, tc_, cfg_.to_json());
  extra["vocab"] = data_->itos;
  extra["lr_schedule"]["next_step"] = done;
  extra["rng"] = {{"init_and_dropout", dist::generator_state(init_gen_)},
                  {"batches", dist::generator_state(data_gen_)},
                  {"sampling", dist::generator_state(sample_gen_)}};
  dist::SaveResult r;
  try {
    r = dist::save_checkpoint(a_.save_dir, done, *opt_, comm_, extra, static_cast<int>(a_.keep),
                              [] { return examples::stop_requests() >= 2; }, &written_);
  } catch (const dist::CollectiveTimeout&) {
    throw;  // the job's own failures: fail_job names the ranks that did not arrive, or stays quiet for
  } catch (const dist::PeerGone&) {  // a peer that failed first and reports its own error
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("--save-dir '{}': the checkpoint of step {} failed: {}; the newest checkpoint is still {}",
                            a_.save_dir, done, e.what(), newest_checkpoint()));
  }
  if (!r.cancelled) {
    saved_step_ = done;
    written_.push_back(dist::checkpoint_name(done));
  }
  if (lead_) {
    if (r.cancelled)
      fmt::print("checkpoint: step {} abandoned (a second stop request); the newest is {}\n", done, newest_checkpoint());
    else
      fmt::print("checkpoint: {} ({} bytes) in {:.1f} ms\n", r.dir, r.bytes, 1000.0 * r.seconds);
    std::fflush(stdout);
  }
  return r;
}

// Note [Preemption] (examples/preemption.cpp): after step `done`, every rank agreed to stop.
int TrainingRun::stop_run(const examples::StopDecision& d, std::int64_t done) {
  std::string what;
  if (a_.save_dir.empty()) {
    what = "nothing saved (no --save-dir)";
  } else if (d.abandon_save) {
    what = fmt::format("no checkpoint saved (a second stop request); the newest is {}", newest_checkpoint());
  } else if (saved_step_ == done) {
    what = fmt::format("checkpoint {} (saved at this step)", newest_checkpoint());
  } else {
    const dist::SaveResult r = save(done);
    what = r.cancelled ? fmt::format("the checkpoint of step {} was abandoned (a second stop request); the newest is {}",
                                     done, newest_checkpoint())
                       : fmt::format("saved {}", r.dir);
  }
  if (lead_) {
    const std::string newest = a_.save_dir.empty() ? "none" : newest_checkpoint();
    fmt::print("stopped by {} after step {}/{}: {}{}\n", examples::signal_name(d.signal), done, a_.steps, what,
               newest == "none" ? std::string()
                                : "; resume with: " + examples::resume_command(setup_.argv, a_.save_dir, world_));
    std::fflush(stdout);
  }
  return 128 + d.signal;
}

void TrainingRun::finish_at_end() {
  // The final checkpoint must still exist in --save-dir (it may have come from elsewhere).
  if (!a_.save_dir.empty() &&
      std::filesystem::weakly_canonical(resume_->dir) !=
          std::filesystem::weakly_canonical(std::filesystem::path(a_.save_dir) / dist::checkpoint_name(a_.steps)))
    save(a_.steps);
  if (lead_) fmt::print("nothing to do: the checkpoint is already at step {} of {}\n", first_step_, a_.steps);
}

void TrainingRun::finish() {
  if (!evaluated_last_) evaluate_and_log(a_.steps);
  // The trace: every rank's events into one file, and how much communication compute hid.
  if (!a_.trace.empty()) {
    trace::set_active(false);
    const std::vector<trace::Event> events = trace::take();
    overlap_ = dist::overlap_summary(events);
    overlap_.comm_us = comm_.all_reduce_sum(overlap_.comm_us) / world_;  // mean over ranks
    overlap_.exposed_us = comm_.all_reduce_sum(overlap_.exposed_us) / world_;
    dist::write_trace(a_.trace, comm_, events);
    trace::disable();
  }
}

TrainingRun::Summary TrainingRun::summarize() const {
  Summary s{};
  const std::int64_t timed_steps = std::max<std::int64_t>(1, steps_run_ - warmup_steps_);
  s.tokens_per_s = train_seconds_ > 0 ? timed_steps * a_.batch * a_.block / train_seconds_ : 0.0;
  s.ms_per_step = 1000.0 * train_seconds_ / timed_steps;
  // Achieved model FLOP/s per rank (PaLM appendix B: 6 Psi per token plus attention, nn::flops_per_token)
  // and MFU against one device's peak: tokens_per_s counts the global batch, which world_ ranks share.
  s.tflops = s.tokens_per_s / world_ * nn::flops_per_token(cfg_, num_params_) / 1e12;
  s.precision = matmul_precision(device_, zo_.dtype, a_.tf32);
  s.peak = peak_flops(device_, s.precision);
  s.mfu = s.peak > 0.0 ? s.tflops * 1e12 / s.peak : 0.0;
  // Traffic per optimizer step from this rank's ledger, beside the ZeRO paper's formula.
  const dist::Ledger& ledger = comm_.ledger();
  s.steps = static_cast<double>(std::max<std::int64_t>(1, steps_run_));
  s.traffic = ledger.to_json();
  for (auto& [k, v] : s.traffic.items()) v = v.get<double>() / s.steps;
  // The layout's padded Ψ (with the gaps of Muon's layout, if any) for this scheme's formula; the baseline
  // is a stage-0 run's, whose layout has no gaps, so any gaps show as the ratio above 1.
  const dist::FlatLayout& layout = opt_->layout();
  const double psi_bytes = static_cast<double>(layout.padded_numel()) * dtype_size(zo_.dtype);
  const double gapless_bytes = static_cast<double>((layout.numel() + layout.alignment() - 1) / layout.alignment() *
                                                   layout.alignment()) * dtype_size(zo_.dtype);
  const double ring = world_ > 1 ? static_cast<double>(world_ - 1) / world_ : 0.0;
  s.baseline = 2.0 * ring * gapless_bytes;  // stage 0: one all-reduce of every gradient
  s.per_step = ledger.total() / s.steps;
  s.comm_ms_per_step = 1000.0 * ledger.total_seconds() / s.steps;  // communication thread busy
  s.comm_cpu_ms_per_step = 1000.0 * ledger.cpu_seconds / s.steps;  // ... and the CPU it used
  // int8 gradients, and Muon's layout (stage 3's unit gathers carry only the gaps inside each unit): the
  // plan's own count of the bytes; otherwise the paper's formula.
  s.expected = zo_.quantized_gradients_block > 0 || zo_.muon ? opt_->plan().traffic().total()
                                                             : expected_traffic_copies(zo_, gas_) * ring * psi_bytes;
  s.mem = largest_memory();
  s.rss = peak_rss_bytes();
  return s;
}

// The summary lines (rank 0): loss and throughput, traffic, communication time, memory, compute, trace.
void TrainingRun::print_summary(const Summary& s) const {
  const dist::Ledger& ledger = comm_.ledger();
  fmt::print("done: train loss {:.4f}, val loss {:.4f}, {:.0f} tokens/s ({} rank(s)), {:.2f} ms/step\n", train_loss_,
             val_loss_, s.tokens_per_s, world_, s.ms_per_step);
  if (world_ > 1)
    fmt::print("traffic per step per rank: all_reduce {:.0f}, reduce_scatter {:.0f}, all_gather {:.0f} bytes; "
               "total {:.0f} = {:.3f}x the stage-0 baseline 2(n-1)/n*Psi ({:.0f}); formula for this scheme {:.0f}\n",
               s.traffic["all_reduce"].get<double>(), s.traffic["reduce_scatter"].get<double>(),
               s.traffic["all_gather"].get<double>(), s.per_step, s.per_step / s.baseline, s.baseline, s.expected);
  if (world_ > 1 && eval_traffic_.total() > 0)
    fmt::print("evaluation: its forwards gathered {:.0f} bytes of parameters per rank in all (not in the traffic "
               "per step)\n",
               eval_traffic_.total());
  if (world_ > 1 && !comm_.times_collectives())
    fmt::print("communication time per step: not measured (the {} backend does not time its collectives)\n",
               comm_.backend_name());
  else if (world_ > 1)
    fmt::print("communication time per step: {:.2f} ms (reduce_scatter {:.2f}, all_reduce {:.2f}, all_gather {:.2f}; "
               "the communication thread's busy time, overlapped or not; it used {:.2f} ms of CPU)\n",
               s.comm_ms_per_step, 1000.0 * ledger.seconds[int(dist::Collective::reduce_scatter)] / s.steps,
               1000.0 * ledger.seconds[int(dist::Collective::all_reduce)] / s.steps,
               1000.0 * ledger.seconds[int(dist::Collective::all_gather)] / s.steps, s.comm_cpu_ms_per_step);
  fmt::print("memory per rank: model states {}, activations {} (held for backward {} + recompute {}), buckets "
             "{}{}{}, peak RSS {}\n", mib(s.mem.model_states()), mib(static_cast<double>(meter_->activations())),
             mib(static_cast<double>(meter_->held())), mib(static_cast<double>(meter_->recompute_working_set())),
             mib(s.mem.buckets),
             zo_.stage == 3 ? fmt::format(", gathered parameters at most {} at once (bound {})", mib(s.mem.gathered),
                                          mib(opt_->plan().memory().gathered))
                            : "",
             s.mem.residual > 0 ? fmt::format(", error-feedback residual {}", mib(s.mem.residual)) : "",
             mib(static_cast<double>(s.rss)));
  if (zo_.stage == 3)
    fmt::print("stage 3: {:.1f} unit all-gathers per step (training steps; evaluation apart)\n",
               static_cast<double>(stage3_gathers_) / s.steps);
  if (s.peak > 0.0)
    fmt::print("compute: {:.2f} TFLOP/s per rank, MFU {:.1f}% of {:.0f} TFLOP/s ({} {} peak)\n", s.tflops,
               100.0 * s.mfu, s.peak / 1e12, device_name(device_), matmul_precision_name(s.precision));
  if (!a_.trace.empty()) {
    const std::int64_t traced =
        std::max<std::int64_t>(1, trace_last_ - std::max<std::int64_t>(trace_first_, first_step_ + 1) + 1);
    fmt::print("trace: {} (steps {}-{}): communication {:.2f} ms/step per rank, {:.0f}% of it hidden behind "
               "compute\n",
               a_.trace, std::max<std::int64_t>(trace_first_, first_step_ + 1), trace_last_,
               overlap_.comm_us / 1000.0 / traced, 100.0 * overlap_.hidden_fraction());
  }
  if (zo_.dtype == DType::f16)
    fmt::print("fp16: final loss scale {:g}, {} skipped step(s) (a skipped step has no all-gather)\n",
               opt_->loss_scale(), opt_->skipped_steps());
}

void TrainingRun::report() {
  const Summary s = summarize();
  if (lead_) print_summary(s);
  // Stage 3: every rank gathers the whole model, so rank 0 can sample alone.
  if (a_.sample > 0) opt_->gather_parameters();
  if (a_.sample > 0 && lead_) {
    model_->eval();
    const std::string text = examples::sample(*model_, data_->itos, examples::default_context(data_->itos), a_.sample,
                                              1.0f, 0, sample_gen_);
    fmt::print("---- sample ----\n{}\n----------------\n", text);
  }
  if (!a_.metrics.empty() && lead_) write_metrics(s);
}

// --metrics: a JSON summary, written to a temporary name and renamed, so a crash never leaves a partial file.
void TrainingRun::write_metrics(const Summary& s) const {
  const bool timed = comm_.times_collectives();  // else the communication times are null: not measured
  nlohmann::json m = {{"params", num_params_},
                      {"steps", a_.steps},
                      {"batch", a_.batch},
                      {"micro_batch", micro_},
                      {"gradient_accumulation_steps", gas_},
                      {"block", a_.block},
                      {"threads", cpu::num_threads()},
                      {"world_size", world_},
                      {"zero_stage", zo_.stage},
                      {"dtype", std::string(dtype_name(zo_.dtype))},
                      {"tokens_per_s", s.tokens_per_s},
                      {"device", std::string(device_name(device_))},
                      {"tf32", a_.tf32},
                      {"matmul_precision", std::string(matmul_precision_name(s.precision))},
                      {"tflops", s.tflops},
                      {"peak_flops", s.peak > 0.0 ? nlohmann::json(s.peak) : nlohmann::json()},
                      {"mfu", s.peak > 0.0 ? nlohmann::json(s.mfu) : nlohmann::json()},
                      {"ms_per_step", s.ms_per_step},
                      {"train_loss", train_loss_},
                      {"val_loss", val_loss_},
                      {"flops_per_token", nn::flops_per_token(cfg_, num_params_)},
                      {"comm_bytes_per_step", s.traffic},
                      {"comm_ms_per_step", timed ? nlohmann::json(s.comm_ms_per_step) : nlohmann::json()},
                      {"comm_cpu_ms_per_step", timed ? nlohmann::json(s.comm_cpu_ms_per_step) : nlohmann::json()},
                      {"memory_bytes",
                       {{"params", s.mem.params},
                        {"grads", s.mem.grads},
                        {"optimizer_states", s.mem.optimizer_states},
                        {"buckets", s.mem.buckets},
                        {"gathered", s.mem.gathered},
                        {"activations", meter_->activations()},
                        {"activations_held", meter_->held()},
                        {"activations_recompute", meter_->recompute_working_set()},
                        {"peak_rss", s.rss},
                        {"allocator_peak", allocator_peak_bytes(device_)}}},
                      {"stage3_all_gathers_per_step",
                       zo_.stage == 3 ? nlohmann::json(static_cast<double>(stage3_gathers_) / s.steps) : nlohmann::json()},
                      {"loss_scale", opt_->loss_scale()},
                      {"skipped_steps", opt_->skipped_steps()},
                      {"config", tc_.to_json()}};
  const std::string tmp = a_.metrics + ".tmp";
  std::ofstream(tmp) << m.dump(2) << "\n";
  std::filesystem::rename(tmp, a_.metrics);
  fmt::print("metrics: {}\n", std::filesystem::absolute(a_.metrics).string());
}

int run(const Setup& setup, dist::Communicator& comm) {
  TrainingRun training(setup, comm);
  if (training.at_end()) {
    training.finish_at_end();
    return 0;
  }
  if (const std::optional<int> stopped = training.train()) return *stopped;
  training.finish();
  training.report();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  examples::Args a;
  CLI::App app{"Train a character-level GPT on a text file (zero.cpp); run under mpirun for data parallelism"};
  examples::add_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help
    // Every rank parses the same arguments; under mpirun fail_job agrees on one rank to say so.
    if (dist::launcher_size() <= 1) {
      std::cerr << "error: " << e.what() << " (see --help)\n";
      return 2;
    }
    dist::fail_job(Error(std::string(e.what()) + " (see --help)"), false, 2);
  }
#ifndef NDEBUG
  a.verbose = true;  // Debug builds always say where an error was raised
#endif
  Setup setup;
  setup.given = examples::given_flags(app);
  setup.argv.assign(argv, argv + argc);
  try {
    // Before MPI starts: every rank finds the same problem, rank 0 reports it.
    examples::apply_step_cap(a);
    // Under mpirun rank 0 alone picks the checkpoint a directory names (Note [One resolution]).
    std::string chosen;
    if (const std::string path = examples::checkpoint_path(a); !path.empty() && dist::launcher_size() > 1) {
      try {
        chosen = dist::resolve_checkpoint(path, *dist::mpi_world());
      } catch (const Error& e) {  // named by the flag, as take_checkpoint_settings does
        throw Error(fmt::format("{}: {}", a.resume.empty() ? "--init-from" : "--resume", e.what()), e.location());
      }
    }
    setup.from = examples::take_checkpoint_settings(a, setup.given, chosen);
    examples::apply_step_cap(a);  // on what the checkpoint set too
    if (a.data.empty()) {
      a.data = "data/tinyshakespeare.txt";
      ZERO_CHECK(std::filesystem::exists(a.data), "no --data given and {} not found: give --data PATH, or run "
                 "scripts/train.sh, which downloads Tiny Shakespeare", a.data);
    }
    examples::validate(a);
    setup.args = a;
    examples::install_stop_handlers();
    auto world = dist::mpi_world();
    const std::shared_ptr<dist::Communicator> comm = make_communicator(a, world);
    return run(setup, *comm);
  } catch (const std::bad_alloc&) {
    dist::fail_job(Error(out_of_memory_message()), a.verbose);
  } catch (const std::exception& e) {
    // One line for the whole job, exit code 1; never leaves the other ranks waiting.
    dist::fail_job(e, a.verbose);
  }
}
