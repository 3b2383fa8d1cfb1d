// zero_in_one_process: ZeRO (stage 2 by default) on 4 ranks inside this one process, each rank a thread
// (distributed/comm/inprocess_communicator.h), training a tiny character-level GPT for a few steps. Made to
// be read, and to be stepped through in a debugger with every rank in view.
//
//   build/bin/zero_in_one_process                   4 ranks, stage 2, 3 steps
//   build/bin/zero_in_one_process --ranks 1         the same global batch on one rank
//   build/bin/zero_in_one_process --stage 0 --steps 5
//   build/bin/zero_in_one_process --stage 3         parameters partitioned too, gathered a block at a time
//
// Each rank prints what it owns (its partition of the flat parameter buffer: the parameter slices whose
// fp32 master weights, Adam moments and, at stages 2 and 3, gradients it alone keeps; at stage 3 also
// the parameters themselves, with the gather units it all-gathers them in) and the loss of its
// micro-batch at every step; then the mean over ranks, the loss of the whole global batch, which is the
// same for any number of ranks up to rounding (the ranks split a fixed global batch between them).
//
// In gdb every rank is a thread named "rank R", and its communication thread "rank R comm" (configure
// with -DCMAKE_BUILD_TYPE=Debug to step line by line):
//   gdb build/bin/zero_in_one_process
//   (gdb) break zero::dist::ZeroOptimizer::step
//   (gdb) run
//   (gdb) info threads            which rank stopped where
//   (gdb) thread apply all bt     every rank's stack at once
//   (gdb) thread 3                look at one rank, `up` into this file's train_rank
// A rank waiting for its peers in a collective sits in InProcessCommunicator::arrive (its "comm" thread).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "examples/cli_errors.h"
#include "core/check.h"
#include "core/cpu/kernels.h"
#include "distributed/distributed.h"
#include "nn/gpt.h"

namespace {

using namespace zero;

// The opening of Coriolanus; its distinct characters are the vocabulary.
const std::string kText =
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n"
    "First Citizen:\nFirst, you know Caius Marcius is chief enemy to the people.\n";

struct Args {
  int ranks = 4;
  int stage = 2;
  int steps = 3;
  std::int64_t batch = 12;  // global batch: rows of every step, split evenly between the ranks
};

struct Vocab {
  std::string chars;  // token id -> character
  std::int64_t id(char c) const { return static_cast<std::int64_t>(chars.find(c)); }
};

Vocab vocab_of(const std::string& text) {
  Vocab v;
  for (char c : text)
    if (v.chars.find(c) == std::string::npos) v.chars += c;
  return v;
}

// Rows [row0, row0 + rows) of step `step`'s global batch: inputs and next-character targets, each row
// a window of the text starting at a place fixed by (step, row), so every rank count sees the same
// global batch.
std::pair<Tensor, Tensor> batch_rows(const Vocab& vocab, std::int64_t T, int step, std::int64_t row0,
                                     std::int64_t rows) {
  std::vector<std::int64_t> x, y;
  const std::int64_t places = static_cast<std::int64_t>(kText.size()) - T - 1;
  for (std::int64_t r = row0; r < row0 + rows; ++r) {
    const std::int64_t start = (step * 131 + r * 37) % places;
    for (std::int64_t t = 0; t < T; ++t) {
      x.push_back(vocab.id(kText[static_cast<std::size_t>(start + t)]));
      y.push_back(vocab.id(kText[static_cast<std::size_t>(start + t + 1)]));
    }
  }
  return {Tensor::from_indices(x, {rows, T}), Tensor::from_indices(y, {rows, T})};
}

// One rank's training: what `body` of run_ranks does on each rank's thread. Every rank builds the same
// model and optimizer (collective), then trains on its own rows of each global batch.
void train_rank(const Args& a, const Vocab& vocab, const std::shared_ptr<dist::Communicator>& comm,
                std::vector<std::string>& log, std::vector<double>& losses) {
  const int rank = comm->rank(), n = comm->world_size();
  cpu::set_num_threads(1);  // one compute thread per rank (an OpenMP setting of this thread): ranks are the parallelism
  nn::GPTConfig cfg;
  cfg.vocab_size = static_cast<std::int64_t>(vocab.chars.size());
  cfg.block_size = 16;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 32;
  Generator gen(1337);  // the same initial weights on every rank (the optimizer also broadcasts rank 0's)
  nn::GPT model(cfg, gen);

  dist::ZeroOptions o;
  o.stage = a.stage;
  o.dtype = DType::f32;
  o.reduce_bucket_size = 4096;  // a few buckets, so backward issues several reduce-scatters
  o.adam.lr = 1e-2f;
  o.weight_decay = 0.1f;
  o.gradient_clipping = 1.0f;
  dist::ZeroOptimizer opt(model.named_parameters(), comm, o);

  // What this rank owns: its partition [begin, end) of the padded flat buffer, as parameter slices.
  const dist::FlatLayout& layout = opt.layout();
  if (a.stage == 0) {
    log.push_back(fmt::format("rank {}: keeps all {} flat elements (stage 0 partitions nothing)", rank,
                              layout.padded_numel()));
  } else {
    log.push_back(fmt::format("rank {}: owns [{}, {}) of the {} flat elements ({} real, {} padding):", rank,
                              layout.partition_begin(rank), layout.partition_end(rank), layout.padded_numel(),
                              layout.partition_real_numel(rank),
                              layout.partition_size(rank) - layout.partition_real_numel(rank)));
    for (const dist::ParamSlice& s : layout.owned(rank)) {
      const dist::ParamRange& p = layout.params()[s.param];
      log.push_back(fmt::format("  {} [{}, {}) of {}", p.name, s.param_offset, s.param_offset + s.length, p.numel));
    }
    if (a.stage == 3) {
      std::string units;
      for (const dist::GatherUnit& u : opt.plan().units) units += fmt::format(" {} ({})", u.name, u.size());
      log.push_back(fmt::format("rank {}: keeps only these parameter values ({} elements); the rest is all-gathered a "
                                "unit at a time, before its forward and its backward, and freed after:{}",
                                rank, layout.partition_size(rank), units));
    }
  }

  const std::int64_t rows = a.batch / n;
  for (int step = 0; step < a.steps; ++step) {
    auto [x, y] = batch_rows(vocab, cfg.block_size, step, rank * rows, rows);
    Tensor loss = model.loss(x, y);
    losses.push_back(loss.item());
    opt.backward(loss);  // hooks fill the buckets; stages 2/3 reduce-scatter each into its owner's gradient
    opt.step();          // each rank updates its partition, then all-gathers the parameters (not at stage 3)
    log.push_back(fmt::format("rank {}: step {} loss {:.6f} (rows {}..{})", rank, step + 1, losses.back(),
                              rank * rows, (rank + 1) * rows - 1));
  }
  if (const dist::PartitionedParameters* p = opt.partitioned())
    log.push_back(fmt::format("rank {}: {} unit all-gathers in {} step(s); at most {} of {} parameter elements "
                              "gathered at once",
                              rank, p->gathers(), a.steps, p->max_live_elements(), layout.numel()));
}

int run(const Args& a) {
  ZERO_CHECK(a.ranks >= 1, "--ranks must be >= 1, got {}", a.ranks);
  ZERO_CHECK(a.stage >= 0 && a.stage <= 3, "--stage must be 0, 1, 2 or 3, got {}", a.stage);
  ZERO_CHECK(a.steps >= 1, "--steps must be >= 1, got {}", a.steps);
  ZERO_CHECK(a.batch >= 1 && a.batch % a.ranks == 0, "--batch must be a positive multiple of --ranks ({}), got {}",
             a.ranks, a.batch);
  const Vocab vocab = vocab_of(kText);
  std::vector<std::vector<std::string>> logs(static_cast<std::size_t>(a.ranks));
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(a.ranks));
  // Rank r runs train_rank on its own thread with communicator r; run_ranks returns when all are done.
  dist::run_ranks(a.ranks, [&](std::shared_ptr<dist::Communicator> comm) {
    train_rank(a, vocab, comm, logs[comm->rank()], losses[comm->rank()]);
  });
  fmt::print("ZeRO stage {} on {} in-process rank(s), global batch {} rows of {} characters\n", a.stage, a.ranks,
             a.batch, 16);
  for (const auto& rank_log : logs)
    for (const auto& line : rank_log) fmt::print("{}\n", line);
  for (int step = 0; step < a.steps; ++step) {
    double sum = 0;
    for (const auto& l : losses) sum += l[static_cast<std::size_t>(step)];
    fmt::print("step {}: loss {:.6f} (mean over {} rank(s))\n", step + 1, sum / a.ranks, a.ranks);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"ZeRO on N ranks as threads of this one process: a tiny GPT, a few steps, to read and debug"};
  app.add_option("--ranks", a.ranks, "number of ranks (threads)")->capture_default_str();
  app.add_option("--stage", a.stage, "ZeRO stage: 0, 1, 2 or 3")->capture_default_str();
  app.add_option("--steps", a.steps, "training steps")->capture_default_str();
  app.add_option("--batch", a.batch, "global batch (rows per step, a multiple of --ranks)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return examples::parse_error_exit(app, e);
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
