// Activation recompute under ZeRO (autograd/checkpoint.h): a GPT with dropout trained at stages 0-3, in
// f32, f16 and bf16, with full or selective recompute, must give bitwise the losses, norms and
// parameters of the same run without recompute (the reference), and every parameter's gradient hooks
// must fire exactly once per backward. At stage 3 the re-runs gather their units through the backward's
// agreed schedule (Note [Checkpoint edges]); a wrong exchange or a second hook would show here as
// different numbers, a hang (the collective timeout), or a count of 2.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/checkpoint.h"
#include "distributed/zero/zero_optimizer.h"
#include "nn/gpt.h"
#include "tests/distributed/tiny_gpt.h"
#include "tests/distributed/world.h"

namespace zero::dist {
namespace {

using autograd::Recompute;

// The GPT's dropout generator lives as long as the model (a base initialised before nn::GPT).
struct GeneratorHolder {
  Generator gen{42};
};
class DropoutGPT : private GeneratorHolder, public nn::GPT {
 public:
  explicit DropoutGPT(const nn::GPTConfig& cfg) : GeneratorHolder(), nn::GPT(cfg, gen) {}
};


struct Outcome {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<std::vector<float>> params;
  int hook_anomalies = 0;  // parameters whose hooks fired other than once in a backward
};

// Three steps of 2 rows per rank; rank r reads rows of its own, the same for every recompute mode.
Outcome train(Recompute mode, int stage, DType dtype) {
  auto comm = test_world();
  const int rank = comm->rank();
  const nn::GPTConfig cfg = harness::tiny_gpt_config(0.25f);
  DropoutGPT model(cfg);
  model.set_recompute(mode);
  model.train();
  auto calls = std::make_shared<std::map<std::string, int>>();
  for (auto& p : model.named_parameters())
    autograd::register_post_accumulate_grad_hook(p.tensor, [calls, name = p.name](Tensor&) { ++(*calls)[name]; });
  ZeroOptions o;
  o.stage = stage;
  o.dtype = dtype;
  o.reduce_bucket_size = 100;
  o.allgather_bucket_size = 100;
  o.adam.lr = 1e-2f;
  o.fp16.initial_scale_power = 10;
  ZeroOptimizer opt(model.named_parameters(), comm, o);
  Outcome out;
  const std::size_t n_params = model.named_parameters().size();
  for (int step = 0; step < 3; ++step) {
    std::vector<std::int64_t> idx, tgt;
    for (std::int64_t i = 0; i < 2 * cfg.block_size; ++i) {
      idx.push_back((step * 7 + rank * 5 + i * 3) % cfg.vocab_size);
      tgt.push_back((step * 3 + rank + i * 5) % cfg.vocab_size);
    }
    const Tensor loss = model.loss(Tensor::from_indices(idx, {2, cfg.block_size}),
                                   Tensor::from_indices(tgt, {2, cfg.block_size}));
    out.losses.push_back(loss.item());
    calls->clear();
    opt.backward(loss);
    if (calls->size() != n_params) ++out.hook_anomalies;
    for (const auto& [name, n] : *calls) out.hook_anomalies += n != 1;
    opt.step();
    out.norms.push_back(opt.last_grad_norm());
  }
  opt.gather_parameters();
  for (const auto& p : model.named_parameters()) out.params.push_back(p.tensor.to_vector());
  return out;
}

ZERO_DIST_TEST(RecomputeZero, BitwiseEqualToNoRecomputeAtEveryStageAndDtype) {
  for (int stage : {0, 1, 2, 3})
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      const Outcome plain = train(Recompute::none, stage, dt);
      for (Recompute mode : {Recompute::full, Recompute::selective}) {
        const Outcome r = train(mode, stage, dt);
        const std::string what = fmt::format("stage {}, {}, recompute {}", stage, dtype_name(dt),
                                             autograd::recompute_name(mode));
        EXPECT_EQ(r.losses, plain.losses) << what;
        EXPECT_EQ(r.norms, plain.norms) << what;
        EXPECT_EQ(r.params, plain.params) << what;
        EXPECT_EQ(r.hook_anomalies, 0) << what;
      }
      EXPECT_EQ(plain.hook_anomalies, 0);
    }
}

}  // namespace
}  // namespace zero::dist
