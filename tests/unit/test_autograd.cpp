// The autograd engine: accumulation into leaves, grad mode, errors, and post-accumulate-grad hooks
// (the interface ZeRO's gradient bucketing is built on; see Note [Hook order] in autograd/autograd.h).
// Expected gradients are worked out by hand in each test.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/tensor.h"

namespace zero {
namespace {

using autograd::NoGradGuard;
using autograd::register_post_accumulate_grad_hook;
using autograd::remove_post_accumulate_grad_hook;

Tensor leaf(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::from_vector(v, s);
  t.set_requires_grad(true);
  return t;
}
Tensor values(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// sum(x * c): dL/dx = c.
Tensor dot(const Tensor& x, const Tensor& c) { return sum(mul(x, c)); }

// ---------------------------------------------------------------------------------------------
// accumulation into leaves

TEST(Autograd, GradientAccumulatesOverTwoBackwards) {
  Tensor x = leaf({1, 2, 3}, {3});
  const Tensor c = values({4, 5, 6}, {3});
  dot(x, c).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{4, 5, 6}));
  dot(x, c).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{8, 10, 12}));
}

TEST(Autograd, LeafUsedTwiceGetsTheSum) {
  Tensor x = leaf({1, 2}, {2});
  const Tensor a = values({3, 4}, {2}), b = values({10, 20}, {2});
  sum(add(mul(x, a), mul(x, b))).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{13, 24}));
}

TEST(Autograd, LeafTimesItselfGetsTwiceItself) {
  Tensor x = leaf({1, -2, 3}, {3});
  sum(mul(x, x)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, -4, 6}));
}

TEST(Autograd, GradientThroughTransposeIsStoredInTheLeafsLayout) {
  // The gradient reaches the leaf through a transpose (a non-contiguous view of the incoming gradient);
  // grad() must hold it in x's own layout, and a second backward must add in the same layout.
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor c = values({1, 2, 3, 4, 5, 6}, {3, 2});  // dL/dx[i][j] = c[j][i]
  dot(x.transpose(0, 1), c).backward();
  EXPECT_TRUE(x.grad().is_contiguous());
  EXPECT_EQ(x.grad().shape(), (Shape{2, 3}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1, 3, 5, 2, 4, 6}));
  dot(x.transpose(0, 1), c).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 6, 10, 4, 8, 12}));
}

TEST(Autograd, LeavesSummedTogetherGetIndependentGradients) {
  // add's backward hands the same gradient tensor to both inputs; each leaf must keep its own copy, or
  // the second backward's accumulation into one would also change the other.
  Tensor a = leaf({1, 2}, {2}), b = leaf({3, 4}, {2});
  const Tensor c = values({5, 6}, {2});
  dot(add(a, b), c).backward();
  EXPECT_NE(a.grad().storage(), b.grad().storage());
  dot(add(a, b), c).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{10, 12}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{10, 12}));
}

TEST(Autograd, DetachStopsTheGradient) {
  Tensor x = leaf({1, 2}, {2});
  sum(mul(x.detach(), x)).backward();  // only the second factor is differentiated: dL/dx = x
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1, 2}));
  EXPECT_FALSE(x.detach().requires_grad());
}

TEST(Autograd, ConstantInputGetsNoGradient) {
  Tensor x = leaf({1, 2}, {2});
  Tensor c = values({3, 4}, {2});
  dot(x, c).backward();
  EXPECT_FALSE(c.grad().defined());
  EXPECT_FALSE(c.requires_grad());
}

TEST(Autograd, HalfLeafGetsHalfGradient) {
  // An f16 parameter used through .to(f32) receives its gradient in f16 (rounded once).
  Tensor p = Tensor::from_vector({1, 2, 3}, {3}).to(DType::f16);
  p.set_requires_grad(true);
  dot(p.to(DType::f32), values({0.1f, -4, 1000}, {3})).backward();
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(p.grad().dtype(), DType::f16);
  // f16(0.1) = 0.0999755859375 (0x2E66); -4 and 1000 are exact in f16.
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{0.0999755859375f, -4, 1000}));
}

TEST(Autograd, HalfLeafUsedTwiceGetsTheSum) {
  // Two .to(f32) conversions of one f16 parameter (a tied weight in fp16 training): both gradients
  // arrive in f16 and must be summed before the leaf accumulates them.
  Tensor p = Tensor::from_vector({1, 2}, {2}).to(DType::f16);
  p.set_requires_grad(true);
  const Tensor a = values({3, 4}, {2}), b = values({10, 20}, {2});
  sum(add(mul(p.to(DType::f32), a), mul(p.to(DType::f32), b))).backward();
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(p.grad().dtype(), DType::f16);
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{13, 24}));
}

// ---------------------------------------------------------------------------------------------
// grad mode

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y;
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(autograd::grad_mode_enabled());
    y = sum(mul(x, 2.0f));
  }
  EXPECT_TRUE(autograd::grad_mode_enabled());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_THROW(y.backward(), Error);
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, NoGradGuardsNestAndRestore) {
  {
    NoGradGuard outer;
    {
      NoGradGuard inner;
      EXPECT_FALSE(autograd::grad_mode_enabled());
    }
    EXPECT_FALSE(autograd::grad_mode_enabled());
  }
  EXPECT_TRUE(autograd::grad_mode_enabled());
}

TEST(Autograd, SetRequiresGradOnlyOnFloatLeaves) {
  Tensor x = leaf({1}, {1});
  Tensor y = mul(x, 2.0f);
  EXPECT_FALSE(y.is_leaf());
  EXPECT_THROW(y.set_requires_grad(true), Error);
  Tensor i = Tensor::from_indices({1}, {1});
  EXPECT_THROW(i.set_requires_grad(true), Error);
}

// ---------------------------------------------------------------------------------------------
// backward's errors and seeds

TEST(Autograd, BackwardOnNonScalarWithoutSeedThrows) {
  Tensor x = leaf({1, 2, 3}, {3});
  EXPECT_THROW(mul(x, 2.0f).backward(), Error);
}

TEST(Autograd, BackwardWithSeedUsesIt) {
  Tensor x = leaf({1, 2, 3}, {3});
  autograd::backward(mul(x, 2.0f), values({1, 10, 100}, {3}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 20, 200}));
}

TEST(Autograd, SeedOfWrongShapeThrows) {
  Tensor x = leaf({1, 2, 3}, {3});
  EXPECT_THROW(autograd::backward(mul(x, 2.0f), values({1, 1}, {2})), Error);
}

TEST(Autograd, BackwardOnTensorThatNeedsNoGradThrows) {
  EXPECT_THROW(sum(values({1, 2}, {2})).backward(), Error);
}

TEST(Autograd, SecondBackwardThroughFreedGraphThrowsClearly) {
  Tensor x = leaf({1, 2}, {2});
  Tensor loss = dot(x, values({3, 4}, {2}));
  loss.backward();
  try {
    loss.backward();
    FAIL() << "expected zero::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(autograd::grad_mode_enabled()) << "a failed backward must restore grad mode";
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{3, 4}));
}

TEST(Autograd, RetainGraphAllowsSecondBackward) {
  Tensor x = leaf({1, 2}, {2});
  Tensor loss = sum(mul(mul(x, x), 0.5f));  // dL/dx = x
  autograd::backward(loss, Tensor(), /*retain_graph=*/true);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1, 2}));
  loss.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 4}));
}

// ---------------------------------------------------------------------------------------------
// post-accumulate-grad hooks

TEST(Hooks, FireOncePerBackwardAfterGradientIsComplete) {
  Tensor x = leaf({1, 2}, {2});
  const Tensor a = values({3, 4}, {2}), b = values({10, 20}, {2});
  std::vector<std::vector<float>> seen;
  register_post_accumulate_grad_hook(x, [&](Tensor& p) { seen.push_back(p.grad().to_vector()); });
  auto loss = [&] { return sum(add(mul(x, a), mul(x, b))); };  // x used twice: dL/dx = a + b
  loss().backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<float>{13, 24}));
  loss().backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<float>{26, 48}));  // the accumulated gradient
}

TEST(Hooks, HookReceivesTheParameterItself) {
  Tensor x = leaf({1, 2}, {2});
  bool same = false;
  register_post_accumulate_grad_hook(x, [&](Tensor& p) { same = p.impl() == x.impl(); });
  dot(x, values({1, 1}, {2})).backward();
  EXPECT_TRUE(same);
}

TEST(Hooks, TiedWeightFiresOnceWithSummedGradient) {
  // A GPT's tied embedding / LM head: W[V=4, C=3] embeds idx, and the result is projected back by W.
  //   h[n, c] = W[idx[n], c];  logits[n, v] = sum_c h[n, c] W[v, c];  L = sum(logits * G)
  //   dL/dW[v, c] = sum_n G[n, v] h[n, c]                          (head)
  //              + sum_n [idx[n] == v] sum_u G[n, u] W[u, c]        (embedding)
  const std::vector<float> w = {0.1f, 0.2f, 0.3f, -0.4f, 0.5f, 0.6f, 0.7f, -0.8f, 0.9f, 1.0f, 1.1f, -1.2f};
  const std::vector<std::int64_t> idx = {1, 3};
  const std::vector<float> g = {1, -1, 2, 0.5f, -2, 3, 0.25f, 1};
  Tensor W = leaf(w, {4, 3});
  std::vector<double> expected(12, 0.0);
  for (int n = 0; n < 2; ++n)
    for (int v = 0; v < 4; ++v)
      for (int c = 0; c < 3; ++c) {
        expected[v * 3 + c] += g[n * 4 + v] * w[idx[n] * 3 + c];
        expected[idx[n] * 3 + c] += g[n * 4 + v] * w[v * 3 + c];
      }

  int fired = 0;
  std::vector<float> in_hook;
  register_post_accumulate_grad_hook(W, [&](Tensor& p) {
    ++fired;
    in_hook = p.grad().to_vector();
  });
  Tensor h = embedding(W, Tensor::from_indices(idx, {2}));
  Tensor logits = linear(h, W, Tensor());
  sum(mul(logits, values(g, {2, 4}))).backward();

  EXPECT_EQ(fired, 1);
  ASSERT_EQ(in_hook.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(in_hook[i], expected[i], 1e-5) << "element " << i;
}

TEST(Hooks, UnusedParameterFiresNoHookAndKeepsNoGradient) {
  Tensor used = leaf({1, 2}, {2}), unused = leaf({3, 4}, {2});
  int fired_unused = 0, fired_used = 0;
  register_post_accumulate_grad_hook(unused, [&](Tensor&) { ++fired_unused; });
  register_post_accumulate_grad_hook(used, [&](Tensor&) { ++fired_used; });
  dot(used, values({1, 1}, {2})).backward();
  EXPECT_EQ(fired_used, 1);
  EXPECT_EQ(fired_unused, 0);
  EXPECT_FALSE(unused.grad().defined());
}

TEST(Hooks, ParameterReachedOnlyThroughDetachFiresNoHook) {
  Tensor p = leaf({1, 2}, {2}), x = leaf({3, 4}, {2});
  int fired = 0;
  register_post_accumulate_grad_hook(p, [&](Tensor&) { ++fired; });
  sum(mul(p.detach(), x)).backward();
  EXPECT_EQ(fired, 0);
  EXPECT_FALSE(p.grad().defined());
}

TEST(Hooks, ParameterUsedUnderNoGradFiresNoHook) {
  Tensor p = leaf({1, 2}, {2}), x = leaf({3, 4}, {2});
  int fired = 0;
  register_post_accumulate_grad_hook(p, [&](Tensor&) { ++fired; });
  Tensor scaled;
  {
    NoGradGuard no_grad;
    scaled = mul(p, 2.0f);  // a tensor that does not require grad
  }
  sum(mul(scaled, x)).backward();
  EXPECT_EQ(fired, 0);
  EXPECT_FALSE(p.grad().defined());
  EXPECT_TRUE(x.grad().defined());
}

TEST(Hooks, ParameterWhosePathCarriesNoGradientFiresNoHook) {
  // An op that is recorded with p as an input but whose backward gives p no gradient (like an index
  // or a mask argument): the engine must still visit p's accumulator, and must neither fire its hook
  // nor define its gradient.
  Tensor p = leaf({1, 2}, {2}), x = leaf({3, 4}, {2});
  int fired = 0;
  register_post_accumulate_grad_hook(p, [&](Tensor&) { ++fired; });
  Tensor out = mul(x.detach(), p.detach());
  autograd::record("x_times_constant_p", {x, p}, out, [p = p.detach()](const Tensor& gr) -> std::vector<Tensor> {
    return {mul(gr, p), Tensor()};
  });
  sum(out).backward();
  EXPECT_EQ(fired, 0);
  EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1, 2}));
}

// A two-layer chain: y = linear(linear(x, W1, b1), W2, b2); L = sum(y * G). Returns the hook order.
struct Chain {
  Tensor W1 = leaf({0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, 0.7f, 0.8f, -0.9f, 1.0f, 1.1f, 1.2f}, {4, 3});
  Tensor b1 = leaf({0.1f, 0.2f, 0.3f, 0.4f}, {4});
  Tensor W2 = leaf({1, 2, 3, 4, -1, -2, -3, -4}, {2, 4});
  Tensor b2 = leaf({0.5f, -0.5f}, {2});
  std::vector<std::string> order;

  Chain() {
    const std::vector<std::pair<Tensor*, std::string>> params = {{&W1, "W1"}, {&b1, "b1"}, {&W2, "W2"}, {&b2, "b2"}};
    for (auto& [t, name] : params)
      register_post_accumulate_grad_hook(*t, [this, name = name](Tensor&) { order.push_back(name); });
  }
  std::vector<std::string> run_backward() {
    order.clear();
    const Tensor x = values({1, 2, 3, -1, 0, 1}, {2, 3});
    Tensor y = linear(linear(x, W1, b1), W2, b2);
    sum(mul(y, values({1, -1, 2, 0.5f}, {2, 2}))).backward();
    return order;
  }
};

TEST(Hooks, OrderIsTheSameOverRepeatedBackwards) {
  Chain chain;
  const auto first = chain.run_backward();
  ASSERT_EQ(first.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(chain.run_backward(), first) << "backward " << i + 2;
}

TEST(Hooks, OrderIsLatestCreatedFirst) {
  // Note [Hook order]: among ready nodes the one created last runs first. In linear(x, W, b) the
  // accumulators are made in input order (W then b), after the op's own node; the second layer's
  // come later. So: b2, W2 (ready with layer 1's node, which is older), then b1, W1.
  Chain chain;
  EXPECT_EQ(chain.run_backward(), (std::vector<std::string>{"b2", "W2", "b1", "W1"}));
}

TEST(Hooks, RemovedHookStopsFiring) {
  Tensor x = leaf({1, 2}, {2});
  int removed_calls = 0, kept_calls = 0;
  const int id = register_post_accumulate_grad_hook(x, [&](Tensor&) { ++removed_calls; });
  register_post_accumulate_grad_hook(x, [&](Tensor&) { ++kept_calls; });
  dot(x, values({1, 1}, {2})).backward();
  remove_post_accumulate_grad_hook(x, id);
  dot(x, values({1, 1}, {2})).backward();
  EXPECT_EQ(removed_calls, 1);
  EXPECT_EQ(kept_calls, 2);
}

TEST(Hooks, HookMayRemoveItself) {
  Tensor x = leaf({1, 2}, {2});
  int calls = 0, id = -1;
  id = register_post_accumulate_grad_hook(x, [&](Tensor& p) {
    ++calls;
    remove_post_accumulate_grad_hook(p, id);
  });
  dot(x, values({1, 1}, {2})).backward();
  dot(x, values({1, 1}, {2})).backward();
  EXPECT_EQ(calls, 1);
}

TEST(Hooks, ReleasingTheGradientInAHookMakesTheNextBackwardStartFresh) {
  // ZeRO-2 copies the gradient into a bucket and drops the parameter's own copy.
  Tensor x = leaf({1, 2}, {2});
  const Tensor c = values({3, 4}, {2});
  std::vector<std::vector<float>> taken;
  register_post_accumulate_grad_hook(x, [&](Tensor& p) {
    taken.push_back(p.grad().to_vector());
    p.set_grad(Tensor());
  });
  dot(x, c).backward();
  EXPECT_FALSE(x.grad().defined());
  dot(x, c).backward();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0], (std::vector<float>{3, 4}));
  EXPECT_EQ(taken[1], (std::vector<float>{3, 4}));  // not 6, 8: the released gradient is gone
}

TEST(Hooks, NeedALeafThatRequiresGrad) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, 2.0f);
  Tensor c = values({1, 2}, {2});
  EXPECT_THROW(register_post_accumulate_grad_hook(y, [](Tensor&) {}), Error);
  EXPECT_THROW(register_post_accumulate_grad_hook(c, [](Tensor&) {}), Error);
}

}  // namespace
}  // namespace zero
