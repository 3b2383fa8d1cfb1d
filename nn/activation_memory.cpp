#include "nn/activation_memory.h"

#include <string>

#include "core/check.h"

namespace zero::nn {

namespace {

// Bytes of one cpu tensor of n elements of `element` bytes: the allocator's 64-byte blocks.
double block(double n, double element = 4.0) {
  const double bytes = n * element;
  return bytes <= 0 ? 64.0 : 64.0 * static_cast<double>(static_cast<std::int64_t>((bytes + 63.0) / 64.0));
}

// What one norm saves for its backward beside its output, over N rows of C channels: LayerNorm its mean
// and rstd (N each); RMSNorm, composed of ops, its rsqrt (N) and x·rsqrt (N·C, read by the weight's mul).
double norm_stats(const std::string& norm, double N, double C) {
  return norm == "rmsnorm" ? block(N) + block(N * C) : 2 * block(N);
}

// What one block's ops leave allocated for its backward, its input excluded and its output included
// (docs/zero.md, section 9). N = b·T rows of C channels; `kept_gemms`: selective recompute's
// re-run, whose four GEMM outputs are the kept ones (not allocated again).
double block_saved(const std::string& norm, double N, double C, double b, double H, double T, bool dropout,
                   bool kept_gemms) {
  const double stats = 2 * norm_stats(norm, N, C);      // ln1, ln2
  const double norms = 2 * block(N * C);                // ln1, ln2 outputs (read by qkv and fc)
  const double qkv = kept_gemms ? 0 : block(3 * N * C);  // qkv output (read by the attention)
  const double scores = block(b * H * T * T);            // the attention's softmax (read by its backward)
  const double attn_out = block(N * C);                  // the attention's output (read by proj)
  const double masks = dropout ? 2 * block(N * C) : 0;   // two dropout masks
  const double h = block(N * C);                         // x + attn (read by ln2)
  const double fc = kept_gemms ? 0 : block(4 * N * C);   // fc output (read by GELU)
  const double gelu = block(4 * N * C);                  // GELU output (read by fc2)
  const double out = block(N * C);                       // the block's output (the next block's input)
  return stats + norms + qkv + scores + attn_out + masks + h + fc + gelu + out;
}

// The outputs selective recompute keeps per block, beside the block's output.
double block_kept(double N, double C) { return block(3 * N * C) + block(N * C) + block(4 * N * C) + block(N * C); }

}  // namespace

ActivationBytes activation_bytes(const GPTConfig& cfg, std::int64_t micro_batch, autograd::Recompute mode) {
  ZERO_CHECK(micro_batch >= 1, "activation_bytes: micro-batch must be >= 1, got {}", micro_batch);
  ZERO_CHECK(cfg.norm == "layernorm" || cfg.norm == "rmsnorm", "activation_bytes: no terms for norm '{}'", cfg.norm);
  const double b = static_cast<double>(micro_batch), T = static_cast<double>(cfg.block_size),
               C = static_cast<double>(cfg.n_embd), H = static_cast<double>(cfg.n_head),
               V = static_cast<double>(cfg.vocab_size), L = static_cast<double>(cfg.n_layer), N = b * T;
  const bool dropout = cfg.dropout > 0.0f;
  // Embedding: the positions (i64, read by wpe's backward), the first block's input, the dropout mask.
  const double embedding = block(T, 8.0) + block(N * C) + (dropout ? block(N * C) : 0);
  // Head: lnf's statistics and output (read by the tied LM head), the softmax of the cross-entropy and
  // the loss itself.
  const double head = norm_stats(cfg.norm, N, C) + block(N * C) + block(N * V) + block(1);
  const double full_block = block_saved(cfg.norm, N, C, b, H, T, dropout, false);
  ActivationBytes a;
  switch (mode) {
    case autograd::Recompute::none:
      a.held = embedding + L * full_block + head;
      break;
    case autograd::Recompute::full:
      a.held = embedding + L * block(N * C) + head;
      a.recompute = full_block;
      break;
    case autograd::Recompute::selective:
      a.held = embedding + L * (block_kept(N, C) + block(N * C)) + head;
      a.recompute = block_saved(cfg.norm, N, C, b, H, T, dropout, true);
      break;
  }
  return a;
}

}  // namespace zero::nn
