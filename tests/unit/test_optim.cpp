// optim/: each optimizer, schedule, clip and scaler result is compared with an independent reference —
// the closed-form update computed in double here, or values worked out by hand in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "core/tensor.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

namespace zero::optim {
namespace {

Tensor param_of(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32) {
  Tensor t = Tensor::empty(shape, dtype);
  t.copy_(Tensor::from_vector(values, shape));
  t.set_requires_grad(true);
  return t;
}

Tensor grad_of(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32) {
  Tensor t = Tensor::empty(shape, dtype);
  t.copy_(Tensor::from_vector(values, shape));
  return t;
}

// AdamW in double, written from the paper's Algorithm 2 with PyTorch's placement of lr in the decay.
struct AdamWReference {
  std::vector<double> p, m, v;
  double weight_decay;
  std::int64_t step = 0;

  AdamWReference(const std::vector<float>& init, double wd)
      : p(init.begin(), init.end()), m(init.size(), 0.0), v(init.size(), 0.0), weight_decay(wd) {}

  void update(const std::vector<float>& g, double lr, double b1, double b2, double eps) {
    ++step;
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * weight_decay;
      m[i] = b1 * m[i] + (1.0 - b1) * g[i];
      v[i] = b2 * v[i] + (1.0 - b2) * static_cast<double>(g[i]) * g[i];
      const double m_hat = m[i] / (1.0 - std::pow(b1, static_cast<double>(step)));
      const double v_hat = v[i] / (1.0 - std::pow(b2, static_cast<double>(step)));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

void expect_near_all(const Tensor& actual, const std::vector<double>& expected, double tol, const char* what) {
  const std::vector<float> a = actual.to_vector();
  ASSERT_EQ(a.size(), expected.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], expected[i], tol) << what << " element " << i;
}

// ---- param groups ----

TEST(OptimGroups, DecayGroupsSplitByRank) {
  Tensor w = param_of({1, 2, 3, 4}, {2, 2});
  Tensor emb = param_of({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor b = param_of({1, 2}, {2});
  const std::vector<ParamGroup> groups = decay_groups({w, b, emb}, 0.1f);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_FLOAT_EQ(groups[0].weight_decay, 0.1f);
  ASSERT_EQ(groups[0].params.size(), 2u);
  EXPECT_TRUE(groups[0].params[0].same(w));
  EXPECT_TRUE(groups[0].params[1].same(emb));
  EXPECT_FLOAT_EQ(groups[1].weight_decay, 0.0f);
  ASSERT_EQ(groups[1].params.size(), 1u);
  EXPECT_TRUE(groups[1].params[0].same(b));
}

TEST(OptimGroups, ZeroGradSetsGradsToNone) {
  Tensor w = param_of({1, 2}, {2});
  w.set_grad(grad_of({1, 1}, {2}));
  SGD opt({{{w}, 0.0f}}, {0.1f});
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  opt.step();  // nothing to do: no gradient
  EXPECT_EQ(w.to_vector(), (std::vector<float>{1, 2}));
}

TEST(OptimGroups, RejectsBadGroupsAndOptions) {
  Tensor w = param_of({1, 2}, {2});
  EXPECT_THROW(AdamW({{{w, w}, 0.0f}}), Error);                  // listed twice
  EXPECT_THROW(AdamW({{{w}, -0.1f}}), Error);                    // negative weight decay
  EXPECT_THROW(AdamW({{{w}, 0.0f}}, {1e-3f, 1.0f}), Error);      // beta1 = 1
  EXPECT_THROW(AdamW({{{w}, 0.0f}}, {-1e-3f}), Error);           // negative lr
  EXPECT_THROW(SGD({{{w}, 0.0f}}, {0.1f, 0.0f, true}), Error);   // nesterov without momentum
  AdamW opt({{{w}, 0.0f}});
  EXPECT_THROW(opt.set_lr(-1.0f), Error);
  opt.set_lr(0.5f);
  EXPECT_FLOAT_EQ(opt.lr(), 0.5f);
}

// ---- AdamW ----

// Three steps on a 2-D weight (decayed) and a bias (not decayed), against the closed form in double.
// The bias gets no gradient at step 2: it must not move then, and its step 3 uses bias correction t = 2.
TEST(OptimAdamW, MatchesClosedFormOverThreeSteps) {
  const std::vector<float> w0{0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
  const std::vector<float> b0{0.1f, -0.2f, 0.3f};
  Tensor w = param_of(w0, {2, 3});
  Tensor b = param_of(b0, {3});
  const float lr = 0.01f, wd = 0.1f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  AdamW opt(decay_groups({w, b}, wd), {lr, b1, b2, eps});
  AdamWReference ref_w(w0, wd), ref_b(b0, 0.0);

  for (int t = 1; t <= 3; ++t) {
    std::vector<float> gw(6), gb(3);
    for (int i = 0; i < 6; ++i) gw[i] = 0.1f * static_cast<float>(i + 1) * (t % 2 ? 1.0f : -1.0f) + 0.05f * t;
    for (int i = 0; i < 3; ++i) gb[i] = 0.3f - 0.2f * static_cast<float>(i) * t;
    w.set_grad(grad_of(gw, {2, 3}));
    if (t == 2)
      b.set_grad(Tensor());
    else
      b.set_grad(grad_of(gb, {3}));
    opt.step();
    ref_w.update(gw, lr, b1, b2, eps);
    if (t != 2) ref_b.update(gb, lr, b1, b2, eps);
    expect_near_all(w, ref_w.p, 2e-6, "weight");
    expect_near_all(b, ref_b.p, 2e-6, "bias");
    expect_near_all(opt.state(0, 0).exp_avg, ref_w.m, 1e-6, "exp_avg");
    expect_near_all(opt.state(0, 0).exp_avg_sq, ref_w.v, 1e-7, "exp_avg_sq");
  }
  EXPECT_EQ(opt.state(0, 0).step, 3);
  EXPECT_EQ(opt.state(1, 0).step, 2);
  EXPECT_FALSE(opt.state(0, 0).master.defined());  // f32 parameters are updated in place
  // The decay must have acted on the weight only: a reference that also decays the bias disagrees.
  AdamWReference decayed_b(b0, wd);
  for (int t : {1, 3}) {
    std::vector<float> gb(3);
    for (int i = 0; i < 3; ++i) gb[i] = 0.3f - 0.2f * static_cast<float>(i) * t;
    decayed_b.update(gb, lr, b1, b2, eps);
  }
  EXPECT_GT(std::abs(b.to_vector()[2] - decayed_b.p[2]), 1e-5);
}

// The one entry on a raw range and AdamW::step run the same math: bit-identical, also when the
// range is stepped in two pieces at an odd boundary (what a ZeRO partition does). n is large enough to
// take the multi-threaded path.
TEST(OptimAdamW, UpdateOnRangeEqualsStep) {
  const std::int64_t n = 100003;
  Generator gen(7);
  Tensor p = Tensor::randn({n}, gen);
  p.set_requires_grad(true);
  std::vector<float> param = p.to_vector(), exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
  AdamW opt({{{p}, 0.1f}}, {3e-3f, 0.8f, 0.95f, 1e-6f});
  for (std::int64_t step = 1; step <= 2; ++step) {
    Tensor g = Tensor::randn({n}, gen, 0.0f, 0.5f);
    p.set_grad(g);
    opt.step();
    const AdamWHyper h = opt.hyper(0);
    EXPECT_FLOAT_EQ(h.weight_decay, 0.1f);
    const float* gd = g.data<float>();
    const std::int64_t cut = 37;
    adamw_update(Device::cpu, param.data(), gd, DType::f32, 1.0f, exp_avg.data(), exp_avg_sq.data(), nullptr,
                 DType::f32, cut, h, step);
    adamw_update(Device::cpu, param.data() + cut, gd + cut, DType::f32, 1.0f, exp_avg.data() + cut,
                 exp_avg_sq.data() + cut, nullptr, DType::f32, n - cut, h, step);
    const std::vector<float> stepped = p.to_vector();
    const std::vector<float> m = opt.state(0, 0).exp_avg.to_vector();
    std::int64_t mismatches = 0;
    for (std::int64_t i = 0; i < n; ++i) mismatches += (stepped[i] != param[i]) + (m[i] != exp_avg[i]);
    EXPECT_EQ(mismatches, 0) << "step " << step;
  }
  EXPECT_THROW(adamw_update(Device::cpu, param.data(), param.data(), DType::f32, 1.0f, exp_avg.data(),
                            exp_avg_sq.data(), nullptr, DType::f32, 1, opt.hyper(0), 0),
               Error);
}

// 16-bit parameters step an fp32 master copy: the master equals an all-f32 run exactly (same inputs to
// adamw_update), and the parameter is that master rounded to its dtype.
TEST(OptimAdamW, SixteenBitParamsKeepFp32Master) {
  const std::vector<float> init{0.5f, -1.0f, 2.0f, 0.25f};        // exact in f16 and bf16
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor ref = param_of(init, {2, 2});
    Tensor low = param_of(init, {2, 2}, dt);
    AdamW ref_opt({{{ref}, 0.1f}}, {0.05f});
    AdamW low_opt({{{low}, 0.1f}}, {0.05f});
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g{0.125f * t, -0.5f, 0.75f, -0.25f * t};  // exact in f16 and bf16
      ref.set_grad(grad_of(g, {2, 2}));
      low.set_grad(grad_of(g, {2, 2}, dt));
      ref_opt.step();
      low_opt.step();
    }
    const Tensor& master = low_opt.state(0, 0).master;
    ASSERT_TRUE(master.defined());
    EXPECT_EQ(master.to_vector(), ref.to_vector()) << dtype_name(dt);
    Tensor rounded = Tensor::empty({2, 2}, dt);
    rounded.copy_(ref);
    EXPECT_EQ(low.to_vector(), rounded.to_vector()) << dtype_name(dt);
    EXPECT_EQ(low.dtype(), dt);
  }
}

// ---- SGD ----

// p0 = [1, -2], lr 0.1, momentum 0.9, grads [0.5, 1] every step; by hand:
//   step 1: buf = g = [0.5, 1]           p = [0.95, -2.1]
//   step 2: buf = 0.9 buf + g = [0.95, 1.9]   p = [0.855, -2.29]
//   step 3: buf = [1.355, 2.71]          p = [0.7195, -2.561]
TEST(OptimSGD, MomentumMatchesHandComputedValues) {
  Tensor p = param_of({1.0f, -2.0f}, {2});
  SGD opt({{{p}, 0.0f}}, {0.1f, 0.9f});
  const std::vector<std::vector<double>> expected{{0.95, -2.1}, {0.855, -2.29}, {0.7195, -2.561}};
  const std::vector<std::vector<double>> expected_buf{{0.5, 1.0}, {0.95, 1.9}, {1.355, 2.71}};
  for (int t = 0; t < 3; ++t) {
    p.set_grad(grad_of({0.5f, 1.0f}, {2}));
    opt.step();
    expect_near_all(p, expected[t], 1e-6, "param");
    expect_near_all(opt.momentum_buffer(0, 0), expected_buf[t], 1e-6, "buffer");
  }
}

// Nesterov, p0 = 1, g = 0.5, lr 0.1, momentum 0.9:
//   step 1: buf = 0.5,  d = 0.5 + 0.9 * 0.5 = 0.95,   p = 0.905
//   step 2: buf = 0.95, d = 0.5 + 0.9 * 0.95 = 1.355, p = 0.7695
TEST(OptimSGD, NesterovMatchesHandComputedValues) {
  Tensor p = param_of({1.0f}, {1});
  SGD opt({{{p}, 0.0f}}, {0.1f, 0.9f, true});
  p.set_grad(grad_of({0.5f}, {1}));
  opt.step();
  EXPECT_NEAR(p.item(), 0.905, 1e-6);
  opt.step();  // same gradient tensor, still set
  EXPECT_NEAR(p.item(), 0.7695, 1e-6);
}

// Coupled L2, no momentum, p0 = 2, g = 1, lr 0.1, weight_decay 0.1:
//   step 1: d = 1 + 0.1 * 2 = 1.2,      p = 1.88
//   step 2: d = 1 + 0.1 * 1.88 = 1.188, p = 1.7612
// The undecayed group (same start, same gradient) moves by lr * g only.
TEST(OptimSGD, WeightDecayIsCoupledPerGroup) {
  Tensor p = param_of({2.0f}, {1});
  Tensor q = param_of({2.0f}, {1});
  SGD opt({{{p}, 0.1f}, {{q}, 0.0f}}, {0.1f});
  p.set_grad(grad_of({1.0f}, {1}));
  q.set_grad(grad_of({1.0f}, {1}));
  opt.step();
  EXPECT_NEAR(p.item(), 1.88, 1e-6);
  EXPECT_NEAR(q.item(), 1.9, 1e-6);
  opt.step();
  EXPECT_NEAR(p.item(), 1.7612, 1e-6);
  EXPECT_NEAR(q.item(), 1.8, 1e-6);
  EXPECT_FALSE(opt.momentum_buffer(0, 0).defined());
}

// ---- learning-rate schedule ----

TEST(OptimLrSchedule, WarmupThenCosineThenFloor) {
  const LrSchedule s{1e-3f, 1e-4f, 10, 110};
  EXPECT_NEAR(lr_at(0, s), 1e-3 * 1 / 10, 1e-9);   // warmup start
  EXPECT_NEAR(lr_at(4, s), 1e-3 * 5 / 10, 1e-9);
  EXPECT_NEAR(lr_at(9, s), 1e-3, 1e-9);            // warmup end reaches the peak
  EXPECT_NEAR(lr_at(10, s), 1e-3, 1e-9);           // cosine start: cos(0) = 1
  EXPECT_NEAR(lr_at(60, s), 1e-4 + 0.5 * (1e-3 - 1e-4), 1e-9);  // half way: cos(pi/2) = 0
  const double at35 = 1e-4 + 0.5 * (1.0 + std::cos(std::numbers::pi * 25.0 / 100.0)) * (1e-3 - 1e-4);
  EXPECT_NEAR(lr_at(35, s), at35, 1e-9);
  EXPECT_NEAR(lr_at(109, s), 1e-4 + 0.5 * (1.0 + std::cos(std::numbers::pi * 0.99)) * 9e-4, 1e-9);
  EXPECT_FLOAT_EQ(lr_at(110, s), 1e-4f);           // end
  EXPECT_FLOAT_EQ(lr_at(100000, s), 1e-4f);        // clamped after
}

TEST(OptimLrSchedule, EdgeCasesAndErrors) {
  EXPECT_NEAR(lr_at(0, {1e-3f, 1e-4f, 0, 100}), 1e-3, 1e-9);  // no warmup: starts at the peak
  EXPECT_FLOAT_EQ(lr_at(5, {1e-3f, 1e-4f, 10, 5}), 1e-3f * 6 / 10);  // warmup longer than the schedule
  EXPECT_FLOAT_EQ(lr_at(10, {1e-3f, 1e-4f, 10, 5}), 1e-4f);
  EXPECT_THROW(lr_at(-1, {}), Error);
  EXPECT_THROW(lr_at(0, {1e-4f, 1e-3f, 10, 100}), Error);  // min_lr > lr
  EXPECT_THROW(lr_at(0, {1e-3f, 1e-4f, -1, 100}), Error);
  EXPECT_THROW(lr_at(0, {1e-3f, 1e-4f, 10, -5}), Error);
  EXPECT_THROW(lr_at(0, {-1e-3f, -2e-3f, 10, 100}), Error);
}

// ---- gradient clipping ----

// Gradients [3, 4] and [12] (and one parameter without a gradient): norm sqrt(9 + 16 + 144) = 13.
TEST(OptimClip, ClipsToMaxNormAndReturnsNormBefore) {
  Tensor a = param_of({0, 0}, {2});
  Tensor b = param_of({0}, {1, 1});
  Tensor c = param_of({0}, {1});
  a.set_grad(grad_of({3, 4}, {2}));
  b.set_grad(grad_of({12}, {1, 1}));
  EXPECT_DOUBLE_EQ(grad_sq_norm(a.grad()), 25.0);
  EXPECT_FLOAT_EQ(clip_grad_norm({a, b, c}, 1.0f), 13.0f);
  const double coef = 1.0 / (13.0 + 1e-6);
  EXPECT_NEAR(a.grad().to_vector()[0], 3 * coef, 1e-7);
  EXPECT_NEAR(a.grad().to_vector()[1], 4 * coef, 1e-7);
  EXPECT_NEAR(b.grad().item(), 12 * coef, 1e-7);
  const double clipped = std::sqrt(grad_sq_norm(a.grad()) + grad_sq_norm(b.grad()));
  EXPECT_NEAR(clipped, 1.0, 1e-6);
  EXPECT_FALSE(c.grad().defined());
}

TEST(OptimClip, LeavesGradsBelowThresholdOrWhenDisabled) {
  Tensor a = param_of({0, 0}, {2});
  a.set_grad(grad_of({3, 4}, {2}));
  EXPECT_FLOAT_EQ(clip_grad_norm({a}, 10.0f), 5.0f);
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{3, 4}));
  EXPECT_FLOAT_EQ(clip_grad_norm({a}, 0.0f), 5.0f);  // max_norm <= 0: measure only
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{3, 4}));
}

TEST(OptimClip, SquaredNormOfSixteenBitAndStridedGrads) {
  // 1.5^2 + 2^2 + 0.25^2 = 6.3125, exact in every dtype.
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    EXPECT_DOUBLE_EQ(grad_sq_norm(grad_of({1.5f, -2.0f, 0.25f}, {3}, dt)), 6.3125) << dtype_name(dt);
  // A transposed view: same elements, same sum.
  const Tensor m = grad_of({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_DOUBLE_EQ(grad_sq_norm(m.transpose(0, 1)), 91.0);
  // Many chunks: n ones sum to n whatever the thread count.
  EXPECT_DOUBLE_EQ(grad_sq_norm(Tensor::ones({300001})), 300001.0);
  EXPECT_DOUBLE_EQ(grad_sq_norm(Tensor()), 0.0);
  EXPECT_THROW(grad_sq_norm(Tensor::from_indices({1, 2}, {2})), Error);
  // scale_grad_ on an f16 gradient.
  Tensor h = grad_of({1.0f, -2.0f}, {2}, DType::f16);
  scale_grad_(h, 0.5f);
  EXPECT_EQ(h.to_vector(), (std::vector<float>{0.5f, -1.0f}));
}

// ---- loss scaler ----

TEST(OptimLossScaler, StartsAtTwoToThePower) {
  LossScaler s;
  EXPECT_TRUE(s.dynamic());
  EXPECT_FLOAT_EQ(s.scale(), 65536.0f);
  EXPECT_FLOAT_EQ(LossScaler({0.0f, 8}).scale(), 256.0f);
}

TEST(OptimLossScaler, HysteresisDelaysHalving) {
  LossScalerConfig c;
  c.hysteresis = 2;
  LossScaler s(c);
  s.update(true);  // first overflow only spends hysteresis
  EXPECT_FLOAT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.hysteresis_left(), 1);
  s.update(true);  // exhausted: halve
  EXPECT_FLOAT_EQ(s.scale(), 32768.0f);
  s.update(true);  // not refilled by a halving: halve again
  EXPECT_FLOAT_EQ(s.scale(), 16384.0f);

  c.hysteresis = 1;
  LossScaler t(c);
  t.update(true);
  EXPECT_FLOAT_EQ(t.scale(), 32768.0f);
}

// stable = iter - last_overflow_iter - 1: from the start (last_overflow_iter = -1) the scale doubles on
// the update with iter = window, then every window updates; after an overflow at iter j, at j + 1 + window.
TEST(OptimLossScaler, DoublesAfterWindowCleanSteps) {
  LossScalerConfig c;
  c.loss_scale_window = 4;
  LossScaler s(c);
  for (int i = 0; i < 4; ++i) s.update(false);  // iter 0..3: stable 0..3
  EXPECT_FLOAT_EQ(s.scale(), 65536.0f);
  s.update(false);  // iter 4: stable 4
  EXPECT_FLOAT_EQ(s.scale(), 131072.0f);
  for (int i = 0; i < 3; ++i) s.update(false);  // iter 5..7
  EXPECT_FLOAT_EQ(s.scale(), 131072.0f);
  s.update(false);  // iter 8: stable 8
  EXPECT_FLOAT_EQ(s.scale(), 262144.0f);

  s.update(true);  // iter 9: overflow, spends one hysteresis
  EXPECT_FLOAT_EQ(s.scale(), 262144.0f);
  EXPECT_EQ(s.hysteresis_left(), 1);
  for (int i = 0; i < 4; ++i) s.update(false);  // iter 10..13: stable 0..3
  EXPECT_FLOAT_EQ(s.scale(), 262144.0f);
  EXPECT_EQ(s.hysteresis_left(), 1);  // clean steps alone do not refill (consecutive_hysteresis off)
  s.update(false);  // iter 14: stable 4: double and refill
  EXPECT_FLOAT_EQ(s.scale(), 524288.0f);
  EXPECT_EQ(s.hysteresis_left(), 2);
  EXPECT_EQ(s.iter(), 15);
}

TEST(OptimLossScaler, ConsecutiveHysteresisRefillsOnCleanStep) {
  LossScalerConfig c;
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.hysteresis_left(), 1);
  s.update(false);
  EXPECT_EQ(s.hysteresis_left(), 2);
  s.update(true);  // tolerated again
  EXPECT_FLOAT_EQ(s.scale(), 65536.0f);
}

TEST(OptimLossScaler, StaticScalerNeverChanges) {
  LossScaler s({128.0f});
  EXPECT_FALSE(s.dynamic());
  for (int i = 0; i < 5; ++i) s.update(true);
  for (int i = 0; i < 3000; ++i) s.update(false);
  EXPECT_FLOAT_EQ(s.scale(), 128.0f);
}

TEST(OptimLossScaler, MinLossScaleIsAFloor) {
  LossScalerConfig c;
  c.initial_scale_power = 2;  // 4
  c.hysteresis = 1;
  c.min_loss_scale = 1.5f;
  c.raise_error_at_min_scale = false;
  LossScaler s(c);
  s.update(true);
  EXPECT_FLOAT_EQ(s.scale(), 2.0f);
  s.update(true);
  EXPECT_FLOAT_EQ(s.scale(), 1.5f);  // max(1, 1.5)
  s.update(true);
  EXPECT_FLOAT_EQ(s.scale(), 1.5f);

  c.raise_error_at_min_scale = true;
  c.initial_scale_power = 0;  // 1
  c.min_loss_scale = 1.0f;
  LossScaler strict(c);
  EXPECT_THROW(strict.update(true), Error);
  EXPECT_THROW(LossScaler({-1.0f}), Error);
}

// Note [Stopping at the minimum scale]. From 2^4 with hysteresis 2 every overflow after the first halves
// the scale (hysteresis is only refilled by a doubling): 16 (hysteresis) 8 4 2 1, so the scale is at
// the minimum 1 after 5 overflows, and the limit-th overflow after that throws: 5 + limit in all.
TEST(OptimLossScaler, StopsAfterTheLimitOfOverflowsAtTheMinimum) {
  for (int limit : {1, 3}) {
    LossScalerConfig c;
    c.initial_scale_power = 4;
    c.min_scale_skip_limit = limit;
    LossScaler s(c);
    int updates = 0;
    try {
      for (; updates < 100; ++updates) s.update(true);
    } catch (const MinLossScaleError& e) {
      ++updates;
      EXPECT_NE(std::string(e.what()).find(fmt::format("on {} consecutive step(s)", limit)), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(updates, 5 + limit) << "limit " << limit;
    EXPECT_EQ(s.scale(), 1.0f);
  }
  // A clean step at the minimum resets the count: overflow, clean, overflow never reaches 2 in a row.
  LossScalerConfig c;
  c.initial_scale_power = 0;
  c.hysteresis = 1;
  c.min_scale_skip_limit = 2;
  LossScaler s(c);
  for (int i = 0; i < 10; ++i) {
    s.update(true);
    EXPECT_EQ(s.skips_at_min(), 1);
    s.update(false);
    EXPECT_EQ(s.skips_at_min(), 0);
  }
  EXPECT_THROW({ s.update(true); s.update(true); }, MinLossScaleError);
  // Off: the scale stays at the floor and the count still grows.
  c.raise_error_at_min_scale = false;
  LossScaler off(c);
  for (int i = 0; i < 50; ++i) off.update(true);
  EXPECT_EQ(off.skips_at_min(), 50);
  c.min_scale_skip_limit = 0;
  EXPECT_THROW(LossScaler{c}, Error);
}

TEST(OptimLossScaler, HasInfOrNan) {
  // 70000 is beyond f16's largest finite value (65504): the conversion overflows to inf.
  Tensor h = grad_of({1.0f, 70000.0f, -3.0f}, {3}, DType::f16);
  EXPECT_TRUE(std::isinf(h.to_vector()[1]));
  EXPECT_TRUE(has_inf_or_nan(h));
  EXPECT_FALSE(has_inf_or_nan(grad_of({1.0f, 65504.0f, -3.0f}, {3}, DType::f16)));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(has_inf_or_nan(grad_of({1.0f, nan}, {2}, DType::bf16)));
  EXPECT_TRUE(has_inf_or_nan(grad_of({-std::numeric_limits<float>::infinity()}, {1})));
  EXPECT_FALSE(has_inf_or_nan(Tensor::ones({100000})));
  // Strided view whose visible elements are finite while a hidden one is not.
  Tensor m = grad_of({1, 2, nan, 4}, {2, 2});
  EXPECT_FALSE(has_inf_or_nan(m.narrow(1, 0, 1).narrow(0, 0, 1)));
  EXPECT_TRUE(has_inf_or_nan(m.transpose(0, 1)));
  EXPECT_THROW(has_inf_or_nan(Tensor::from_indices({1}, {1})), Error);
}

}  // namespace
}  // namespace zero::optim
