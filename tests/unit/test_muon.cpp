// Muon (optim/muon.h) against PyTorch: tests/data/muon_reference.json was written by
// tools/make_muon_reference.py (PyTorch 1.13, plain torch ops written from the published recipes, not from
// optim/muon.cpp) for the tiny GPT of tests/data/gpt_reference.json: the Newton–Schulz iteration on two
// random matrices (wide and tall), and 5 Muon + AdamW steps with clipping (losses and final parameters).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "core/check.h"
#include "distributed/run/config.h"
#include "gpt_reference.h"
#include "nn/gpt.h"
#include "optim/clip.h"
#include "optim/muon.h"
#include "test_paths.h"

namespace {

using namespace zero;
using nlohmann::json;

json load(const std::string& file) {
  std::ifstream in(zero::testing::test_data_dir() + "/" + file);
  EXPECT_TRUE(in.good()) << "missing tests/data/" << file;
  return json::parse(in);
}

// |a - b| <= tol * max(|b|, floor) for every element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, double floor,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(static_cast<double>(got[i]) - want[i]), tol * std::max<double>(std::abs(want[i]), floor))
        << what << "[" << i << "]: got " << got[i] << ", PyTorch " << want[i];
}

TEST(Muon, NewtonSchulzMatchesPyTorch) {
  const json ref = load("muon_reference.json")["newton_schulz"];
  for (std::size_t k = 0; k < ref["inputs"].size(); ++k) {
    const auto shape = ref["inputs"][k]["shape"].get<std::vector<std::int64_t>>();
    std::vector<float> x = ref["inputs"][k]["data"].get<std::vector<float>>();
    optim::newton_schulz5(x.data(), shape[0], shape[1], ref["steps"]);
    expect_close(x, ref["outputs"][k]["data"].get<std::vector<float>>(), 1e-5, 1e-1,
                 "matrix " + std::to_string(k));
  }
}

TEST(Muon, NewtonSchulzRejectsEmptyMatricesAndZeroSteps) {
  std::vector<float> x(4, 1.0f);
  EXPECT_THROW(optim::newton_schulz5(x.data(), 0, 4, 5), Error);
  EXPECT_THROW(optim::newton_schulz5(x.data(), 2, 2, 0), Error);
}

using Model = zero::testing::ReferenceGpt;  // our GPT with the reference weights and batch

// The recipe's split: is_muon_matrix picks exactly the matrices the reference gave Muon.
TEST(Muon, HiddenMatricesGoToMuonTheRestToAdamW) {
  Model m;
  const json ref = load("muon_reference.json")["muon"];
  std::vector<std::string> picked;
  for (auto& p : m.model->named_parameters())
    if (optim::is_muon_matrix(p.name, p.tensor.shape())) picked.push_back(p.name);
  EXPECT_EQ(picked, ref["muon_params"].get<std::vector<std::string>>());
}

TEST(Muon, FiveStepsMatchPyTorch) {
  Model m;
  const json ref = load("muon_reference.json");
  const json& h = ref["muon"];
  std::vector<optim::ParamGroup> muon(1), adamw(2);
  muon[0].weight_decay = adamw[0].weight_decay = h["weight_decay"];
  for (auto& p : m.model->named_parameters()) {
    if (optim::is_muon_matrix(p.name, p.tensor.shape())) muon[0].params.push_back(p.tensor);
    else adamw[p.decay ? 0 : 1].params.push_back(p.tensor);
  }
  optim::MuonOptions o;
  o.lr = h["lr"];
  o.momentum = h["momentum"];
  o.ns_steps = h["ns_steps"];
  o.beta1 = h["betas"][0];
  o.beta2 = h["betas"][1];
  o.eps = h["eps"];
  optim::Muon opt(muon, adamw, o);
  const auto want = h["losses"].get<std::vector<float>>();
  for (std::size_t step = 0; step < want.size(); ++step) {
    Tensor loss = m.model->loss(m.idx, m.targets);
    EXPECT_NEAR(loss.item(), want[step], 1e-4 * want[step]) << "step " << step;
    opt.zero_grad();
    loss.backward();
    optim::clip_grad_norm(m.model->parameters(), h["clip"]);
    opt.step();
  }
  // The key biases (qkv.bias[C, 2C)) have an exactly-zero gradient in exact arithmetic (softmax's shift
  // invariance), so their AdamW steps normalise rounding noise: each moves by up to lr per step in either
  // direction. They are held to that bound; every other element to 1e-4.
  const std::int64_t C = m.ref["config"]["n_embd"];
  const double noise_bound = 2.0 * h["lr"].get<double>() * static_cast<double>(want.size());
  for (auto& p : m.model->named_parameters()) {
    std::vector<float> got = p.tensor.to_vector(), ref_values = ref["params"][p.name].get<std::vector<float>>();
    if (p.name.ends_with("attn.qkv.bias")) {
      for (std::int64_t i = C; i < 2 * C; ++i) {
        EXPECT_NEAR(got[i], ref_values[i], noise_bound) << p.name << "[" << i << "]";
        got[i] = ref_values[i];
      }
    }
    expect_close(got, ref_values, 1e-4, 1e-1, p.name);
  }
}

TEST(Muon, RejectsANonMatrixAndBadOptions) {
  std::vector<optim::ParamGroup> muon(1);
  muon[0].params.push_back(Tensor::zeros({4}));
  EXPECT_THROW(optim::Muon(muon, {}), Error);
  muon[0].params[0] = Tensor::zeros({2, 2});
  optim::MuonOptions o;
  o.momentum = 1.0f;
  EXPECT_THROW(optim::Muon(muon, {}, o), Error);
  o = {};
  o.ns_steps = 0;
  EXPECT_THROW(optim::Muon(muon, {}, o), Error);
}

// A bf16 matrix is stepped through an fp32 master (Note [Master weights]): the parameter after a step is
// the f32 run's parameter rounded to bf16, given the same (bf16-exact) weights and gradient.
TEST(Muon, SixteenBitParameterIsTheRoundedFp32Step) {
  Generator gen{7};
  Tensor w32 = Tensor::randn({6, 4}, gen).to(DType::bf16).to(DType::f32);
  Tensor g32 = Tensor::randn({6, 4}, gen).to(DType::bf16).to(DType::f32);
  Tensor w16 = w32.to(DType::bf16);
  w32.set_grad(g32);
  w16.set_grad(g32.to(DType::bf16));
  optim::Muon a({{{w32}, 0.1f}}, {}), b({{{w16}, 0.1f}}, {});
  a.step();
  b.step();
  EXPECT_EQ(w16.to(DType::f32).to_vector(), w32.to(DType::bf16).to(DType::f32).to_vector());
}

std::string config_error(const json& j, const std::vector<std::pair<std::string, std::string>>& flags = {}) {
  try {
    dist::merge_config(j, "q.json", flags);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// "optimizer": {"type": "Muon"} (any case) or --optimizer muon: ZeroOptions carry Muon and its params.
TEST(MuonConfig, TypeAndParamsReachTheZeroOptions) {
  const auto c = dist::TrainingConfig::from_json(
      json::parse(R"({"optimizer": {"type": "muon", "params": {"lr": 0.02, "momentum": 0.9, "ns_steps": 3}}})"));
  const dist::ZeroOptions zo = c.zero_options();
  EXPECT_TRUE(zo.muon);
  EXPECT_FLOAT_EQ(zo.muon_momentum, 0.9f);
  EXPECT_EQ(zo.muon_ns_steps, 3);
  EXPECT_TRUE(dist::TrainingConfig::from_json(c.to_json()).zero_options().muon);  // the round trip keeps it
  const auto flagged = dist::merge_config(json::object(), "", {{"--optimizer", "muon"}});
  EXPECT_TRUE(flagged.zero_options().muon);
  EXPECT_FALSE(flagged.optimizer.has_value());  // the flag sets the type only: lr and decay stay the program's
  // The recorded config (a checkpoint's) keeps the type and the program's values: DeepSpeed's section
  // defaults do not replace the program's weight decay and beta2 on resume (it records every param, so it
  // reads back as a section whose values are all given).
  const auto recorded = dist::TrainingConfig::from_json(flagged.to_json());
  EXPECT_TRUE(recorded.zero_options().muon);
  EXPECT_EQ(recorded.optimizer->weight_decay, 0.1);
  EXPECT_EQ(recorded.optimizer->beta2, 0.99);
  EXPECT_EQ(recorded.optimizer->lr, 1e-3);
  EXPECT_FALSE(dist::TrainingConfig::from_json(json::object()).zero_options().muon);
  EXPECT_FALSE(dist::TrainingConfig::from_json(dist::TrainingConfig::from_json(json::object()).to_json()).optimizer);
}

TEST(MuonConfig, BadValuesGetOneLineNamingTheKey) {
  EXPECT_NE(config_error(json::parse(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})"))
                .find("optimizer.params.momentum' in q.json: is Muon's"),
            std::string::npos);
  EXPECT_NE(config_error(json::parse(R"({"optimizer": {"type": "Muon", "params": {"momentum": 1.0}}})"))
                .find("must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(config_error(json::parse(R"({"optimizer": {"type": "Muon", "params": {"ns_steps": 0}}})"))
                .find("optimizer.params.ns_steps"),
            std::string::npos);
  EXPECT_EQ(config_error(json::parse(R"({"zero_optimization": {"stage": 3}})"), {{"--optimizer", "muon"}}), "");
  const std::string int8 = config_error(
      json::parse(R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})"), {{"--optimizer", "muon"}});
  EXPECT_NE(int8.find("'optimizer.type' (--optimizer muon): Muon with zero_optimization.zero_quantized_gradients"),
            std::string::npos)
      << int8;
  EXPECT_EQ(int8.find('\n'), std::string::npos);
}

}  // namespace
