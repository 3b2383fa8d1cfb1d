// GPT: a decoder-only transformer (Radford et al. 2019, GPT-2) as in nanoGPT: token + position
// embeddings, L pre-LN blocks (x + attn(ln1(x)), x + mlp(ln2(x))), a final LayerNorm, and an LM head
// tied to the token embedding. Parameter names match PyTorch's layout in tools/make_gpt_reference.py:
// wte, wpe, blocks.{i}.ln1, blocks.{i}.attn.{qkv,proj}, blocks.{i}.ln2, blocks.{i}.mlp.{fc,fc2}, lnf.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "nn/layers.h"

namespace zero::nn {

/// The model's one description. Checkpoints record it (state.json "model"), and every program that
/// builds or reads a GPT (train_gpt, sample_gpt, zero_explain, tools/check_checkpoint.py) reads the
/// same fields. A block variant (which norm, which MLP, ...) is a text field here and one row of
/// model_options() (nn/gpt.cpp), from which its JSON key, its check, its command-line flag and its
/// place in a checkpoint all come (docs/adding_a_layer.md).
struct GPTConfig {
  std::int64_t vocab_size = 65;
  std::int64_t block_size = 64;  // T: the longest sequence
  std::int64_t n_layer = 4;      // L
  std::int64_t n_head = 4;       // H
  std::int64_t n_embd = 128;     // C
  float dropout = 0.0f;
  bool bias = true;  // biases in Linear layers (LayerNorm always has them)
  /// "layernorm" (GPT-2) or "rmsnorm" (nn/rms_norm.h) for ln1, ln2 and lnf.
  std::string norm = "layernorm";

  /// Throws zero::Error naming the first invalid field (non-positive sizes, C not divisible by H,
  /// dropout outside [0, 1), an unknown norm).
  void validate() const;

  /// Every field as one JSON object: {"vocab_size", "block_size", "n_layer", "n_head", "n_embd" (integers),
  /// "dropout" (number), "bias" (bool)} and one string per row of model_options() ("norm", ...).
  nlohmann::json to_json() const;
  /// The config to_json wrote, validated. vocab_size, block_size, n_layer, n_head and n_embd are
  /// required; dropout (0), bias (true) and norm ("layernorm") default to what a model had before the
  /// field existed, so an older checkpoint's config still reads as the model it was. Throws zero::Error
  /// naming the field for a missing required field, a value of the wrong type, a field this build does
  /// not know (a newer model variant must not load as a different model), or an invalid config.
  static GPTConfig from_json(const nlohmann::json& j);
};

/// One model option: which variant fills a slot of the block (nn::Norm, nn::FeedForward, ...). A row
/// gives the GPTConfig field, its key in the config's JSON (state.json "model"), its command-line flag
/// (train_gpt, zero_explain: examples/model_options.h), its values (the first is the default, and what
/// a config written before the option existed reads as) and the flag's help line. A resumed run takes
/// it from the checkpoint and refuses a flag that differs (examples/resume_settings.cpp).
struct ModelOption {
  const char* key;                   // "norm": the JSON key
  const char* flag;                  // "--norm"
  std::vector<std::string> allowed;  // {"layernorm", "rmsnorm"}: the default first
  const char* doc;                   // one line
  std::string GPTConfig::*field;     // &GPTConfig::norm
};

/// Every model option, in the order the flags are listed.
const std::vector<ModelOption>& model_options();

/// The slot of attention in a block (CausalSelfAttention): x[B, T, C] -> [B, T, C].
class Attention : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
};

/// The slot of the feed-forward network in a block (MLP): x[B, T, C] -> [B, T, C].
class FeedForward : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
};

/// Causal multi-head self-attention: qkv = Linear(C, 3C), fused causal attention, proj = Linear(C, C).
class CausalSelfAttention : public Attention {
 public:
  CausalSelfAttention(const GPTConfig& cfg, Generator& gen);
  /// x[B, T, C] -> [B, T, C].
  Tensor forward(const Tensor& x) const override;

  std::shared_ptr<Linear> qkv, proj;
  std::shared_ptr<Dropout> resid_dropout;
  std::int64_t n_head;
};

/// Feed-forward: fc = Linear(C, 4C), GELU, fc2 = Linear(4C, C).
class MLP : public FeedForward {
 public:
  MLP(const GPTConfig& cfg, Generator& gen);
  /// x[B, T, C] -> [B, T, C].
  Tensor forward(const Tensor& x) const override;

  std::shared_ptr<Linear> fc, fc2;
  std::shared_ptr<Dropout> dropout;
};

/// Pre-LN transformer block.
class Block : public Module {
 public:
  Block(const GPTConfig& cfg, Generator& gen);
  /// x[B, T, C] -> [B, T, C].
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<Norm> ln1, ln2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<FeedForward> mlp;
};

class GPT : public Module {
 public:
  /// Builds and initialises the model (GPT-2 / nanoGPT: N(0, 0.02), residual projections
  /// N(0, 0.02/sqrt(2L)), zero biases, unit LayerNorm weights). Throws zero::Error on a bad config.
  GPT(const GPTConfig& cfg, Generator& gen);
  /// idx[B, T] (i64 token ids, T <= block_size) -> logits[B, T, V].
  Tensor forward(const Tensor& idx) const;
  /// Mean cross-entropy of forward(idx) against targets[B, T]: a one-element tensor.
  Tensor loss(const Tensor& idx, const Tensor& targets) const;

  const GPTConfig& config() const { return cfg_; }

  /// Activation recompute per block (autograd/checkpoint.h): none (default), full (each block a
  /// checkpointed segment keeping only its input) or selective (keeping also its GEMMs' outputs). The
  /// results are bitwise the same in every mode; only the memory held for the backward and the compute
  /// change (docs/zero.md, section 9). Not part of the model's config: a training setting.
  void set_recompute(autograd::Recompute mode) { recompute_ = mode; }
  autograd::Recompute recompute() const { return recompute_; }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<Norm> lnf;

 private:
  GPTConfig cfg_;
  autograd::Recompute recompute_ = autograd::Recompute::none;
};

/// Training FLOPs per token (forward + backward), PaLM paper (Chowdhery et al. 2022) appendix B:
/// 6·N for the N parameters plus 12·L·T·C for attention scores and values.
double flops_per_token(const GPTConfig& cfg, std::int64_t num_params);

}  // namespace zero::nn
