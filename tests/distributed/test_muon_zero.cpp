// Muon (optim/muon.h) inside ZeroOptimizer, against the one-process optim::Muon on the same global batch
// (an independent path: its own gradients from one backward, clip_grad_norm, Muon::step). Runs under
// mpirun with 1-4 ranks and in the in-process runner (tests/distributed/world.h).
#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/check.h"
#include "distributed/comm/inprocess_communicator.h"
#include "distributed/zero/zero_optimizer.h"
#include "nn/gpt.h"
#include "optim/clip.h"
#include "optim/muon.h"
#include "tests/distributed/tiny_gpt.h"
#include "tests/distributed/world.h"

namespace zero::dist {
namespace {

double unit_hash(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t h = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full ^
                    c * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 53);
}


std::unique_ptr<nn::GPT> make_model(const nn::GPTConfig& cfg = harness::tiny_gpt_config()) {
  Generator gen(42);
  return std::make_unique<nn::GPT>(cfg, gen);
}

// Loss of rows [row0, row0 + rows) of training step `step`'s global batch.
Tensor batch_loss(nn::GPT& m, int step, std::int64_t row0, std::int64_t rows) {
  const nn::GPTConfig c = harness::tiny_gpt_config();
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rows * c.block_size)), tgt(idx.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < c.block_size; ++i) {
      const std::size_t k = static_cast<std::size_t>(r * c.block_size + i);
      idx[k] = static_cast<std::int64_t>(unit_hash(step, row0 + r, i) * c.vocab_size);
      tgt[k] = static_cast<std::int64_t>(unit_hash(step + 1000, row0 + r, i) * c.vocab_size);
    }
  return m.loss(Tensor::from_indices(idx, {rows, c.block_size}), Tensor::from_indices(tgt, {rows, c.block_size}));
}

ZeroOptions muon_options(int stage) {
  ZeroOptions o;
  o.stage = stage;
  o.dtype = DType::f32;
  o.reduce_bucket_size = 100;
  o.allgather_bucket_size = 100;
  o.adam.lr = 1e-2f;
  o.adam.beta2 = 0.99f;
  o.weight_decay = 0.1f;
  o.gradient_clipping = 1.0f;
  o.muon = true;
  return o;
}

std::vector<std::vector<float>> snapshot(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.tensor.to_vector());
  return out;
}

// ZeRO on this job's ranks: b rows per rank per micro-step.
std::vector<std::vector<float>> run_zero(const ZeroOptions& o, int steps, std::int64_t b,
                                         std::shared_ptr<Communicator> comm = test_world(),
                                         const nn::GPTConfig& cfg = harness::tiny_gpt_config()) {
  const int n = comm->world_size(), rank = comm->rank();
  auto model = make_model(cfg);
  ZeroOptimizer opt(model->named_parameters(), comm, o);
  for (int s = 0; s < steps; ++s) {
    for (int g = 0; g < o.gradient_accumulation_steps; ++g)
      opt.backward(batch_loss(*model, s, (static_cast<std::int64_t>(g) * n + rank) * b, b));
    EXPECT_TRUE(opt.step());
  }
  opt.gather_parameters();
  return snapshot(*model);
}

// One process, optim::Muon over the whole global batch of `rows` rows.
std::vector<std::vector<float>> run_reference(const ZeroOptions& o, int steps, std::int64_t rows,
                                              const nn::GPTConfig& cfg = harness::tiny_gpt_config()) {
  auto model = make_model(cfg);
  std::vector<optim::ParamGroup> muon(1), adamw(2);
  muon[0].weight_decay = adamw[0].weight_decay = o.weight_decay;
  for (const auto& p : model->named_parameters()) {
    if (optim::is_muon_matrix(p.name, p.tensor.shape())) muon[0].params.push_back(p.tensor);
    else adamw[p.decay ? 0 : 1].params.push_back(p.tensor);
  }
  optim::MuonOptions mo;
  mo.lr = o.adam.lr;
  mo.beta1 = o.adam.beta1;
  mo.beta2 = o.adam.beta2;
  mo.eps = o.adam.eps;
  optim::Muon opt(muon, adamw, mo);
  for (int s = 0; s < steps; ++s) {
    batch_loss(*model, s, 0, rows).backward();
    optim::clip_grad_norm(model->parameters(), o.gradient_clipping);
    opt.step();
    opt.zero_grad();
  }
  return snapshot(*model);
}

// Per tensor: max |a - b| <= rtol · max(max |b|, floor).
void expect_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, double rtol,
                  const std::string& what, double floor = 1e-3) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what;
    double diff = 0, scale = floor;
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      diff = std::max(diff, std::abs(static_cast<double>(a[i][j]) - b[i][j]));
      scale = std::max(scale, std::abs(static_cast<double>(b[i][j])));
    }
    EXPECT_LE(diff, rtol * scale) << what << ": parameter " << i << " max |diff| " << diff;
  }
}

// Every stage against one-process Muon. One rank: the same math in the same order, so bitwise. N ranks:
// the gradient is summed in the ring's order instead of one backward's, a rounding difference (bound
// 1e-4 of the largest element) that Newton–Schulz's normalisation does not grow.
ZERO_DIST_TEST(MuonZero, EveryStageTrainsLikeOneProcessMuon) {
  const int n = test_world()->world_size();
  const auto ref = run_reference(muon_options(0), 4, 2 * n);
  for (int stage : {0, 1, 2, 3}) {
    const auto zero = run_zero(muon_options(stage), 4, 2);
    if (n == 1) {
      EXPECT_EQ(zero, ref) << "stage " << stage;
    }
    expect_close(zero, ref, 1e-4, "stage " + std::to_string(stage));
  }
}

// Stages 1, 2 and 3 share the layout and its reduce-scatter, so they agree bitwise with each other in
// every dtype, on any number of ranks; stage 0 (an all-reduce, whose sums run in another order: Note
// [The ring's order] in inprocess_communicator.cpp) within rounding of the model dtype. fp32: 1e-4 of the
// largest element. 16-bit: 5e-2 of the largest element, at least 5e-3, which is some ten units in the
// last place of these matrices (about 0.03): Newton–Schulz brings every singular value of the momentum
// near 1, so the gradient's smallest directions, where a 16-bit sum's rounding lives, reach the update
// at full size. For the norm weights near 1 the bound is as large as three steps' updates, so in 16-bit
// this check holds the matrices, and the bitwise checks and fp32 hold the rest.
ZERO_DIST_TEST(MuonZero, StagesOneToThreeAgreeBitwiseInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<std::vector<std::vector<float>>> runs;
    for (int stage : {0, 1, 2, 3}) {
      ZeroOptions o = muon_options(stage);
      o.dtype = dt;
      runs.push_back(run_zero(o, 3, 2));
    }
    EXPECT_EQ(runs[2], runs[1]) << dtype_name(dt) << ": stage 2 vs 1";
    EXPECT_EQ(runs[3], runs[1]) << dtype_name(dt) << ": stage 3 vs 1";
    const bool f32 = dt == DType::f32;
    expect_close(runs[1], runs[0], f32 ? 1e-4 : 5e-2, std::string(dtype_name(dt)) + " stage 1 vs 0", f32 ? 1e-3 : 0.1);
  }
}

// The plan keeps every Muon matrix inside one partition at stages 1-3, whatever the world size, and the
// matrices of a partition are the ones its rank steps. The partitions tile the buffer in rank order with
// even boundaries, each within half the largest matrix (plus one) of AdamW's r·P, and the buffer holds at
// most one element of padding per matrix more than AdamW's layout of the same parameters.
ZERO_DIST_TEST(MuonZero, EveryMatrixIsOwnedWholeByOneRank) {
  auto model = make_model();
  std::vector<FlatLayout::Entry> entries;
  for (const auto& p : model->named_parameters()) entries.push_back({p.name, p.tensor.shape(), p.decay});
  for (int world : {1, 2, 3, 4, 7}) {
    const ZeroPlan plan = plan_zero(entries, world, muon_options(2));
    const FlatLayout& L = plan.layout;
    const FlatLayout adamw(entries, world);
    std::int64_t matrices = 0, largest = 0, psi = 0, previous_end = 0;
    for (const ParamRange& p : L.params()) {
      EXPECT_GE(p.offset, previous_end) << p.name << ": parameters in order, none overlapping";
      previous_end = p.end();
      psi += p.numel;
      if (!optim::is_muon_matrix(p.name, p.shape)) continue;
      ++matrices;
      largest = std::max(largest, p.numel);
      // Its first and last element in one rank's [begin, end); the slices the optimizer steps agree.
      int holders = 0;
      for (int r = 0; r < world; ++r)
        holders += L.partition_begin(r) <= p.offset && p.end() <= L.partition_end(r) && p.numel > 0 ? 1 : 0;
      EXPECT_EQ(holders, 1) << p.name << " on " << world << " ranks";
      ASSERT_EQ(p.slices.size(), 1u) << p.name << " on " << world << " ranks";
    }
    EXPECT_EQ(matrices, 8);  // 2 layers x qkv, proj, fc, fc2
    EXPECT_LE(L.padded_numel(), adamw.padded_numel() + (world > 1 ? matrices : 0)) << world << " ranks";
    EXPECT_EQ(L.partition_begin(0), 0);
    EXPECT_EQ(L.partition_end(world - 1), L.padded_numel());
    const std::int64_t P = adamw.padded_numel() / world;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(L.partition_begin(r) % 2, 0) << "rank " << r << " of " << world;
      if (r > 0) {
        EXPECT_EQ(L.partition_begin(r), L.partition_end(r - 1)) << "rank " << r << " of " << world;
      }
      EXPECT_LE(std::abs(L.partition_begin(r) - r * P), largest / 2 + 1 + L.interior_padding())
          << "rank " << r << " of " << world;
    }
    std::int64_t owned = 0;  // the ranks' real elements cover Ψ exactly once
    for (int r = 0; r < world; ++r) owned += L.partition_real_numel(r);
    EXPECT_EQ(owned, psi);
  }
}

// Newton–Schulz runs once per optimizer step: 4 accumulated micro-batches of 1 row equal 1 micro-batch of
// 4 rows up to rounding (orthogonalising each micro-batch's gradient would give a different update).
ZERO_DIST_TEST(MuonZero, GradientAccumulationOrthogonalisesOncePerStep) {
  for (int stage : {0, 2, 3}) {
    ZeroOptions o = muon_options(stage);
    const auto one = run_zero(o, 3, 4);
    o.gradient_accumulation_steps = 4;
    const auto four = run_zero(o, 3, 1);
    expect_close(four, one, 1e-4, "GAS 4 x 1 against GAS 1 x 4, stage " + std::to_string(stage));
  }
}

// Muon's partitions differ in size, so each rank's memory is its own: the plan's memory(rank) equals what
// that rank allocated after a step, its optimizer state is (fp32 master +) m + v over the rank's
// partition, counted here from the partition's bounds, and memory() is the largest rank's.
ZERO_DIST_TEST(MuonZero, PlannedMemoryIsEachRanksOwnAllocation) {
  auto comm = test_world();
  const int rank = comm->rank();
  for (int stage : {1, 2, 3})
    for (DType dt : {DType::f32, DType::bf16}) {
      ZeroOptions o = muon_options(stage);
      o.dtype = dt;
      auto model = make_model();
      ZeroOptimizer opt(model->named_parameters(), comm, o);
      opt.backward(batch_loss(*model, 0, rank, 1));
      EXPECT_TRUE(opt.step());
      const std::string what = fmt::format("stage {} {} rank {}", stage, dtype_name(dt), rank);
      const MemoryBreakdown have = opt.memory(), want = opt.plan().memory(rank);
      EXPECT_EQ(have.params, want.params) << what;
      EXPECT_EQ(have.grads, want.grads) << what;
      EXPECT_EQ(have.optimizer_states, want.optimizer_states) << what;
      const double partition = static_cast<double>(opt.layout().partition_end(rank) - opt.layout().partition_begin(rank));
      EXPECT_EQ(have.optimizer_states, (dt == DType::f32 ? 8.0 : 12.0) * partition) << what;
      EXPECT_EQ(comm->all_reduce_max(have.optimizer_states), opt.plan().memory().optimizer_states) << what;
    }
}

// A step skipped for a non-finite gradient leaves the momentum (held in exp_avg) and the weights bitwise
// as they were.
ZERO_DIST_TEST(MuonZero, SkippedStepLeavesMomentumUntouched) {
  for (int stage : {0, 2}) {
    for (DType dt : {DType::f32, DType::f16}) {  // f32: nonfinite_grads skip; f16: the loss scaler's overflow
      ZeroOptions o = muon_options(stage);
      o.dtype = dt;
      o.nonfinite_grads = NonfiniteGrads::skip;
      o.nonfinite_skip_limit = 0;
      auto comm = test_world();
      auto model = make_model();
      ZeroOptimizer opt(model->named_parameters(), comm, o);
      opt.backward(batch_loss(*model, 0, comm->rank() * 2, 2));
      ASSERT_TRUE(opt.step());
      const std::vector<float> momentum = opt.exp_avg().to_vector(), master = opt.master().to_vector();
      opt.backward(mul(batch_loss(*model, 1, comm->rank() * 2, 2), std::numeric_limits<float>::infinity()));
      EXPECT_FALSE(opt.step());
      EXPECT_EQ(opt.exp_avg().to_vector(), momentum) << "stage " << stage << " " << dtype_name(dt);
      EXPECT_EQ(opt.master().to_vector(), master) << "stage " << stage << " " << dtype_name(dt);
    }
  }
}

#ifdef ZERO_INPROCESS_TESTS  // eight ranks as threads, whatever the job's size

// Partitions left empty: one layer of 16 channels on 8 ranks, where the MLP matrices (1,024 elements) are
// larger than two partitions (P = 428), so two boundaries move onto the same matrix edge and ranks 5 and
// 7 hold nothing. Stages 1-3 train like one-process Muon (the bound of EveryStageTrainsLikeOneProcessMuon),
// bitwise equal to each other.
TEST(MuonZeroEmptyPartitions, EightRanksTrainLikeOneProcess) {
  nn::GPTConfig cfg = harness::tiny_gpt_config();
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  const int n = 8;
  std::vector<FlatLayout::Entry> entries;
  for (const auto& p : make_model(cfg)->named_parameters()) entries.push_back({p.name, p.tensor.shape(), p.decay});
  const ZeroPlan plan = plan_zero(entries, n, muon_options(2));
  const FlatLayout& L = plan.layout;
  int empty = 0;
  for (int r = 0; r < n; ++r) empty += L.partition_size(r) == 0 ? 1 : 0;
  ASSERT_GE(empty, 1) << "the layout must leave a partition empty for this test";
  const auto ref = run_reference(muon_options(0), 3, 2 * n, cfg);
  std::vector<std::vector<std::vector<float>>> runs;
  for (int stage : {1, 2, 3}) {
    std::vector<std::vector<float>> rank0;
    run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
      const auto got = run_zero(muon_options(stage), 3, 2, comm, cfg);
      if (comm->rank() == 0) rank0 = got;
    });
    expect_close(rank0, ref, 1e-4, "stage " + std::to_string(stage) + " on 8 ranks");
    runs.push_back(rank0);
  }
  EXPECT_EQ(runs[1], runs[0]) << "stage 2 vs 1";
  EXPECT_EQ(runs[2], runs[0]) << "stage 3 vs 1";
}

#endif  // ZERO_INPROCESS_TESTS

#ifndef ZERO_INPROCESS_TESTS  // MPI only: the bytes handed to MPI, counted by tests/pmpi's interposer

// Wire bytes per step of Muon against AdamW at the same stage: the ledger against the bytes MPI was handed
// (summed over ranks), and Muon's bytes against AdamW's (at most 2% more, the goal; its layout differs
// only by the single elements that start matrices on even positions, Note [Whole-matrix partitions]).
TEST(MuonWireBytes, LedgerMatchesMpiAndStaysWithinTwoPercentOfAdamW) {
  using CounterFn = std::int64_t (*)();
  const auto sent = reinterpret_cast<CounterFn>(dlsym(RTLD_DEFAULT, "zero_pmpi_sent_bytes"));
  if (std::getenv("ZERO_EXPECT_PMPI") != nullptr) {
    ASSERT_NE(sent, nullptr) << "interposer not preloaded";
  }
  if (sent == nullptr) GTEST_SKIP() << "run with LD_PRELOAD=libzero_count_sent_bytes.so (ctest does)";
  auto comm = test_world();
  const int n = comm->world_size();
  if (n == 1) GTEST_SKIP() << "nothing on the wire with one rank";
  for (int stage : {1, 2, 3}) {
    double ledger[2] = {}, padded[2] = {};
    for (int muon : {0, 1}) {
      ZeroOptions o = muon_options(stage);
      o.muon = muon == 1;
      o.dtype = DType::bf16;
      auto model = make_model();
      ZeroOptimizer opt(model->named_parameters(), comm, o);
      comm->barrier();
      comm->ledger().reset();
      const std::int64_t before = sent();
      for (int s = 0; s < 2; ++s) {
        opt.backward(batch_loss(*model, s, comm->rank() * 2, 2));
        opt.step();
      }
      const double wire = comm->all_reduce_sum(double(sent() - before));
      ledger[muon] = comm->all_reduce_sum(comm->ledger().total());
      padded[muon] = double(opt.layout().padded_numel());
      EXPECT_NEAR(wire / ledger[muon], 1.0, 0.02) << "stage " << stage << (muon ? " Muon" : " AdamW");
    }
    if (comm->rank() == 0)
      std::printf("[ wire     ] stage %d, %d ranks: Muon / AdamW bytes %.4f (padded %.0f / %.0f)\n", stage, n,
                  ledger[1] / ledger[0], padded[1], padded[0]);
    EXPECT_LE(ledger[1], 1.02 * ledger[0]) << "stage " << stage;
    // Stages 1, 2 move every collective over the padded buffer; stage 3 all-gathers gather units, which
    // hold only the gaps inside them, so it grows by no more.
    if (stage < 3) {
      EXPECT_NEAR(ledger[1] / ledger[0], padded[1] / padded[0], 1e-9) << "stage " << stage;
    } else {
      EXPECT_LE(ledger[1] / ledger[0], padded[1] / padded[0] + 1e-9);
    }
  }
}

#endif  // ZERO_INPROCESS_TESTS

}  // namespace
}  // namespace zero::dist
