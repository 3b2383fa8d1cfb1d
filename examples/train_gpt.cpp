// train_gpt: trains a character-level GPT on a text file (Tiny Shakespeare by default) on the CPU.
//
//   build/bin/train_gpt --data data/tinyshakespeare.txt
//
// Defaults are nanoGPT's CPU recipe (4 layers, 4 heads, 128 channels, block 64, batch 12, 2000 steps,
// AdamW lr 1e-3 -> 1e-4 cosine after 100 warm-up steps). Prints a progress line every --log-every
// steps, validation loss every --eval-every steps and at the end, then a generated sample; --metrics
// writes a JSON summary. Bad flags or files stop with one line naming the problem, before any work.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "core/cpu/kernels.h"
#include "examples/text_data.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"

namespace {

using namespace zero;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string data;
  std::int64_t steps = 2000, batch = 12, block = 64, n_layer = 4, n_head = 4, n_embd = 128;
  float dropout = 0.0f, lr = 1e-3f, min_lr = 1e-4f, weight_decay = 0.1f, clip = 1.0f, beta1 = 0.9f, beta2 = 0.99f;
  std::int64_t warmup = 100, eval_every = 500, eval_iters = 200, log_every = 100, sample = 500;
  std::uint64_t seed = 1337;
  int threads = 0;
  std::string metrics;
};

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
  if (!a.metrics.empty()) {
    const auto dir = std::filesystem::absolute(a.metrics).parent_path();
    ZERO_CHECK(std::filesystem::is_directory(dir), "--metrics: directory '{}' does not exist", dir.string());
  }
}

float evaluate(const nn::GPT& model, const std::vector<std::int64_t>& split, const Args& a, Generator& gen) {
  autograd::NoGradGuard no_grad;
  double total = 0.0;
  for (std::int64_t i = 0; i < a.eval_iters; ++i) {
    auto [x, y] = examples::TextData::batch(split, a.batch, a.block, gen);
    total += model.loss(x, y).item();
  }
  return static_cast<float>(total / static_cast<double>(a.eval_iters));
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
    Tensor logits = model.forward(Tensor::from_indices(window, {1, T}));
    Tensor probs = softmax(logits.narrow(1, T - 1, 1).reshape({V}));
    const float r = gen.uniform();
    float acc = 0.0f;
    std::int64_t next = V - 1;
    for (std::int64_t v = 0; v < V; ++v) {
      acc += probs.item_at(v);
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

int run(const Args& a) {
  validate(a);
  const examples::TextData data = examples::TextData::load(a.data, a.block);
  nn::GPTConfig cfg;
  cfg.vocab_size = data.vocab_size();
  cfg.block_size = a.block;
  cfg.n_layer = a.n_layer;
  cfg.n_head = a.n_head;
  cfg.n_embd = a.n_embd;
  cfg.dropout = a.dropout;
  cfg.validate();
  if (a.threads > 0) cpu::set_num_threads(a.threads);

  // The model keeps init_gen for its dropout masks after initialisation.
  Generator init_gen(a.seed), data_gen(a.seed + 1);
  nn::GPT model(cfg, init_gen);
  const std::int64_t num_params = model.num_parameters();
  fmt::print("train_gpt: {} ({} train / {} val tokens, vocab {})\n", a.data, data.train.size(), data.val.size(),
             cfg.vocab_size);
  fmt::print("model: {} layers, {} heads, {} channels, block {}: {} parameters; batch {}, {} steps, {} threads\n",
             cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, num_params, a.batch, a.steps, cpu::num_threads());

  std::vector<optim::ParamGroup> groups(2);
  groups[0].weight_decay = a.weight_decay;
  for (auto& p : model.named_parameters()) groups[p.decay ? 0 : 1].params.push_back(p.tensor);
  optim::AdamW opt(groups, optim::AdamWOptions{a.lr, a.beta1, a.beta2, 1e-8f});
  const optim::LrSchedule schedule{a.lr, a.min_lr, a.warmup, a.steps};

  const std::int64_t warmup_steps = std::min<std::int64_t>(5, a.steps - 1);  // excluded from throughput
  double train_seconds = 0.0, window_seconds = 0.0;
  float train_loss = NAN, val_loss = NAN;
  for (std::int64_t step = 0; step < a.steps; ++step) {
    const auto t0 = Clock::now();
    const float lr = optim::lr_at(step, schedule);
    opt.set_lr(lr);
    auto [x, y] = examples::TextData::batch(data.train, a.batch, a.block, data_gen);
    Tensor loss = model.loss(x, y);
    opt.zero_grad();
    loss.backward();
    optim::clip_grad_norm(model.parameters(), a.clip);
    opt.step();
    train_loss = loss.item();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step >= warmup_steps) train_seconds += dt;
    window_seconds += dt;
    const bool last = step + 1 == a.steps;
    if ((step + 1) % a.log_every == 0 || last) {
      const std::int64_t n = (step % a.log_every) + 1;
      fmt::print("step {:5d}/{} | loss {:.4f} | lr {:.2e} | {:.1f} ms/step | {:.0f} tokens/s\n", step + 1, a.steps,
                 train_loss, lr, 1000.0 * window_seconds / n, n * a.batch * a.block / window_seconds);
      std::fflush(stdout);
      window_seconds = 0.0;
    }
    if ((a.eval_every > 0 && (step + 1) % a.eval_every == 0) || last) {
      model.eval();
      val_loss = evaluate(model, data.val, a, data_gen);
      model.train();
      fmt::print("step {:5d}/{} | val loss {:.4f}\n", step + 1, a.steps, val_loss);
      std::fflush(stdout);
    }
  }
  const std::int64_t timed_steps = a.steps - warmup_steps;
  const double tokens_per_s = timed_steps * a.batch * a.block / train_seconds;
  const double ms_per_step = 1000.0 * train_seconds / timed_steps;
  fmt::print("done: train loss {:.4f}, val loss {:.4f}, {:.0f} tokens/s, {:.2f} ms/step\n", train_loss, val_loss,
             tokens_per_s, ms_per_step);

  if (a.sample > 0) {
    model.eval();
    Generator sample_gen(a.seed + 3);
    fmt::print("---- sample ----\n{}\n----------------\n", generate(model, data, a.sample, sample_gen));
  }
  if (!a.metrics.empty()) {
    nlohmann::json m = {{"params", num_params},     {"steps", a.steps},         {"batch", a.batch},
                        {"block", a.block},         {"threads", cpu::num_threads()},
                        {"tokens_per_s", tokens_per_s}, {"ms_per_step", ms_per_step},
                        {"train_loss", train_loss}, {"val_loss", val_loss},
                        {"flops_per_token", nn::flops_per_token(cfg, num_params)}};
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
  CLI::App app{"Train a character-level GPT on a text file (zero.cpp)"};
  app.add_option("--data", a.data, "text file to train on (default: data/tinyshakespeare.txt)");
  app.add_option("--steps", a.steps, "optimizer steps")->capture_default_str();
  app.add_option("--batch", a.batch, "sequences per step (B)")->capture_default_str();
  app.add_option("--block", a.block, "sequence length (T)")->capture_default_str();
  app.add_option("--n-layer", a.n_layer, "transformer blocks (L)")->capture_default_str();
  app.add_option("--n-head", a.n_head, "attention heads (H)")->capture_default_str();
  app.add_option("--n-embd", a.n_embd, "channels (C)")->capture_default_str();
  app.add_option("--dropout", a.dropout, "dropout probability")->capture_default_str();
  app.add_option("--lr", a.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", a.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  app.add_option("--warmup", a.warmup, "linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", a.weight_decay, "AdamW weight decay (matrices only)")->capture_default_str();
  app.add_option("--beta1", a.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", a.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--clip", a.clip, "max global gradient norm (0 = off)")->capture_default_str();
  app.add_option("--seed", a.seed, "random seed (init, batches, sampling)")->capture_default_str();
  app.add_option("--eval-every", a.eval_every, "validate every N steps (0 = only at the end)")->capture_default_str();
  app.add_option("--eval-iters", a.eval_iters, "validation batches per evaluation")->capture_default_str();
  app.add_option("--log-every", a.log_every, "progress line every N steps")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0 = all cores)")->capture_default_str();
  app.add_option("--metrics", a.metrics, "write a JSON summary to this path");
  app.add_option("--sample", a.sample, "characters to generate at the end (0 = none)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (a.data.empty()) {
    a.data = default_data_path();
    if (!std::filesystem::exists(a.data)) {
      std::cerr << "error: no --data given and " << a.data << " not found. Get Tiny Shakespeare with:\n"
                << "  mkdir -p data && curl -o data/tinyshakespeare.txt "
                   "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt\n";
      return 1;
    }
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
