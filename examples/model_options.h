// The model's command-line flags, for train_gpt and zero_explain: the shape (one flag per size field of
// nn::GPTConfig, nn/gpt.h) and one flag per row of nn::model_options() (--norm, ...), so a new model
// option reaches both programs from its row (docs/adding_a_layer.md).
#pragma once

#include <CLI/CLI.hpp>

#include "nn/gpt.h"

namespace zero::examples {

/// One flag per row of nn::model_options() (--norm, ...), writing its field of `cfg`; the shown default
/// is cfg's value, and a value outside the row's list is a usage error naming the flag.
inline void add_model_option_flags(CLI::App& app, nn::GPTConfig& cfg) {
  for (const nn::ModelOption& o : nn::model_options())
    app.add_option(o.flag, cfg.*o.field, o.doc)->check(CLI::IsMember(o.allowed))->capture_default_str();
}

/// Adds --block, --n-layer, --n-head, --n-embd, --dropout and the model options' flags to `app`, each
/// writing its field of `cfg` (shown defaults: cfg's values), for zero_explain. vocab_size comes from the
/// data, not a flag. Sizes are checked by cfg.validate(), which the program calls before any work.
inline void add_model_options(CLI::App& app, nn::GPTConfig& cfg) {
  app.add_option("--block", cfg.block_size, "sequence length (T)")->capture_default_str();
  app.add_option("--n-layer", cfg.n_layer, "transformer blocks (L)")->capture_default_str();
  app.add_option("--n-head", cfg.n_head, "attention heads (H)")->capture_default_str();
  app.add_option("--n-embd", cfg.n_embd, "channels (C)")->capture_default_str();
  app.add_option("--dropout", cfg.dropout, "dropout probability")->capture_default_str();
  add_model_option_flags(app, cfg);
}

/// The model options of `cfg` copied into `to` (train_gpt's flags into the model it builds).
inline void copy_model_options(const nn::GPTConfig& from, nn::GPTConfig& to) {
  for (const nn::ModelOption& o : nn::model_options()) to.*o.field = from.*o.field;
}

}  // namespace zero::examples
