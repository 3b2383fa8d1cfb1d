// Parity with PyTorch: tests/data/gpt_reference.json was written by tools/make_gpt_reference.py
// (PyTorch 1.13) for a tiny GPT: its weights, one batch, logits, loss, every parameter gradient, and
// the losses of 5 AdamW steps with clipping. Our GPT loads the same weights and must agree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "gpt_reference.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace {

using namespace zero;
using nlohmann::json;

using Fixture = zero::testing::ReferenceGpt;

// |a - b| <= rel * max(|b|, floor): relative, with an absolute floor for values that are zero in exact
// arithmetic (e.g. the key-bias gradients, which softmax's shift invariance makes exactly 0).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double floor,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]) / std::max<double>(std::abs(want[i]), floor);
    worst = std::max(worst, err);
    ASSERT_LE(err, rel) << what << "[" << i << "]: got " << got[i] << ", PyTorch " << want[i];
  }
}

TEST(GptParity, ParameterNamesMatchPyTorch) {
  Fixture f;
  std::vector<std::string> names;
  for (auto& p : f.model->named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names, f.ref["param_order"].get<std::vector<std::string>>());
}

TEST(GptParity, LogitsAndLossMatchPyTorch) {
  Fixture f;
  Tensor logits = f.model->forward(f.idx);
  EXPECT_EQ(logits.shape(), f.ref["logits"]["shape"].get<Shape>());
  expect_close(logits.to_vector(), f.ref["logits"]["data"].get<std::vector<float>>(), 1e-5, 1e-2, "logits");
  const float loss = f.model->loss(f.idx, f.targets).item();
  EXPECT_NEAR(loss, f.ref["loss"].get<double>(), 1e-5 * f.ref["loss"].get<double>());
}

TEST(GptParity, GradientsMatchPyTorch) {
  Fixture f;
  f.model->loss(f.idx, f.targets).backward();
  for (auto& p : f.model->named_parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    expect_close(p.tensor.grad().to_vector(), f.ref["grads"][p.name].get<std::vector<float>>(), 1e-4, 1e-2, p.name);
  }
}

TEST(GptParity, FiveAdamWStepsMatchPyTorchLosses) {
  Fixture f;
  const auto& h = f.ref["adamw"];
  std::vector<optim::ParamGroup> groups(2);
  groups[0].weight_decay = h["weight_decay"];
  for (auto& p : f.model->named_parameters()) groups[p.decay ? 0 : 1].params.push_back(p.tensor);
  optim::AdamW opt(groups, optim::AdamWOptions{h["lr"], h["betas"][0], h["betas"][1], h["eps"]});
  const auto want = h["losses"].get<std::vector<float>>();
  for (std::size_t step = 0; step < want.size(); ++step) {
    Tensor loss = f.model->loss(f.idx, f.targets);
    EXPECT_NEAR(loss.item(), want[step], 1e-4 * want[step]) << "step " << step;
    opt.zero_grad();
    loss.backward();
    optim::clip_grad_norm(f.model->parameters(), h["clip"]);
    opt.step();
  }
}

}  // namespace
