// Text generation from a character-level GPT, shared by train_gpt's end-of-run sample and sample_gpt,
// so that the same seed prints the same text from the same weights; and the model hyper-parameters as
// a checkpoint's state.json records them ("model").
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "nn/gpt.h"

namespace zero::examples {

/// The generator sampling draws from in a run with --seed `seed` (init and dropout use seed, batches
/// seed + 1).
inline Generator sampling_generator(std::uint64_t seed) { return Generator(seed + 3); }

/// Token ids of `text` under vocabulary `itos` (token id -> byte). Throws zero::Error naming the first
/// character that is not in the vocabulary.
inline std::vector<std::int64_t> encode(const std::vector<unsigned char>& itos, const std::string& text) {
  std::vector<std::int64_t> out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    const auto it = std::find(itos.begin(), itos.end(), c);
    ZERO_CHECK(it != itos.end(), "prompt character {} (byte {}) is not in the checkpoint's vocabulary of {} characters",
               c >= 32 && c < 127 ? fmt::format("'{}'", static_cast<char>(c)) : std::string("(unprintable)"), int{c},
               itos.size());
    out.push_back(it - itos.begin());
  }
  return out;
}

/// The context a sample starts from when no prompt is given: one newline (token 0 if the vocabulary
/// has none), as nanoGPT's sample.py starts from "\n".
inline std::vector<std::int64_t> default_context(const std::vector<unsigned char>& itos) {
  const auto it = std::find(itos.begin(), itos.end(), static_cast<unsigned char>('\n'));
  return {it == itos.end() ? 0 : static_cast<std::int64_t>(it - itos.begin())};
}

/// Appends `n` sampled characters to `context` (token ids) and returns them as text. Each step feeds
/// the last block_size tokens, divides the last position's logits by `temperature` (> 0), keeps the
/// `top_k` largest (0 = all; ties at the k-th value are kept), and draws one token by inverting the
/// cumulative softmax at one gen.uniform() (fp64 arithmetic on the host, so the draw is the same on
/// every machine for the same logits). nanoGPT's sample.py does the same with torch.multinomial.
inline std::string sample(const nn::GPT& model, const std::vector<unsigned char>& itos, std::vector<std::int64_t> context,
                          std::int64_t n, float temperature, std::int64_t top_k, Generator& gen) {
  ZERO_CHECK(temperature > 0.0f, "temperature must be positive, got {}", temperature);
  ZERO_CHECK(top_k >= 0, "top-k must be >= 0 (0 = all), got {}", top_k);
  ZERO_CHECK(!context.empty(), "sample: empty context");
  autograd::NoGradGuard no_grad;
  std::string out;
  const std::int64_t V = static_cast<std::int64_t>(itos.size()), T_max = model.config().block_size;
  std::vector<double> p(static_cast<std::size_t>(V));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto T = std::min<std::int64_t>(static_cast<std::int64_t>(context.size()), T_max);
    std::vector<std::int64_t> window(context.end() - T, context.end());
    const Tensor logits = model.forward(Tensor::from_indices(window, {1, T}).to(model.wte->weight.device()));
    const std::vector<float> last = logits.narrow(1, T - 1, 1).reshape({V}).to(Device::cpu).to_vector();
    double cut = -INFINITY;  // logits below the k-th largest are dropped
    if (top_k > 0 && top_k < V) {
      std::vector<float> sorted = last;
      std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
      cut = sorted[static_cast<std::size_t>(top_k - 1)];
    }
    const double top = *std::max_element(last.begin(), last.end());
    double total = 0.0;
    for (std::int64_t v = 0; v < V; ++v) {
      const double l = last[static_cast<std::size_t>(v)];
      p[static_cast<std::size_t>(v)] = l >= cut ? std::exp((l - top) / temperature) : 0.0;
      total += p[static_cast<std::size_t>(v)];
    }
    const double r = static_cast<double>(gen.uniform()) * total;
    double acc = 0.0;
    std::int64_t next = -1;
    for (std::int64_t v = 0; v < V; ++v) {
      if (p[static_cast<std::size_t>(v)] == 0.0) continue;
      next = v;  // the last kept token catches r at the very top
      acc += p[static_cast<std::size_t>(v)];
      if (r < acc) break;
    }
    context.push_back(next);
    out.push_back(static_cast<char>(itos[static_cast<std::size_t>(next)]));
  }
  return out;
}

}  // namespace zero::examples
