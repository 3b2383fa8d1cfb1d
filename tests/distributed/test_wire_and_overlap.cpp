// The wire dtype (Note [Wire dtype]), the ledger against an independent byte count (the PMPI interposer
// tests/pmpi/count_sent_bytes.cpp), the stage-2 bucket pool bound and automatic bucket size, and the
// overlapped parameter all-gather (Note [Overlapped all-gather]) against the same run without it.
//
// References are independent of the code under test: a per-hop rounded ring sum computed here in
// the ring's order, the interposer's count of bytes handed to MPI, closed-form memory bounds, and a
// run of the same optimizer without overlap (bitwise, since an all-gather moves bytes, not sums).
// Under mpirun and in one process (ZERO_DIST_TEST, tests/distributed/world.h); the byte count is MPI's only.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "autograd/autograd.h"
#include "distributed/comm/job_runtime.h"
#include "distributed/zero/zero_optimizer.h"
#include "nn/gpt.h"
#include "tests/distributed/world.h"

namespace zero::dist {
namespace {

int world() { return test_world()->world_size(); }

// ---- 16-bit partial sums on the wire, rounded once per hop ------------------------------------------

// Rank r's element i: an integer k < 2^bits scaled by 2^(-10 + r % 3), exact in T; sums of three or
// more such values usually need more bits than T has, so per-hop and single rounding differ.
template <typename T>
float source(int rank, std::size_t i) {
  constexpr int bits = std::is_same_v<T, half> ? 11 : 8;
  const std::uint64_t k = (i * 2654435761u + std::uint64_t(rank) * 40503u) % (1u << bits);
  return std::ldexp(float(k), -10 + rank % 3);
}

// The ring's order for the slice owned by `dest`: the partial sum starts at rank dest+1 and each later
// rank adds its own value in fp32 and rounds to T before forwarding; rank dest adds last.
template <typename T>
T ring_sum(int n, int dest, std::size_t i) {
  T acc = T(source<T>((dest + 1) % n, i));
  for (int k = 2; k <= n; ++k) acc = T(float(acc) + source<T>((dest + k) % n, i));
  return acc;
}

// This rank's source<T> values (kCount of them), its reduce_scatter slice (uneven counts: the last rank
// gets the remainder) and their all_reduce, with the communicator's current wire settings.
constexpr std::size_t kCount = 4099;
template <typename T>
struct Reduced {
  std::vector<T> src, scattered, all;
  std::vector<std::size_t> counts;
};
template <typename T>
Reduced<T> scatter_and_all_reduce(Communicator& comm, DType dtype) {
  const int n = comm.world_size(), rank = comm.rank();
  Reduced<T> r;
  r.src.resize(kCount);
  for (std::size_t i = 0; i < kCount; ++i) r.src[i] = T(source<T>(rank, i));
  r.counts.assign(n, kCount / n);
  r.counts.back() += kCount % n;
  r.scattered.resize(r.counts[rank]);
  comm.reduce_scatter(r.src.data(), r.scattered.data(), r.counts, dtype);
  r.all = r.src;
  comm.all_reduce(r.all.data(), kCount, dtype);
  return r;
}

template <typename T>
void check_per_hop_rounding(DType dtype) {
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  comm->set_reduce_in_fp32(false);
  const std::size_t count = kCount;
  // all_reduce and reduce split evenly (the first count % n ranks get one more element).
  const auto [src, scattered, all, counts] = scatter_and_all_reduce<T>(*comm, dtype);
  std::vector<T> reduced = src;
  comm->reduce(reduced.data(), count, dtype, 0);

  std::size_t off = 0, wrong_rs = 0, wrong_ar = 0, wrong_reduce = 0, differs_from_single = 0;
  for (int r = 0; r < rank; ++r) off += counts[r];
  for (std::size_t j = 0; j < counts[rank]; ++j)
    if (float(scattered[j]) != float(ring_sum<T>(n, rank, off + j))) ++wrong_rs;
  std::vector<int> owner;  // the even split: rank r owns count / n elements, + 1 for r < count % n
  for (int r = 0; r < n; ++r) owner.insert(owner.end(), count / n + (std::size_t(r) < count % n ? 1 : 0), r);
  for (std::size_t i = 0; i < count; ++i) {
    const T want = ring_sum<T>(n, owner[i], i);
    if (float(all[i]) != float(want)) ++wrong_ar;
    if (rank == 0 && float(reduced[i]) != float(want)) ++wrong_reduce;
    float exact = 0;
    for (int r = 0; r < n; ++r) exact += source<T>(r, i);
    if (float(T(exact)) != float(want)) ++differs_from_single;
  }
  EXPECT_EQ(wrong_rs, 0u) << "reduce_scatter";
  EXPECT_EQ(wrong_ar, 0u) << "all_reduce";
  EXPECT_EQ(wrong_reduce, 0u) << "reduce";
  if (n >= 3) {
    EXPECT_GT(differs_from_single, count / 100) << "values do not tell per-hop from single rounding";
  }
}

ZERO_DIST_TEST(WireDtype, HalfPartialSumsRoundOncePerHop) { check_per_hop_rounding<half>(DType::f16); }
ZERO_DIST_TEST(WireDtype, Bfloat16PartialSumsRoundOncePerHop) { check_per_hop_rounding<bfloat16>(DType::bf16); }

ZERO_DIST_TEST(WireDtype, LedgerCountsTheWireDtype) {
  auto comm = test_world();
  const int n = comm->world_size();
  const std::size_t count = 1000;
  std::vector<half> buf(count, half(1.0f)), out(count / n + 1);
  std::vector<std::size_t> counts(n, count / n);
  counts.back() += count % n;
  const double ring = double(n - 1) / n;
  for (bool fp32 : {false, true}) {
    comm->set_reduce_in_fp32(fp32);
    comm->ledger().reset();
    comm->reduce_scatter(buf.data(), out.data(), counts, DType::f16);
    comm->all_gather(out.data(), buf.data(), counts, DType::f16);
    comm->all_reduce(buf.data(), count, DType::f16);
    const Ledger& l = comm->ledger();
    const double wire = fp32 ? 4.0 : 2.0;
    EXPECT_DOUBLE_EQ(l[Collective::reduce_scatter], ring * count * wire) << "fp32 " << fp32;
    EXPECT_DOUBLE_EQ(l[Collective::all_gather], ring * count * 2.0) << "fp32 " << fp32;
    // The fp32 all-reduce reduces in fp32 and gathers the narrowed 16-bit slices.
    EXPECT_DOUBLE_EQ(l[Collective::all_reduce], ring * count * (fp32 ? 6.0 : 4.0)) << "fp32 " << fp32;
    EXPECT_TRUE(comm->times_collectives());
    if (n > 1) {
      EXPECT_GT(l.seconds[int(Collective::reduce_scatter)], 0.0) << "the communication thread's timer";
      // One thread cannot use more CPU time than the wall-clock time it ran for. The two clocks are read
      // a few statements apart and the thread CPU clock advances in the scheduler's steps, so a margin
      // (microseconds on a busy machine); a unit error (ns as us) or double counting still exceeds it.
      EXPECT_GT(l.cpu_seconds, 0.0) << "the communication thread's CPU clock";
      EXPECT_LE(l.cpu_seconds, 1.1 * l.total_seconds() + 2e-5);
    }
  }
  comm->set_reduce_in_fp32(false);
}

// ---- a GPT small enough for seconds, large enough for several automatic buckets ----------------------

nn::GPTConfig gpt_config(std::int64_t n_embd) {
  nn::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = n_embd;
  c.dropout = 0.0f;
  return c;
}

std::pair<Tensor, Tensor> batch(const nn::GPTConfig& c, int step, std::int64_t row0, std::int64_t rows) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rows * c.block_size)), tgt(idx.size());
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const std::uint64_t h = (std::uint64_t(step) * 1000003u + std::uint64_t(row0) * 8191u + k) * 2654435761u;
    idx[k] = static_cast<std::int64_t>((h >> 7) % std::uint64_t(c.vocab_size));
    tgt[k] = static_cast<std::int64_t>((h >> 17) % std::uint64_t(c.vocab_size));
  }
  return {Tensor::from_indices(idx, {rows, c.block_size}), Tensor::from_indices(tgt, {rows, c.block_size})};
}

struct Trace {
  std::vector<float> losses;       // per step: this rank's training loss
  std::vector<float> eval_losses;  // per step: a no-grad forward after the step (waits by itself)
  std::vector<float> params;       // the flat buffer at the end, as float
};

Trace train(const nn::GPTConfig& cfg, const ZeroOptions& o, int steps) {
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  Generator gen(5);
  nn::GPT model(cfg, gen);
  ZeroOptimizer opt(model.named_parameters(), comm, o);
  Trace t;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(cfg, s, rank * 2, 2);
    Tensor loss = model.loss(x, y);
    t.losses.push_back(loss.item());
    opt.backward(loss);
    opt.step();
    autograd::NoGradGuard no_grad;
    auto [ex, ey] = batch(cfg, 1000 + s, rank * 2, 2);
    t.eval_losses.push_back(model.loss(ex, ey).item());
  }
  opt.wait_for_params();
  t.params = opt.flat_params().to(DType::f32).to_vector();
  (void)n;
  return t;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

ZERO_DIST_TEST(OverlapParamGather, BitwiseIdenticalToWaitingForTheGather) {
  const nn::GPTConfig cfg = gpt_config(16);
  for (int stage : {1, 2})
    for (DType dtype : {DType::f32, DType::f16})
      for (std::int64_t chunk : {kAutoBucketSize, std::int64_t{64}}) {
        ZeroOptions o;
        o.stage = stage;
        o.dtype = dtype;
        o.reduce_bucket_size = 500;
        o.allgather_bucket_size = chunk;
        o.adam.lr = 1e-2f;
        o.gradient_clipping = 1.0f;
        const Trace off = train(cfg, o, 4);
        o.overlap_param_gather = true;
        const Trace on = train(cfg, o, 4);
        const std::string what = fmt::format("stage {}, {}, allgather chunk {}", stage, dtype_name(dtype), chunk);
        EXPECT_TRUE(bitwise_equal(on.losses, off.losses)) << what << ": training losses";
        EXPECT_TRUE(bitwise_equal(on.eval_losses, off.eval_losses)) << what << ": no-grad forward after the step";
        EXPECT_TRUE(bitwise_equal(on.params, off.params)) << what << ": parameters";
        if (world() > 1) {
          EXPECT_NE(off.losses.front(), off.losses.back()) << what << ": the model did not train";
        }
      }
}

// ---- fp32 accumulation: one rounding, whatever the bucket size ---------------------------------------
// Note [fp32-accumulating reduce-scatter] (distributed/comm/communicator.cpp).

// The collectives against sums formed here: rank order in fp32, rounded once.
template <typename T>
void check_fp32_accumulation(DType dtype) {
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  comm->set_fp32_accumulation(true);
  const std::size_t count = kCount;
  const auto [src, scattered, all, counts] = scatter_and_all_reduce<T>(*comm, dtype);
  comm->set_fp32_accumulation(false);
  std::size_t off = 0, wrong_rs = 0, wrong_ar = 0;
  for (int r = 0; r < rank; ++r) off += counts[r];
  auto once = [&](std::size_t i) {
    float acc = source<T>(0, i);
    for (int r = 1; r < n; ++r) acc += source<T>(r, i);
    return T(acc);
  };
  for (std::size_t j = 0; j < counts[rank]; ++j)
    if (float(scattered[j]) != float(once(off + j))) ++wrong_rs;
  for (std::size_t i = 0; i < count; ++i)
    if (float(all[i]) != float(once(i))) ++wrong_ar;
  EXPECT_EQ(wrong_rs, 0u) << "reduce_scatter";
  EXPECT_EQ(wrong_ar, 0u) << "all_reduce";
}

ZERO_DIST_TEST(WireDtype, HalfFp32AccumulationRoundsOnce) { check_fp32_accumulation<half>(DType::f16); }
ZERO_DIST_TEST(WireDtype, Bfloat16Fp32AccumulationRoundsOnce) { check_fp32_accumulation<bfloat16>(DType::bf16); }

// bf16 training with 16-bit reductions: with fp32 accumulation the parameters after a few steps are the
// same bits for every bucket size at every stage (each element's sum is the same rank-order fp32 sum
// wherever the bucket edges fall). The ring instead starts each element's chain at its owner's right
// neighbour, and at stage 0 the owner is set by the even split of the bucket: there the bucket size
// shows in the bits (checked at 3 ranks and more, where the order of three additions can matter).
ZERO_DIST_TEST(Fp32Accumulation, ResultsDoNotDependOnBucketSize) {
  const nn::GPTConfig cfg = gpt_config(16);
  const int n = world();
  for (int stage : {0, 1, 2})
    for (bool accumulate : {true, false}) {
      if (!accumulate && stage != 0) continue;
      std::vector<float> first;
      bool ring_differs = false;
      for (std::int64_t bucket : {std::int64_t{97}, std::int64_t{1000}, kAutoBucketSize}) {
        ZeroOptions o;
        o.stage = stage;
        o.dtype = DType::bf16;
        o.reduce_bucket_size = bucket;
        o.reduce_scatter_with_fp32_accumulation = accumulate;
        o.adam.lr = 1e-2f;
        const Trace t = train(cfg, o, 3);
        if (first.empty()) {
          first = t.params;
          continue;
        }
        if (accumulate) {
          EXPECT_TRUE(bitwise_equal(t.params, first)) << "stage " << stage << ", bucket " << bucket;
        } else {
          ring_differs = ring_differs || !bitwise_equal(t.params, first);
        }
      }
      if (!accumulate && n >= 3) {
        EXPECT_TRUE(ring_differs) << "stage 0 ring: the bucket size should show (else this test cannot fail)";
      }
    }  test_world()->set_fp32_accumulation(false);
}

// ---- int8 quantized gradients (Note [int8 quantized reduce-scatter], Note [Error feedback]) -------------

// Stages 1 and 2 (GAS 2 at stage 2: a reduction every micro-step), f32 and bf16, with error feedback:
// the ledger counts the int8 values and block scales of every bucket slice (counted here from the
// buckets' counts), the residual is one int8 per element plus a scale per block (held twice: Note [Error
// feedback state]), and overlap_comm does
// not change a bit (the blocks and the summation order do not depend on timing).
ZERO_DIST_TEST(QuantizedGradients, LedgerResidualAndOverlapMatchTheirClosedForms) {
  const nn::GPTConfig cfg = gpt_config(16);
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  for (DType dtype : {DType::f32, DType::bf16})
    for (int stage : {1, 2}) {
      std::vector<float> params[2];
      for (bool overlap : {false, true}) {
        ZeroOptions o;
        o.stage = stage;
        o.dtype = dtype;
        o.reduce_bucket_size = 300;
        o.overlap_comm = overlap;
        o.gradient_accumulation_steps = stage == 2 ? 2 : 1;
        o.quantized_gradients_block = 32;
        o.quantized_gradients_error_feedback = true;
        o.adam.lr = 1e-2f;
        Generator gen(5);
        nn::GPT model(cfg, gen);
        ZeroOptimizer opt(model.named_parameters(), comm, o);
        double slices = 0;  // bytes of one reduction of every bucket: int8 values + fp32 scales
        for (const Bucket& b : opt.plan().buckets)
          for (std::size_t c : b.counts) slices += double(c + 4 * ((c + 31) / 32));
        EXPECT_DOUBLE_EQ(opt.memory().residual, 2 * slices) << "stage " << stage;  // and its copy
        EXPECT_DOUBLE_EQ(opt.plan().memory().residual, 2 * slices);
        comm->ledger().reset();
        const int steps = 3;
        for (int s = 0; s < steps; ++s) {
          for (int m = 0; m < o.gradient_accumulation_steps; ++m) {
            auto [x, y] = batch(cfg, 2 * s + m, rank * 2, 2);
            opt.backward(model.loss(x, y));
          }
          ASSERT_TRUE(opt.step());
        }
        const double reductions = steps * o.gradient_accumulation_steps;
        // (summed per call here, per bucket there: equal up to double rounding)
        const double want = reductions * (n - 1.0) / n * slices;
        EXPECT_NEAR(comm->ledger()[Collective::reduce_scatter], want, 1e-12 * want)
            << dtype_name(dtype) << ", stage " << stage;
        EXPECT_NEAR(comm->ledger().total(), steps * opt.plan().traffic().total(), 1e-12 * want);
        opt.wait_for_params();
        params[overlap] = opt.flat_params().to(DType::f32).to_vector();
      }
      EXPECT_TRUE(bitwise_equal(params[0], params[1])) << dtype_name(dtype) << ", stage " << stage;
    }
  comm->set_quantized_gradients(0);
}

// ---- bucket pool and automatic bucket size -----------------------------------------------------------

// wte (64 x 32 = 2048 elements) spans many 100-element buckets and is the last gradient backward
// produces: copying it bucket by bucket must not hold one pool buffer per bucket.
ZERO_DIST_TEST(Stage2Buckets, PoolHoldsAtMostTwoBuckets) {
  const nn::GPTConfig cfg = gpt_config(32);
  ZeroOptions o;
  o.stage = 2;
  o.dtype = DType::f16;
  o.reduce_bucket_size = 100;
  auto comm = test_world();
  Generator gen(5);
  nn::GPT model(cfg, gen);
  ZeroOptimizer opt(model.named_parameters(), comm, o);
  for (int s = 0; s < 2; ++s) {
    auto [x, y] = batch(cfg, s, comm->rank() * 2, 2);
    opt.backward(model.loss(x, y));
    opt.step();
  }
  EXPECT_GT(opt.layout().make_buckets(100).size(), 20u);
  EXPECT_LE(opt.memory().buckets, 2.0 * 100 * 2) << "pool bytes (two f16 buckets of 100 elements)";
}

ZERO_DIST_TEST(Stage2Buckets, AutomaticSizeKeepsStage2BelowStage1) {
  // The closed form for the example model (~0.8 M parameters) and one 1000x larger, N = 2..64:
  // partition gradient + two buckets < the full gradient, and at least eight buckets.
  for (double psi : {8.0e5, 8.0e8})
    for (int n : {2, 3, 4, 8, 64}) {
      const double b = 2.0;  // fp16 bytes
      const double bucket = double(default_bucket_size(std::int64_t(psi)));
      EXPECT_LT(b * psi / n + 2 * b * bucket, b * psi) << "psi " << psi << " n " << n;
      EXPECT_GE(psi / bucket, 7.99) << "psi " << psi;
    }
  EXPECT_EQ(default_bucket_size(1), 4096);
  EXPECT_EQ(default_bucket_size(std::int64_t(1e12)), 500'000'000);
  // A real run at the defaults: measured gradient + bucket bytes below stage 1's gradient.
  const int n = world();
  const nn::GPTConfig cfg = gpt_config(48);  // ~62 k parameters: eight buckets of ~7.8 k
  auto comm = test_world();
  double grads[3] = {};
  for (int stage : {1, 2}) {
    ZeroOptions o;
    o.stage = stage;
    o.dtype = DType::f16;
    Generator gen(5);
    nn::GPT model(cfg, gen);
    ZeroOptimizer opt(model.named_parameters(), comm, o);
    auto [x, y] = batch(cfg, 0, comm->rank() * 2, 2);
    opt.backward(model.loss(x, y));
    opt.step();
    const MemoryBreakdown m = opt.memory();
    grads[stage] = m.grads + m.buckets;
    if (stage == 2) {
      const double psi = double(opt.layout().padded_numel());
      EXPECT_GE(opt.layout().make_buckets(opt.options().reduce_bucket_size).size(), 8u);
      EXPECT_LE(grads[2], 2.0 * psi / n + 2 * 2.0 * double(opt.options().reduce_bucket_size));
    }
  }
  if (n >= 2) {
    EXPECT_LT(grads[2], grads[1]) << "stage 2 gradient + bucket bytes vs stage 1";
  }
}

#ifndef ZERO_INPROCESS_TESTS  // MPI only: it counts the bytes handed to MPI

// ---- the ledger against the bytes handed to MPI (needs the interposer preloaded) ---------------------

using CounterFn = std::int64_t (*)();

// The interposer's byte counter as sent_(); a test skips without the interposer (ctest preloads it and
// sets ZERO_EXPECT_PMPI, and then its absence is a failure).
class WireBytes : public ::testing::Test {
 protected:
  void SetUp() override {
    sent_ = reinterpret_cast<CounterFn>(dlsym(RTLD_DEFAULT, "zero_pmpi_sent_bytes"));
    if (std::getenv("ZERO_EXPECT_PMPI") != nullptr) {
      ASSERT_NE(sent_, nullptr) << "interposer not preloaded";
    }
    if (sent_ == nullptr) GTEST_SKIP() << "run with LD_PRELOAD=libzero_count_sent_bytes.so (ctest does)";
  }
  // Trains `steps` steps of `model` and returns the bytes handed to MPI and the ledger's bytes, each
  // summed over ranks (a ring's per-rank bytes differ by the uneven slices, their sum does not).
  std::pair<double, double> train_and_count(nn::GPT& model, ZeroOptimizer& opt, const nn::GPTConfig& cfg, int steps) {
    auto comm = test_world();
    comm->barrier();
    comm->ledger().reset();
    const std::int64_t before = sent_();
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = batch(cfg, s, comm->rank() * 2, 2);
      opt.backward(model.loss(x, y));
      opt.step();
    }
    return {comm->all_reduce_sum(double(sent_() - before)), comm->all_reduce_sum(comm->ledger().total())};
  }
  CounterFn sent_ = nullptr;
};

TEST_F(WireBytes, LedgerMatchesBytesSentFp16Stage2) {
  auto comm = test_world();
  const int n = comm->world_size();
  const nn::GPTConfig cfg = gpt_config(32);
  for (int mode : {0, 1, 2, 3}) {  // 16-bit ring, fp32 wire, 16-bit all-to-all with fp32 accumulation, int8
    const bool fp32 = mode == 1;
    ZeroOptions o;
    o.stage = 2;
    o.dtype = DType::f16;
    o.reduce_in_fp32 = fp32;
    o.reduce_scatter_with_fp32_accumulation = mode == 2;
    o.quantized_gradients_block = mode == 3 ? 64 : 0;
    Generator gen(5);
    nn::GPT model(cfg, gen);
    ZeroOptimizer opt(model.named_parameters(), comm, o);
    const int steps = 3;
    const auto [wire, ledger] = train_and_count(model, opt, cfg, steps);
    const double baseline = 2.0 * (n - 1.0) / n * double(opt.layout().padded_numel()) * 2.0 * steps * n;
    if (n == 1) {
      EXPECT_EQ(wire, 0.0);
      EXPECT_EQ(ledger, 0.0);
      continue;
    }
    if (comm->rank() == 0)
      std::printf("[ wire     ] %s reductions, %d ranks: wire %.0f B, ledger %.0f B, wire/ledger %.4f, "
                  "ledger/baseline %.4f\n",
                  mode == 0   ? "fp16 ring"
                  : mode == 1 ? "fp32"
                  : mode == 2 ? "fp16 all-to-all, fp32-accumulated"
                              : "int8 blocks of 64 all-to-all",
                  n, wire, ledger,
                  wire / ledger, ledger / baseline);
    EXPECT_NEAR(wire / ledger, 1.0, 0.02) << "wire " << wire << " ledger " << ledger << " mode " << mode;
    if (mode == 3) {
      // int8: the reduce-scatter half moves 1 byte per element plus 4 per block of 64 of each slice,
      // counted independently from the buckets' counts; the all-gather half stays fp16.
      double quantized = 0;
      for (const Bucket& b : opt.plan().buckets)
        for (std::size_t c : b.counts) quantized += double(c + 4 * ((c + 63) / 64));
      const double expect = ((n - 1.0) / n * quantized + (n - 1.0) / n * 2.0 * double(opt.layout().padded_numel())) *
                            steps * n;
      EXPECT_NEAR(ledger / expect, 1.0, 1e-9);
      continue;
    }
    // fp16 on the wire: ZeRO-2 moves the stage-0 baseline 2(n-1)/n·Ψ; fp32 reductions add half of it again.
    EXPECT_NEAR(ledger / baseline, fp32 ? 1.5 : 1.0, 1e-9) << "mode " << mode;
  }
  comm->set_reduce_in_fp32(false);
  comm->set_fp32_accumulation(false);
  comm->set_quantized_gradients(0);
}

// Stage 3 against stage 0 (the ZeRO paper's §7.2.2): per step stage 0 all-reduces the gradient,
// 2(N-1)/N·Ψ; stage 3 reduce-scatters it, (N-1)/N·Ψ, and all-gathers every gather unit twice (forward
// and backward), 2(N-1)/N·Ψ: 1.5x. Expected bytes from Ψ counted here from the model's parameters and
// the bytes of bf16, against the bytes the interposer saw and the ledger.
TEST_F(WireBytes, Stage3IsOneAndAHalfTimesStage0) {
  auto comm = test_world();
  const int n = comm->world_size();
  if (n == 1) GTEST_SKIP() << "nothing on the wire with one rank";
  const nn::GPTConfig cfg = gpt_config(32);
  const int steps = 3;
  double wire[4] = {}, padding = 0;
  for (int stage : {0, 3}) {
    ZeroOptions o;
    o.stage = stage;
    o.dtype = DType::bf16;
    Generator gen(5);
    nn::GPT model(cfg, gen);
    double psi = 0;  // counted here, independently of the optimizer's layout
    for (const auto& p : model.named_parameters()) psi += double(p.tensor.numel());
    ZeroOptimizer opt(model.named_parameters(), comm, o);
    padding = double(opt.layout().padded_numel()) - psi;
    // Summed over ranks, a ring moves (N-1)·S bytes for an all-gather or reduce-scatter of S bytes
    // and 2(N-1)·S for an all-reduce.
    const auto [sent, ledger] = train_and_count(model, opt, cfg, steps);
    wire[stage] = sent;
    const double b = 2.0, per_step = (stage == 0 ? 2.0 : 3.0) * (n - 1.0) * b * psi;
    const double expected = per_step * steps;
    if (comm->rank() == 0)
      std::printf("[ wire     ] stage %d, bf16, %d ranks, Ψ %.0f: wire %.0f B/step, ledger %.0f B/step, "
                  "expected %.0f B/step\n",
                  stage, n, psi, wire[stage] / steps, ledger / steps, expected / steps);
    EXPECT_NEAR(wire[stage] / ledger, 1.0, 0.02) << "stage " << stage;
    // Padding: the flat buffer is padded to a multiple of N (and alignment); its bytes move too.
    const double pad_share = (stage == 0 ? 2.0 : 3.0) * (n - 1.0) * b * padding * steps;
    EXPECT_GE(wire[stage], expected * 0.98) << "stage " << stage;
    EXPECT_LE(wire[stage], (expected + pad_share) * 1.02) << "stage " << stage;
  }
  if (comm->rank() == 0) std::printf("[ wire     ] stage 3 / stage 0: %.4f\n", wire[3] / wire[0]);
  EXPECT_NEAR(wire[3] / wire[0], 1.5, 0.02);
}

#endif  // ZERO_INPROCESS_TESTS

}  // namespace
}  // namespace zero::dist
