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
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "core/cpu/kernels.h"
#include "distributed/config.h"
#include "distributed/mpi_communicator.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#include "distributed/nccl_communicator.h"
#endif
#include "distributed/zero_optimizer.h"
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
  // Distributed / mixed precision (override the --config file).
  std::string config;
  int zero_stage = 0;
  std::string dtype = "fp32";
  int grad_accum = 1;
  double reduce_bucket_size = 0;  // a double so 5e8 is accepted, as in the JSON config
  bool overlap_comm = false;
  // Device and communicator.
  std::string device = "cpu";  // cpu | cuda
  std::string comm = "auto";   // auto | mpi | nccl | host-staged
  bool tf32 = false;
};

// Which flags were given explicitly (they override the --config file).
struct Given {
  bool batch, clip, zero_stage, dtype, grad_accum, reduce_bucket_size, overlap_comm;
};

Device device_of(const Args& a) { return a.device == "cuda" ? Device::cuda : Device::cpu; }

// Waits for the device's queued work (no-op on cpu): timings then measure the work, not its issue.
void synchronize(Device device) {
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) cuda::synchronize();
#endif
  (void)device;
}

// Dense peak FLOP/s of the device for `dtype` (0 when unknown: cpu). NVIDIA H100 datasheet, SXM (the
// H200 has the same compute): bf16/fp16 tensor cores 989 TFLOP/s, TF32 495, plain fp32 67 (without
// sparsity). Used as the MFU denominator, as the PaLM paper's appendix does with the A100's peak.
double peak_flops(Device device, DType dtype, bool tf32) {
  if (device != Device::cuda) return 0.0;
  if (dtype == DType::f16 || dtype == DType::bf16) return 989e12;
  return tf32 ? 495e12 : 67e12;
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
  if (comm == "auto") comm = dist::nccl_usable(world->rank(), world->world_size()) ? "nccl" : "host-staged";
  if (comm == "nccl") return std::make_shared<dist::NcclCommunicator>(world);
  return dist::make_host_staged(world);
#else
  (void)world;
  throw Error("--device cuda: this build has no CUDA (configure with -DZERO_CUDA=ON on a machine with the toolkit)");
#endif
}

// Finds the default corpus: data/tinyshakespeare.txt relative to the working directory.
std::string default_data_path() { return "data/tinyshakespeare.txt"; }

void validate(const Args& a) {
  ZERO_CHECK(a.steps > 0, "--steps must be positive, got {}", a.steps);
  ZERO_CHECK(a.batch > 0, "--batch must be positive, got {}", a.batch);
  ZERO_CHECK(a.block > 0, "--block must be positive, got {}", a.block);
  ZERO_CHECK(a.warmup >= 0, "--warmup must be >= 0, got {}", a.warmup);
  ZERO_CHECK(a.eval_every >= 0, "--eval-every must be >= 0, got {}", a.eval_every);
  ZERO_CHECK(a.eval_iters > 0, "--eval-iters must be positive, got {}", a.eval_iters);
  ZERO_CHECK(a.log_every > 0, "--log-every must be positive, got {}", a.log_every);
  ZERO_CHECK(a.sample >= 0, "--sample must be >= 0, got {}", a.sample);
  ZERO_CHECK(a.threads >= 0, "--threads must be >= 0 (0 = all cores), got {}", a.threads);
  ZERO_CHECK(a.lr > 0 && a.min_lr >= 0 && a.min_lr <= a.lr, "--lr must be positive and --min-lr in [0, lr], got {} and {}",
             a.lr, a.min_lr);
  ZERO_CHECK(a.weight_decay >= 0, "--weight-decay must be >= 0, got {}", a.weight_decay);
  ZERO_CHECK(a.dropout >= 0 && a.dropout < 1, "--dropout must be in [0, 1), got {}", a.dropout);
  ZERO_CHECK(a.grad_accum >= 1, "--grad-accum must be >= 1, got {}", a.grad_accum);
  ZERO_CHECK(a.reduce_bucket_size >= 0 && std::floor(a.reduce_bucket_size) == a.reduce_bucket_size,
             "--reduce-bucket-size must be a positive whole number of elements, got {}", a.reduce_bucket_size);
  ZERO_CHECK(a.zero_stage >= 0 && a.zero_stage <= 2, "--zero-stage must be 0, 1 or 2 (stage 3 is not supported), got {}",
             a.zero_stage);
  if (!a.metrics.empty()) {
    const auto path = std::filesystem::absolute(a.metrics);
    ZERO_CHECK(!std::filesystem::is_directory(path), "--metrics '{}' is a directory; give a file path", a.metrics);
    ZERO_CHECK(std::filesystem::is_directory(path.parent_path()), "--metrics: '{}' is not an existing directory",
               path.parent_path().string());
  }
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

// Samples `n` characters after a newline, feeding back the last block_size tokens (temperature 1).
std::string generate(const nn::GPT& model, const examples::TextData& data, std::int64_t n, Generator& gen) {
  autograd::NoGradGuard no_grad;
  std::vector<std::int64_t> context{0};
  for (std::size_t i = 0; i < data.itos.size(); ++i)
    if (data.itos[i] == '\n') context[0] = static_cast<std::int64_t>(i);
  std::string out;
  const std::int64_t V = data.vocab_size(), T_max = model.config().block_size;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto T = std::min<std::int64_t>(static_cast<std::int64_t>(context.size()), T_max);
    std::vector<std::int64_t> window(context.end() - T, context.end());
    Tensor logits = model.forward(Tensor::from_indices(window, {1, T}).to(model.wte->weight.device()));
    const std::vector<float> probs = softmax(logits.narrow(1, T - 1, 1).reshape({V})).to_vector();
    const float r = gen.uniform();
    float acc = 0.0f;
    std::int64_t next = V - 1;
    for (std::int64_t v = 0; v < V; ++v) {
      acc += probs[static_cast<std::size_t>(v)];
      if (r < acc) {
        next = v;
        break;
      }
    }
    context.push_back(next);
    out.push_back(static_cast<char>(data.itos[next]));
  }
  return out;
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

int run(Args a, const Given& given, dist::Communicator& comm) {
  validate(a);
  const int rank = comm.rank(), world = comm.world_size();
  const bool lead = rank == 0;
  const dist::TrainingConfig tc = make_config(a, given, world);
  a.batch = *tc.train_batch_size;
  const std::int64_t micro = *tc.train_micro_batch_size_per_gpu;
  check_attention_memory(a, micro);
  const int gas = static_cast<int>(*tc.gradient_accumulation_steps);
  const examples::TextData data = examples::TextData::load(a.data, a.block);
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
  const std::int64_t num_params = model.num_parameters();
  const Device device = device_of(a);
  model.to(device);  // before the optimizer builds its flat buffers (on the same device)

  dist::ZeroOptions zo;
  zo.stage = tc.zero_optimization.stage;
  zo.dtype = tc.model_dtype();
  zo.reduce_bucket_size = tc.zero_optimization.reduce_bucket_size;
  zo.allgather_bucket_size = tc.zero_optimization.allgather_bucket_size;
  zo.reduce_scatter = tc.zero_optimization.reduce_scatter;
  zo.overlap_comm = tc.zero_optimization.overlap_comm;
  zo.contiguous_gradients = tc.zero_optimization.contiguous_gradients;
  zo.gradient_accumulation_steps = gas;
  zo.gradient_clipping = static_cast<float>(tc.gradient_clipping);
  zo.fp16 = tc.loss_scaler_config();
  zo.adam = optim::AdamWOptions{a.lr, a.beta1, a.beta2, 1e-8f};
  zo.weight_decay = a.weight_decay;
  dist::ZeroOptimizer opt(model.named_parameters(), std::shared_ptr<dist::Communicator>(&comm, [](auto*) {}), zo);
  comm.ledger().reset();  // count training traffic only (not the initial broadcast of the weights)

  if (lead) {
    fmt::print("train_gpt: {} ({} train / {} val tokens, vocab {})\n", a.data, data.train.size(), data.val.size(),
               cfg.vocab_size);
    fmt::print("model: {} layers, {} heads, {} channels, block {}: {} parameters; {} steps, {} threads/rank\n",
               cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, num_params, a.steps, cpu::num_threads());
    fmt::print("data parallel: {} rank(s) x micro-batch {} x {} accumulation step(s) = global batch {}\n", world,
               micro, gas, a.batch);
    const auto& layout = opt.layout();
    const auto buckets = layout.make_buckets(zo.reduce_bucket_size).size();
    fmt::print("device: {}{}\n", device_name(device), device == Device::cuda && a.tf32 ? " (TF32 matmuls)" : "");
    fmt::print("zero: stage {}, {} ({}), reduce_scatter {}, overlap_comm {}, {} bucket(s) of <= {} elements\n",
               zo.stage, dtype_name(zo.dtype), comm.backend_name(), zo.reduce_scatter, zo.overlap_comm, buckets,
               zo.reduce_bucket_size);
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
  const std::int64_t warmup_steps = std::min<std::int64_t>(5, a.steps - 1);  // excluded from throughput
  double train_seconds = 0.0, window_seconds = 0.0;
  float train_loss = NAN, val_loss = NAN;
  for (std::int64_t step = 0; step < a.steps; ++step) {
    synchronize(device);  // the clock measures finished work
    const auto t0 = Clock::now();
    const float lr = optim::lr_at(step, schedule);
    opt.set_lr(lr);
    // Global batch rows [(i·world + rank)·micro, +micro) are this rank's micro-step i.
    auto [x_host, y_host] = examples::TextData::batch(data.train, a.batch, a.block, data_gen);
    const Tensor x = x_host.to(device), y = y_host.to(device);
    double loss_sum = 0.0;
    for (int i = 0; i < gas; ++i) {
      const std::int64_t first = (static_cast<std::int64_t>(i) * world + rank) * micro;
      Tensor loss = model.loss(x.narrow(0, first, micro), y.narrow(0, first, micro));
      opt.backward(loss);
      loss_sum += loss.item();
    }
    opt.step();
    synchronize(device);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step >= warmup_steps) train_seconds += dt;
    window_seconds += dt;
    const bool last = step + 1 == a.steps;
    if ((step + 1) % a.log_every == 0 || last) {
      train_loss = static_cast<float>(comm.all_reduce_sum(loss_sum) / (gas * world));
      const std::int64_t n = (step % a.log_every) + 1;
      if (lead) {
        fmt::print("step {:5d}/{} | loss {:.4f} | lr {:.2e} | {:.1f} ms/step | {:.0f} tokens/s{}\n", step + 1, a.steps,
                   train_loss, lr, 1000.0 * window_seconds / n, n * a.batch * a.block / window_seconds,
                   opt.skipped_steps() > 0 ? fmt::format(" | loss scale {:g}, {} skipped", opt.loss_scale(),
                                                         opt.skipped_steps())
                                           : "");
        std::fflush(stdout);
      }
      window_seconds = 0.0;
    }
    if ((a.eval_every > 0 && (step + 1) % a.eval_every == 0) || last) {
      model.eval();
      val_loss = evaluate(model, data.val, a, data_gen, comm);
      model.train();
      if (lead) {
        fmt::print("step {:5d}/{} | val loss {:.4f}\n", step + 1, a.steps, val_loss);
        std::fflush(stdout);
      }
    }
  }
  const std::int64_t timed_steps = a.steps - warmup_steps;
  const double tokens_per_s = timed_steps * a.batch * a.block / train_seconds;
  const double ms_per_step = 1000.0 * train_seconds / timed_steps;
  // Achieved model FLOP/s (PaLM appendix B: 6 Psi per token plus attention, nn::flops_per_token) and MFU.
  const double tflops = tokens_per_s * nn::flops_per_token(cfg, num_params) / 1e12;
  const double peak = peak_flops(device, zo.dtype, a.tf32);
  const double mfu = peak > 0.0 ? tflops * 1e12 / peak : 0.0;

  // Traffic per optimizer step from this rank's ledger, beside the ZeRO paper's formula.
  const dist::Ledger& ledger = comm.ledger();
  const double steps_d = static_cast<double>(a.steps);
  nlohmann::json traffic = ledger.to_json();
  for (auto& [k, v] : traffic.items()) v = v.get<double>() / steps_d;
  const double psi_bytes = static_cast<double>(opt.layout().padded_numel()) * dtype_size(zo.dtype);
  const double ring = world > 1 ? static_cast<double>(world - 1) / world : 0.0;
  const double baseline = 2.0 * ring * psi_bytes;  // stage 0: one all-reduce of every gradient
  const double per_step = ledger.total() / steps_d;
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
    fmt::print("memory per rank: model states {}, buckets {}, peak RSS {}\n", mib(mem.model_states()),
               mib(mem.buckets), mib(static_cast<double>(rss)));
    if (peak > 0.0)
      fmt::print("compute: {:.2f} TFLOP/s per rank, MFU {:.1f}% of {:.0f} TFLOP/s ({} peak)\n", tflops, 100.0 * mfu,
                 peak / 1e12, device_name(device));
    if (zo.dtype == DType::f16)
      fmt::print("fp16: final loss scale {:g}, {} skipped step(s) (a skipped step has no all-gather)\n",
                 opt.loss_scale(), opt.skipped_steps());
  }

  if (a.sample > 0 && lead) {
    model.eval();
    Generator sample_gen(a.seed + 3);
    fmt::print("---- sample ----\n{}\n----------------\n", generate(model, data, a.sample, sample_gen));
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
                        {"tflops", tflops},
                        {"peak_flops", peak > 0.0 ? nlohmann::json(peak) : nlohmann::json()},
                        {"mfu", peak > 0.0 ? nlohmann::json(mfu) : nlohmann::json()},
                        {"ms_per_step", ms_per_step},
                        {"train_loss", train_loss},
                        {"val_loss", val_loss},
                        {"flops_per_token", nn::flops_per_token(cfg, num_params)},
                        {"comm_bytes_per_step", traffic},
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
  app.add_option("--seed", a.seed, "random seed (init, batches, sampling)")->capture_default_str();
  app.add_option("--eval-every", a.eval_every, "validate every N steps (0 = only at the end)")->capture_default_str();
  app.add_option("--eval-iters", a.eval_iters, "validation batches per evaluation")->capture_default_str();
  app.add_option("--log-every", a.log_every, "progress line every N steps")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads per rank (0 = this machine's cores / ranks)")->capture_default_str();
  app.add_option("--metrics", a.metrics, "write a JSON summary to this path");
  app.add_option("--sample", a.sample, "characters to generate at the end (0 = none)")->capture_default_str();
  app.add_option("--config", a.config, "DeepSpeed-style JSON config (docs/config.md); flags below override it");
  auto* stage = app.add_option("--zero-stage", a.zero_stage, "ZeRO stage: 0 (data parallel), 1 or 2")
                    ->capture_default_str();
  auto* dtype = app.add_option("--dtype", a.dtype, "model dtype: fp32, fp16 (dynamic loss scaling) or bf16")
                    ->capture_default_str();
  auto* gas = app.add_option("--grad-accum", a.grad_accum, "gradient accumulation steps")->capture_default_str();
  auto* rbs = app.add_option("--reduce-bucket-size", a.reduce_bucket_size, "elements per gradient bucket");
  auto* overlap = app.add_flag("--overlap-comm", a.overlap_comm, "reduce buckets while backward continues");
  app.add_option("--device", a.device, "where to train: cpu or cuda (one GPU per rank, by local rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--comm", a.comm, "communicator: auto (cpu: mpi; cuda: nccl if every rank has its own GPU, else "
                 "host-staged), mpi, nccl, host-staged (MPI through pinned host memory)")
      ->check(CLI::IsMember({"auto", "mpi", "nccl", "host-staged"}))
      ->capture_default_str();
  app.add_flag("--tf32", a.tf32, "let fp32 matmuls use TF32 tensor cores (cuda)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const Given given{batch->count() > 0, clip->count() > 0,    stage->count() > 0,  dtype->count() > 0,
                    gas->count() > 0,   rbs->count() > 0,     overlap->count() > 0};
  if (a.data.empty()) {
    a.data = default_data_path();
    if (!std::filesystem::exists(a.data)) {
      std::cerr << "error: no --data given and " << a.data << " not found. Get Tiny Shakespeare with:\n"
                << "  mkdir -p data && curl -o data/tinyshakespeare.txt "
                   "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt\n";
      return 1;
    }
  }
  auto world = dist::mpi_world();
  try {
    const std::shared_ptr<dist::Communicator> comm = make_communicator(a, world);
    return run(a, given, *comm);
  } catch (const std::exception& e) {
    if (world->world_size() == 1) {
      std::cerr << "error: " << e.what() << "\n";
      return 1;
    }
    dist::abort_job(std::string("error: ") + e.what());  // ends every rank, never leaves them waiting
  }
}
