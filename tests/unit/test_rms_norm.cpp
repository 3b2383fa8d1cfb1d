// RMSNorm, the layer docs/adding_a_layer.md builds from ops: forward against a plain-loop reference,
// gradient check of input and weight, and the guide's code block is the header that compiles here.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/rms_norm.h"
#include "tests/unit/gradcheck.h"

namespace zero {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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

// The guide's first code block is nn/rms_norm.h, so the example in the docs is the one built here.
TEST(RMSNorm, GuideExampleIsTheHeaderThatBuilds) {
  const std::string doc = read_file(std::string(ZERO_TEST_DATA_DIR) + "/../../docs/adding_a_layer.md");
  const std::string header = read_file(std::string(ZERO_TEST_DATA_DIR) + "/../../nn/rms_norm.h");
  const std::size_t open = doc.find("```cpp\n");
  ASSERT_NE(open, std::string::npos);
  const std::size_t begin = open + 7, end = doc.find("```", begin);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(doc.substr(begin, end - begin), header) << "docs/adding_a_layer.md's first block differs from nn/rms_norm.h";
}

}  // namespace
}  // namespace zero
