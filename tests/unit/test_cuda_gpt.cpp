// The framework on cuda against the same framework on the CPU: every differentiable op (forward and
// backward through autograd), a GPT forward/backward, AdamW and clipping on device parameters, and the
// device checks. Skipped when no GPU is visible (core/cuda/runtime.h); the CPU results are the reference.
#include <gtest/gtest.h>

#ifdef ZERO_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/check.h"
#include "core/cuda/runtime.h"
#include "cuda_test_util.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/loss_scaler.h"

namespace zero {
namespace {

using cuda_test::CudaTest;

// max |a - b| <= atol + rtol * max |b|.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  EXPECT_LE(diff, atol + rtol * scale) << what << ": max |diff| " << diff << ", scale " << scale;
}

Tensor leaf(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  return Tensor::randn(shape, gen).set_requires_grad(true);
}

// One op case: builds a scalar loss from its inputs (all on one device).
struct OpCase {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(const std::vector<Tensor>&, Device)> loss;
};

std::vector<OpCase> op_cases() {
  auto weighted = [](const Tensor& y, Device d) {  // sum(y * w) with a fixed w: a gradient that varies
    Generator gen(99);
    return sum(mul(y, Tensor::randn(y.shape(), gen).to(d)));
  };
  std::vector<OpCase> c;
  c.push_back({"add_broadcast", {{3, 4, 5}, {4, 5}}, [=](auto& x, Device d) { return weighted(add(x[0], x[1]), d); }});
  c.push_back({"sub_leading_one", {{3, 4}, {1, 4}}, [=](auto& x, Device d) { return weighted(sub(x[0], x[1]), d); }});
  c.push_back({"mul_inner_broadcast", {{3, 4, 5}, {3, 1, 5}},
               [=](auto& x, Device d) { return weighted(mul(x[0], x[1]), d); }});
  c.push_back({"mul_scalar_mean", {{7, 3}}, [=](auto& x, Device) { return mean(mul(x[0], 0.5f)); }});
  c.push_back({"matmul_shared", {{2, 3, 4}, {4, 5}}, [=](auto& x, Device d) { return weighted(matmul(x[0], x[1]), d); }});
  c.push_back({"matmul_batched", {{2, 3, 4}, {2, 4, 5}},
               [=](auto& x, Device d) { return weighted(matmul(x[0], x[1]), d); }});
  c.push_back({"linear_bias", {{2, 3, 6}, {5, 6}, {5}},
               [=](auto& x, Device d) { return weighted(linear(x[0], x[1], x[2]), d); }});
  c.push_back({"linear_transposed_input", {{6, 4}, {5, 6}},
               [=](auto& x, Device d) { return weighted(linear(x[0].transpose(0, 1), x[1], Tensor()), d); }});
  c.push_back({"layer_norm", {{4, 8}, {8}, {8}},
               [=](auto& x, Device d) { return weighted(layer_norm(x[0], x[1], x[2], 1e-5f), d); }});
  c.push_back({"gelu", {{3, 9}}, [=](auto& x, Device d) { return weighted(gelu(x[0]), d); }});
  c.push_back({"softmax", {{3, 9}}, [=](auto& x, Device d) { return weighted(softmax(x[0]), d); }});
  c.push_back({"attention", {{2, 5, 12}},
               [=](auto& x, Device d) { return weighted(causal_self_attention(x[0], 2), d); }});
  c.push_back({"narrow_reshape", {{4, 6}},
               [=](auto& x, Device d) { return weighted(x[0].narrow(1, 1, 4).reshape({2, 8}), d); }});
  c.push_back({"embedding_cross_entropy", {{7, 5}}, [](auto& x, Device d) {
                 Tensor idx = Tensor::from_indices({0, 3, 3, 6, 1, 2}, {2, 3}).to(d);
                 Tensor tgt = Tensor::from_indices({4, 0, 1, 2, 3, 4}, {6}).to(d);
                 return cross_entropy(embedding(x[0], idx).reshape({6, 5}), tgt);
               }});
  return c;
}

class CudaOps : public CudaTest {};

TEST_F(CudaOps, ForwardAndBackwardMatchCpu) {
  for (const OpCase& c : op_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> host, dev;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) {
      host.push_back(leaf(c.shapes[i], 10 + i));
      dev.push_back(leaf(c.shapes[i], 10 + i).detach().to(Device::cuda).set_requires_grad(true));
    }
    Tensor lh = c.loss(host, Device::cpu), ld = c.loss(dev, Device::cuda);
    ASSERT_EQ(ld.device(), Device::cuda);
    // Estimates (Note [CUDA test tolerances], cuda_test_util.h): each case is a few ops deep over at most
    // 60 unit-scale terms, so two f32 evaluations in different orders differ by about sqrt(60) u per
    // unit of sum |terms| (random-sign rounding errors; the worst case, 60 u, is 4e-6 per unit);
    // 1e-5 is 20 times the former. The per-kernel bounds are in test_cuda_kernels.cpp.
    expect_close(ld.to_vector(), lh.to_vector(), 1e-5, 1e-5, c.name + " forward");
    lh.backward();
    ld.backward();
    for (std::size_t i = 0; i < host.size(); ++i) {
      ASSERT_TRUE(dev[i].grad().defined()) << "input " << i;
      EXPECT_EQ(dev[i].grad().device(), Device::cuda);
      expect_close(dev[i].grad().to_vector(), host[i].grad().to_vector(), 1e-4, 1e-5,
                   c.name + " grad " + std::to_string(i));
    }
  }
}

TEST_F(CudaOps, MixedDevicesAreAClearError) {
  Tensor a = Tensor::ones({3}), b = Tensor::ones({3}, DType::f32, Device::cuda);
  try {
    add(b, a);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different devices"), std::string::npos) << e.what();
  }
}

TEST_F(CudaOps, DropoutMaskKeepsOneMinusPScaled) {
  Generator gen(1);
  Tensor x = Tensor::ones({100000}, DType::f32, Device::cuda).set_requires_grad(true);
  Tensor y = dropout(x, 0.25f, /*training=*/true, gen);
  const std::vector<float> v = y.to_vector();
  std::int64_t zeros = 0;
  for (float e : v) {
    if (e == 0.0f) ++zeros;
    else EXPECT_FLOAT_EQ(e, 1.0f / 0.75f);
  }
  EXPECT_NEAR(static_cast<double>(zeros) / v.size(), 0.25, 0.01);
  sum(y).backward();  // the gradient is the mask itself
  EXPECT_EQ(x.grad().to_vector(), v);
}

nn::GPTConfig small_config() {
  nn::GPTConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.bias = false;  // a key bias has an exactly-zero true gradient: rounding noise that AdamW turns into +-lr
  return c;
}

std::pair<Tensor, Tensor> batch(const nn::GPTConfig& c, std::int64_t B, int step) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(B * c.block_size)), tgt(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    idx[i] = static_cast<std::int64_t>((i * 7 + static_cast<std::size_t>(step) * 3) % c.vocab_size);
    tgt[i] = static_cast<std::int64_t>((i * 5 + 1 + static_cast<std::size_t>(step)) % c.vocab_size);
  }
  return {Tensor::from_indices(idx, {B, c.block_size}), Tensor::from_indices(tgt, {B, c.block_size})};
}

class CudaGpt : public CudaTest {};

// Forward and backward against the CPU model, then clipping and AdamW on both models from the same
// gradients: the device's, copied into the CPU model, so that both optimizers see the same values and
// each can be held to Note [AdamW trajectory bound] (tests/unit/kernel_bounds.h) against exact AdamW on
// them, however close to zero a gradient is. The parameters therefore stay within that bound of each
// other, and every step's forward and backward compare two models with (nearly) the same weights.
TEST_F(CudaGpt, ForwardBackwardAndAdamWMatchCpu) {
  const nn::GPTConfig cfg = small_config();
  Generator g1(5), g2(5);
  nn::GPT cpu_model(cfg, g1), gpu_model(cfg, g2);
  gpu_model.to(Device::cuda);
  for (const auto& p : gpu_model.named_parameters()) ASSERT_EQ(p.tensor.device(), Device::cuda) << p.name;

  const float weight_decay = 0.1f, max_norm = 0.5f;
  auto groups_of = [&](nn::GPT& m) {
    std::vector<optim::ParamGroup> g(1);
    g[0].weight_decay = weight_decay;
    g[0].params = m.parameters();
    return g;
  };
  const optim::AdamWOptions adam{1e-2f};
  optim::AdamW cpu_opt(groups_of(cpu_model), adam);
  optim::AdamW gpu_opt(groups_of(gpu_model), adam);
  const auto pc = cpu_model.named_parameters(), pg = gpu_model.named_parameters();
  auto flat = [](const std::vector<nn::NamedParameter>& ps, bool grads) {
    std::vector<double> out;
    for (const auto& p : ps) {
      const auto v = (grads ? p.tensor.grad() : p.tensor).to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  kernel_bounds::AdamWTrajectory exact(flat(pc, false), adam.lr, adam.beta1, adam.beta2, adam.eps);
  const std::vector<float> decay(exact.param.size(), weight_decay);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    auto [x, y] = batch(cfg, 3, step);
    Tensor lc = cpu_model.loss(x, y), lg = gpu_model.loss(x.to(Device::cuda), y.to(Device::cuda));
    // Estimates, not bounds (Note [CUDA test tolerances]): the loss is a mean of 3 x block_size
    // cross-entropies after n_layer blocks, each a chain of C- and T-long sums (~1e-6 relative per
    // layer at u = 6e-8); the gradients likewise, 1e-3 of the largest below. The per-kernel bounds are
    // in test_cuda_kernels.cpp.
    EXPECT_NEAR(lg.item(), lc.item(), 1e-4 * std::abs(lc.item()));
    lc.backward();
    lg.backward();
    for (std::size_t i = 0; i < pc.size(); ++i)
      expect_close(pg[i].tensor.grad().to_vector(), pc[i].tensor.grad().to_vector(), 1e-3, 1e-6, pc[i].name + " grad");
    EXPECT_FALSE(optim::has_inf_or_nan(pg[0].tensor.grad()));

    // From here both optimizers work on the device's gradients g.
    for (std::size_t i = 0; i < pc.size(); ++i) pc[i].tensor.grad().copy_(pg[i].tensor.grad());
    const std::vector<double> g = flat(pg, true);
    double sq = 0.0;
    for (double v : g) sq += v * v;
    const float nc = optim::clip_grad_norm(cpu_model.parameters(), max_norm);
    const float ng = optim::clip_grad_norm(gpu_model.parameters(), max_norm);
    // Both are the double norm of the same values (summed in different orders, ~1e-16 apart) rounded
    // to f32: the same float, or neighbours across a rounding boundary.
    EXPECT_LE(std::abs(static_cast<double>(ng) - nc), kernel_bounds::ulp_f32(nc));
    // The clipped gradient each side hands AdamW: g times the clip coefficient (double, rounded to f32,
    // then one f32 product): within 2u of exact, 3u with margin.
    const double coef = std::min(1.0, max_norm / (std::sqrt(sq) + 1e-6));
    std::vector<double> clipped(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) clipped[i] = g[i] * coef;
    exact.apply(clipped, decay, 3 * kernel_bounds::kU);
    cpu_opt.step();
    gpu_opt.step();
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    std::vector<float> got_cpu, got_gpu;
    for (std::size_t i = 0; i < pc.size(); ++i) {
      const auto c = pc[i].tensor.to_vector(), d = pg[i].tensor.to_vector();
      got_cpu.insert(got_cpu.end(), c.begin(), c.end());
      got_gpu.insert(got_gpu.end(), d.begin(), d.end());
    }
    EXPECT_TRUE(kernel_bounds::within_bounds(got_gpu, exact.param, exact.bound)) << "cuda parameters";
    EXPECT_TRUE(kernel_bounds::within_bounds(got_cpu, exact.param, exact.bound)) << "cpu parameters";
  }
}

TEST_F(CudaGpt, EvalWithoutGradAndDropoutRun) {
  nn::GPTConfig cfg = small_config();
  cfg.dropout = 0.1f;
  Generator gen(3);
  nn::GPT model(cfg, gen);
  model.to(Device::cuda);
  auto [x, y] = batch(cfg, 2, 0);
  Tensor loss = model.loss(x.to(Device::cuda), y.to(Device::cuda));  // training: device dropout masks
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item()));
  model.eval();
  autograd::NoGradGuard no_grad;
  Tensor logits = model.forward(x.to(Device::cuda));
  EXPECT_EQ(logits.device(), Device::cuda);
  EXPECT_EQ(logits.shape(), (Shape{2, cfg.block_size, cfg.vocab_size}));
}

}  // namespace
}  // namespace zero

#endif  // ZERO_HAS_CUDA
