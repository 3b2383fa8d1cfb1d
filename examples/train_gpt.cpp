// train_gpt: trains a character-level GPT on a text file (Tiny Shakespeare by default) on the CPU,
// in one process or data-parallel under mpirun with ZeRO stage 0, 1 or 2.
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
// --resume PATH continues a run (any world size and ZeRO stage); --init-from FILE starts from the
// weights of a model.safetensors; --log-file PATH writes one JSON object per step.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "core/cpu/kernels.h"
#include "core/gemm_precision.h"
#include "core/trace.h"
#include "distributed/checkpoint.h"
#include "distributed/config.h"
#include "distributed/job_runtime.h"
#include "distributed/trace_file.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#include "distributed/nccl_communicator.h"
#endif
#include "distributed/zero_optimizer.h"
#include "examples/gpt_sampling.h"
#include "examples/text_data.h"
#include "nn/gpt.h"
#include "optim/lr_schedule.h"

namespace {

using namespace zero;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string data;
  std::int64_t steps = 2000, batch = 12, block = 64, n_layer = 4, n_head = 4, n_embd = 128;
  std::string norm = "layernorm";
  float dropout = 0.0f, lr = 1e-3f, min_lr = 1e-4f, weight_decay = 0.1f, clip = 1.0f, beta1 = 0.9f, beta2 = 0.99f;
  std::int64_t warmup = 100, eval_every = 500, eval_iters = 200, log_every = 100, sample = 500;
  std::uint64_t seed = 1337;
  int threads = 0;
  std::string metrics;
  std::string trace, trace_steps;  // Chrome trace file; steps A:B (1-based, inclusive) to record
  // Distributed / mixed precision (override the --config file).
  std::string config;
  int zero_stage = 0;
  std::string dtype = "fp32";
  int grad_accum = 1;
  double reduce_bucket_size = 0;  // a double so 5e8 is accepted, as in the JSON config
  bool overlap_comm = false;
  bool overlap_param_gather = false;
  std::string communication_data_type;  // "" = the config's (default: the model dtype)
  // Device and communicator.
  std::string device = "cpu";  // cpu | cuda
  std::string comm = "auto";   // auto | mpi | nccl | host-staged
  bool tf32 = false;
  // Checkpoints and the per-step log.
  std::string save_dir, resume, init_from, log_file;
  std::int64_t save_every = 0, keep = 0;
  // Reliability and error reports.
  double collective_timeout = 0;  // seconds; given or not (Given)
  std::string nonfinite_grads = "error";
  bool verbose = false;
};

// Which flags were given explicitly (they override the --config file).
struct Given {
  bool batch, clip, zero_stage, dtype, grad_accum, reduce_bucket_size, overlap_comm, collective_timeout,
      nonfinite_grads, overlap_param_gather, communication_data_type;
};

Device device_of(const Args& a) { return a.device == "cuda" ? Device::cuda : Device::cpu; }

// Waits for the device's queued work (no-op on cpu): timings then measure the work, not its issue.
void synchronize(Device device) {
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) cuda::synchronize();
#endif
  (void)device;
}

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

// The world's communicator for --comm on --device (Note [ZeRO on cuda] in distributed/zero_optimizer.cpp).
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

// Finds the default corpus: data/tinyshakespeare.txt relative to the working directory.
std::string default_data_path() { return "data/tinyshakespeare.txt"; }

// The inclusive 1-based step range of --trace-steps "A:B" (all steps when empty). Throws zero::Error
// naming the flag for anything else.
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
  return {first, std::min(last, a.steps)};
}

// An output path must not be a directory and its directory must exist (checked before any work).
void check_output_path(const std::string& path, const char* flag) {
  const auto p = std::filesystem::absolute(path);
  ZERO_CHECK(!std::filesystem::is_directory(p), "{} '{}' is a directory; give a file path", flag, path);
  ZERO_CHECK(std::filesystem::is_directory(p.parent_path()), "{}: '{}' is not an existing directory", flag,
             p.parent_path().string());
}

// Every flag by the rule of the config key it overrides (distributed/config.cpp), naming the flag.
void validate(const Args& a, const Given& given) {
  ZERO_CHECK(a.steps > 0, "--steps must be positive, got {}", a.steps);
  ZERO_CHECK(a.n_layer > 0, "--n-layer must be positive, got {}", a.n_layer);
  ZERO_CHECK(a.n_head > 0, "--n-head must be positive, got {}", a.n_head);
  ZERO_CHECK(a.n_embd > 0, "--n-embd must be positive, got {}", a.n_embd);
  ZERO_CHECK(a.batch > 0, "--batch must be positive, got {}", a.batch);
  ZERO_CHECK(a.block > 0, "--block must be positive, got {}", a.block);
  ZERO_CHECK(a.warmup >= 0, "--warmup must be >= 0, got {}", a.warmup);
  ZERO_CHECK(a.eval_every >= 0, "--eval-every must be >= 0, got {}", a.eval_every);
  ZERO_CHECK(a.eval_iters > 0, "--eval-iters must be positive, got {}", a.eval_iters);
  ZERO_CHECK(a.log_every > 0, "--log-every must be positive, got {}", a.log_every);
  ZERO_CHECK(a.sample >= 0, "--sample must be >= 0, got {}", a.sample);
  ZERO_CHECK(a.threads >= 0, "--threads must be >= 0 (0 = all cores), got {}", a.threads);
  ZERO_CHECK(std::isfinite(a.lr) && a.lr > 0, "--lr must be positive, got {}", a.lr);
  ZERO_CHECK(a.min_lr >= 0 && a.min_lr <= a.lr, "--min-lr must be in [0, --lr = {}], got {}", a.lr, a.min_lr);
  ZERO_CHECK(std::isfinite(a.weight_decay) && a.weight_decay >= 0, "--weight-decay must be >= 0, got {}",
             a.weight_decay);
  ZERO_CHECK(a.beta1 >= 0 && a.beta1 < 1, "--beta1 must be in [0, 1), got {}", a.beta1);
  ZERO_CHECK(a.beta2 >= 0 && a.beta2 < 1, "--beta2 must be in [0, 1), got {}", a.beta2);
  ZERO_CHECK(std::isfinite(a.clip) && a.clip >= 0, "--clip must be >= 0 (0 turns clipping off), got {}", a.clip);
  ZERO_CHECK(a.dtype == "fp32" || a.dtype == "fp16" || a.dtype == "bf16", "--dtype must be fp32, fp16 or bf16, got '{}'",
             a.dtype);
  if (given.collective_timeout) dist::check_collective_timeout(a.collective_timeout, "--collective-timeout");
  ZERO_CHECK(a.nonfinite_grads == "error" || a.nonfinite_grads == "skip",
             "--nonfinite-grads must be error or skip, got '{}'", a.nonfinite_grads);
  ZERO_CHECK(a.dropout >= 0 && a.dropout < 1, "--dropout must be in [0, 1), got {}", a.dropout);
  ZERO_CHECK(a.grad_accum >= 1, "--grad-accum must be >= 1, got {}", a.grad_accum);
  if (given.reduce_bucket_size)
    ZERO_CHECK(a.reduce_bucket_size > 0 && a.reduce_bucket_size <= 9.0e15 &&
                   std::floor(a.reduce_bucket_size) == a.reduce_bucket_size,
               "--reduce-bucket-size must be a whole number of elements > 0, got {}", a.reduce_bucket_size);
  ZERO_CHECK(a.zero_stage >= 0 && a.zero_stage <= 2, "--zero-stage must be 0, 1 or 2 (stage 3 is not supported), got {}",
             a.zero_stage);
  if (!a.metrics.empty()) check_output_path(a.metrics, "--metrics");
  if (!a.log_file.empty()) check_output_path(a.log_file, "--log-file");
  if (!a.trace.empty()) check_output_path(a.trace, "--trace");
  ZERO_CHECK(a.trace_steps.empty() || !a.trace.empty(), "--trace-steps needs --trace PATH");
  trace_range(a);
  ZERO_CHECK(a.save_every >= 0, "--save-every must be >= 0 (0 = only at the end), got {}", a.save_every);
  ZERO_CHECK(a.keep >= 0, "--keep must be >= 0 (0 = keep every checkpoint), got {}", a.keep);
  if (!a.save_dir.empty()) {
    ZERO_CHECK(!std::filesystem::exists(a.save_dir) || std::filesystem::is_directory(a.save_dir),
               "--save-dir '{}' exists and is not a directory", a.save_dir);
    std::error_code ec;
    std::filesystem::create_directories(a.save_dir, ec);  // every rank may try: it is idempotent
    ZERO_CHECK(std::filesystem::is_directory(a.save_dir) && ::access(a.save_dir.c_str(), W_OK) == 0,
               "--save-dir '{}' cannot be created or is not writable", a.save_dir);
  }
  ZERO_CHECK(a.resume.empty() || a.init_from.empty(), "--resume and --init-from exclude each other (--resume restores "
             "the weights and the optimizer; --init-from only the weights)");
  ZERO_CHECK(!a.save_every || !a.save_dir.empty(), "--save-every needs --save-dir");
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

// The DeepSpeed-style config: the --config file (or defaults) with the command-line overrides.
dist::TrainingConfig make_config(const Args& a, const Given& given, int world_size) {
  dist::TrainingConfig cfg = a.config.empty() ? dist::TrainingConfig::from_json(nlohmann::json::object())
                                              : dist::TrainingConfig::from_file(a.config);
  if (given.zero_stage) cfg.zero_optimization.stage = a.zero_stage;
  if (given.dtype) cfg.set_model_dtype(parse_float_dtype(a.dtype));
  if (given.reduce_bucket_size)
    cfg.zero_optimization.reduce_bucket_size = static_cast<std::int64_t>(a.reduce_bucket_size);
  if (given.overlap_comm) cfg.zero_optimization.overlap_comm = a.overlap_comm;
  if (given.overlap_param_gather) cfg.zero_optimization.overlap_param_gather = a.overlap_param_gather;
  if (given.communication_data_type) cfg.communication_data_type = a.communication_data_type;
  if (given.clip || a.config.empty()) cfg.gradient_clipping = a.clip;
  const bool file_has_batch = cfg.train_batch_size || cfg.train_micro_batch_size_per_gpu;
  if (given.batch || !file_has_batch) {
    const std::int64_t per_step = static_cast<std::int64_t>(world_size) * (given.grad_accum ? a.grad_accum : 1);
    ZERO_CHECK(a.batch % per_step == 0 && a.batch >= per_step,
               "--batch {} does not split into {} rank(s) x {} accumulation step(s) (it must be a positive multiple of {})",
               a.batch, world_size, per_step / world_size, per_step);
    cfg.train_batch_size = a.batch;
    cfg.train_micro_batch_size_per_gpu.reset();
    if (!cfg.gradient_accumulation_steps) cfg.gradient_accumulation_steps = 1;
  }
  if (given.grad_accum) {
    cfg.gradient_accumulation_steps = a.grad_accum;
    if (cfg.train_micro_batch_size_per_gpu && cfg.train_batch_size) cfg.train_micro_batch_size_per_gpu.reset();
  }
  if (given.nonfinite_grads) cfg.nonfinite_grads = a.nonfinite_grads;
  cfg.resolve_batch(world_size);
  cfg.validate();
  return cfg;
}

// Gradient + parameter traffic per optimizer step in parameter copies (before the (n-1)/n factor):
// stage 0 all-reduces once (2); stage 1 reduce-scatters once and all-gathers (1 + 1); stage 2 reduces
// every micro-step (GAS + 1); reduce_scatter=false all-reduces instead (2 per reduction).
double expected_traffic_copies(const dist::ZeroOptions& zo, int gas) {
  if (zo.stage == 0) return 2.0;
  const double reduce = zo.reduce_scatter ? 1.0 : 2.0;
  return (zo.stage == 2 ? gas : 1) * reduce + 1.0;
}

std::size_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::size_t>(usage.ru_maxrss) * 1024;  // ru_maxrss is in KiB on Linux
}

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

// A time left for progress lines: "42s", "3m07s", "1h02m".
std::string eta(double seconds) {
  const auto s = static_cast<std::int64_t>(std::max(0.0, seconds) + 0.5);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
}

int run(Args a, const Given& given, dist::Communicator& comm) {
  const int rank = comm.rank(), world = comm.world_size();
  const bool lead = rank == 0;
  const dist::TrainingConfig tc = make_config(a, given, world);
  a.batch = *tc.train_batch_size;
  const std::int64_t micro = *tc.train_micro_batch_size_per_gpu;
  check_attention_memory(a, micro);
  const int gas = static_cast<int>(*tc.gradient_accumulation_steps);
  // Collective timeout: the flag, else $ZERO_COLLECTIVE_TIMEOUT_S (the communicator's default), else
  // the config key, else 300 s.
  if (given.collective_timeout)
    comm.set_timeout(a.collective_timeout);
  else if (tc.collective_timeout_s && std::getenv("ZERO_COLLECTIVE_TIMEOUT_S") == nullptr)
    comm.set_timeout(*tc.collective_timeout_s);
  const examples::TextData data = examples::TextData::load(a.data, a.block);
  // A checkpoint to resume: found, verified (files, checksums) and matched before any work.
  std::optional<dist::Checkpoint> resume;
  double verify_seconds = 0.0;
  if (!a.resume.empty()) {
    const auto t_verify = Clock::now();
    resume = dist::open_checkpoint(dist::resolve_checkpoint(a.resume), &comm);
    verify_seconds = std::chrono::duration<double>(Clock::now() - t_verify).count();
    const auto& vocab = resume->state.at("vocab");
    ZERO_CHECK(vocab.get<std::vector<unsigned char>>() == data.itos,
               "checkpoint '{}' was trained on a different character set: {} characters there, {} in '{}'",
               resume->dir, vocab.size(), data.itos.size(), a.data);
    const auto step = resume->state.at("step").get<std::int64_t>();
    ZERO_CHECK(step <= a.steps, "checkpoint '{}' is at step {}, beyond --steps {}", resume->dir, step, a.steps);
  }
  nn::GPTConfig cfg;
  cfg.vocab_size = data.vocab_size();
  cfg.block_size = a.block;
  cfg.n_layer = a.n_layer;
  cfg.n_head = a.n_head;
  cfg.n_embd = a.n_embd;
  cfg.dropout = a.dropout;
  cfg.norm = a.norm;
  cfg.validate();
  // 0 = share this machine's cores among the ranks (mpirun starts them all on one node here).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::set_num_threads(a.threads > 0 ? a.threads : std::max(1, cores / world));
  if (lead)
    for (const auto& w : tc.warnings) fmt::print(stderr, "{}\n", w);

  // The model keeps init_gen for its dropout masks after initialisation (every rank draws the same).
  Generator init_gen(a.seed), data_gen(a.seed + 1);
  nn::GPT model(cfg, init_gen);
  if (resume) dist::check_parameters(*resume, model.named_parameters());
  if (!a.init_from.empty()) dist::load_weights(a.init_from, model.named_parameters());
  Generator sample_gen = examples::sampling_generator(a.seed);
  const std::int64_t num_params = model.num_parameters();
  const Device device = device_of(a);
  model.to(device);  // before the optimizer builds its flat buffers (on the same device)

  dist::ZeroOptions zo = tc.zero_options();
  zo.adam = optim::AdamWOptions{a.lr, a.beta1, a.beta2, 1e-8f};
  zo.weight_decay = a.weight_decay;
  dist::ZeroOptimizer opt(model.named_parameters(), std::shared_ptr<dist::Communicator>(&comm, [](auto*) {}), zo);
  std::int64_t first_step = 0;
  if (resume) {
    const auto t_load = Clock::now();
    dist::load_checkpoint(*resume, opt, comm);
    const auto& rng = resume->state.at("rng");
    dist::set_generator_state(init_gen, rng.at("init_and_dropout").get<std::string>());
    dist::set_generator_state(data_gen, rng.at("batches").get<std::string>());
    dist::set_generator_state(sample_gen, rng.at("sampling").get<std::string>());
    first_step = resume->state.at("step").get<std::int64_t>();
    const double load_seconds = std::chrono::duration<double>(Clock::now() - t_load).count();
    if (lead)
      fmt::print("resumed from {} at step {} (saved by {} rank(s), stage {}, {}) in {:.1f} ms (verify {:.1f} + load "
                 "{:.1f})\n", resume->dir, first_step, resume->state.at("world_size").get<int>(),
                 resume->state.at("zero_stage").get<int>(), resume->state.at("dtype").get<std::string>(),
                 1000.0 * (verify_seconds + load_seconds), 1000.0 * verify_seconds, 1000.0 * load_seconds);
  }
  comm.ledger().reset();  // count training traffic only (not the initial broadcast of the weights)
  // The per-step log (rank 0): JSON lines; a resumed run continues the file after its step.
  std::ofstream log;
  if (!a.log_file.empty() && lead) {
    if (resume)
      truncate_log(a.log_file, first_step);
    else
      std::ofstream(a.log_file, std::ios::trunc);
    log.open(a.log_file, std::ios::app);
    ZERO_CHECK(log.good(), "cannot write --log-file '{}'", a.log_file);
  }
  auto log_line = [&](const nlohmann::json& j) {
    if (!log.is_open()) return;
    log << j.dump() << "\n";  // nlohmann writes the shortest text that reads back to the same double
    log.flush();
  };
  auto save = [&](std::int64_t done) {
    const nlohmann::json extra = {
        {"config", tc.to_json()},
        {"model", examples::gpt_config_json(cfg)},
        {"vocab", data.itos},
        {"data", a.data},
        {"seed", a.seed},
        {"lr_schedule", {{"lr", a.lr}, {"min_lr", a.min_lr}, {"warmup", a.warmup}, {"steps", a.steps},
                         {"next_step", done}}},
        {"rng", {{"init_and_dropout", dist::generator_state(init_gen)},
                 {"batches", dist::generator_state(data_gen)},
                 {"sampling", dist::generator_state(sample_gen)}}}};
    const dist::SaveResult r = dist::save_checkpoint(a.save_dir, done, opt, comm, extra, static_cast<int>(a.keep));
    if (lead) {
      fmt::print("checkpoint: {} ({} bytes) in {:.1f} ms\n", r.dir, r.bytes, 1000.0 * r.seconds);
      std::fflush(stdout);
    }
  };
  const auto [trace_first, trace_last] = trace_range(a);
  if (!a.trace.empty()) {
    comm.barrier();  // a common clock origin for every rank's events
    trace::enable();
    trace::set_active(false);  // the loop turns it on for the traced steps
  }

  if (lead) {
    fmt::print("train_gpt: {} ({} train / {} val tokens, vocab {})\n", a.data, data.train.size(), data.val.size(),
               cfg.vocab_size);
    fmt::print("model: {} layers, {} heads, {} channels, block {}: {} parameters; {} steps, {} threads/rank\n",
               cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, num_params, a.steps, cpu::num_threads());
    fmt::print("data parallel: {} rank(s) x micro-batch {} x {} accumulation step(s) = global batch {}\n", world,
               micro, gas, a.batch);
    const auto& layout = opt.layout();
    const dist::ZeroOptions& used = opt.options();  // bucket sizes resolved
    const auto buckets = layout.make_buckets(used.reduce_bucket_size).size();
    fmt::print("device: {}{}\n", device_name(device), matmul_note(device, matmul_precision(device, zo.dtype, a.tf32)));
    fmt::print("zero: stage {}, {} ({}), reduce_scatter {}, overlap_comm {}, overlap_param_gather {}, {} bucket(s) "
               "of <= {} elements{}, reductions in {} on the wire\n",
               zo.stage, dtype_name(zo.dtype), comm.backend_name(), zo.reduce_scatter, zo.overlap_comm,
               zo.overlap_param_gather, buckets, used.reduce_bucket_size,
               tc.zero_optimization.reduce_bucket_size ? "" : " (automatic)",
               dtype_name(comm.reduce_in_fp32() ? DType::f32 : zo.dtype));
    if (zo.stage == 2 && tc.zero_optimization.reduce_bucket_size && buckets == 1)
      fmt::print(stderr,
                 "warning: reduce_bucket_size {} covers the whole model ({} elements): stage 2 then holds a full-size "
                 "gradient bucket (no memory saved over stage 1) and cannot overlap reduction with backward; leave "
                 "it unset for the automatic size ({})\n",
                 used.reduce_bucket_size, layout.padded_numel(), dist::default_bucket_size(layout.numel()));
    fmt::print("flat layout: {} parameters + {} padding = {} elements; partition {} elements per rank\n",
               layout.numel(), layout.padding(), layout.padded_numel(), layout.partition_size());
    const auto have = opt.memory();
    const auto want = dist::expected_memory(zo.stage, zo.dtype, static_cast<double>(num_params), world);
    fmt::print("model states per rank (measured | ZeRO formula): params {} | {}, grads {} | {}, optimizer {} | {}, "
               "total {} | {}\n",
               mib(have.params), mib(want.params), mib(have.grads), mib(want.grads), mib(have.optimizer_states),
               mib(want.optimizer_states), mib(have.model_states()), mib(want.model_states()));
    std::fflush(stdout);
  }

  const optim::LrSchedule schedule{a.lr, a.min_lr, a.warmup, a.steps};
  const std::int64_t steps_run = a.steps - first_step;  // in this process
  const std::int64_t warmup_steps = std::max<std::int64_t>(0, std::min<std::int64_t>(5, steps_run - 1));
  double train_seconds = 0.0, window_seconds = 0.0;
  std::int64_t window_steps = 0;  // steps since the last progress line
  float train_loss = NAN, val_loss = NAN;
  const auto run_start = Clock::now();  // the ETA extrapolates wall time, evaluations included
  bool evaluated_last = false;
  for (std::int64_t step = first_step; step < a.steps; ++step) {
    synchronize(device);  // the clock measures finished work
    if (!a.trace.empty()) trace::set_active(step + 1 >= trace_first && step + 1 <= trace_last);
    std::optional<trace::Span> step_span;
    step_span.emplace("step", "step");
    step_span->arg("step", step + 1);
    const auto t0 = Clock::now();
    const float lr = optim::lr_at(step, schedule);
    opt.set_lr(lr);
    // Global batch rows [(i·world + rank)·micro, +micro) are this rank's micro-step i.
    auto [x_host, y_host] = examples::TextData::batch(data.train, a.batch, a.block, data_gen);
    const Tensor x = x_host.to(device), y = y_host.to(device);
    double loss_sum = 0.0;
    for (int i = 0; i < gas; ++i) {
      const std::int64_t first = (static_cast<std::int64_t>(i) * world + rank) * micro;
      Tensor loss;
      {
        trace::Span span("forward", "forward");
        loss = model.loss(x.narrow(0, first, micro), y.narrow(0, first, micro));
      }
      opt.backward(loss);
      loss_sum += loss.item();
    }
    const bool applied = opt.step();
    synchronize(device);
    step_span.reset();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step - first_step >= warmup_steps) train_seconds += dt;
    window_seconds += dt;
    ++window_steps;
    const bool last = step + 1 == a.steps;
    if (!a.log_file.empty()) {
      const double mean_loss = comm.all_reduce_sum(loss_sum) / (gas * world);
      log_line({{"step", step + 1}, {"loss", mean_loss}, {"lr", lr}, {"grad_norm", opt.last_grad_norm()},
                {"loss_scale", opt.loss_scale()}, {"skipped", !applied}, {"ms", 1000.0 * dt},
                {"tokens_per_s", static_cast<double>(a.batch * a.block) / dt}});
    }
    if ((step + 1) % a.log_every == 0 || last) {
      train_loss = static_cast<float>(comm.all_reduce_sum(loss_sum) / (gas * world));
      const std::int64_t n = window_steps;
      if (lead) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
        const double per_step = elapsed / static_cast<double>(step + 1 - first_step);
        fmt::print("step {:5d}/{} | loss {:.4f} | lr {:.2e} | {:.1f} ms/step | {:.0f} tokens/s{}{}\n", step + 1,
                   a.steps, train_loss, lr, 1000.0 * window_seconds / n, n * a.batch * a.block / window_seconds,
                   last ? "" : " | ETA " + eta(per_step * static_cast<double>(a.steps - step - 1)),
                   opt.skipped_steps() > 0 ? fmt::format(" | loss scale {:g}, {} skipped", opt.loss_scale(),
                                                         opt.skipped_steps())
                                           : "");
        std::fflush(stdout);
      }
      window_seconds = 0.0;
      window_steps = 0;
    }
    if (a.eval_every > 0 && (step + 1) % a.eval_every == 0) {
      model.eval();
      val_loss = evaluate(model, data.val, a, data_gen, comm);
      model.train();
      evaluated_last = last;
      log_line({{"step", step + 1}, {"val_loss", val_loss}});
      if (lead) {
        fmt::print("step {:5d}/{} | val loss {:.4f}\n", step + 1, a.steps, val_loss);
        std::fflush(stdout);
      }
    }
    // After the periodic evaluation (which the data stream of an uninterrupted run also went through)
    // and before the final one (which it did not), so a resumed run draws the same batches.
    if (!a.save_dir.empty() && ((a.save_every > 0 && (step + 1) % a.save_every == 0) || last)) save(step + 1);
  }
  // Resumed at the end: the final checkpoint must still exist in --save-dir (it may have come from elsewhere).
  if (steps_run == 0 && !a.save_dir.empty() &&
      std::filesystem::weakly_canonical(resume->dir) !=
          std::filesystem::weakly_canonical(std::filesystem::path(a.save_dir) / dist::checkpoint_name(a.steps)))
    save(a.steps);
  if (!evaluated_last) {
    model.eval();
    val_loss = evaluate(model, data.val, a, data_gen, comm);
    model.train();
    log_line({{"step", a.steps}, {"val_loss", val_loss}});
    if (lead) {
      fmt::print("step {:5d}/{} | val loss {:.4f}\n", a.steps, a.steps, val_loss);
      std::fflush(stdout);
    }
  }
  // The trace: every rank's events into one file, and how much communication compute hid.
  dist::OverlapSummary overlap;
  if (!a.trace.empty()) {
    trace::set_active(false);
    const std::vector<trace::Event> events = trace::take();
    overlap = dist::overlap_summary(events);
    overlap.comm_us = comm.all_reduce_sum(overlap.comm_us) / world;  // mean over ranks
    overlap.exposed_us = comm.all_reduce_sum(overlap.exposed_us) / world;
    dist::write_trace(a.trace, comm, events);
    trace::disable();
  }
  const std::int64_t timed_steps = std::max<std::int64_t>(1, steps_run - warmup_steps);
  const double tokens_per_s = train_seconds > 0 ? timed_steps * a.batch * a.block / train_seconds : 0.0;
  const double ms_per_step = 1000.0 * train_seconds / timed_steps;
  // Achieved model FLOP/s (PaLM appendix B: 6 Psi per token plus attention, nn::flops_per_token) and MFU.
  const double tflops = tokens_per_s * nn::flops_per_token(cfg, num_params) / 1e12;
  const MatmulPrecision precision = matmul_precision(device, zo.dtype, a.tf32);
  const double peak = peak_flops(device, precision);
  const double mfu = peak > 0.0 ? tflops * 1e12 / peak : 0.0;

  // Traffic per optimizer step from this rank's ledger, beside the ZeRO paper's formula.
  const dist::Ledger& ledger = comm.ledger();
  const double steps_d = static_cast<double>(std::max<std::int64_t>(1, steps_run));
  nlohmann::json traffic = ledger.to_json();
  for (auto& [k, v] : traffic.items()) v = v.get<double>() / steps_d;
  const double psi_bytes = static_cast<double>(opt.layout().padded_numel()) * dtype_size(zo.dtype);
  const double ring = world > 1 ? static_cast<double>(world - 1) / world : 0.0;
  const double baseline = 2.0 * ring * psi_bytes;  // stage 0: one all-reduce of every gradient
  const double per_step = ledger.total() / steps_d;
  const double comm_ms_per_step = 1000.0 * ledger.total_seconds() / steps_d;  // communication thread busy
  const double comm_cpu_ms_per_step = 1000.0 * ledger.cpu_seconds / steps_d;   // ... and the CPU it used
  const double expected = expected_traffic_copies(zo, gas) * ring * psi_bytes;
  const auto mem = opt.memory();
  const std::size_t rss = peak_rss_bytes();
  if (lead) {
    fmt::print("done: train loss {:.4f}, val loss {:.4f}, {:.0f} tokens/s ({} rank(s)), {:.2f} ms/step\n", train_loss,
               val_loss, tokens_per_s, world, ms_per_step);
    if (world > 1)
      fmt::print("traffic per step per rank: all_reduce {:.0f}, reduce_scatter {:.0f}, all_gather {:.0f} bytes; "
                 "total {:.0f} = {:.3f}x the stage-0 baseline 2(n-1)/n*Psi ({:.0f}); formula for this scheme {:.0f}\n",
                 traffic["all_reduce"].get<double>(), traffic["reduce_scatter"].get<double>(),
                 traffic["all_gather"].get<double>(), per_step, per_step / baseline, baseline, expected);
    if (world > 1)
      fmt::print("communication time per step: {:.2f} ms (reduce_scatter {:.2f}, all_reduce {:.2f}, all_gather {:.2f}; "
                 "the communication thread's busy time, overlapped or not; it used {:.2f} ms of CPU)\n",
                 comm_ms_per_step, 1000.0 * ledger.seconds[int(dist::Collective::reduce_scatter)] / steps_d,
                 1000.0 * ledger.seconds[int(dist::Collective::all_reduce)] / steps_d,
                 1000.0 * ledger.seconds[int(dist::Collective::all_gather)] / steps_d, comm_cpu_ms_per_step);
    fmt::print("memory per rank: model states {}, buckets {}, peak RSS {}\n", mib(mem.model_states()),
               mib(mem.buckets), mib(static_cast<double>(rss)));
    if (peak > 0.0)
      fmt::print("compute: {:.2f} TFLOP/s per rank, MFU {:.1f}% of {:.0f} TFLOP/s ({} {} peak)\n", tflops,
                 100.0 * mfu, peak / 1e12, device_name(device), matmul_precision_name(precision));
    if (!a.trace.empty()) {
      const std::int64_t traced =
          std::max<std::int64_t>(1, trace_last - std::max<std::int64_t>(trace_first, first_step + 1) + 1);
      fmt::print("trace: {} (steps {}-{}): communication {:.2f} ms/step per rank, {:.0f}% of it hidden behind "
                 "compute\n",
                 a.trace, std::max<std::int64_t>(trace_first, first_step + 1), trace_last, overlap.comm_us / 1000.0 / traced, 100.0 * overlap.hidden_fraction());
    }
    if (zo.dtype == DType::f16)
      fmt::print("fp16: final loss scale {:g}, {} skipped step(s) (a skipped step has no all-gather)\n",
                 opt.loss_scale(), opt.skipped_steps());
  }

  if (a.sample > 0 && lead) {
    model.eval();
    const std::string text = examples::sample(model, data.itos, examples::default_context(data.itos), a.sample, 1.0f,
                                              0, sample_gen);
    fmt::print("---- sample ----\n{}\n----------------\n", text);
  }
  if (!a.metrics.empty() && lead) {
    nlohmann::json m = {{"params", num_params},
                        {"steps", a.steps},
                        {"batch", a.batch},
                        {"micro_batch", micro},
                        {"gradient_accumulation_steps", gas},
                        {"block", a.block},
                        {"threads", cpu::num_threads()},
                        {"world_size", world},
                        {"zero_stage", zo.stage},
                        {"dtype", std::string(dtype_name(zo.dtype))},
                        {"tokens_per_s", tokens_per_s},
                        {"device", std::string(device_name(device))},
                        {"tf32", a.tf32},
                        {"matmul_precision", std::string(matmul_precision_name(precision))},
                        {"tflops", tflops},
                        {"peak_flops", peak > 0.0 ? nlohmann::json(peak) : nlohmann::json()},
                        {"mfu", peak > 0.0 ? nlohmann::json(mfu) : nlohmann::json()},
                        {"ms_per_step", ms_per_step},
                        {"train_loss", train_loss},
                        {"val_loss", val_loss},
                        {"flops_per_token", nn::flops_per_token(cfg, num_params)},
                        {"comm_bytes_per_step", traffic},
                        {"comm_ms_per_step", comm_ms_per_step},
                        {"comm_cpu_ms_per_step", comm_cpu_ms_per_step},
                        {"memory_bytes",
                         {{"params", mem.params},
                          {"grads", mem.grads},
                          {"optimizer_states", mem.optimizer_states},
                          {"buckets", mem.buckets},
                          {"peak_rss", rss}}},
                        {"loss_scale", opt.loss_scale()},
                        {"skipped_steps", opt.skipped_steps()},
                        {"config", tc.to_json()}};
    // Written to a temporary name and renamed, so a crash never leaves a partial file.
    const std::string tmp = a.metrics + ".tmp";
    std::ofstream(tmp) << m.dump(2) << "\n";
    std::filesystem::rename(tmp, a.metrics);
    fmt::print("metrics: {}\n", std::filesystem::absolute(a.metrics).string());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Train a character-level GPT on a text file (zero.cpp); run under mpirun for data parallelism"};
  app.add_option("--data", a.data, "text file to train on (default: data/tinyshakespeare.txt)");
  app.add_option("--steps", a.steps, "optimizer steps")->capture_default_str();
  auto* batch = app.add_option("--batch", a.batch, "global batch: sequences per optimizer step over all ranks")
                    ->capture_default_str();
  app.add_option("--block", a.block, "sequence length (T)")->capture_default_str();
  app.add_option("--n-layer", a.n_layer, "transformer blocks (L)")->capture_default_str();
  app.add_option("--n-head", a.n_head, "attention heads (H)")->capture_default_str();
  app.add_option("--n-embd", a.n_embd, "channels (C)")->capture_default_str();
  app.add_option("--dropout", a.dropout, "dropout probability")->capture_default_str();
  app.add_option("--norm", a.norm, "normalisation layers: layernorm or rmsnorm")
      ->check(CLI::IsMember({"layernorm", "rmsnorm"}))
      ->capture_default_str();
  app.add_option("--lr", a.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", a.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  app.add_option("--warmup", a.warmup, "linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", a.weight_decay, "AdamW weight decay (matrices only)")->capture_default_str();
  app.add_option("--beta1", a.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", a.beta2, "AdamW beta2")->capture_default_str();
  auto* clip = app.add_option("--clip", a.clip, "max global gradient norm (0 = off)")->capture_default_str();
  app.add_option("--seed", a.seed, "random seed (init, batches, sampling)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--eval-every", a.eval_every, "validate every N steps (0 = only at the end)")->capture_default_str();
  app.add_option("--eval-iters", a.eval_iters, "validation batches per evaluation")->capture_default_str();
  app.add_option("--log-every", a.log_every, "progress line every N steps")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads per rank (0 = this machine's cores / ranks)")->capture_default_str();
  app.add_option("--metrics", a.metrics, "write a JSON summary to this path");
  app.add_option("--trace", a.trace, "write a Chrome trace (Perfetto, chrome://tracing) of every rank to this path");
  app.add_option("--trace-steps", a.trace_steps, "with --trace: record only steps A:B (from 1, inclusive)");
  app.add_option("--sample", a.sample, "characters to generate at the end (0 = none)")->capture_default_str();
  app.add_option("--config", a.config, "DeepSpeed-style JSON config (docs/config.md); flags below override it");
  auto* stage = app.add_option("--zero-stage", a.zero_stage, "ZeRO stage: 0 (data parallel), 1 or 2")
                    ->capture_default_str();
  auto* dtype = app.add_option("--dtype", a.dtype, "model dtype: fp32, fp16 (dynamic loss scaling) or bf16")
                    ->capture_default_str();
  auto* gas = app.add_option("--grad-accum", a.grad_accum, "gradient accumulation steps")->capture_default_str();
  auto* rbs = app.add_option("--reduce-bucket-size", a.reduce_bucket_size, "elements per gradient bucket");
  auto* overlap = app.add_flag("--overlap-comm", a.overlap_comm, "reduce buckets while backward continues");
  auto* overlap_gather = app.add_flag("--overlap-param-gather", a.overlap_param_gather,
                                      "all-gather the updated parameters while the next forward runs (stages 1, 2)");
  auto* comm_dtype = app.add_option("--communication-data-type", a.communication_data_type,
                                    "dtype gradient reductions travel in: fp32, fp16 or bf16 (default: the model "
                                    "dtype; fp32 is more accurate for a 16-bit model, at twice the bytes)")
                         ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--device", a.device, "where to train: cpu or cuda (one GPU per rank, by local rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--comm", a.comm, "communicator: auto (cpu: mpi; cuda: nccl if there are several ranks and each has "
                 "its own GPU, else host-staged), mpi, nccl, host-staged (MPI through pinned host memory)")
      ->check(CLI::IsMember({"auto", "mpi", "nccl", "host-staged"}))
      ->capture_default_str();
  app.add_flag("--tf32", a.tf32, "let fp32 matmuls use TF32 tensor cores (cuda)");
  app.add_option("--save-dir", a.save_dir, "write checkpoints to DIR/step_XXXXXXXX (always one at the end)");
  app.add_option("--save-every", a.save_every, "also checkpoint every N steps (0 = only at the end)")
      ->capture_default_str();
  app.add_option("--keep", a.keep, "keep only the K newest checkpoints (0 = all)")->capture_default_str();
  app.add_option("--resume", a.resume, "continue from a checkpoint directory, or from a save dir's newest one");
  app.add_option("--init-from", a.init_from, "start from the weights of this model.safetensors (fresh optimizer)");
  app.add_option("--log-file", a.log_file, "write every step's loss, lr, grad norm, ... as JSON lines");
  auto* timeout = app.add_option("--collective-timeout", a.collective_timeout,
                                 "seconds one collective may take before the job ends with a message naming it "
                                 "(default: $ZERO_COLLECTIVE_TIMEOUT_S, else the config's collective_timeout_s, "
                                 "else 300)");
  auto* nonfinite = app.add_option("--nonfinite-grads", a.nonfinite_grads,
                                   "fp32/bf16 step with an inf/NaN gradient: error (stop, naming the step) or skip")
                        ->capture_default_str();
  app.add_flag("--verbose", a.verbose, "add the C++ source location to error messages");
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
  const Given given{batch->count() > 0, clip->count() > 0,     stage->count() > 0,   dtype->count() > 0,
                    gas->count() > 0,   rbs->count() > 0,      overlap->count() > 0, timeout->count() > 0,
                    nonfinite->count() > 0, overlap_gather->count() > 0, comm_dtype->count() > 0};
#ifndef NDEBUG
  a.verbose = true;  // Debug builds always say where an error was raised
#endif
  if (a.data.empty()) {
    a.data = default_data_path();
    if (!std::filesystem::exists(a.data)) {
      const std::string message = "no --data given and " + a.data +
                                  " not found: give --data PATH, or run scripts/train.sh, which downloads Tiny "
                                  "Shakespeare";
      if (dist::launcher_size() > 1) dist::fail_job(Error(message));
      std::cerr << "error: " << message << "\n";
      return 1;
    }
  }
  try {
    validate(a, given);  // before MPI starts: every rank finds the same problem, rank 0 reports it
    auto world = dist::mpi_world();
    const std::shared_ptr<dist::Communicator> comm = make_communicator(a, world);
    return run(a, given, *comm);
  } catch (const std::exception& e) {
    // One line for the whole job, exit code 1; never leaves the other ranks waiting.
    dist::fail_job(e, a.verbose);
  }
}
