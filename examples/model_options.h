// The model's command-line flags: one flag per field of nn::GPTConfig (nn/gpt.h), for zero_explain.
// train_gpt does not use this header: its model flags, with the same names and defaults, are in its own
// Args (examples/train_options.h, .cpp). A new config field gets its flag in both (the full list of
// files: docs/adding_a_layer.md).
#pragma once

#include <CLI/CLI.hpp>

#include "nn/gpt.h"

namespace zero::examples {

/// Adds --block, --n-layer, --n-head, --n-embd, --dropout and --norm to `app`, each writing its field of
/// `cfg` (shown defaults: cfg's values). vocab_size comes from the data, not a flag. Values are checked
/// by cfg.validate(), which the program calls before any work.
inline void add_model_options(CLI::App& app, nn::GPTConfig& cfg) {
  app.add_option("--block", cfg.block_size, "sequence length (T)")->capture_default_str();
  app.add_option("--n-layer", cfg.n_layer, "transformer blocks (L)")->capture_default_str();
  app.add_option("--n-head", cfg.n_head, "attention heads (H)")->capture_default_str();
  app.add_option("--n-embd", cfg.n_embd, "channels (C)")->capture_default_str();
  app.add_option("--dropout", cfg.dropout, "dropout probability")->capture_default_str();
  app.add_option("--norm", cfg.norm, "normalisation layers: layernorm or rmsnorm")->capture_default_str();
}

}  // namespace zero::examples
