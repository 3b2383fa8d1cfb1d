#include "nn/gpt.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/ops_elementwise.h"
#include "autograd/ops_linalg.h"
#include "autograd/ops_nn.h"
#include "nn/rms_norm.h"

namespace zero::nn {

const std::vector<ModelOption>& model_options() {
  static const std::vector<ModelOption> table = {
      {"norm", "--norm", {"layernorm", "rmsnorm"}, "normalisation layers: layernorm or rmsnorm", &GPTConfig::norm},
  };
  return table;
}

void GPTConfig::validate() const {
  ZERO_CHECK(vocab_size > 0, "vocab_size must be positive, got {}", vocab_size);
  ZERO_CHECK(block_size > 0, "block_size must be positive, got {}", block_size);
  ZERO_CHECK(n_layer > 0, "n_layer must be positive, got {}", n_layer);
  ZERO_CHECK(n_head > 0, "n_head must be positive, got {}", n_head);
  ZERO_CHECK(n_embd > 0, "n_embd must be positive, got {}", n_embd);
  ZERO_CHECK(n_embd % n_head == 0, "n_embd ({}) must be divisible by n_head ({})", n_embd, n_head);
  ZERO_CHECK(dropout >= 0.0f && dropout < 1.0f, "dropout must be in [0, 1), got {}", dropout);
  for (const ModelOption& o : model_options()) {
    const std::string& v = this->*o.field;
    ZERO_CHECK(std::find(o.allowed.begin(), o.allowed.end(), v) != o.allowed.end(), "{} must be {}, got '{}'", o.key,
               fmt::join(o.allowed, " or "), v);
  }
}

// The shape fields, once, for both directions: nlohmann/json's macro writes them and reads them back
// keeping GPTConfig's default for an absent one. The options' fields come from model_options().
struct GPTShape {
  std::int64_t vocab_size = GPTConfig{}.vocab_size, block_size = GPTConfig{}.block_size,
               n_layer = GPTConfig{}.n_layer, n_head = GPTConfig{}.n_head, n_embd = GPTConfig{}.n_embd;
  float dropout = GPTConfig{}.dropout;
  bool bias = GPTConfig{}.bias;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GPTShape, vocab_size, block_size, n_layer, n_head, n_embd, dropout,
                                                bias)

nlohmann::json GPTConfig::to_json() const {
  nlohmann::json j = GPTShape{vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias};
  for (const ModelOption& o : model_options()) j[o.key] = this->*o.field;
  return j;
}

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  ZERO_CHECK(j.is_object(), "model config: expected a JSON object, got {}", j.dump());
  const nlohmann::json fields = GPTConfig{}.to_json();  // each field with a value of its type
  std::string names;
  for (const auto& f : fields.items()) names += (names.empty() ? "" : ", ") + f.key();
  for (const auto& [key, value] : j.items()) {
    ZERO_CHECK(fields.contains(key), "model config: unknown field '{}' (this build knows {})", key, names);
    const nlohmann::json& like = fields[key];
    const bool ok = like.is_number_integer() ? value.is_number_integer()
                    : like.is_number()       ? value.is_number()
                                             : value.type() == like.type();
    ZERO_CHECK(ok, "model config: '{}' must be {}, got {}", key,
               like.is_number_integer() ? "an integer"
               : like.is_number()       ? "a number"
               : like.is_boolean()      ? "true or false"
                                        : "a string",
               value.dump());
  }
  for (const char* key : {"vocab_size", "block_size", "n_layer", "n_head", "n_embd"})
    ZERO_CHECK(j.contains(key), "model config: '{}' is missing", key);
  const auto shape = j.get<GPTShape>();  // an absent field keeps GPTConfig's default
  GPTConfig c;
  c.vocab_size = shape.vocab_size, c.block_size = shape.block_size, c.n_layer = shape.n_layer;
  c.n_head = shape.n_head, c.n_embd = shape.n_embd, c.dropout = shape.dropout, c.bias = shape.bias;
  for (const ModelOption& o : model_options()) c.*o.field = j.value(o.key, o.allowed.front());
  c.validate();
  return c;
}

namespace {
// GPT-2 scales the init of the projections that write into the residual stream by 1/sqrt(2L).
float residual_std(const GPTConfig& cfg) { return 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.n_layer)); }
}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& cfg, Generator& gen) : n_head(cfg.n_head) {
  qkv = register_module("qkv", std::make_shared<Linear>(cfg.n_embd, 3 * cfg.n_embd, cfg.bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(cfg.n_embd, cfg.n_embd, cfg.bias, gen, residual_std(cfg)));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(cfg.dropout, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  // The attention's own GEMMs run in the model's dtype where the device has 16-bit GEMMs (cuda).
  return resid_dropout->forward(proj->forward(causal_self_attention(qkv->forward(x), n_head, qkv->weight.dtype())));
}

MLP::MLP(const GPTConfig& cfg, Generator& gen) {
  fc = register_module("fc", std::make_shared<Linear>(cfg.n_embd, 4 * cfg.n_embd, cfg.bias, gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(4 * cfg.n_embd, cfg.n_embd, cfg.bias, gen, residual_std(cfg)));
  dropout = register_module("dropout", std::make_shared<Dropout>(cfg.dropout, gen));
}

Tensor MLP::forward(const Tensor& x) const { return dropout->forward(fc2->forward(gelu(fc->forward(x)))); }

namespace {
std::shared_ptr<Norm> make_norm(const GPTConfig& cfg) {
  if (cfg.norm == "rmsnorm") return std::make_shared<RMSNorm>(cfg.n_embd);
  return std::make_shared<LayerNorm>(cfg.n_embd);
}
}  // namespace

Block::Block(const GPTConfig& cfg, Generator& gen) {
  ln1 = register_module("ln1", make_norm(cfg));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(cfg, gen));
  ln2 = register_module("ln2", make_norm(cfg));
  mlp = register_module("mlp", std::make_shared<MLP>(cfg, gen));
}

Tensor Block::forward(const Tensor& x) const {
  Tensor h = add(x, attn->forward(ln1->forward(x)));
  return add(h, mlp->forward(ln2->forward(h)));
}

GPT::GPT(const GPTConfig& cfg, Generator& gen) : cfg_(cfg) {
  cfg.validate();
  wte = register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, gen));
  wpe = register_module("wpe", std::make_shared<Embedding>(cfg.block_size, cfg.n_embd, gen));
  drop = register_module("drop", std::make_shared<Dropout>(cfg.dropout, gen));
  for (std::int64_t i = 0; i < cfg.n_layer; ++i)
    blocks.push_back(register_module("blocks." + std::to_string(i), std::make_shared<Block>(cfg, gen)));
  lnf = register_module("lnf", make_norm(cfg));
}

Tensor GPT::forward(const Tensor& idx) const {
  ZERO_CHECK(idx.dim() == 2, "GPT::forward: idx must be [B, T], got {}", shape_str(idx.shape()));
  const std::int64_t T = idx.size(1);
  ZERO_CHECK(T <= cfg_.block_size, "GPT::forward: sequence length {} exceeds block_size {}", T, cfg_.block_size);
  std::vector<std::int64_t> positions(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) positions[t] = t;
  // Positions live with the model (wpe's device): cpu -> cuda is one small upload per forward.
  Tensor pos = Tensor::from_indices(positions, {T}).to(wpe->weight.device());
  // Each scope is one forward and one backward span in a trace (Note [Traced scopes]).
  Tensor x;
  {
    autograd::ScopeGuard scope("embedding");
    const Tensor tok = wte->forward(idx);  // [B,T,C]
    const Tensor at = wpe->forward(pos);   // [T,C]
    x = drop->forward(add(tok, at));
  }
  const autograd::RecomputePolicy policy =
      recompute_ == autograd::Recompute::none ? nullptr : autograd::recompute_policy(recompute_);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    autograd::ScopeGuard scope(autograd::tracing() ? "block " + std::to_string(i) : std::string());
    if (!policy) {
      x = blocks[i]->forward(x);
    } else {
      const Block* block = blocks[i].get();
      x = autograd::checkpoint([block](const std::vector<Tensor>& in) { return block->forward(in[0]); }, {x}, policy);
    }
  }
  // LM head tied to the token embedding: logits = lnf(x) @ wte^T. The final norm runs before the
  // weight is read: at ZeRO stage 3 reading another layer's parameters frees the ones read before
  // (Note [Gathering on use] in distributed/zero/partitioned_parameters.cpp).
  autograd::ScopeGuard scope("head");
  const Tensor h = lnf->forward(x);
  return linear(h, wte->gemm_weight(), Tensor());
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) const {
  Tensor logits = forward(idx);
  const std::int64_t V = cfg_.vocab_size;
  autograd::ScopeGuard scope("loss");
  return cross_entropy(logits.view({-1, V}), targets.reshape({-1}));
}

double flops_per_token(const GPTConfig& cfg, std::int64_t num_params) {
  return 6.0 * static_cast<double>(num_params) +
         12.0 * static_cast<double>(cfg.n_layer * cfg.block_size * cfg.n_embd);
}

}  // namespace zero::nn
