// ZeRO: the flat layout's range arithmetic against closed forms, and the ZeRO optimizer against one
// process running plain AdamW on the whole batch (the equivalence that is the backbone of these tests).
//
// Every rank runs every test. A training run on N ranks gives rank r the micro-batch rows
// [(g·N + r)·b, (g·N + r + 1)·b) of micro-step g of the same global batch, and each rank also computes
// the single-process reference (batch N·b·GAS) locally, so every rank can check its own parameters.
// Models are tiny (a GPT with ~1.8k parameters, a 77-parameter toy with every edge shape) so the suite
// takes seconds even with 4 oversubscribed ranks. Checks come after the collectives, so a failure on one
// rank never leaves the others waiting. The tests run under mpirun and with the ranks as threads of one process
// (ZERO_DIST_TEST, tests/distributed/world.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/check.h"
#include "distributed/zero/flat_layout.h"
#include "distributed/comm/job_runtime.h"
#include "distributed/zero/zero_optimizer.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/loss_scaler.h"
#include "tests/distributed/tiny_gpt.h"
#include "tests/distributed/world.h"

namespace zero::dist {
namespace {

// =====================================================================================================
// FlatLayout: pure arithmetic (the same on every rank; world sizes here are not the job's)
// =====================================================================================================

std::vector<FlatLayout::Entry> entries_of(const std::vector<Shape>& shapes) {
  std::vector<FlatLayout::Entry> e;
  for (std::size_t i = 0; i < shapes.size(); ++i) e.push_back({fmt::format("p{}", i), shapes[i], i % 2 == 0});
  return e;
}

void expect_slice(const ParamSlice& s, int rank, std::size_t param, std::int64_t flat, std::int64_t in_param,
                  std::int64_t length) {
  EXPECT_EQ(s.rank, rank);
  EXPECT_EQ(s.param, param);
  EXPECT_EQ(s.flat_offset, flat);
  EXPECT_EQ(s.param_offset, in_param);
  EXPECT_EQ(s.length, length);
}

TEST(FlatLayout, NotDivisibleStraddlingAndPaddingOnlyPartition) {
  // Ψ = 5 + 3 = 8 on 3 ranks: padded to a multiple of 6 -> 12, P = 4: [0,4) [4,8) [8,12).
  FlatLayout l(entries_of({{5}, {3}}), 3);
  EXPECT_EQ(l.numel(), 8);
  EXPECT_EQ(l.padded_numel(), 12);
  EXPECT_EQ(l.padding(), 4);
  EXPECT_EQ(l.alignment(), 6);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(l.partition_size(r), 4);
  ASSERT_EQ(l.params()[0].slices.size(), 2u);  // p0 = [0,5) straddles partitions 0 and 1
  expect_slice(l.params()[0].slices[0], 0, 0, 0, 0, 4);
  expect_slice(l.params()[0].slices[1], 1, 0, 4, 4, 1);
  ASSERT_EQ(l.params()[1].slices.size(), 1u);  // p1 = [5,8)
  expect_slice(l.params()[1].slices[0], 1, 1, 5, 0, 3);
  ASSERT_EQ(l.owned(0).size(), 1u);
  ASSERT_EQ(l.owned(1).size(), 2u);
  EXPECT_TRUE(l.owned(2).empty());  // padding only
  expect_slice(l.owned(1)[0], 1, 0, 4, 4, 1);
  expect_slice(l.owned(1)[1], 1, 1, 5, 0, 3);
  EXPECT_TRUE(l.owned(1)[0].decay);
  EXPECT_FALSE(l.owned(1)[1].decay);
  EXPECT_EQ(l.partition_real_numel(0), 4);
  EXPECT_EQ(l.partition_real_numel(1), 4);
  EXPECT_EQ(l.partition_real_numel(2), 0);
  EXPECT_EQ(l.owner_of(11), 2);
}

TEST(FlatLayout, WholeEntriesMoveTheBoundariesToTheirNearerEdge) {
  // p0 = 5 elements, p1 = [3, 5] kept whole, p2 = 6, on 3 ranks. p1 starts on an even position: 6, one
  // element of padding after p0; it ends at 21, p2 = [21, 27); padded to a multiple of 6: 30, P = 10.
  // Boundary 10 lies in p1 = [6, 21): 4 from its start, 12 from its end rounded up to even (22) -> 6.
  // Boundary 20: 14 from the start, 2 from 22 -> 22. Partitions [0, 6) [6, 22) [22, 30).
  auto entries = entries_of({{5}, {3, 5}, {6}});
  entries[1].whole = true;
  FlatLayout l(entries, 3);
  EXPECT_EQ(l.numel(), 26);
  EXPECT_EQ(l.interior_padding(), 1);
  EXPECT_EQ(l.padded_numel(), 30);
  EXPECT_EQ(l.params()[1].offset, 6);
  EXPECT_EQ(l.params()[2].offset, 21);
  const std::int64_t begins[] = {0, 6, 22}, ends[] = {6, 22, 30};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(l.partition_begin(r), begins[r]) << r;
    EXPECT_EQ(l.partition_end(r), ends[r]) << r;
  }
  EXPECT_EQ(l.largest_partition_size(), 16);
  ASSERT_EQ(l.params()[1].slices.size(), 1u);
  expect_slice(l.params()[1].slices[0], 1, 1, 6, 0, 15);
  ASSERT_EQ(l.params()[2].slices.size(), 2u);  // p2 straddles ranks 1 and 2 like any AdamW parameter
  expect_slice(l.params()[2].slices[0], 1, 2, 21, 0, 1);
  expect_slice(l.params()[2].slices[1], 2, 2, 22, 1, 5);
  EXPECT_EQ(l.owner_of(5), 0);
  EXPECT_EQ(l.owner_of(6), 1);
  EXPECT_EQ(l.owner_of(29), 2);
  EXPECT_EQ(l.range_counts(0, 30), (std::vector<std::size_t>{6, 16, 8}));
  // On one rank nothing is kept whole: no gap.
  EXPECT_EQ(FlatLayout(entries, 1).interior_padding(), 0);
}

TEST(FlatLayout, AMatrixLargerThanAPartitionLeavesEmptyPartitions) {
  // p0 = 2, p1 = 40 whole, p2 = 2 on 4 ranks: padded 48, P = 12, p1 = [2, 42). Boundary 12 -> 2 (10 from
  // p1's start against 30 from its end), 24 -> 42 (22 against 18), 36 -> 42 (34 against 6). Rank 2's
  // partition [42, 42) is empty; rank 3 holds p2 and the padding, [42, 48).
  auto entries = entries_of({{2}, {4, 10}, {2}});
  entries[1].whole = true;
  FlatLayout l(entries, 4);
  const std::int64_t begins[] = {0, 2, 42, 42}, ends[] = {2, 42, 42, 48};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(l.partition_begin(r), begins[r]) << r;
    EXPECT_EQ(l.partition_end(r), ends[r]) << r;
  }
  EXPECT_TRUE(l.owned(2).empty());
  EXPECT_EQ(l.owner_of(42), 3);
  EXPECT_EQ(l.partition_real_numel(3), 2);
}

TEST(FlatLayout, ParameterSpanningManyPartitions) {
  // Ψ = 2 + 20 + 1 = 23 on 4 ranks: padded 24, P = 6. p1 = [2,22) touches all four partitions.
  FlatLayout l(entries_of({{2}, {4, 5}, {1}}), 4);
  EXPECT_EQ(l.padded_numel(), 24);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(l.partition_size(r), 6);
  const auto& s = l.params()[1].slices;
  ASSERT_EQ(s.size(), 4u);
  expect_slice(s[0], 0, 1, 2, 0, 4);
  expect_slice(s[1], 1, 1, 6, 4, 6);
  expect_slice(s[2], 2, 1, 12, 10, 6);
  expect_slice(s[3], 3, 1, 18, 16, 4);
  ASSERT_EQ(l.owned(3).size(), 2u);
  expect_slice(l.owned(3)[1], 3, 2, 22, 0, 1);
  EXPECT_EQ(l.partition_real_numel(3), 5);
}

TEST(FlatLayout, ZeroElementParametersAndModelSmallerThanWorld) {
  // Ψ = 0 + 3 + 0 + 1 = 4 on 4 ranks: padded 8, P = 2; ranks 2 and 3 own only padding.
  FlatLayout l(entries_of({{0, 3}, {3}, {0}, {1}}), 4);
  EXPECT_EQ(l.numel(), 4);
  EXPECT_EQ(l.padded_numel(), 8);
  EXPECT_EQ(l.params()[0].numel, 0);
  EXPECT_TRUE(l.params()[0].slices.empty());
  EXPECT_EQ(l.params()[2].offset, 3);
  EXPECT_TRUE(l.params()[2].slices.empty());
  expect_slice(l.params()[1].slices[0], 0, 1, 0, 0, 2);
  expect_slice(l.params()[1].slices[1], 1, 1, 2, 2, 1);
  expect_slice(l.params()[3].slices[0], 1, 3, 3, 0, 1);
  EXPECT_TRUE(l.owned(2).empty());
  EXPECT_TRUE(l.owned(3).empty());
  // One element on 4 ranks.
  FlatLayout one(entries_of({{1}}), 4);
  EXPECT_EQ(one.padded_numel(), 8);
  EXPECT_EQ(one.owned(0).size(), 1u);
  for (int r = 1; r < 4; ++r) EXPECT_TRUE(one.owned(r).empty());
}

TEST(FlatLayout, SlicesTileParametersAndPartitions) {
  // Properties over many shapes and world sizes: the padding is the least multiple of 2N, slices tile
  // each parameter in rank order, and each rank's slices tile the real part of its partition.
  const std::vector<Shape> shapes = {{7}, {0}, {3, 5}, {1}, {13}, {2, 2, 2}, {0, 4}, {29}, {1}};
  for (int n = 1; n <= 7; ++n) {
    FlatLayout l(entries_of(shapes), n);
    SCOPED_TRACE("world_size " + std::to_string(n));
    EXPECT_EQ(l.padded_numel() % (2 * n), 0);
    EXPECT_LT(l.padding(), 2 * n);
    for (int r = 0; r < n; ++r) EXPECT_EQ(l.partition_size(r), l.padded_numel() / n);
    std::int64_t offset = 0;
    for (const ParamRange& p : l.params()) {
      EXPECT_EQ(p.offset, offset);
      std::int64_t in_param = 0;
      int last_rank = -1;
      for (const ParamSlice& s : p.slices) {
        EXPECT_EQ(s.param_offset, in_param);
        EXPECT_EQ(s.flat_offset, p.offset + in_param);
        EXPECT_GT(s.length, 0);
        EXPECT_GT(s.rank, last_rank);
        EXPECT_GE(s.flat_offset, l.partition_begin(s.rank));
        EXPECT_LE(s.flat_offset + s.length, l.partition_end(s.rank));
        last_rank = s.rank;
        in_param += s.length;
      }
      EXPECT_EQ(in_param, p.numel);
      offset += p.numel;
    }
    for (int r = 0; r < n; ++r) {
      std::int64_t pos = l.partition_begin(r);
      for (const ParamSlice& s : l.owned(r)) {
        EXPECT_EQ(s.flat_offset, pos);
        pos += s.length;
      }
      EXPECT_EQ(pos - l.partition_begin(r), l.partition_real_numel(r));
    }
  }
}

TEST(FlatLayout, BucketsAreFixedRangesFromTheEnd) {
  // padded 24, P = 6 on 4 ranks, buckets of 7: [17,24) [10,17) [3,10) [0,3).
  FlatLayout l(entries_of({{2}, {20}, {1}}), 4);
  const auto b = l.make_buckets(7);
  ASSERT_EQ(b.size(), 4u);
  const std::int64_t begins[] = {17, 10, 3, 0}, ends[] = {24, 17, 10, 3};
  const std::vector<std::vector<std::size_t>> counts = {{0, 0, 1, 6}, {0, 2, 5, 0}, {3, 4, 0, 0}, {3, 0, 0, 0}};
  const std::vector<std::vector<std::size_t>> params = {{1, 2}, {1}, {1}, {0, 1}};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(b[k].index, k);
    EXPECT_EQ(b[k].begin, begins[k]);
    EXPECT_EQ(b[k].end, ends[k]);
    EXPECT_EQ(b[k].counts, counts[k]);
    EXPECT_EQ(b[k].params, params[k]);
  }
  const auto whole = l.make_buckets(1000);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].begin, 0);
  EXPECT_EQ(whole[0].end, 24);
  EXPECT_EQ(whole[0].counts, (std::vector<std::size_t>{6, 6, 6, 6}));
  EXPECT_THROW(l.make_buckets(0), Error);
  EXPECT_THROW(FlatLayout(entries_of({{2}}), 0), Error);
}

// =====================================================================================================
// Models, data and runs
// =====================================================================================================

// A deterministic pseudo-random number in [0, 1) from a few integers (same on every rank).
double hash01(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t h =
      a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full ^ c * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 53);
}

// Rows [row0, row0 + rows) of step `step`'s data: inputs x [rows, d], each hash01(step, row, column)
// mapped to [-1, 1), and labels y [rows] in [0, classes), hash01(step, row, label_column).
struct HashedBatch {
  Tensor x, y;
};
HashedBatch hashed_batch(int step, std::int64_t row0, std::int64_t rows, std::int64_t d, std::int64_t classes,
                         std::uint64_t label_column) {
  std::vector<float> x(static_cast<std::size_t>(rows * d));
  std::vector<std::int64_t> y(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < d; ++i)
      x[static_cast<std::size_t>(r * d + i)] = static_cast<float>(2.0 * hash01(step, row0 + r, i) - 1.0);
    y[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(hash01(step, row0 + r, label_column) * classes);
  }
  return {Tensor::from_vector(x, {rows, d}), Tensor::from_indices(y, {rows})};
}

// Holds a tensor owned elsewhere: registering it a second time ties it (named_parameters lists it once).
class Holder : public nn::Module {
 public:
  explicit Holder(Tensor t) { weight = register_parameter("weight", t, true); }
  Tensor weight;
};

// Every edge shape at once: parameters not divisible by N, one larger than a 7-element bucket and
// spanning three partitions on 4 ranks (w1 = [14, 49) of 80), a zero-element parameter, a frozen one,
// a tied one (w2 is also head.weight) and one unused on odd steps (extra). Trainable Ψ = 77.
class Toy : public nn::Module {
 public:
  static constexpr std::int64_t D = 5, H = 7, K = 3;
  explicit Toy(Generator& gen) {
    gain = register_parameter("gain", Tensor::randn({H}, gen, 1.0f, 0.1f), false);
    b1 = register_parameter("b1", Tensor::randn({H}, gen, 0.0f, 0.1f), false);
    w1 = register_parameter("w1", Tensor::randn({H, D}, gen, 0.0f, 0.5f), true);
    empty = register_parameter("empty", Tensor::zeros({0, 3}), true);
    frozen = register_parameter("frozen", Tensor::randn({H}, gen, 0.0f, 0.1f), false);
    frozen.set_requires_grad(false);
    w2 = register_parameter("w2", Tensor::randn({K, H}, gen, 0.0f, 0.5f), true);
    extra = register_parameter("extra", Tensor::randn({H}, gen, 0.0f, 0.1f), false);
    head = register_module("head", std::make_shared<Holder>(w2));
  }
  Tensor loss(const Tensor& x, const Tensor& y, bool use_extra) const {
    Tensor h = gelu(linear(x, compute(w1), compute(b1)));
    h = add(mul(h, compute(gain)), compute(frozen));
    if (use_extra) h = add(h, compute(extra));
    Tensor logits = add(linear(h, compute(w2), Tensor()), linear(gelu(h), compute(head->weight), Tensor()));
    logits = add(logits, sum(compute(empty)));
    return cross_entropy(logits, y);
  }
  Tensor gain, b1, w1, empty, frozen, w2, extra;
  std::shared_ptr<Holder> head;
};

// Three parameter elements: smaller than a 4-rank world (ranks 2 and 3 own only padding).
class Tiny : public nn::Module {
 public:
  explicit Tiny(Generator& gen) { p = register_parameter("p", Tensor::randn({3}, gen, 0.0f, 1.0f), false); }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    Tensor d = sub(mul(x, compute(p)), y);
    return mean(mul(d, d));
  }
  Tensor p;
};

struct Task {
  std::function<std::shared_ptr<nn::Module>()> make;  // same weights on every call
  /// Loss of rows [row0, row0 + rows) of the global batch of training step `step`.
  std::function<Tensor(nn::Module&, int step, std::int64_t row0, std::int64_t rows)> loss;
};


Task gpt_task(const nn::GPTConfig& cfg = harness::tiny_gpt_config(), bool round_to_f16 = false) {
  Task t;
  t.make = [cfg, round_to_f16] {
    Generator gen(42);
    auto m = std::make_shared<nn::GPT>(cfg, gen);
    if (round_to_f16) {  // the f32 twin of an f16 run starts from the same rounded weights
      m->to(DType::f16);
      m->to(DType::f32);
    }
    return std::static_pointer_cast<nn::Module>(m);
  };
  t.loss = [cfg](nn::Module& m, int step, std::int64_t row0, std::int64_t rows) {
    const std::int64_t T = cfg.block_size, V = cfg.vocab_size;
    std::vector<std::int64_t> idx(static_cast<std::size_t>(rows * T)), tgt(idx.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < T; ++i) {
        const std::size_t k = static_cast<std::size_t>(r * T + i);
        idx[k] = static_cast<std::int64_t>(hash01(step, row0 + r, i) * V);
        tgt[k] = static_cast<std::int64_t>(hash01(step + 1000, row0 + r, i) * V);
      }
    return static_cast<nn::GPT&>(m).loss(Tensor::from_indices(idx, {rows, T}), Tensor::from_indices(tgt, {rows, T}));
  };
  return t;
}

Task toy_task() {
  Task t;
  t.make = [] {
    Generator gen(7);
    return std::static_pointer_cast<nn::Module>(std::make_shared<Toy>(gen));
  };
  t.loss = [](nn::Module& m, int step, std::int64_t row0, std::int64_t rows) {
    const HashedBatch b = hashed_batch(step, row0, rows, Toy::D, Toy::K, 99);
    return static_cast<Toy&>(m).loss(b.x, b.y, step % 2 == 0);
  };
  return t;
}

// The toy, but `extra` is used only by the rows of even-numbered chunks of `chunk` rows: with one chunk
// per rank, ranks 1, 3 never fire extra's hook, so hook order and the set of delivered gradients differ
// between ranks (Note [Bucket order]). The reference computes the same loss as the mean over chunks.
Task toy_uneven_task(std::int64_t chunk) {
  Task base = toy_task();
  Task t;
  t.make = base.make;
  t.loss = [chunk](nn::Module& m, int step, std::int64_t row0, std::int64_t rows) {
    Tensor total;
    for (std::int64_t c = row0; c < row0 + rows; c += chunk) {
      const HashedBatch b = hashed_batch(step, c, chunk, Toy::D, Toy::K, 99);
      Tensor l = static_cast<Toy&>(m).loss(b.x, b.y, (c / chunk) % 2 == 0);
      total = total.defined() ? add(total, l) : l;
    }
    return mul(total, static_cast<float>(chunk) / static_cast<float>(rows));
  };
  return t;
}

Task tiny_task() {
  Task t;
  t.make = [] {
    Generator gen(3);
    return std::static_pointer_cast<nn::Module>(std::make_shared<Tiny>(gen));
  };
  t.loss = [](nn::Module& m, int step, std::int64_t row0, std::int64_t rows) {
    std::vector<float> x(static_cast<std::size_t>(rows * 3)), y(x.size());
    for (std::size_t k = 0; k < x.size(); ++k) {
      const std::int64_t r = row0 + static_cast<std::int64_t>(k / 3);
      x[k] = static_cast<float>(hash01(step, r, k % 3) * 2.0 - 1.0);
      y[k] = static_cast<float>(hash01(step + 7, r, k % 3));
    }
    return static_cast<Tiny&>(m).loss(Tensor::from_vector(x, {rows, 3}), Tensor::from_vector(y, {rows, 3}));
  };
  return t;
}

struct RunResult {
  std::vector<float> losses;               // per micro-step: this rank's loss
  std::vector<std::string> names;
  std::vector<std::vector<float>> params;  // every named parameter (frozen included), as float
  std::vector<double> norms;               // per step: unscaled pre-clip global norm
  std::vector<char> applied;               // per step: step() returned true
  std::vector<float> scales;               // per step: loss scale after the step
};

RunResult snapshot(const nn::Module& m) {
  RunResult r;
  for (const auto& p : m.named_parameters()) {
    r.names.push_back(p.name);
    r.params.push_back(p.tensor.to_vector());
  }
  return r;
}

ZeroOptions base_options() {
  ZeroOptions o;
  o.stage = 1;
  o.dtype = DType::f32;
  o.reduce_bucket_size = 100;
  o.allgather_bucket_size = 100;
  o.adam.lr = 1e-2f;
  o.weight_decay = 0.1f;
  o.gradient_clipping = 0.5f;
  return o;
}

// Trains `steps` steps on this job's ranks; micro-batch b rows per rank per micro-step. `hook`, if
// set, is called with the model before the optimizer is built (to register extra hooks), and
// `skip(step)` leaves a step's data out entirely.
RunResult run_zero(const Task& task, const ZeroOptions& o, int steps, std::int64_t b,
                   const std::function<void(nn::Module&)>& hook = {}, const std::function<bool(int)>& skip = {}) {
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  auto model = task.make();
  if (hook) hook(*model);
  ZeroOptimizer opt(model->named_parameters(), comm, o);
  RunResult res;
  for (int s = 0; s < steps; ++s) {
    if (skip && skip(s)) continue;
    for (int g = 0; g < o.gradient_accumulation_steps; ++g) {
      const Tensor loss = task.loss(*model, s, (static_cast<std::int64_t>(g) * n + rank) * b, b);
      res.losses.push_back(loss.item());
      opt.backward(loss);
    }
    res.applied.push_back(opt.step());
    res.norms.push_back(opt.last_grad_norm());
    res.scales.push_back(opt.loss_scale());
  }
  opt.gather_parameters();  // stage 3: the parameters hold values only while gathered
  RunResult snap = snapshot(*model);
  res.names = snap.names;
  res.params = snap.params;
  return res;
}

// One process, plain AdamW + clip_grad_norm over the whole global batch (N·b·GAS rows). A trainable
// parameter without a gradient (unused this step) is not stepped (PyTorch's rule, which ZeRO follows:
// Note [Unused parameters]).
RunResult run_reference(const Task& task, const ZeroOptions& o, int steps, std::int64_t rows,
                        const std::function<bool(int)>& skip = {}) {
  auto model = task.make();
  std::vector<optim::ParamGroup> groups(2);
  groups[0].weight_decay = o.weight_decay;
  groups[1].weight_decay = 0.0f;
  std::vector<Tensor> trainable;
  for (const auto& p : model->named_parameters()) {
    if (!p.tensor.requires_grad()) continue;
    groups[p.decay ? 0 : 1].params.push_back(p.tensor);
    trainable.push_back(p.tensor);
  }
  optim::AdamW adamw(groups, o.adam);
  RunResult res;
  for (int s = 0; s < steps; ++s) {
    if (skip && skip(s)) continue;
    task.loss(*model, s, 0, rows).backward();
    res.norms.push_back(optim::clip_grad_norm(trainable, o.gradient_clipping));
    adamw.step();
    adamw.zero_grad();
    res.applied.push_back(1);
  }
  RunResult snap = snapshot(*model);
  res.names = snap.names;
  res.params = snap.params;
  return res;
}

// Per tensor: max |a - b| <= rtol · max(max |b|, floor).
void expect_params_close(const RunResult& a, const RunResult& b, double rtol, const std::string& what,
                         double floor = 1e-3) {
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_EQ(a.params[i].size(), b.params[i].size()) << what << " " << b.names[i];
    double diff = 0, scale = floor;
    for (std::size_t j = 0; j < a.params[i].size(); ++j) {
      diff = std::max(diff, std::abs(static_cast<double>(a.params[i][j]) - b.params[i][j]));
      scale = std::max(scale, std::abs(static_cast<double>(b.params[i][j])));
    }
    EXPECT_LE(diff, rtol * scale) << what << ": parameter " << b.names[i] << " max |diff| " << diff << " (scale "
                                  << scale << ")";
  }
}

void expect_norms_close(const RunResult& a, const RunResult& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.norms.size(), b.norms.size()) << what;
  for (std::size_t s = 0; s < a.norms.size(); ++s)
    EXPECT_NEAR(a.norms[s], b.norms[s], rtol * b.norms[s]) << what << ": step " << s;
}

std::string describe(const ZeroOptions& o) {
  return "stage " + std::to_string(o.stage) + ", bucket " + std::to_string(o.reduce_bucket_size) + ", allgather " +
         std::to_string(o.allgather_bucket_size) + ", overlap " + std::to_string(o.overlap_comm) + ", reduce_scatter " +
         std::to_string(o.reduce_scatter) + ", GAS " + std::to_string(o.gradient_accumulation_steps);
}

int world_size() { return test_world()->world_size(); }
int world_rank() { return test_world()->rank(); }

// =====================================================================================================
// Equivalence with one process
// =====================================================================================================

constexpr double kRtol = 1e-5;

ZERO_DIST_TEST(ZeroEquivalence, StagesBucketsAndOverlapMatchOneProcess) {
  const Task task = gpt_task();
  const int n = world_size(), steps = 3;
  const std::int64_t b = 2;
  const RunResult ref = run_reference(task, base_options(), steps, n * b);
  for (int stage : {0, 1, 2}) {
    RunResult first;
    for (std::int64_t bucket : {std::int64_t{7}, std::int64_t{100}, std::int64_t{1'000'000}}) {
      for (bool overlap : {false, true}) {
        ZeroOptions o = base_options();
        o.stage = stage;
        o.reduce_bucket_size = bucket;
        o.allgather_bucket_size = bucket == 7 ? 13 : bucket;
        o.overlap_comm = overlap;
        const RunResult z = run_zero(task, o, steps, b);
        expect_params_close(z, ref, kRtol, describe(o));
        expect_norms_close(z, ref, 1e-6, describe(o));
        if (!overlap)
          first = z;
        else
          EXPECT_EQ(z.params, first.params) << "overlap on and off differ: " << describe(o);
      }
    }
  }
}

ZERO_DIST_TEST(ZeroEquivalence, ReduceScatterOffMatches) {
  const Task task = gpt_task();
  const int n = world_size(), steps = 3;
  const RunResult ref = run_reference(task, base_options(), steps, n * 2);
  for (int stage : {1, 2})
    for (bool overlap : {false, true}) {
      ZeroOptions o = base_options();
      o.stage = stage;
      o.reduce_scatter = false;
      o.reduce_bucket_size = 37;
      o.overlap_comm = overlap;
      const RunResult z = run_zero(task, o, steps, 2);
      expect_params_close(z, ref, kRtol, describe(o));
      expect_norms_close(z, ref, 1e-6, describe(o));
    }
}

ZERO_DIST_TEST(ZeroEquivalence, GradientAccumulationEqualsLargerBatch) {
  // GAS = 4 with micro-batch 1 == GAS = 1 with micro-batch 4 == one process with batch 4N.
  const Task task = gpt_task();
  const int n = world_size(), steps = 3;
  const RunResult ref = run_reference(task, base_options(), steps, 4 * n);
  for (int stage : {0, 1, 2}) {
    ZeroOptions o = base_options();
    o.stage = stage;
    o.reduce_bucket_size = 50;
    const RunResult big = run_zero(task, o, steps, 4);
    o.gradient_accumulation_steps = 4;
    o.overlap_comm = stage == 2;
    const RunResult acc = run_zero(task, o, steps, 1);
    expect_params_close(big, ref, kRtol, "GAS 1, " + describe(o));
    expect_params_close(acc, ref, kRtol, describe(o));
    expect_params_close(acc, big, kRtol, "GAS 4 vs GAS 1, " + describe(o));
    expect_norms_close(acc, ref, 1e-6, describe(o));
  }
}

ZERO_DIST_TEST(ZeroEquivalence, EdgeShapes) {
  // Ψ = 77 (not divisible by 2N), w1 larger than a bucket and spanning partitions, a zero-element, a
  // frozen, a tied and a sometimes-unused parameter; clipping on, several steps.
  const Task task = toy_task();
  const int n = world_size(), steps = 4;
  ZeroOptions base = base_options();
  base.adam.lr = 3e-2f;
  // GAS 1 with micro-batch 2 and GAS 2 with micro-batch 1 both cover the 2N rows of the reference.
  const RunResult ref = run_reference(task, base, steps, n * 2);
  const RunResult initial = snapshot(*task.make());
  for (int stage : {0, 1, 2})
    for (std::int64_t bucket : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}})
      for (bool overlap : {false, true}) {
        ZeroOptions o = base;
        o.stage = stage;
        o.reduce_bucket_size = bucket;
        o.allgather_bucket_size = bucket == 1 ? 3 : bucket;
        o.overlap_comm = overlap;
        o.gradient_accumulation_steps = stage == 1 && bucket == 7 ? 2 : 1;
        const RunResult z = run_zero(task, o, steps, o.gradient_accumulation_steps == 2 ? 1 : 2);
        expect_params_close(z, ref, kRtol, describe(o));
        expect_norms_close(z, ref, 1e-6, describe(o));
        // The frozen parameter was never touched and is not in the layout.
        const auto it = std::find(z.names.begin(), z.names.end(), "frozen");
        ASSERT_NE(it, z.names.end());
        const std::size_t fi = static_cast<std::size_t>(it - z.names.begin());
        EXPECT_EQ(z.params[fi], initial.params[fi]) << describe(o);
      }
}

ZERO_DIST_TEST(ZeroEquivalence, ParameterUnusedOnSomeRanks) {
  const Task task = toy_uneven_task(2);
  const int n = world_size(), steps = 3;
  const RunResult ref = run_reference(task, base_options(), steps, n * 2);
  for (int stage : {0, 1, 2})
    for (std::int64_t bucket : {std::int64_t{5}, std::int64_t{1000}})
      for (bool overlap : {false, true}) {
        ZeroOptions o = base_options();
        o.stage = stage;
        o.reduce_bucket_size = bucket;
        o.overlap_comm = overlap;
        const RunResult z = run_zero(task, o, steps, 2);
        expect_params_close(z, ref, kRtol, describe(o));
      }
}

ZERO_DIST_TEST(ZeroEquivalence, ModelSmallerThanWorld) {
  const Task task = tiny_task();
  const int n = world_size(), steps = 4;
  const RunResult ref = run_reference(task, base_options(), steps, n * 2);
  for (int stage : {0, 1, 2})
    for (bool rs : {true, false}) {
      ZeroOptions o = base_options();
      o.stage = stage;
      o.reduce_scatter = rs;
      o.reduce_bucket_size = 2;
      o.allgather_bucket_size = 2;
      const RunResult z = run_zero(task, o, steps, 2);
      expect_params_close(z, ref, kRtol, describe(o));
    }
  auto model = task.make();
  ZeroOptimizer opt(model->named_parameters(), test_world(), base_options());
  EXPECT_EQ(opt.layout().numel(), 3);
  EXPECT_EQ(opt.layout().padded_numel(), 2 * n * ((3 + 2 * n - 1) / (2 * n)));
}

ZERO_DIST_TEST(ZeroEquivalence, ToyLayoutAndTiedParameter) {
  auto model = toy_task().make();
  ZeroOptimizer opt(model->named_parameters(), test_world(), base_options());
  const FlatLayout& l = opt.layout();
  ASSERT_EQ(l.params().size(), 6u);  // gain b1 w1 empty w2 extra: frozen excluded, head.weight tied
  EXPECT_EQ(l.numel(), 77);
  EXPECT_EQ(l.params()[2].name, "w1");
  EXPECT_EQ(l.params()[2].offset, 14);
  EXPECT_EQ(l.params()[3].numel, 0);
  // The module's tensors are views of the flat buffer; the tied alias is the same tensor.
  auto& toy = static_cast<Toy&>(*model);
  EXPECT_EQ(toy.w1.storage(), opt.flat_params().storage());
  EXPECT_EQ(toy.w1.offset(), 14);
  EXPECT_TRUE(toy.head->weight.same(toy.w2));
  EXPECT_NE(toy.frozen.storage(), opt.flat_params().storage());
}

// =====================================================================================================
// Gradient norm and clipping
// =====================================================================================================

ZERO_DIST_TEST(ZeroClipping, NormFromPartitionsEqualsFullGradientNorm) {
  // One step each; the reference norm is optim::clip_grad_norm over one process's full gradient.
  const Task task = gpt_task();
  const int n = world_size();
  ZeroOptions o = base_options();
  o.gradient_clipping = 0.0f;
  const RunResult ref = run_reference(task, o, 1, 3 * n);
  for (int stage : {0, 1, 2})
    for (bool rs : {true, false}) {
      o.stage = stage;
      o.reduce_scatter = rs;
      o.reduce_bucket_size = 29;
      const RunResult z = run_zero(task, o, 1, 3);
      ASSERT_EQ(z.norms.size(), 1u);
      EXPECT_NEAR(z.norms[0], ref.norms[0], 1e-6 * ref.norms[0]) << describe(o);
      EXPECT_GT(z.norms[0], 0.0);
    }
  // Clipping binds at a small threshold and the runs still agree.
  o.gradient_clipping = 0.05f;
  o.stage = 2;
  o.reduce_scatter = true;
  ASSERT_GT(ref.norms[0], 0.05);
  const RunResult clipped_ref = run_reference(task, o, 3, 3 * n);
  const RunResult clipped = run_zero(task, o, 3, 3);
  expect_params_close(clipped, clipped_ref, kRtol, "clip 0.05, " + describe(o));
}

// =====================================================================================================
// fp16: loss scaling, overflow, hysteresis
// =====================================================================================================

ZeroOptions fp16_options(int stage) {
  ZeroOptions o = base_options();
  o.stage = stage;
  o.dtype = DType::f16;
  o.reduce_bucket_size = 64;
  o.fp16.initial_scale_power = 10;
  o.fp16.loss_scale_window = 1000;
  o.fp16.hysteresis = 2;
  return o;
}

// Registers (before the optimizer's own hook) a hook that writes +inf into the first gradient element
// of the model's LAST parameter on rank 0 when *flag is set. The last parameter sits in the last
// partition, so with N > 1 the rank that injects is not the rank that finds the overflow.
std::function<void(nn::Module&)> inject_inf(std::shared_ptr<bool> flag) {
  return [flag](nn::Module& m) {
    Tensor last = m.named_parameters().back().tensor;
    autograd::register_post_accumulate_grad_hook(last, [flag](Tensor& p) {
      if (!*flag || world_rank() != 0) return;
      Tensor g = p.grad();
      g.as_strided({1}, {1}, g.offset()).fill_(std::numeric_limits<float>::infinity());
    });
  };
}

ZERO_DIST_TEST(ZeroFp16, OverflowOnOneRankSkipsEverywhereWithHysteresis) {
  const Task task = gpt_task();
  for (int stage : {0, 1, 2}) {
    ZeroOptions o = fp16_options(stage);
    auto flag = std::make_shared<bool>(false);
    auto comm = test_world();
    const int rank = comm->rank();
    auto model = task.make();
    inject_inf(flag)(*model);
    ZeroOptimizer opt(model->named_parameters(), comm, o);
    optim::LossScaler mirror(o.fp16);
    const std::vector<bool> overflow = {false, true, true, false, true, false};
    std::vector<std::vector<float>> before, after;
    std::vector<char> applied;
    std::vector<float> scales, expected_scales;
    for (std::size_t s = 0; s < overflow.size(); ++s) {
      *flag = overflow[s];
      before.push_back(opt.flat_params().to_vector());
      opt.backward(task.loss(*model, static_cast<int>(s), rank * 2, 2));
      applied.push_back(opt.step());
      after.push_back(opt.flat_params().to_vector());
      mirror.update(overflow[s]);
      scales.push_back(opt.loss_scale());
      expected_scales.push_back(mirror.scale());
    }
    for (std::size_t s = 0; s < overflow.size(); ++s) {
      EXPECT_EQ(applied[s] != 0, !overflow[s]) << "stage " << stage << " step " << s;
      if (overflow[s])
        EXPECT_EQ(after[s], before[s]) << "stage " << stage << ": skipped step " << s << " changed weights";
      else
        EXPECT_NE(after[s], before[s]) << "stage " << stage << " step " << s;
    }
    EXPECT_EQ(scales, expected_scales) << "stage " << stage;
    // Hysteresis 2: the first overflow keeps the scale, the second halves it; the third (after a clean
    // step, hysteresis not refilled) halves it again.
    EXPECT_EQ(scales, (std::vector<float>{1024, 1024, 512, 512, 256, 256})) << "stage " << stage;
    EXPECT_EQ(opt.skipped_steps(), 3);
    EXPECT_EQ(opt.steps(), 3);
  }
}

ZERO_DIST_TEST(ZeroFp16, DynamicScaleEqualsStaticScaleAcrossSkipsAndRises) {
  // Power-of-two loss scales commute with fp16 rounding (away from subnormals), so a dynamic run whose
  // scale rises every other step and that skips two overflowed steps must give the weights of a
  // static-scale run that never sees those two batches. A step that unscaled with the post-update scale
  // (DeepSpeed's post-update scale) would halve the gradient on every rising step and fail this.
  const Task task = gpt_task();
  const std::vector<bool> overflow = {false, false, true, false, false, true, false, false};
  for (int stage : {0, 1, 2}) {
    ZeroOptions dyn = fp16_options(stage);
    dyn.fp16.loss_scale_window = 1;
    dyn.fp16.hysteresis = 1;
    dyn.fp16.initial_scale_power = 12;
    auto flag = std::make_shared<bool>(false);
    auto comm = test_world();
    const int rank = comm->rank();
    auto model = task.make();
    inject_inf(flag)(*model);
    ZeroOptimizer opt(model->named_parameters(), comm, dyn);
    std::vector<float> used;
    for (std::size_t s = 0; s < overflow.size(); ++s) {
      *flag = overflow[s];
      used.push_back(opt.loss_scale());
      opt.backward(task.loss(*model, static_cast<int>(s), rank * 2, 2));
      opt.step();
    }
    const RunResult dynamic = snapshot(*model);
    // The scale really moved both ways: 4096 4096 8192 [overflow] 4096 4096 8192 [overflow] 4096 4096.
    EXPECT_EQ(used, (std::vector<float>{4096, 4096, 8192, 4096, 4096, 8192, 4096, 4096})) << "stage " << stage;

    ZeroOptions fixed = dyn;
    fixed.fp16.loss_scale = 16384.0f;
    const RunResult stat =
        run_zero(task, fixed, static_cast<int>(overflow.size()), 2, {}, [&](int s) { return overflow[s]; });
    expect_params_close(dynamic, stat, 1e-6, "dynamic vs static, stage " + std::to_string(stage));
  }
}

ZERO_DIST_TEST(ZeroFp16, UpdatesMatchFp32WhenTheScaleRises) {
  // AdamW with beta1 = beta2 = 0 and eps = 1 updates by lr·g/(|g| + 1), nearly linear in g, so each
  // step's update shows whether the gradient was unscaled by the right factor: an fp16 run whose scale
  // doubles after every step must move the weights like fp32 to within fp16 noise (a 2× unscaling error
  // would be a 50% difference on a rising step).
  const int n = world_size(), steps = 4;
  ZeroOptions o = fp16_options(2);
  o.fp16.loss_scale_window = 1;
  o.fp16.initial_scale_power = 8;
  o.adam.beta1 = 0.0f;
  o.adam.beta2 = 0.0f;
  o.adam.eps = 1.0f;
  o.adam.lr = 1.0f;
  o.weight_decay = 0.0f;
  o.gradient_clipping = 0.0f;
  const Task task16 = gpt_task(harness::tiny_gpt_config(), /*round_to_f16=*/true);
  for (int stage : {1, 2}) {
    o.stage = stage;
    RunResult prev16 = snapshot(*task16.make()), prev32 = prev16;
    for (int s = 1; s <= steps; ++s) {
      const RunResult r16 = run_zero(task16, o, s, 2);
      ZeroOptions o32 = o;
      o32.dtype = DType::f32;
      const RunResult r32 = run_reference(task16, o32, s, 2 * n);
      double diff = 0, ref = 0;
      for (std::size_t i = 0; i < r16.params.size(); ++i)
        for (std::size_t j = 0; j < r16.params[i].size(); ++j) {
          const double d16 = double(r16.params[i][j]) - prev16.params[i][j];
          const double d32 = double(r32.params[i][j]) - prev32.params[i][j];
          diff += (d16 - d32) * (d16 - d32);
          ref += d32 * d32;
        }
      EXPECT_LT(std::sqrt(diff / ref), 0.05)
          << "stage " << stage << ", step " << s << " (loss scale " << r16.scales.back() << ")";
      EXPECT_TRUE(std::all_of(r16.applied.begin(), r16.applied.end(), [](char a) { return a != 0; }));
      prev16 = r16;
      prev32 = r32;
    }
  }
}

ZERO_DIST_TEST(ZeroFp16, Bf16RunsWithoutLossScaling) {
  const Task task = gpt_task(harness::tiny_gpt_config(), true);
  ZeroOptions o = base_options();
  o.stage = 2;
  o.dtype = DType::bf16;
  auto model = task.make();
  ZeroOptimizer opt(model->named_parameters(), test_world(), o);
  EXPECT_EQ(opt.loss_scale(), 1.0f);
  EXPECT_EQ(opt.flat_params().dtype(), DType::bf16);
  opt.backward(task.loss(*model, 0, world_rank() * 2, 2));
  EXPECT_TRUE(opt.step());
  EXPECT_TRUE(std::isfinite(opt.last_grad_norm()));
}

// =====================================================================================================
// Traffic (ledger) and memory
// =====================================================================================================

ZERO_DIST_TEST(ZeroLedger, PerStepBytesMatchTheClosedForms) {
  const Task task = gpt_task();
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  for (DType dt : {DType::f32, DType::f16}) {
    auto one_step = [&](int stage, bool rs) {
      ZeroOptions o = base_options();
      o.stage = stage;
      o.dtype = dt;
      o.reduce_scatter = rs;
      o.reduce_bucket_size = 100;
      o.allgather_bucket_size = 300;
      auto model = task.make();
      ZeroOptimizer opt(model->named_parameters(), comm, o);
      comm->ledger().reset();
      opt.backward(task.loss(*model, 0, rank * 2, 2));
      opt.step();
      Ledger l = comm->ledger();
      return std::make_pair(l, opt.layout().padded_numel());
    };
    const auto [l0, padded] = one_step(0, true);
    const auto [l1, p1] = one_step(1, true);
    const auto [l2, p2] = one_step(2, true);
    const auto [l1x, p1x] = one_step(1, false);
    const auto [l2x, p2x] = one_step(2, false);
    const double psi_bytes = static_cast<double>(padded) * static_cast<double>(dtype_size(dt));
    const double f = static_cast<double>(n - 1) / n;
    const std::string what = std::string("dtype ") + std::string(dtype_name(dt));
    auto near = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b)); };
    // Baseline: all-reduce of every gradient, 2(n-1)/n·Ψ.
    EXPECT_TRUE(near(l0.total(), 2 * f * psi_bytes)) << what << ": " << l0.total();
    EXPECT_TRUE(near(l0[Collective::all_reduce], l0.total())) << what;
    // Stages 1 and 2: reduce-scatter Ψ + all-gather Ψ, "no extra communication".
    for (const Ledger* l : {&l1, &l2}) {
      EXPECT_TRUE(near(l->total(), l0.total())) << what << ": " << l->total() << " vs " << l0.total();
      EXPECT_TRUE(near((*l)[Collective::reduce_scatter], f * psi_bytes)) << what;
      EXPECT_TRUE(near((*l)[Collective::all_gather], f * psi_bytes)) << what;
      EXPECT_EQ((*l)[Collective::all_reduce], 0.0) << what;
    }
    // reduce_scatter = false: all-reduce + all-gather = 3Ψ, 1.5× the baseline.
    for (const Ledger* l : {&l1x, &l2x}) {
      EXPECT_TRUE(near(l->total(), 1.5 * l0.total())) << what << ": " << l->total();
      EXPECT_TRUE(near((*l)[Collective::all_reduce], 2 * f * psi_bytes)) << what;
    }
    // Call counts follow the fixed buckets / chunks.
    const std::int64_t buckets = (padded + 99) / 100, chunks = (padded + 299) / 300;
    EXPECT_EQ(l0.calls[static_cast<int>(Collective::all_reduce)], buckets) << what;
    EXPECT_EQ(l1.calls[static_cast<int>(Collective::reduce_scatter)], buckets) << what;
    EXPECT_EQ(l2.calls[static_cast<int>(Collective::all_gather)], chunks) << what;
    EXPECT_EQ(p1, padded);
    EXPECT_EQ(p2 + p1x + p2x, 3 * padded);
  }
}

ZERO_DIST_TEST(ZeroLedger, Stage2ReducesEveryMicroStep) {
  // GAS micro-steps: stage 2 reduce-scatters GAS·Ψ, stage 1 Ψ (only at the boundary).
  const Task task = gpt_task();
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  for (int stage : {1, 2}) {
    ZeroOptions o = base_options();
    o.stage = stage;
    o.gradient_accumulation_steps = 3;
    auto model = task.make();
    ZeroOptimizer opt(model->named_parameters(), comm, o);
    comm->ledger().reset();
    for (int g = 0; g < 3; ++g) opt.backward(task.loss(*model, 0, (g * n + rank) * 1, 1));
    opt.step();
    const double f = static_cast<double>(n - 1) / n;
    const double psi_bytes = 4.0 * static_cast<double>(opt.layout().padded_numel());
    const double expected = (stage == 2 ? 3 : 1) * f * psi_bytes;
    EXPECT_NEAR(comm->ledger()[Collective::reduce_scatter], expected, 1e-9 * std::max(1.0, expected)) << stage;
  }
}

ZERO_DIST_TEST(ZeroMemory, MatchesThePaperFormulas) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 64;
  cfg.block_size = 16;
  cfg.n_layer = 4;
  cfg.n_head = 2;
  cfg.n_embd = 32;
  cfg.bias = false;
  const Task task = gpt_task(cfg);
  const int n = world_size();
  for (int stage : {0, 1, 2}) {
    ZeroOptions o = base_options();
    o.stage = stage;
    o.dtype = DType::f16;
    o.reduce_bucket_size = 4096;
    auto model = task.make();
    ZeroOptimizer opt(model->named_parameters(), test_world(), o);
    opt.backward(task.loss(*model, 0, world_rank(), 1));
    opt.step();
    const double psi = static_cast<double>(opt.layout().numel());
    ASSERT_GT(psi, 50'000);
    const MemoryBreakdown got = opt.memory(), want = expected_memory(stage, DType::f16, psi, n);
    const double paper = stage == 0 ? 16 * psi : stage == 1 ? 4 * psi + 12 * psi / n : 2 * psi + 14 * psi / n;
    EXPECT_NEAR(want.model_states(), paper, 1e-6 * paper);
    EXPECT_NEAR(got.model_states(), paper, 0.02 * paper) << "stage " << stage;
    EXPECT_NEAR(got.params, want.params, 0.02 * want.params);
    EXPECT_NEAR(got.grads, want.grads, 0.02 * want.grads);
    EXPECT_NEAR(got.optimizer_states, want.optimizer_states, 0.02 * want.optimizer_states);
    // Buckets are reported apart: stages 0/1 reduce in place in the flat gradient; stage 2 holds a pool
    // of reduce_bucket_size buffers.
    if (stage < 2)
      EXPECT_EQ(got.buckets, 0.0);
    else {
      EXPECT_GE(got.buckets, 2.0 * 4096);
      EXPECT_EQ(std::fmod(got.buckets, 2.0 * 4096), 0.0);
    }
  }
  // f32: the flat buffer is the master (K = 8).
  const MemoryBreakdown f32 = expected_memory(1, DType::f32, 1000, 4);
  EXPECT_DOUBLE_EQ(f32.model_states(), 4000 + 4000 + 8000 / 4.0);
}

// =====================================================================================================
// Errors
// =====================================================================================================

ZERO_DIST_TEST(ZeroErrors, BadOptions) {
  const Task task = gpt_task();
  auto model = task.make();
  auto comm = test_world();
  auto with = [&](auto edit) {
    ZeroOptions o = base_options();
    edit(o);
    ZeroOptimizer opt(model->named_parameters(), comm, o);
  };
  EXPECT_THROW(with([](ZeroOptions& o) { o.stage = 4; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.stage = -1; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.stage3_max_live_parameters = 0; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.stage3_prefetch_bucket_size = -1; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.reduce_bucket_size = 0; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.allgather_bucket_size = 0; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.gradient_accumulation_steps = 0; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.gradient_clipping = -1; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.dtype = DType::i64; }), Error);
  // Muon's options on every rank at construction, not mid-step on the ranks that own a matrix.
  EXPECT_THROW(with([](ZeroOptions& o) { o.muon = true, o.muon_momentum = 1.0f; }), Error);
  EXPECT_THROW(with([](ZeroOptions& o) { o.muon = true, o.muon_ns_steps = 0; }), Error);
  EXPECT_THROW(ZeroOptimizer(model->named_parameters(), nullptr, base_options()), Error);
  auto twice = model->named_parameters();
  twice.push_back(twice.front());
  EXPECT_THROW(ZeroOptimizer(twice, comm, base_options()), Error);
  auto frozen = model->named_parameters();
  for (auto& p : frozen) p.tensor.set_requires_grad(false);
  EXPECT_THROW(ZeroOptimizer(frozen, comm, base_options()), Error);
  try {
    with([](ZeroOptions& o) { o.stage = 4; });
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage must be 0, 1, 2 or 3, got 4"), std::string::npos) << e.what();
  }
}

ZERO_DIST_TEST(ZeroErrors, CallOrder) {
  const Task task = gpt_task();
  const int rank = world_rank();
  for (int stage : {0, 1, 2}) {
    auto model = task.make();
    ZeroOptions o = base_options();
    o.stage = stage;
    o.gradient_accumulation_steps = 2;
    ZeroOptimizer opt(model->named_parameters(), test_world(), o);
    EXPECT_THROW(opt.step(), Error);  // no backward yet
    opt.backward(task.loss(*model, 0, rank, 1));
    EXPECT_THROW(opt.step(), Error);  // 1 of 2
    opt.backward(task.loss(*model, 0, rank + world_size(), 1));
    EXPECT_THROW(opt.backward(task.loss(*model, 0, rank, 1)), Error);  // a third before step()
    EXPECT_TRUE(opt.step());
    // A plain loss.backward() bypasses the optimizer: its hooks refuse.
    EXPECT_THROW(task.loss(*model, 1, rank, 1).backward(), Error);
  }
}

ZERO_DIST_TEST(ZeroErrors, GradientComputedTwiceInOneBackward) {
  // A second, nested backward (run from a user hook) reaches a parameter whose gradient the outer
  // backward also computes. Stage 1 before the accumulation boundary issues no collective, so the
  // error is purely local.
  const Task task = gpt_task();
  auto model = task.make();
  auto params = model->named_parameters();
  Tensor first = params.front().tensor, last = params.back().tensor;
  auto side = std::make_shared<Tensor>();
  autograd::register_post_accumulate_grad_hook(last, [side](Tensor&) {
    if (side->defined()) {
      Tensor s = *side;
      *side = Tensor();
      autograd::backward(s);
    }
  });
  ZeroOptions o = base_options();
  o.gradient_accumulation_steps = 2;
  ZeroOptimizer opt(model->named_parameters(), test_world(), o);
  *side = sum(first);
  try {
    opt.backward(task.loss(*model, 0, world_rank(), 1));
    ADD_FAILURE() << "no error for a gradient computed twice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("computed twice"), std::string::npos) << e.what();
  }
}

// =====================================================================================================
// Stage 3: parameters partitioned, gathered on use
// =====================================================================================================

// Stage 3 keeps the flat layout, buckets and partitions of stage 2 and changes only where parameters
// live, so every loss, norm and parameter must be bitwise those of stage 2.
ZERO_DIST_TEST(ZeroStage3, BitwiseEqualToStage2) {
  const Task task = gpt_task();
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (int gas : {1, 3})
      for (bool overlap : {false, true}) {
        ZeroOptions o = dt == DType::f16 ? fp16_options(2) : base_options();
        o.stage = 2;
        o.dtype = dt;
        o.gradient_accumulation_steps = gas;
        o.overlap_comm = overlap;
        const RunResult two = run_zero(task, o, 3, 2);
        o.stage = 3;
        for (std::int64_t prefetch : {std::int64_t{0}, std::int64_t{1'000'000}}) {
          o.stage3_prefetch_bucket_size = prefetch;
          const RunResult three = run_zero(task, o, 3, 2);
          const std::string what = describe(o) + ", " + std::string(dtype_name(dt)) + ", prefetch " +
                                   std::to_string(prefetch);
          EXPECT_EQ(three.losses, two.losses) << what;
          EXPECT_EQ(three.norms, two.norms) << what;
          EXPECT_EQ(three.params, two.params) << what;
          EXPECT_EQ(three.applied, two.applied) << what;
        }
      }
  // int8 quantized gradients with error feedback: stage 3 reduces exactly as stage 2 does.
  ZeroOptions q = base_options();
  q.stage = 2;
  q.quantized_gradients_block = 16;
  q.quantized_gradients_error_feedback = true;
  const RunResult two = run_zero(task, q, 3, 2);
  q.stage = 3;
  const RunResult three = run_zero(task, q, 3, 2);
  EXPECT_EQ(three.losses, two.losses) << "int8";
  EXPECT_EQ(three.params, two.params) << "int8";
}

ZERO_DIST_TEST(ZeroStage3, TiedParameterAndToyLayoutMatchOneProcess) {
  // The toy has every edge shape and a parameter used twice; stage 3 against plain AdamW.
  const Task task = toy_task();
  const int n = world_size();
  ZeroOptions o = base_options();
  o.stage = 3;
  const RunResult ref = run_reference(task, o, 3, n * 2);
  const RunResult z = run_zero(task, o, 3, 2);
  expect_params_close(z, ref, kRtol, describe(o));
  expect_norms_close(z, ref, 1e-6, describe(o));
}

// stage3_max_live_parameters bounds the gathered elements alive at once, prefetches included, even
// with a prefetch budget that would fetch the whole model; the results do not change.
ZERO_DIST_TEST(ZeroStage3, LiveGatheredParametersNeverExceedTheBound) {
  const Task task = gpt_task();
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  ZeroOptions o = base_options();
  o.stage = 3;
  o.stage3_prefetch_bucket_size = 1'000'000;
  auto probe = task.make();
  const ZeroPlan plan = plan_zero(
      [&] {
        std::vector<FlatLayout::Entry> e;
        for (const auto& p : probe->named_parameters()) e.push_back({p.name, p.tensor.shape(), p.decay});
        return e;
      }(),
      n, o);
  std::int64_t largest = 0, all = 0;
  for (const GatherUnit& u : plan.units) {
    largest = std::max(largest, u.size());
    all += u.size();
  }
  ASSERT_GE(plan.units.size(), 4u);  // wte, wpe, h.0, h.1, ln_f
  std::vector<float> unbounded_losses;
  for (std::int64_t bound : {all, largest + largest / 2, largest}) {
    o.stage3_max_live_parameters = bound;
    auto model = task.make();
    ZeroOptimizer opt(model->named_parameters(), comm, o);
    std::vector<float> losses;
    for (int s = 0; s < 3; ++s) {
      const Tensor loss = task.loss(*model, s, rank * 2, 2);
      losses.push_back(loss.item());
      opt.backward(loss);
      opt.step();
    }
    const PartitionedParameters* pp = opt.partitioned();
    ASSERT_NE(pp, nullptr);
    EXPECT_LE(pp->max_live_elements(), bound) << "bound " << bound;
    EXPECT_GE(pp->max_live_elements(), largest) << "bound " << bound;
    EXPECT_EQ(pp->live_elements(), 0) << "something stayed gathered after the step";
    if (bound == all)
      unbounded_losses = losses;
    else
      EXPECT_EQ(losses, unbounded_losses) << "bound " << bound;
  }
  o.stage3_max_live_parameters = largest - 1;
  auto model = task.make();
  try {
    ZeroOptimizer opt(model->named_parameters(), comm, o);
    ADD_FAILURE() << "no error for a bound below the largest unit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage3_max_live_parameters"), std::string::npos) << e.what();
  }
}

// The ZeRO paper's 1.5x (§7.2.2): per step one reduce-scatter of the gradient and two all-gathers of
// the parameters, against stage 0's all-reduce; and model states of 16Ψ/N.
ZERO_DIST_TEST(ZeroStage3, TrafficIsOneAndAHalfTimesTheBaselineAndMemorySixteenPsiOverN) {
  const Task task = gpt_task();
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  auto one_step = [&](int stage) {
    ZeroOptions o = base_options();
    o.stage = stage;
    o.dtype = DType::bf16;
    auto model = task.make();
    ZeroOptimizer opt(model->named_parameters(), comm, o);
    comm->ledger().reset();
    opt.backward(task.loss(*model, 0, rank * 2, 2));
    opt.step();
    return std::make_tuple(comm->ledger(), opt.layout().numel(), opt.layout().padded_numel(), opt.memory());
  };
  const auto [l0, psi, padded, m0] = one_step(0);
  const auto [l3, psi3, padded3, m3] = one_step(3);
  const double f = static_cast<double>(n - 1) / n, b = 2.0;
  auto near = [](double a, double e) { return std::abs(a - e) <= 1e-9 * std::max(1.0, std::abs(e)); };
  EXPECT_TRUE(near(l3[Collective::reduce_scatter], f * b * static_cast<double>(padded))) << l3.to_json().dump();
  // Every unit twice (the tied embedding: twice in the forward, none in the backward).
  EXPECT_TRUE(near(l3[Collective::all_gather], 2 * f * b * static_cast<double>(psi))) << l3.to_json().dump();
  EXPECT_EQ(l3[Collective::all_reduce], 0.0);
  if (n > 1) {
    EXPECT_NEAR(l3.total() / l0.total(), 1.5, 1.5 * static_cast<double>(padded - psi) / static_cast<double>(psi));
  }
  // Model states: (2 + 2 + 12)Ψ/N, each part measured from the buffers.
  const double per_rank = static_cast<double>(padded) / n;
  EXPECT_EQ(m3.params, 2 * per_rank);
  EXPECT_EQ(m3.grads, 2 * per_rank);
  EXPECT_EQ(m3.optimizer_states, 12 * per_rank);
  EXPECT_NEAR(expected_memory(3, DType::bf16, static_cast<double>(psi), n).model_states(),
              16.0 * static_cast<double>(psi) / n, 1e-9 * static_cast<double>(psi));
  EXPECT_GT(m3.gathered, 0.0);
  EXPECT_LE(m3.gathered, b * static_cast<double>(psi));
}

ZERO_DIST_TEST(ZeroStage3, ReadingAParameterOutsideItsLayerGathersIt) {
  const Task task = gpt_task();
  auto model = task.make();
  ZeroOptions o = base_options();
  o.stage = 3;
  ZeroOptimizer opt(model->named_parameters(), test_world(), o);
  const Tensor w = model->named_parameters().front().tensor;
  // Freed: the read joins the schedule (every rank reads here) and sees the values rank 0 started from
  // (every rank builds the same model from one seed).
  const std::vector<float> expected = task.make()->named_parameters().front().tensor.to_vector();
  EXPECT_EQ(w.to_vector(), expected);
  opt.gather_parameters();
  EXPECT_EQ(w.to_vector(), expected);
}

ZERO_DIST_TEST(ZeroStage3, GatheredParametersOutliveTheOptimizer) {
  const Task task = gpt_task();
  auto model = task.make();
  ZeroOptions o = base_options();
  o.stage = 3;
  {
    ZeroOptimizer opt(model->named_parameters(), test_world(), o);
    opt.gather_parameters();
  }
  EXPECT_EQ(snapshot(*model).params, snapshot(*task.make()).params);
}

// =====================================================================================================
// Stage 3 under rank-dependent module use (Note [One schedule] in partitioned_parameters.cpp)
// =====================================================================================================

// What a rank's forward runs depends on the rank, the step and the micro-step: the patterns of public
// ZeRO-3 bug reports (mixture-of-experts routing, a rank that runs none, a branch whose output only
// some ranks use, a layer applied twice, weights read outside their layer, a zero-element parameter).
enum class Use { routing, idle_rank, gradient_on_some_ranks, applied_twice, outside_reads, all };

std::string use_name(Use u) {
  switch (u) {
    case Use::routing: return "routing";
    case Use::idle_rank: return "idle rank";
    case Use::gradient_on_some_ranks: return "gradient on some ranks";
    case Use::applied_twice: return "applied twice";
    case Use::outside_reads: return "outside reads";
    case Use::all: return "all";
  }
  return "?";
}

// A module whose one parameter has no elements.
class Blank : public nn::Module {
 public:
  Blank() { weight = register_parameter("weight", Tensor::zeros({0, 3}), true); }
  Tensor total() const { return sum(compute(weight)); }
  Tensor weight;
};

class Routed : public nn::Module {
 public:
  static constexpr std::int64_t D = 6, K = 4, C = 3;
  explicit Routed(Generator& gen) {
    embed = register_module("embed", std::make_shared<nn::Linear>(D, D, true, gen, 0.4f));
    for (int k = 0; k < K; ++k)
      experts.push_back(
          register_module("experts." + std::to_string(k), std::make_shared<nn::Linear>(D, D, false, gen, 0.4f)));
    gate = register_module("gate", std::make_shared<nn::Linear>(D, D, false, gen, 0.4f));
    blank = register_module("blank", std::make_shared<Blank>());
    head = register_module("head", std::make_shared<nn::Linear>(D, C, true, gen, 0.4f));
  }
  std::shared_ptr<nn::Linear> embed, gate, head;
  std::vector<std::shared_ptr<nn::Linear>> experts;
  std::shared_ptr<Blank> blank;
};

// The sum of a parameter's values read outside any layer (to_vector: the storage's guard at stage 3).
float outside_sum(const Tensor& p) {
  double s = 0;
  for (float v : p.to_vector()) s += v;
  return static_cast<float>(s);
}

Task routed_task(Use use) {
  Task t;
  t.make = [] {
    Generator gen(11);
    return std::static_pointer_cast<nn::Module>(std::make_shared<Routed>(gen));
  };
  t.loss = [use](nn::Module& m, int step, std::int64_t row0, std::int64_t rows) {
    auto& r = static_cast<Routed&>(m);
    const std::uint64_t who = static_cast<std::uint64_t>(row0 / rows);  // micro-step · N + rank
    const bool all = use == Use::all;
    const HashedBatch b = hashed_batch(step, row0, rows, Routed::D, Routed::C, 77);
    const Tensor& x = b.x;
    float outside = 0;
    const bool reads = use == Use::outside_reads || all;
    if (reads) outside += outside_sum(r.embed->weight);  // freed here at stage 3
    Tensor h = gelu(r.embed->forward(x));
    if (reads) outside += outside_sum(r.embed->weight);  // gathered: the unit in use
    if (use == Use::routing || all) {  // one expert, sometimes two, chosen per rank, step and micro-step
      const auto k = static_cast<std::size_t>(hash01(step, who, 5) * Routed::K);
      h = r.experts[k]->forward(h);
      if (hash01(step, who, 6) < 0.4) h = gelu(r.experts[(k + 2) % Routed::K]->forward(h));
    }
    if ((use == Use::idle_rank || all) && !(who % 2 == 1 && step % 2 == 0))  // odd ranks idle on even steps
      h = r.experts[static_cast<std::size_t>(step) % Routed::K]->forward(h);
    if (use == Use::gradient_on_some_ranks || all) {  // run everywhere, used on even ranks only
      const Tensor g = r.gate->forward(h);
      if (who % 2 == 0) h = add(h, g);
    }
    if (use == Use::applied_twice || all) {
      h = r.experts[1]->forward(h);
      h = gelu(r.gate->forward(h));
      h = r.experts[1]->forward(h);
    }
    if (reads) outside += outside_sum(r.head->weight);  // prefetched (in flight) or freed, by options
    Tensor logits = add(r.head->forward(h), r.blank->total());
    if (reads) logits = add(logits, Tensor::full({1}, 1e-3f * outside, logits.dtype()));
    if (reads && r.embed->weight.dtype() == DType::f32)  // an op on a parameter outside its layer
      return add(cross_entropy(logits, b.y),
                 mul(sum(mul(r.embed->weight, r.embed->weight)), 1e-3f));
    return cross_entropy(logits, b.y);
  };
  return t;
}

// Every pattern × dtype × options (bucket size, prefetch, live bound, overlap, GAS): stage 3 bitwise
// equal to stage 2 (which gathers nothing, so cannot be confused by what each rank runs), and stages 0
// and 1 within rounding of it.
ZERO_DIST_TEST(ZeroStage3Schedule, RankDependentUseIsBitwiseStage2) {
  struct Options {
    std::int64_t bucket, prefetch, live;
    bool overlap;
    int gas;
  };
  const std::int64_t largest = Routed::D * Routed::D + Routed::D;  // embed: the largest unit
  const Options table[] = {{100, 0, 1'000'000'000, false, 1},
                           {100, 1'000'000, 1'000'000'000, true, 3},
                           {7, 50, largest, false, 1},
                           {1'000'000, 1'000'000, largest, true, 2}};
  for (Use use : {Use::routing, Use::idle_rank, Use::gradient_on_some_ranks, Use::applied_twice, Use::outside_reads,
                  Use::all}) {
    const Task task = routed_task(use);
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (const Options& t : table) {
        ZeroOptions o = dt == DType::f16 ? fp16_options(2) : base_options();
        o.stage = 2;
        o.dtype = dt;
        o.reduce_bucket_size = t.bucket;
        o.overlap_comm = t.overlap;
        o.gradient_accumulation_steps = t.gas;
        const RunResult two = run_zero(task, o, 3, 2);
        o.stage = 3;
        o.stage3_prefetch_bucket_size = t.prefetch;
        o.stage3_max_live_parameters = t.live;
        const RunResult three = run_zero(task, o, 3, 2);
        const std::string what = use_name(use) + ", " + describe(o) + ", " + std::string(dtype_name(dt)) +
                                 ", prefetch " + std::to_string(t.prefetch) + ", live " + std::to_string(t.live);
        EXPECT_EQ(three.losses, two.losses) << what;
        EXPECT_EQ(three.norms, two.norms) << what;
        EXPECT_EQ(three.params, two.params) << what;
        EXPECT_EQ(three.applied, two.applied) << what;
        if (dt != DType::f32 || t.gas != 1) continue;
        for (int stage : {0, 1}) {
          o.stage = stage;
          const RunResult other = run_zero(task, o, 3, 2);
          expect_params_close(other, two, kRtol, use_name(use) + ", stage " + std::to_string(stage));
        }
      }
  }
}

// The schedule is agreed, and learned: after the first step a model whose ranks all read the same units
// needs four rounds a step, and its gathers are those of the units it reads (GPT: every unit twice).
ZERO_DIST_TEST(ZeroStage3Schedule, LearnedScheduleCostsFourRoundsAStep) {
  const Task task = gpt_task();
  auto model = task.make();
  ZeroOptions o = base_options();
  o.stage = 3;
  auto comm = test_world();
  ZeroOptimizer opt(model->named_parameters(), comm, o);
  const PartitionedParameters& p = *opt.partitioned();
  const int n = comm->world_size(), rank = comm->rank();
  auto train_step = [&](int s) {
    opt.backward(task.loss(*model, s, rank * 2, 2));
    opt.step();
  };
  train_step(0);
  const std::size_t units = opt.plan().units.size();
  // GPT reads wte, wpe, each block, lnf, then wte again for the tied head; backward needs all but wte,
  // which the forward's last read left gathered.
  EXPECT_EQ(p.schedule(false).size(), units + 1);
  EXPECT_EQ(p.schedule(true).size(), units - 1);
  const std::int64_t rounds = p.rounds(), gathers = p.gathers();
  train_step(1);
  // forward: a start round and a last round; backward: a last round; step: one start round.
  EXPECT_EQ(p.rounds() - rounds, 4) << n << " ranks";
  EXPECT_EQ(p.gathers() - gathers, static_cast<std::int64_t>(2 * units));
}

// A layer composed of ops whose backward runs nodes after the one that gives its weight a gradient:
// y = (x · w.detach()) · w. The second product's node gives w its gradient first, so the unit is freed
// (Note [Nodes after the last gradient]); the first product's node still reads w's values (for x's
// gradient), through the detached view, and must get them gathered, not freed memory.
class ComposedScale : public nn::Module {
 public:
  static constexpr std::int64_t D = 6;
  explicit ComposedScale(Generator& gen) {
    weight = register_parameter("weight", Tensor::randn({D}, gen, 1.0f, 0.2f), false);
  }
  Tensor forward(const Tensor& x) const {
    const Tensor w = compute(weight);
    return mul(gelu(mul(x, w.detach())), w);
  }
  Tensor weight;
};

class Composed : public nn::Module {
 public:
  explicit Composed(Generator& gen) {
    first = register_module("first", std::make_shared<ComposedScale>(gen));
    second = register_module("second", std::make_shared<ComposedScale>(gen));
  }
  std::shared_ptr<ComposedScale> first, second;
};

Task composed_task() {
  Task t;
  t.make = [] {
    Generator gen(5);
    return std::static_pointer_cast<nn::Module>(std::make_shared<Composed>(gen));
  };
  t.loss = [](nn::Module& m, int step, std::int64_t row0, std::int64_t rows) {
    auto& c = static_cast<Composed&>(m);
    const HashedBatch b = hashed_batch(step, row0, rows, ComposedScale::D, ComposedScale::D, 31);
    return cross_entropy(c.second->forward(c.first->forward(b.x)), b.y);
  };
  return t;
}

// Layers composed of ops (GPT with RMSNorm; the detached read above): every unit gathered twice a step
// (before its forward and its backward), and the results bitwise those of stage 2.
ZERO_DIST_TEST(ZeroStage3Schedule, ComposedLayersGatherEachUnitTwiceAStep) {
  nn::GPTConfig cfg = harness::tiny_gpt_config();
  cfg.norm = "rmsnorm";
  for (const Task& task : {gpt_task(cfg), composed_task()}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      ZeroOptions o = base_options();
      o.dtype = dt;
      o.stage = 2;
      const RunResult two = run_zero(task, o, 3, 2);
      o.stage = 3;
      const RunResult three = run_zero(task, o, 3, 2);
      EXPECT_EQ(three.losses, two.losses) << dtype_name(dt);
      EXPECT_EQ(three.params, two.params) << dtype_name(dt);
    }
    auto model = task.make();
    ZeroOptions o = base_options();
    o.stage = 3;
    auto comm = test_world();
    ZeroOptimizer opt(model->named_parameters(), comm, o);
    const int rank = comm->rank();
    opt.backward(task.loss(*model, 0, rank * 2, 2));
    opt.step();
    const std::int64_t gathers = opt.partitioned()->gathers();
    opt.backward(task.loss(*model, 1, rank * 2, 2));
    opt.step();
    // GPT reads wte again for its tied head (one gather more in the forward, one fewer in the backward).
    // The composed model's second unit, left gathered by the forward, is freed after its weight's
    // gradient and gathered again by the detached read (the guard): two a unit as well.
    EXPECT_EQ(opt.partitioned()->gathers() - gathers, static_cast<std::int64_t>(2 * opt.plan().units.size()));
  }
}

// A program the schedule cannot absorb (rank 1 gathers everything for sampling while the others run
// their backward) fails on every rank with the one line that names both sides, not a hang.
ZERO_DIST_TEST(ZeroStage3Schedule, RanksOutOfStepFailWithOneLine) {
  if (world_size() == 1) return;
  const Task task = gpt_task();
  auto model = task.make();
  ZeroOptions o = base_options();
  o.stage = 3;
  ZeroOptimizer opt(model->named_parameters(), test_world(), o);
  try {
    if (world_rank() == 1)
      opt.gather_parameters();
    else
      opt.backward(task.loss(*model, 0, world_rank() * 2, 2));
    ADD_FAILURE() << "ranks out of step went on";
  } catch (const CollectiveMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 issued control all_reduce 'stage-3 schedule round (backward)'"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 issued all_gather 'gather of wte'"), std::string::npos) << e.what();
    if (world_size() == 2) {  // the line docs/zero.md §8 quotes
      EXPECT_EQ(std::string(e.what()),
                "collective #16 at step 1: rank 0 issued control all_reduce 'stage-3 schedule round (backward)' "
                "(counts 8; f32) but rank 1 issued all_gather 'gather of wte' (counts 88,0; f32) (every rank must "
                "issue the same collectives in the same order)");
    }
  }
}

}  // namespace
}  // namespace zero::dist
