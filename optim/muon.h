// Muon: momentum orthogonalised by a Newton–Schulz iteration, for the 2-D hidden weights of a network
// (the attention and MLP matrices), with AdamW for everything else (embeddings, the head, norms and
// biases), as the published recipes do.
//
// Sources (read for the math; no code copied):
//   - K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks" (blog post, 2024,
//     kellerjordan.github.io/posts/muon) and the nanoGPT speedrun (github.com/KellerJordan/modded-nanogpt):
//     Nesterov momentum, the quintic Newton–Schulz iteration and its coefficients (a, b, c) =
//     (3.4445, -4.7750, 2.0315), 5 steps, the input divided by its Frobenius norm + 1e-7 first.
//   - J. Liu et al. (Moonshot AI), "Muon is Scalable for LLM Training", arXiv 2502.16982 (Moonlight),
//     section 2.2, eq. 4: decoupled weight decay and the update scaled by 0.2·sqrt(max(m, n)).
//   - torch.optim.Muon (PyTorch 2.9) names the same two choices adjust_lr_fn "original" and
//     "match_rms_adamw".
// See Note [Muon update scale] in optim/muon.cpp for which scale is used here and why, and
// Note [Newton–Schulz precision] for why the iteration runs in fp32.
//
// One entry, muon_update, steps one whole matrix; Muon::step calls it per matrix, and the ZeRO
// optimizer (distributed/) calls the same function on the matrices its rank steps, so both compute
// bit-identical updates for the same inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/optimizer.h"

namespace zero::optim {

/// Muon's quintic Newton–Schulz coefficients (Jordan et al., the speedrun's zeropower_via_newtonschulz5).
inline constexpr float kNewtonSchulzA = 3.4445f;
inline constexpr float kNewtonSchulzB = -4.7750f;
inline constexpr float kNewtonSchulzC = 2.0315f;
/// Added to the Frobenius norm before the first division (the same reference).
inline constexpr float kNewtonSchulzEps = 1e-7f;

/// Hyperparameters of one Muon update of one matrix. lr in parameter units per step (before the
/// RMS-matching scale, Note [Muon update scale]); weight_decay decoupled (multiplied by lr, as AdamW's);
/// momentum in [0, 1); ns_steps >= 1 Newton–Schulz iterations.
struct MuonHyper {
  float lr, momentum, weight_decay;
  bool nesterov;
  int ns_steps;
};

/// The factor the orthogonalised update of a rows x cols matrix is multiplied by:
/// 0.2·sqrt(max(rows, cols)) (Moonlight, arXiv 2502.16982 eq. 4; Note [Muon update scale]).
float muon_update_scale(std::int64_t rows, std::int64_t cols);

/// Floating-point operations of ns_steps Newton–Schulz iterations on a rows x cols matrix: with
/// r = min(rows, cols), c = max(rows, cols), each iteration is three GEMMs, X·Xᵀ (2r²c), A·A (2r³) and
/// B·X (2r²c), so ns_steps·(4r²c + 2r³). zero_explain and train_gpt report each rank's sum and its
/// imbalance; the plan does not balance ranks by it (Note [Whole-matrix partitions]).
double newton_schulz_flops(std::int64_t rows, std::int64_t cols, int ns_steps);

/// The quintic Newton–Schulz iteration (Jordan et al.) in place on x, a row-major rows x cols fp32
/// matrix on the host: X <- x / (‖x‖_F + 1e-7), transposed first when rows > cols so that X·Xᵀ is the
/// smaller Gram matrix, then ns_steps times A = X·Xᵀ, B = b·A + c·A·A, X <- a·X + B·X, transposed back.
/// The result approximates U·Vᵀ of x's SVD U·S·Vᵀ (singular values pushed into roughly [0.7, 1.2]).
/// Uses the CPU GEMM kernel (each element summed in a fixed order, so the result is the same on every
/// run and thread count). Throws zero::Error for rows or cols < 1 or ns_steps < 1.
void newton_schulz5(float* x, std::int64_t rows, std::int64_t cols, int ns_steps);

/// One Muon step of one whole rows x cols matrix (row-major, rows·cols elements), in place, on the host:
///   g       <- f32(grad) * grad_factor
///   buf     <- momentum·buf + (1 - momentum)·g                (= buf.lerp_(g, 1 - momentum))
///   u       <- nesterov ? (1 - momentum)·g + momentum·buf : buf
///   o       <- newton_schulz5(u)
///   master  <- master · (1 - lr·weight_decay)
///   master  <- master - lr · muon_update_scale(rows, cols) · o
///   model_out <- master rounded to nearest even in model_dtype (skipped when model_out is null)
/// master and momentum_buffer are f32 [rows·cols] and updated (the buffer starts at zero); grad is in
/// grad_dtype (f32, f16, bf16) and read; grad_factor folds in 1 / loss scale and the clip coefficient.
/// Throws zero::Error for rows or cols < 1, a non-float dtype, momentum outside [0, 1) or ns_steps < 1.
void muon_update(float* master, const void* grad, DType grad_dtype, float grad_factor, float* momentum_buffer,
                 void* model_out, DType model_dtype, std::int64_t rows, std::int64_t cols, const MuonHyper& h);

struct MuonOptions {
  float lr = 1e-3f;          // shared by the Muon matrices (scaled, Note [Muon update scale]) and AdamW
  float momentum = 0.95f;    // Muon's momentum (Jordan et al., Moonlight, torch.optim.Muon: 0.95)
  bool nesterov = true;
  int ns_steps = 5;
  float beta1 = 0.9f;        // AdamW's, for the parameters Muon does not take
  float beta2 = 0.999f;
  float eps = 1e-8f;
};

/// Whether the recipes give parameter `name` of shape `shape` to Muon: a 2-D weight that is neither an
/// embedding nor the output head, i.e. a hidden matrix (in nn::GPT: blocks.{i}.attn.qkv, attn.proj,
/// mlp.fc, mlp.fc2 weights). Embeddings (wte, wpe: the head is tied to wte), norms and biases go to
/// AdamW, as in the speedrun and Moonlight.
bool is_muon_matrix(const std::string& name, const Shape& shape);

/// Per-matrix state: the f32 [numel] momentum buffer and, for a 16-bit or strided parameter, its fp32
/// master (Note [Master weights]). Undefined until the matrix's first step.
struct MuonState {
  Tensor momentum_buffer;
  Tensor master;
  std::int64_t step = 0;
};

/// Muon over `muon_groups` (every parameter 2-D; weight decay per group) and AdamW over `adamw_groups`,
/// one learning rate for both (set_lr). Parameters may be f32, f16 or bf16, on the CPU. Throws
/// zero::Error from the constructor for a Muon parameter that is not 2-D or not on the CPU, lr < 0,
/// momentum outside [0, 1), ns_steps < 1, and AdamW's option checks; from step() as AdamW::step does.
class Muon final : public Optimizer {
 public:
  Muon(std::vector<ParamGroup> muon_groups, std::vector<ParamGroup> adamw_groups, MuonOptions options = {});

  void step() override;

  const MuonOptions& options() const { return options_; }
  /// Groups [0, muon_group_count()) of param_groups() are Muon's, the rest AdamW's.
  std::size_t muon_group_count() const { return muon_groups_; }
  /// The Muon hyperparameters of group `group` (< muon_group_count()) at the current learning rate.
  MuonHyper hyper(std::size_t group) const;
  /// State of Muon parameter `index` of group `group`. Throws zero::Error when out of range.
  const MuonState& state(std::size_t group, std::size_t index) const;

 private:
  void step_matrix(const Tensor& p, const Tensor& grad, MuonState& s, const MuonHyper& h);
  MuonOptions options_;
  std::size_t muon_groups_ = 0;
  std::vector<std::vector<MuonState>> muon_state_;    // parallel to groups_[g].params, g < muon_groups_
  std::vector<std::vector<AdamWState>> adamw_state_;  // parallel to groups_[muon_groups_ + g].params
};

}  // namespace zero::optim
