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

#include "core/backend.h"
#include "core/cpu/kernels.h"
#include "core/gemm_precision.h"
#include "core/storage.h"
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

int run(const Setup& setup, dist::Communicator& comm) {
  Args a = setup.args;
  const Given& given = setup.given;
  const int rank = comm.rank(), world = comm.world_size();
  const bool lead = rank == 0;
  const bool resuming = !a.resume.empty();
  const nlohmann::json* saved_config =
      resuming && setup.from.state.contains("config") ? &setup.from.state.at("config") : nullptr;
  const dist::TrainingConfig tc = examples::make_config(a, given, world, saved_config);
  a.batch = *tc.train_batch_size;
  const std::int64_t micro = *tc.train_micro_batch_size_per_gpu;
  check_attention_memory(a, micro);
  const int gas = static_cast<int>(*tc.gradient_accumulation_steps);
  // Collective timeout: the flag, else $ZERO_COLLECTIVE_TIMEOUT_S (the communicator's default), else
  // the config key, else 300 s.
  if (given.has("--collective-timeout"))
    comm.set_timeout(a.collective_timeout);
  else if (tc.collective_timeout_s && std::getenv("ZERO_COLLECTIVE_TIMEOUT_S") == nullptr)
    comm.set_timeout(*tc.collective_timeout_s);
  // One writer per save directory (Note [One writer] in distributed/checkpoint.cpp): rank 0 takes the
  // lock before any work, and every rank stops with its message if it cannot.
  std::optional<dist::SaveDirLock> save_lock;
  if (!a.save_dir.empty()) {
    std::string error;
    if (lead) {
      try {
        save_lock.emplace(a.save_dir, fmt::format("{}", fmt::join(setup.argv, " ")));
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (comm.all_reduce_max(error.empty() ? 0.0 : 1.0) > 0.0)
      throw Error(lead ? error : fmt::format("rank 0 could not lock --save-dir '{}'", a.save_dir));
    if (save_lock && !save_lock->warning().empty()) fmt::print(stderr, "{}\n", save_lock->warning());
  }
  const examples::TextData data = examples::TextData::load(a.data, a.block);
  // A checkpoint to resume: found, verified (files, checksums) and matched before any work.
  std::optional<dist::Checkpoint> resume;
  double verify_seconds = 0.0;
  if (resuming) {
    const auto t_verify = Clock::now();
    resume = dist::open_checkpoint(setup.from.dir, &comm);
    ZERO_CHECK(resume->state == setup.from.state, "checkpoint '{}' changed between reading its settings and loading "
               "it: it was rewritten while this job started; is another job saving there?", resume->dir);
    verify_seconds = std::chrono::duration<double>(Clock::now() - t_verify).count();
    const auto& vocab = resume->state.at("vocab");
    ZERO_CHECK(vocab.get<std::vector<unsigned char>>() == data.itos,
               "checkpoint '{}' was trained on a different character set: {} characters there, {} in '{}'",
               resume->dir, vocab.size(), data.itos.size(), a.data);
    const auto step = resume->state.at("step").get<std::int64_t>();
    ZERO_CHECK(step <= a.steps, "checkpoint '{}' is at step {}, beyond --steps {}", resume->dir, step, a.steps);
    ZERO_CHECK(a.trace.empty() || examples::trace_range(a).second > step, "--trace-steps {}: this run resumes after "
               "step {}, past them", a.trace_steps, step);
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
  a.threads > 0 ? cpu::set_num_threads(a.threads) : cpu::set_adaptive_threads(std::max(1, cores / world));
  if (lead) {
    for (const auto& w : tc.warnings) fmt::print(stderr, "{}\n", w);
    for (const auto& w : setup.from.warnings) fmt::print(stderr, "{}\n", w);
    if (saved_config)
      for (const auto& w : examples::config_warnings(tc, *saved_config, given, setup.from.dir)) fmt::print(stderr, "{}\n", w);
  }

  // The model keeps init_gen for its dropout masks after initialisation (every rank draws the same).
  Generator init_gen(a.seed), data_gen(a.seed + 1);
  nn::GPT model(cfg, init_gen);
  if (resume) dist::check_parameters(*resume, model.named_parameters());
  if (!a.init_from.empty()) dist::load_weights(a.init_from, model.named_parameters(), a.allow_non_finite_weights);
  Generator sample_gen = examples::sampling_generator(a.seed);
  const std::int64_t num_params = model.num_parameters();
  const Device device = device_of(a);
  model.to(device);  // before the optimizer builds its flat buffers (on the same device)

  dist::ZeroOptions zo = tc.zero_options();
  const examples::OptimizerSettings optimizer = examples::resolve_optimizer(a, given, tc);
  zo.adam = optimizer.adam;
  zo.weight_decay = optimizer.weight_decay;
  dist::ZeroOptimizer opt(model.named_parameters(), std::shared_ptr<dist::Communicator>(&comm, [](auto*) {}), zo);
  // Stage 3 has just freed the fp32 model it was built from and the full flat buffer (8Ψ bytes): give
  // them back to the system rather than keep them cached for blocks of other sizes.
  if (zo.stage == 3) empty_cpu_cache();
  std::int64_t first_step = 0;
  if (resume) {
    const auto t_load = Clock::now();
    const dist::LoadResult loaded = dist::load_checkpoint(*resume, opt, comm);
    if (lead && !loaded.warning.empty()) fmt::print(stderr, "{}\n", loaded.warning);
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
    ZERO_CHECK(log.good(), "--log-file '{}': writing failed ({})", a.log_file, std::strerror(errno));
  };
  // The newest complete checkpoint in --save-dir, for messages ("none" if there is none).
  auto newest_checkpoint = [&]() -> std::string {
    try {
      return dist::resolve_checkpoint(a.save_dir);
    } catch (const std::exception&) {
      return "none";
    }
  };
  std::int64_t saved_step = -1;  // the step of the last checkpoint this run committed
  std::vector<std::string> written;  // the checkpoints this job wrote: the only ones --keep may delete
  auto save = [&](std::int64_t done) {
    nlohmann::json extra = examples::settings_json(a, tc, cfg.to_json());
    extra["vocab"] = data.itos;
    extra["lr_schedule"]["next_step"] = done;
    extra["rng"] = {{"init_and_dropout", dist::generator_state(init_gen)},
                    {"batches", dist::generator_state(data_gen)},
                    {"sampling", dist::generator_state(sample_gen)}};
    dist::SaveResult r;
    try {
      r = dist::save_checkpoint(a.save_dir, done, opt, comm, extra, static_cast<int>(a.keep),
                                [] { return examples::stop_requests() >= 2; }, &written);
    } catch (const dist::CollectiveTimeout&) {
      throw;  // the job's own failures: fail_job names the ranks that did not arrive, or stays quiet for
    } catch (const dist::PeerGone&) {  // a peer that failed first and reports its own error
      throw;
    } catch (const std::exception& e) {
      throw Error(fmt::format("--save-dir '{}': the checkpoint of step {} failed: {}; the newest checkpoint is still {}",
                              a.save_dir, done, e.what(), newest_checkpoint()));
    }
    if (!r.cancelled) {
      saved_step = done;
      written.push_back(dist::checkpoint_name(done));
    }
    if (lead) {
      if (r.cancelled)
        fmt::print("checkpoint: step {} abandoned (a second stop request); the newest is {}\n", done, newest_checkpoint());
      else
        fmt::print("checkpoint: {} ({} bytes) in {:.1f} ms\n", r.dir, r.bytes, 1000.0 * r.seconds);
      std::fflush(stdout);
    }
    return r;
  };
  // Note [Preemption] (examples/preemption.cpp): after step `done`, every rank agreed to stop.
  auto stop_run = [&](const examples::StopDecision& d, std::int64_t done) {
    std::string what;
    if (a.save_dir.empty()) {
      what = "nothing saved (no --save-dir)";
    } else if (d.abandon_save) {
      what = fmt::format("no checkpoint saved (a second stop request); the newest is {}", newest_checkpoint());
    } else if (saved_step == done) {
      what = fmt::format("checkpoint {} (saved at this step)", newest_checkpoint());
    } else {
      const dist::SaveResult r = save(done);
      what = r.cancelled ? fmt::format("the checkpoint of step {} was abandoned (a second stop request); the newest is {}",
                                       done, newest_checkpoint())
                         : fmt::format("saved {}", r.dir);
    }
    if (lead) {
      const std::string newest = a.save_dir.empty() ? "none" : newest_checkpoint();
      fmt::print("stopped by {} after step {}/{}: {}{}\n", examples::signal_name(d.signal), done, a.steps, what,
                 newest == "none" ? std::string()
                                  : "; resume with: " + examples::resume_command(setup.argv, a.save_dir, world));
      std::fflush(stdout);
    }
    return 128 + d.signal;
  };
  const auto [trace_first, trace_last] = examples::trace_range(a);
  if (!a.trace.empty()) {
    comm.barrier();  // a common clock origin for every rank's events
    trace::enable();
    trace::set_active(false);  // the loop turns it on for the traced steps
  }

  if (lead) {
    fmt::print("train_gpt: {} ({} train / {} val tokens, vocab {})\n", a.data, data.train.size(), data.val.size(),
               cfg.vocab_size);
    fmt::print("model: {} layers, {} heads, {} channels, block {}: {} parameters; {} step{}, {} thread{}/rank\n",
               cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, num_params, a.steps, a.steps == 1 ? "" : "s",
               cpu::num_threads(), cpu::num_threads() == 1 ? "" : "s");
    fmt::print("data parallel: {} rank(s) x micro-batch {} x {} accumulation step(s) = global batch {}\n", world,
               micro, gas, a.batch);
    const auto& layout = opt.layout();
    const dist::ZeroOptions& used = opt.options();  // bucket sizes resolved
    const auto buckets = layout.make_buckets(used.reduce_bucket_size).size();
    fmt::print("device: {}{}\n", device_name(device), matmul_note(device, matmul_precision(device, zo.dtype, a.tf32)));
    fmt::print("zero: stage {}, {} ({}), reduce_scatter {}, overlap_comm {}, overlap_param_gather {}, {} bucket(s) "
               "of <= {} elements{}, reductions in {} on the wire{}\n",
               zo.stage, dtype_name(zo.dtype), comm.backend_name(), zo.reduce_scatter, zo.overlap_comm,
               zo.overlap_param_gather, buckets, used.reduce_bucket_size,
               tc.zero_optimization.reduce_bucket_size ? "" : " (automatic)",
               comm.quantized_gradients() > 0 ? fmt::format("int8 (blocks of {})", comm.quantized_gradients())
                                              : std::string(dtype_name(comm.reduce_in_fp32() ? DType::f32 : zo.dtype)),
               comm.quantized_gradients() > 0 || comm.accumulates_in_fp32(zo.dtype)
                   ? fmt::format(" (all-to-all, summed in fp32{})",
                                 zo.quantized_gradients_error_feedback ? ", error feedback" : "")
                   : "");
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
    if (zo.stage == 3)
      fmt::print("stage 3: {} gather units, each all-gathered before its forward and its backward and freed after; "
                 "gathered parameters alive at once at most {} (stage3_max_live_parameters {} elements), prefetch "
                 "{} elements\n",
                 opt.plan().units.size(), mib(opt.plan().memory().gathered), used.stage3_max_live_parameters,
                 used.stage3_prefetch_bucket_size);
    std::fflush(stdout);
  }

  // Evaluation moves no gradient, but at stage 3 its forwards gather the parameters: counted apart.
  dist::Ledger eval_traffic;
  auto evaluate_counted = [&] {
    const dist::Ledger before = comm.ledger();
    const float loss = evaluate(model, data.val, a, data_gen, comm);
    move_since(comm.ledger(), before, eval_traffic);
    return loss;
  };
  const optim::LrSchedule& schedule = optimizer.schedule;
  const std::int64_t steps_run = a.steps - first_step;  // in this process
  const std::int64_t warmup_steps = std::max<std::int64_t>(0, std::min<std::int64_t>(5, steps_run - 1));
  double train_seconds = 0.0, window_seconds = 0.0;
  std::int64_t window_steps = 0;  // steps since the last progress line
  float train_loss = NAN, val_loss = NAN;
  const auto run_start = Clock::now();  // the ETA extrapolates wall time, evaluations included
  bool evaluated_last = false;
  for (std::int64_t step = first_step; step < a.steps; ++step) {
    backend(device).synchronize();  // the clock measures finished work
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
    bool applied = false;
    try {
      applied = opt.step();
    } catch (const optim::MinLossScaleError& e) {
      // Every rank saw the same overflow (Note [Stopping at the minimum scale] in optim/loss_scaler.cpp).
      throw Error(fmt::format("step {}: {} ({} of {} steps skipped; --min-scale-skip-limit 0 keeps skipping)", step + 1,
                              e.what(), opt.skipped_steps(), opt.steps() + opt.skipped_steps()));
    } catch (const dist::NonfiniteSkipLimitError& e) {
      // Every rank saw the same non-finite norm (Note [Non-finite gradients] in distributed/zero_optimizer.cpp).
      throw Error(fmt::format("{} ({} of {} steps skipped; --nonfinite-skip-limit 0 keeps skipping)", e.what(),
                              opt.skipped_steps(), opt.steps() + opt.skipped_steps()));
    }
    backend(device).synchronize();
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
      val_loss = evaluate_counted();
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
    if (const examples::StopDecision stop = examples::agree_to_stop(comm); stop.stop) return stop_run(stop, step + 1);
  }
  // Resumed at the end: the final checkpoint must still exist in --save-dir (it may have come from elsewhere).
  if (steps_run == 0 && !a.save_dir.empty() &&
      std::filesystem::weakly_canonical(resume->dir) !=
          std::filesystem::weakly_canonical(std::filesystem::path(a.save_dir) / dist::checkpoint_name(a.steps)))
    save(a.steps);
  if (!evaluated_last) {
    model.eval();
    val_loss = evaluate_counted();
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
  // int8 gradients: the plan's count of the quantized reduce-scatter (values + block scales).
  const double expected = zo.quantized_gradients_block > 0 ? opt.plan().traffic().total()
                                                           : expected_traffic_copies(zo, gas) * ring * psi_bytes;
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
    if (world > 1 && eval_traffic.total() > 0)
      fmt::print("evaluation: its forwards gathered {:.0f} bytes of parameters per rank in all (not in the traffic "
                 "per step)\n",
                 eval_traffic.total());
    if (world > 1)
      fmt::print("communication time per step: {:.2f} ms (reduce_scatter {:.2f}, all_reduce {:.2f}, all_gather {:.2f}; "
                 "the communication thread's busy time, overlapped or not; it used {:.2f} ms of CPU)\n",
                 comm_ms_per_step, 1000.0 * ledger.seconds[int(dist::Collective::reduce_scatter)] / steps_d,
                 1000.0 * ledger.seconds[int(dist::Collective::all_reduce)] / steps_d,
                 1000.0 * ledger.seconds[int(dist::Collective::all_gather)] / steps_d, comm_cpu_ms_per_step);
    fmt::print("memory per rank: model states {}, buckets {}{}{}, peak RSS {}\n", mib(mem.model_states()),
               mib(mem.buckets),
               zo.stage == 3 ? fmt::format(", gathered parameters at most {} at once (bound {})", mib(mem.gathered),
                                           mib(opt.plan().memory().gathered))
                             : "",
               mem.residual > 0 ? fmt::format(", error-feedback residual {}", mib(mem.residual)) : "",
               mib(static_cast<double>(rss)));
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

  // Stage 3: every rank gathers the whole model, so rank 0 can sample alone.
  if (a.sample > 0) opt.gather_parameters();
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
                          {"gathered", mem.gathered},
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
    if (const std::string path = examples::checkpoint_path(a); !path.empty() && dist::launcher_size() > 1)
      chosen = dist::resolve_checkpoint(path, *dist::mpi_world());
    setup.from = examples::take_checkpoint_settings(a, setup.given, chosen);
    examples::apply_step_cap(a);  // on what the checkpoint set too
    if (a.data.empty()) {
      a.data = "data/tinyshakespeare.txt";
      ZERO_CHECK(std::filesystem::exists(a.data), "no --data given and {} not found: give --data PATH, or run "
                 "scripts/train.sh, which downloads Tiny Shakespeare", a.data);
    }
    examples::validate(a, setup.given);
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
