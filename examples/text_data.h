// Character-level text data for train_gpt: the vocabulary is the set of distinct bytes of the file
// (for Tiny Shakespeare, 65 characters), split 90/10 into train and validation tokens, and batches
// are random windows drawn from a seeded Generator.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace zero::examples {

struct TextData {
  std::vector<unsigned char> itos;  // token id -> byte
  std::vector<std::int64_t> train, val;

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(itos.size()); }

  /// Reads `path`; throws zero::Error with a one-line reason for a missing, unreadable or empty file,
  /// or one too short for `block` (each split needs at least block + 1 tokens).
  static TextData load(const std::string& path, std::int64_t block) {
    ZERO_CHECK(std::filesystem::exists(path), "--data file '{}' does not exist", path);
    ZERO_CHECK(!std::filesystem::is_directory(path), "--data '{}' is a directory, not a text file", path);
    std::ifstream in(path, std::ios::binary);
    ZERO_CHECK(in.good(), "cannot read --data file '{}'", path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ZERO_CHECK(!in.bad(), "error while reading --data file '{}'", path);
    ZERO_CHECK(!text.empty(), "--data file '{}' is empty", path);
    TextData d;
    std::int64_t stoi[256];
    bool present[256] = {};
    for (unsigned char c : text) present[c] = true;
    for (int c = 0; c < 256; ++c) {
      if (!present[c]) continue;
      stoi[c] = static_cast<std::int64_t>(d.itos.size());
      d.itos.push_back(static_cast<unsigned char>(c));
    }
    const std::size_t n_train = text.size() * 9 / 10;
    for (std::size_t i = 0; i < text.size(); ++i)
      (i < n_train ? d.train : d.val).push_back(stoi[static_cast<unsigned char>(text[i])]);
    const auto need = static_cast<std::size_t>(block) + 1;
    ZERO_CHECK(d.train.size() >= need && d.val.size() >= need,
               "--block {} is too long for '{}' ({} bytes: {} train / {} validation tokens; each split needs block + 1)",
               block, path, text.size(), d.train.size(), d.val.size());
    return d;
  }

  /// Inputs x[B, T] and next-token targets y[B, T] from `batch` random windows of `split`.
  static std::pair<Tensor, Tensor> batch(const std::vector<std::int64_t>& split, std::int64_t B, std::int64_t T,
                                         Generator& gen) {
    std::vector<std::int64_t> x(static_cast<std::size_t>(B * T)), y(x.size());
    const auto windows = static_cast<std::int64_t>(split.size()) - T;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t start = gen.randint(windows);
      for (std::int64_t t = 0; t < T; ++t) {
        x[b * T + t] = split[start + t];
        y[b * T + t] = split[start + t + 1];
      }
    }
    return {Tensor::from_indices(x, {B, T}), Tensor::from_indices(y, {B, T})};
  }
};

}  // namespace zero::examples
