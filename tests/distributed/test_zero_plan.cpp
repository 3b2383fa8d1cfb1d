// ZeroPlan (distributed/zero/zero_plan.h, what zero_explain prints) against a real ZeroOptimizer on this
// job's ranks: the planned per-rank memory must equal what the optimizer allocated (memory(), bucket
// pool included) and the planned bytes per step what its communicator's ledger counted, for every
// stage, reduce_scatter on and off, several bucket sizes and accumulation steps. The plan is pure
// arithmetic over the layout; the measurement runs real backward passes and collectives.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "distributed/comm/job_runtime.h"
#include "distributed/zero/zero_optimizer.h"
#include "distributed/zero/zero_plan.h"
#include "nn/gpt.h"
#include "tests/distributed/world.h"

namespace zero::dist {
namespace {

nn::GPTConfig plan_gpt_config() {
  nn::GPTConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 12;
  return c;
}

Tensor tokens(std::int64_t rows, std::int64_t T, std::int64_t V, int salt) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rows * T));
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>((i * 7 + salt * 3) % V);
  return Tensor::from_indices(idx, {rows, T});
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b)); }

ZERO_DIST_TEST(ZeroPlan, MemoryAndTrafficEqualTheOptimizersMeasurements) {
  auto comm = test_world();
  const int n = comm->world_size();
  const nn::GPTConfig cfg = plan_gpt_config();
  struct Case {
    int stage;
    bool reduce_scatter;
    std::int64_t bucket;
    int gas;
    DType dtype;
    bool wide = false;  // communication_data_type fp32 for a 16-bit model
  };
  std::vector<Case> cases;
  for (int stage : {0, 1, 2})
    for (bool rs : {true, false})
      for (std::int64_t bucket : {std::int64_t{50}, std::int64_t{333}, std::int64_t{500'000'000}, kAutoBucketSize})
        for (int gas : {1, 3}) {
          const DType dt = stage == 1 ? DType::bf16 : DType::f32;
          cases.push_back({stage, rs, bucket, gas, dt});
          if (dt != DType::f32) cases.push_back({stage, rs, bucket, gas, dt, true});
        }
  const int steps = 2;
  for (const Case& c : cases) {
    if (c.stage == 0 && !c.reduce_scatter) continue;  // the same scheme as stage 0
    Generator gen(5);
    nn::GPT model(cfg, gen);
    ZeroOptions o;
    o.stage = c.stage;
    o.dtype = c.dtype;
    o.reduce_scatter = c.reduce_scatter;
    o.reduce_bucket_size = c.bucket;
    o.allgather_bucket_size = 120;
    o.gradient_accumulation_steps = c.gas;
    o.reduce_in_fp32 = c.wide;
    std::vector<FlatLayout::Entry> entries;
    for (const auto& p : model.named_parameters()) entries.push_back({p.name, p.tensor.shape(), p.decay});
    const ZeroPlan plan = plan_zero(entries, n, o);

    ZeroOptimizer opt(model.named_parameters(), comm, o);
    comm->ledger().reset();  // training traffic only, as train_gpt counts it
    for (int s = 0; s < steps; ++s) {
      for (int g = 0; g < c.gas; ++g) {
        const Tensor x = tokens(2, cfg.block_size, cfg.vocab_size, s * 10 + g + comm->rank());
        opt.backward(model.loss(x, x));
      }
      opt.step();
    }
    const std::string what = fmt::format("stage {} reduce_scatter {} bucket {} GAS {} {}{}", c.stage,
                                         c.reduce_scatter, c.bucket, c.gas, dtype_name(c.dtype),
                                         c.wide ? " (fp32 on the wire)" : "");
    const MemoryBreakdown have = opt.memory(), want = plan.memory();
    EXPECT_EQ(have.params, want.params) << what;
    EXPECT_EQ(have.grads, want.grads) << what;
    EXPECT_EQ(have.optimizer_states, want.optimizer_states) << what;
    EXPECT_EQ(have.buckets, want.buckets) << what << ": pool of " << plan.pool_buffers << " planned";
    const Ledger& l = comm->ledger();
    const StepTraffic t = plan.traffic();
    for (int k = 0; k < kNumCollectives; ++k) {
      EXPECT_TRUE(near(l.bytes[k] / steps, t.bytes[k]))
          << what << ": " << collective_name(static_cast<Collective>(k)) << " measured " << l.bytes[k] / steps
          << " planned " << t.bytes[k];
      EXPECT_EQ(l.calls[k], steps * t.calls[k]) << what << ": " << collective_name(static_cast<Collective>(k));
    }
  }
}

TEST(ZeroPlan, RingModelClosedForms) {
  // 2 ranks, 1 MB reduce-scatter of bus bytes 0.5 MB at 1 GB/s with 10 us latency: 1 step.
  EXPECT_DOUBLE_EQ(ring_time_s(Collective::reduce_scatter, 0.5e6, 2, 1e9, 1e-5), 1e-5 + 0.5e-3);
  // An all-reduce pays the latency 2(n-1) times.
  EXPECT_DOUBLE_EQ(ring_time_s(Collective::all_reduce, 0.0, 4, 1e9, 1e-5), 6e-5);
  EXPECT_EQ(ring_time_s(Collective::all_gather, 1e6, 1, 1e9, 1e-5), 0.0);
  EXPECT_THROW(ring_time_s(Collective::all_gather, 1e6, 2, 0.0, 0.0), Error);
  EXPECT_THROW(ring_time_s(Collective::all_gather, 1e6, 2, 1e9, -1.0), Error);
}

}  // namespace
}  // namespace zero::dist
