// tests/data/gpt_reference.json, written by tools/make_gpt_reference.py (PyTorch 1.13): a tiny GPT's
// config, its weights, one batch, and PyTorch's logits, loss, gradients and 5 AdamW steps. ReferenceGpt
// builds our GPT with those weights and that batch, for the tests that compare against PyTorch.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "test_paths.h"

namespace zero::testing {

struct ReferenceGpt {
  nlohmann::json ref;  // the whole file
  nn::GPTConfig cfg;   // the file's config (no dropout, biases as PyTorch's)
  Generator gen{0};
  std::unique_ptr<nn::GPT> model;  // cfg, with the file's weights loaded
  Tensor idx, targets;             // [batch, block_size] token ids of the file's batch

  ReferenceGpt() {
    std::ifstream in(test_data_dir() + "/gpt_reference.json");
    EXPECT_TRUE(in.good()) << "missing tests/data/gpt_reference.json";
    ref = nlohmann::json::parse(in);
    const auto& c = ref["config"];
    cfg.vocab_size = c["vocab_size"];
    cfg.n_layer = c["n_layer"];
    cfg.n_head = c["n_head"];
    cfg.n_embd = c["n_embd"];
    cfg.block_size = c["block_size"];
    model = std::make_unique<nn::GPT>(cfg, gen);
    std::map<std::string, Tensor> state;
    for (auto& [name, p] : ref["params"].items())
      state[name] = Tensor::from_vector(p["data"].get<std::vector<float>>(), p["shape"].get<Shape>());
    model->load_state_dict(state);
    const std::int64_t B = c["batch"], T = c["block_size"];
    std::vector<std::int64_t> x, y;
    for (auto& row : ref["idx"]) for (auto v : row) x.push_back(v);
    for (auto& row : ref["targets"]) for (auto v : row) y.push_back(v);
    idx = Tensor::from_indices(x, {B, T});
    targets = Tensor::from_indices(y, {B, T});
  }
};

}  // namespace zero::testing
