// The GPT the ZeRO suites train: small enough for milliseconds a step, with every kind of tensor a real
// one has (embeddings, attention, MLP, norms).
#pragma once

#include "nn/gpt.h"

namespace zero::dist::harness {

/// 2 layers, 2 heads, 8 channels, block 8, vocabulary 11, no biases (a key bias has an exactly-zero true
/// gradient: pure rounding noise that AdamW amplifies), dropout as given.
inline nn::GPTConfig tiny_gpt_config(float dropout = 0.0f) {
  nn::GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.dropout = dropout;
  c.bias = false;
  return c;
}

}  // namespace zero::dist::harness
