// RMSNorm, the layer docs/adding_a_layer.md builds from ops: forward against a plain-loop reference and
// a gradient check of input and weight (tests/unit/test_adding_a_layer.cpp checks that the guide shows
// this header).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/rms_norm.h"
#include "tests/unit/gradcheck.h"

namespace zero {
namespace {

TEST(RMSNorm, ForwardMatchesReference) {
  Generator gen(7);
  nn::RMSNorm norm(8);
  norm.weight.copy_(Tensor::randn({8}, gen));
  const Tensor x = Tensor::randn({2, 3, 8}, gen);
  const std::vector<float> y = norm.forward(x).to_vector(), xv = x.to_vector(), w = norm.weight.to_vector();
  for (int r = 0; r < 6; ++r) {
    double ms = 0.0;
    for (int c = 0; c < 8; ++c) ms += static_cast<double>(xv[r * 8 + c]) * xv[r * 8 + c] / 8.0;
    for (int c = 0; c < 8; ++c) {
      const double ref = xv[r * 8 + c] / std::sqrt(ms + 1e-6) * w[c];
      EXPECT_NEAR(y[r * 8 + c], ref, 1e-5 * (1.0 + std::abs(ref))) << "row " << r << " channel " << c;
    }
  }
}

TEST(RMSNorm, LayerPassesTheGradientCheck) {
  Generator gen(11);
  nn::RMSNorm norm(6);
  norm.weight.copy_(Tensor::randn({6}, gen));
  Tensor x = Tensor::randn({2, 4, 6}, gen);
  x.set_requires_grad(true);
  const auto r = test::gradcheck([&](const std::vector<Tensor>& in) { return norm.forward(in[0]); }, {x, norm.weight});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.checked, 48 + 6);
  std::printf("[ gradcheck] rms_norm layer max error %.2e over %lld elements\n", r.max_error,
              static_cast<long long>(r.checked));
}

TEST(RMSNorm, GPTWithRMSNormHasOneWeightPerNormAndLearns) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 11;
  cfg.block_size = 8;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  cfg.norm = "rmsnorm";
  Generator gen(3);
  nn::GPT model(cfg, gen);
  int norm_params = 0;
  for (const auto& p : model.named_parameters())
    if (p.name.find("ln") != std::string::npos) {
      ++norm_params;
      EXPECT_EQ(p.name.substr(p.name.size() - 6), "weight") << p.name;
    }
  EXPECT_EQ(norm_params, 3);  // ln1, ln2, lnf: weights only
  // Plain SGD on one fixed batch: the loss must fall.
  const Tensor idx = Tensor::from_indices({1, 2, 3, 4, 5, 6, 7, 8}, {1, 8});
  const Tensor tgt = Tensor::from_indices({2, 3, 4, 5, 6, 7, 8, 9}, {1, 8});
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < 30; ++step) {
    Tensor loss = model.loss(idx, tgt);
    if (step == 0) first = loss.item();
    last = loss.item();
    for (Tensor& p : model.parameters()) p.set_grad(Tensor());
    loss.backward();
    autograd::NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) add_(p, mul(p.grad(), -0.5f));
  }
  EXPECT_LT(last, 0.5f * first) << "first " << first << ", last " << last;
  nn::GPTConfig bad = cfg;
  bad.norm = "batchnorm";
  EXPECT_THROW(bad.validate(), Error);
}

}  // namespace
}  // namespace zero
