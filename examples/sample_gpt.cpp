// sample_gpt: generates text from a train_gpt checkpoint, without retraining (CPU, one process).
//
//   build/bin/sample_gpt --checkpoint out/ --prompt "ROMEO:" --tokens 500 --temperature 0.8 --top-k 40 --seed 1
//
// --checkpoint is a checkpoint directory or a save directory (its newest checkpoint). Prints the
// prompt, then the continuation. The model runs in the checkpoint's dtype (fp32 weights rounded to
// fp16/bf16 for 16-bit runs, as train_gpt computed with them), so with the defaults (no prompt: start
// after a newline, temperature 1, no top-k, --seed as train_gpt's) it prints the text train_gpt's
// end-of-run sample printed. --logits FILE instead writes the logits [1, T, V] of the prompt as a
// safetensors file (tools/compare_torch_logits.py compares them with PyTorch's).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "core/safetensors.h"
#include "distributed/distributed.h"
#include "examples/cli_errors.h"
#include "examples/gpt_sampling.h"

namespace {

using namespace zero;

struct Args {
  std::string checkpoint, prompt, logits;
  std::int64_t tokens = 500, top_k = 0;
  float temperature = 1.0f;
  std::uint64_t seed = 1337;
};

int run(const Args& a) {
  ZERO_CHECK(!a.checkpoint.empty(), "--checkpoint is required");
  ZERO_CHECK(a.tokens >= 0, "--tokens must be >= 0, got {}", a.tokens);
  ZERO_CHECK(a.temperature > 0.0f, "--temperature must be positive, got {}", a.temperature);
  ZERO_CHECK(a.top_k >= 0, "--top-k must be >= 0 (0 = all tokens), got {}", a.top_k);
  const dist::Checkpoint ckpt = dist::open_checkpoint(dist::resolve_checkpoint(a.checkpoint), nullptr);
  // The model is what the checkpoint says it is (GPTConfig::from_json): no model flags.
  ZERO_CHECK(ckpt.state.contains("model"), "checkpoint '{}': state.json has no \"model\" (the model config)", ckpt.dir);
  nn::GPTConfig cfg;
  try {
    cfg = nn::GPTConfig::from_json(ckpt.state.at("model"));
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint '{}': {}", ckpt.dir, e.what()), e.location());
  }
  const auto itos = ckpt.state.at("vocab").get<std::vector<unsigned char>>();
  ZERO_CHECK(static_cast<std::int64_t>(itos.size()) == cfg.vocab_size,
             "checkpoint '{}': {} vocabulary characters for vocab_size {}", ckpt.dir, itos.size(), cfg.vocab_size);
  std::vector<std::int64_t> context =
      a.prompt.empty() ? examples::default_context(itos) : examples::encode(itos, a.prompt);
  ZERO_CHECK(static_cast<std::int64_t>(context.size()) <= cfg.block_size || a.logits.empty(),
             "--logits: the prompt has {} characters, more than the block size {}", context.size(), cfg.block_size);

  Generator init(0);  // the weights are overwritten below
  nn::GPT model(cfg, init);
  dist::check_parameters(ckpt, model.named_parameters());
  dist::load_weights((std::filesystem::path(ckpt.dir) / "model.safetensors").string(), model.named_parameters());
  const DType dtype = parse_float_dtype(ckpt.state.at("dtype").get<std::string>());
  if (dtype != DType::f32)
    for (nn::NamedParameter& p : model.named_parameters()) p.tensor.set_data(p.tensor.to(dtype));
  model.eval();

  if (!a.logits.empty()) {
    autograd::NoGradGuard no_grad;
    const auto T = static_cast<std::int64_t>(context.size());
    const Tensor logits = model.forward(Tensor::from_indices(context, {1, T})).contiguous();
    const std::vector<float> values = logits.to_vector();
    std::vector<float> idx(context.begin(), context.end());
    safetensors::write_f32_file(a.logits, {"idx", "logits"}, {{1, T}, logits.shape()}, {idx.data(), values.data()});
    return 0;
  }
  Generator gen = examples::sampling_generator(a.seed);
  const std::string text = examples::sample(model, itos, context, a.tokens, a.temperature, a.top_k, gen);
  std::cout << a.prompt << text << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Generate text from a train_gpt checkpoint (zero.cpp)"};
  app.add_option("--checkpoint", a.checkpoint, "checkpoint directory, or a save dir (its newest checkpoint)");
  app.add_option("--prompt", a.prompt, "text to continue (default: start after a newline)");
  app.add_option("--tokens", a.tokens, "characters to generate")->capture_default_str();
  app.add_option("--temperature", a.temperature, "divide the logits by this (> 0)")->capture_default_str();
  app.add_option("--top-k", a.top_k, "sample among the k likeliest characters (0 = all)")->capture_default_str();
  app.add_option("--seed", a.seed, "the training run's --seed gives its end-of-run sample")
      ->check(examples::kNonNegativeInteger)
      ->capture_default_str();
  app.add_option("--logits", a.logits, "write the prompt's logits [1, T, V] to this safetensors file and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return examples::parse_error_exit(app, e);
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
