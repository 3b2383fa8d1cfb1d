// Activation recompute (autograd/checkpoint.h): a GPT with dropout trained with full or selective
// recompute must give bitwise the loss and every gradient of the same GPT without it (the reference:
// the plain forward and backward), in f32, f16 and bf16; gradient hooks fire once per parameter per
// backward; the generators end where the plain run leaves them; and the segment holds less.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/ops.h"
#include "core/storage.h"
#include "nn/gpt.h"

namespace {

using namespace zero;
using autograd::Recompute;

struct RunResult {
  std::vector<float> losses;
  std::map<std::string, std::vector<unsigned char>> grads;  // raw bytes: bitwise comparison
  std::vector<std::map<std::string, int>> hook_calls;       // per backward: parameter -> calls
  std::mt19937_64 rng_after;
};

nn::GPTConfig small_config() {
  nn::GPTConfig cfg;
  cfg.vocab_size = 29;
  cfg.block_size = 16;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.n_embd = 24;
  cfg.dropout = 0.2f;
  return cfg;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  return {p, p + c.numel() * static_cast<std::int64_t>(dtype_size(c.dtype()))};
}

// Two forward/backward passes on the same model (gradients accumulate), recompute `mode`.
RunResult run(Recompute mode, DType dtype) {
  Generator gen(7);
  nn::GPT model(small_config(), gen);
  if (dtype != DType::f32) model.to(dtype);
  model.set_recompute(mode);
  model.train();
  RunResult r;
  std::map<std::string, int> calls;
  for (auto& p : model.named_parameters())
    autograd::register_post_accumulate_grad_hook(p.tensor, [&calls, name = p.name](Tensor&) { ++calls[name]; });
  Generator data(11);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<std::int64_t> x, y;
    for (int i = 0; i < 2 * 16; ++i) x.push_back(data.randint(29)), y.push_back(data.randint(29));
    Tensor loss = model.loss(Tensor::from_indices(x, {2, 16}), Tensor::from_indices(y, {2, 16}));
    r.losses.push_back(loss.item());
    calls.clear();
    loss.backward();
    r.hook_calls.push_back(calls);
  }
  for (auto& p : model.named_parameters()) r.grads[p.name] = bytes_of(p.tensor.grad());
  r.rng_after = gen.engine();
  return r;
}

class RecomputeBitwise : public ::testing::TestWithParam<std::tuple<Recompute, DType>> {};

TEST_P(RecomputeBitwise, LossesAndGradientsEqualThePlainRun) {
  const auto [mode, dtype] = GetParam();
  const RunResult plain = run(Recompute::none, dtype), recomputed = run(mode, dtype);
  ASSERT_EQ(plain.losses.size(), recomputed.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&plain.losses[i], &recomputed.losses[i], sizeof(float)), 0)
        << "pass " << i << ": " << plain.losses[i] << " vs " << recomputed.losses[i];
  ASSERT_EQ(plain.grads.size(), recomputed.grads.size());
  for (const auto& [name, bytes] : plain.grads) EXPECT_TRUE(bytes == recomputed.grads.at(name)) << name;
  EXPECT_TRUE(plain.rng_after == recomputed.rng_after) << "the dropout generator ends elsewhere";
}

TEST_P(RecomputeBitwise, EveryGradientHookFiresOncePerBackward) {
  const auto [mode, dtype] = GetParam();
  const RunResult r = run(mode, dtype);
  const std::size_t n_params = r.grads.size();
  for (const auto& calls : r.hook_calls) {
    EXPECT_EQ(calls.size(), n_params);
    for (const auto& [name, n] : calls) EXPECT_EQ(n, 1) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, RecomputeBitwise,
                         ::testing::Combine(::testing::Values(Recompute::full, Recompute::selective),
                                            ::testing::Values(DType::f32, DType::f16, DType::bf16)),
                         [](const auto& info) {
                           return std::string(autograd::recompute_name(std::get<0>(info.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// A parameter read both inside and outside a segment (and in two segments) gets one accumulated
// gradient, once, equal to the plain run's: the checkpoint returns its part to the outer engine.
TEST(Checkpoint, SharedParameterAccumulatesOnceAcrossSegments) {
  auto grad_of_w = [](bool checkpointed, int* hook_calls) {
    Tensor w = Tensor::from_vector({0.5f, -1.25f, 2.0f}, {3});
    w.set_requires_grad(true);
    autograd::register_post_accumulate_grad_hook(w, [hook_calls](Tensor&) { ++*hook_calls; });
    Tensor x = Tensor::from_vector({1.0f, 2.0f, 3.0f}, {3});
    auto seg = [&w](const std::vector<Tensor>& in) { return gelu(mul(in[0], w)); };
    Tensor h = mul(x, w);
    for (int i = 0; i < 2; ++i) h = checkpointed ? autograd::checkpoint(seg, {h}, autograd::keep_nothing()) : seg({h});
    sum(mul(h, w)).backward();
    return bytes_of(w.grad());
  };
  int plain_calls = 0, ckpt_calls = 0;
  EXPECT_TRUE(grad_of_w(false, &plain_calls) == grad_of_w(true, &ckpt_calls));
  EXPECT_EQ(plain_calls, 1);
  EXPECT_EQ(ckpt_calls, 1);
}

TEST(Checkpoint, NestingIsRefused) {
  Tensor x = Tensor::from_vector({1.0f}, {1});
  x.set_requires_grad(true);
  auto inner = [](const std::vector<Tensor>& in) { return gelu(in[0]); };
  auto outer = [&](const std::vector<Tensor>& in) { return autograd::checkpoint(inner, in, autograd::keep_nothing()); };
  EXPECT_THROW(autograd::checkpoint(outer, {x}, autograd::keep_nothing()), Error);
}

TEST(Checkpoint, ParseRecompute) {
  EXPECT_EQ(autograd::parse_recompute("selective"), Recompute::selective);
  EXPECT_THROW(autograd::parse_recompute("some"), Error);
}

// Bytes allocated and still held after the forward: full < selective < none.
std::size_t held_after_forward(Recompute mode) {
  Generator gen(3);
  nn::GPTConfig cfg = small_config();
  cfg.block_size = 64;
  nn::GPT model(cfg, gen);
  model.set_recompute(mode);
  std::vector<std::int64_t> x(2 * 64, 1);
  const Tensor idx = Tensor::from_indices(x, {2, 64});
  const std::size_t before = cpu_allocator_stats().in_use;
  Tensor loss = model.loss(idx, idx);
  const std::size_t held = cpu_allocator_stats().in_use - before;
  loss.backward();
  return held;
}

TEST(Checkpoint, HoldsLessAfterTheForward) {
  const std::size_t none = held_after_forward(Recompute::none), full = held_after_forward(Recompute::full),
                    selective = held_after_forward(Recompute::selective);
  EXPECT_LT(full, selective);
  EXPECT_LT(selective, none);
}

}  // namespace

namespace {

// A segment outside the GPT's blocks: views between its GEMMs (a view records only when its input needs a
// gradient, which inside the segment holds in the re-run alone) and a batched matmul. Full and selective
// recompute must give the plain run's loss and gradients bitwise; selective hands each GEMM of the re-run
// the output it kept, and a kept output of another op or shape would throw.
std::vector<std::vector<unsigned char>> view_segment_grads(const autograd::RecomputePolicy* policy) {
  Generator gen(5);
  Tensor x = Tensor::randn({4, 6}, gen).set_requires_grad(true);
  Tensor w1 = Tensor::randn({12, 6}, gen).set_requires_grad(true);
  Tensor w2 = Tensor::randn({5, 4}, gen).set_requires_grad(true);
  const autograd::SegmentFn fn = [&](const std::vector<Tensor>& in) {
    const Tensor h = gelu(linear(in[0], w1, Tensor()));                // [4, 12]
    const Tensor v = h.reshape({4, 3, 4});                              // a view: [4, 3, 4]
    const Tensor m = gelu(matmul(v.transpose(1, 2), v));                // [4, 4, 3] @ [4, 3, 4] = [4, 4, 4]
    return linear(m.reshape({16, 4}), w2, Tensor());                    // [16, 5]
  };
  const Tensor out = policy != nullptr ? autograd::checkpoint(fn, {x}, *policy) : fn({x});
  Tensor loss = mean(mul(out, out));
  loss.backward();
  std::vector<std::vector<unsigned char>> grads{bytes_of(loss)};
  for (const Tensor& t : {x, w1, w2}) grads.push_back(bytes_of(t.grad()));
  return grads;
}

TEST(Checkpoint, ViewsBetweenGemmsAndBatchedMatmulsRecomputeBitwise) {
  const auto plain = view_segment_grads(nullptr);
  const autograd::RecomputePolicy full = autograd::keep_nothing(), selective = autograd::keep_matmul_outputs();
  EXPECT_EQ(view_segment_grads(&full), plain);
  EXPECT_EQ(view_segment_grads(&selective), plain);
}

}  // namespace
