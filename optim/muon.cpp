#include "optim/muon.h"

#include <algorithm>
#include <cmath>

#include "core/kernels.h"

namespace zero::optim {

// Note [Muon update scale]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Newton–Schulz returns (approximately) U·Vᵀ, whose entries have RMS 1/sqrt(max(m, n)) for an m x n
// matrix: without a scale, Muon's step size depends on the shape and is far from AdamW's. Two recipes:
//   - the speedrun (Jordan et al.) multiplies by sqrt(max(1, m/n)) and uses its own learning rate
//     (0.02 - 0.05 there, tuned separately from the AdamW parameters' lr);
//   - Moonlight (Liu et al., arXiv 2502.16982, section 2.2, eq. 4) multiplies by 0.2·sqrt(max(m, n)),
//     which makes the update's RMS 0.2, about the RMS of an AdamW update, so that AdamW's learning rate
//     and weight decay carry over unchanged ("match_rms_adamw" in torch.optim.Muon).
// We follow Moonlight. The training programs here have one learning-rate schedule and one
// --lr / --weight-decay (optim::Optimizer has one lr for all groups; the config's optimizer.params has
// one lr), so a scale that lets the Muon matrices and the AdamW parameters share them needs no second
// set of hyperparameters and lets `--optimizer muon` be tried with an AdamW run's settings as they are.

// Note [Newton–Schulz precision]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The speedrun runs the iteration in bf16 on a GPU for speed; its coefficients were chosen to be
// robust to that rounding. Here it runs in fp32 with the CPU GEMM kernel: more accurate, and the same
// bits on every run and thread count (the kernel sums every element in a fixed order), which is what
// the ZeRO tests need when the owner of a matrix changes. The norm is accumulated in double.

float muon_update_scale(std::int64_t rows, std::int64_t cols) {
  return 0.2f * static_cast<float>(std::sqrt(static_cast<double>(std::max(rows, cols))));
}

double newton_schulz_flops(std::int64_t rows, std::int64_t cols, int ns_steps) {
  const double r = static_cast<double>(std::min(rows, cols)), c = static_cast<double>(std::max(rows, cols));
  return ns_steps * (4.0 * r * r * c + 2.0 * r * r * r);
}

namespace {

// out[j, i] = in[i, j] for a rows x cols row-major `in`.
void transpose(const float* in, float* out, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
}

}  // namespace

void newton_schulz5(float* x, std::int64_t rows, std::int64_t cols, int ns_steps) {
  ZERO_CHECK(rows >= 1 && cols >= 1, "newton_schulz5: a {}x{} matrix has no elements", rows, cols);
  ZERO_CHECK(ns_steps >= 1, "newton_schulz5: ns_steps must be >= 1, got {}", ns_steps);
  const bool tall = rows > cols;
  const std::int64_t r = tall ? cols : rows, c = tall ? rows : cols, n = rows * cols;
  std::vector<float> X(static_cast<std::size_t>(n)), Y(X.size());
  if (tall) transpose(x, X.data(), rows, cols);
  else std::copy(x, x + n, X.begin());
  double sq = 0.0;
  for (float v : X) sq += static_cast<double>(v) * v;
  const float inv = 1.0f / (static_cast<float>(std::sqrt(sq)) + kNewtonSchulzEps);
  for (float& v : X) v *= inv;
  std::vector<float> A(static_cast<std::size_t>(r * r)), AA(A.size());
  Kernels& k = kernels(Device::cpu);
  for (int it = 0; it < ns_steps; ++it) {
    k.gemm(false, true, r, r, c, 1.0f, X.data(), c, X.data(), c, 0.0f, A.data(), r, nullptr);     // A = X·Xᵀ
    k.gemm(false, false, r, r, r, 1.0f, A.data(), r, A.data(), r, 0.0f, AA.data(), r, nullptr);  // A·A
    for (std::size_t i = 0; i < A.size(); ++i) A[i] = kNewtonSchulzB * A[i] + kNewtonSchulzC * AA[i];  // B
    k.gemm(false, false, r, c, r, 1.0f, A.data(), r, X.data(), c, 0.0f, Y.data(), c, nullptr);   // B·X
    for (std::size_t i = 0; i < X.size(); ++i) X[i] = kNewtonSchulzA * X[i] + Y[i];
  }
  if (tall) transpose(X.data(), x, cols, rows);
  else std::copy(X.begin(), X.end(), x);
}

void muon_update(float* master, const void* grad, DType grad_dtype, float grad_factor, float* momentum_buffer,
                 void* model_out, DType model_dtype, std::int64_t rows, std::int64_t cols, const MuonHyper& h) {
  ZERO_CHECK(rows >= 1 && cols >= 1, "muon_update: a {}x{} matrix has no elements", rows, cols);
  ZERO_CHECK(is_floating(grad_dtype) && (model_out == nullptr || is_floating(model_dtype)),
             "muon_update: gradient ({}) and model ({}) must be f32, f16 or bf16", dtype_name(grad_dtype),
             dtype_name(model_dtype));
  ZERO_CHECK(h.momentum >= 0.0f && h.momentum < 1.0f, "Muon: momentum must be in [0, 1), got {}", h.momentum);
  ZERO_CHECK(h.ns_steps >= 1, "Muon: ns_steps must be >= 1, got {}", h.ns_steps);
  const std::int64_t n = rows * cols;
  const float mu = h.momentum, one_minus_mu = 1.0f - h.momentum;
  std::vector<float> u(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = load_as_float(grad, i, grad_dtype) * grad_factor;
    momentum_buffer[i] = mu * momentum_buffer[i] + one_minus_mu * g;
    u[i] = h.nesterov ? one_minus_mu * g + mu * momentum_buffer[i] : momentum_buffer[i];
  }
  newton_schulz5(u.data(), rows, cols, h.ns_steps);
  const float decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  const float step = h.lr * muon_update_scale(rows, cols);
  for (std::int64_t i = 0; i < n; ++i) {
    master[i] = master[i] * decay - step * u[i];
    if (model_out != nullptr) store_from_float(model_out, i, model_dtype, master[i]);
  }
}

bool is_muon_matrix(const std::string& name, const Shape& shape) {
  if (shape.size() != 2) return false;
  std::string module = name;
  if (const auto dot = module.rfind('.'); dot != std::string::npos) module = module.substr(0, dot);
  if (const auto dot = module.rfind('.'); dot != std::string::npos) module = module.substr(dot + 1);
  for (const char* embedding_or_head : {"wte", "wpe", "head", "lm_head"})
    if (module == embedding_or_head) return false;
  return module.find("emb") == std::string::npos;
}

Muon::Muon(std::vector<ParamGroup> muon_groups, std::vector<ParamGroup> adamw_groups, MuonOptions options)
    : Optimizer(
          [&] {
            muon_groups.insert(muon_groups.end(), adamw_groups.begin(), adamw_groups.end());
            return std::move(muon_groups);
          }(),
          options.lr),
      options_(options),
      muon_groups_(groups_.size() - adamw_groups.size()) {
  ZERO_CHECK(options.momentum >= 0.0f && options.momentum < 1.0f, "Muon: momentum must be in [0, 1), got {}",
             options.momentum);
  ZERO_CHECK(options.ns_steps >= 1, "Muon: ns_steps must be >= 1, got {}", options.ns_steps);
  ZERO_CHECK(options.eps >= 0.0f, "Muon: AdamW eps must be >= 0, got {}", options.eps);
  ZERO_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f && options.beta2 >= 0.0f && options.beta2 < 1.0f,
             "Muon: AdamW betas must be in [0, 1), got [{}, {}]", options.beta1, options.beta2);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (g < muon_groups_) {
      for (const Tensor& p : groups_[g].params) {
        ZERO_CHECK(p.dim() == 2, "Muon: a Muon parameter must be a 2-D matrix, got shape {}", shape_str(p.shape()));
        ZERO_CHECK(p.device() == Device::cpu, "Muon: Newton–Schulz runs on the CPU only, got a {} parameter",
                   device_name(p.device()));
      }
      muon_state_.emplace_back(groups_[g].params.size());
    } else {
      adamw_state_.emplace_back(groups_[g].params.size());
    }
  }
}

MuonHyper Muon::hyper(std::size_t group) const {
  ZERO_CHECK(group < muon_groups_, "Muon: group {} is not a Muon group ({} of them)", group, muon_groups_);
  return {lr_, options_.momentum, groups_[group].weight_decay, options_.nesterov, options_.ns_steps};
}

const MuonState& Muon::state(std::size_t group, std::size_t index) const {
  ZERO_CHECK(group < muon_state_.size() && index < muon_state_[group].size(), "Muon: no parameter {} in group {}",
             index, group);
  return muon_state_[group][index];
}

void Muon::step_matrix(const Tensor& p, const Tensor& grad, MuonState& s, const MuonHyper& h) {
  detail::check_param_and_grad(p, grad);
  if (s.step == 0) s.momentum_buffer = Tensor::zeros({p.numel()}, DType::f32, p.device());
  s.step += 1;
  Tensor scratch;
  const float* g = detail::grad_f32(grad, scratch);
  muon_update(detail::master_data(p, s.master), g, DType::f32, 1.0f, s.momentum_buffer.data<float>(), nullptr,
              DType::f32, p.shape()[0], p.shape()[1], h);
  detail::write_back(p, s.master);
}

void Muon::step() {
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const bool muon = gi < muon_groups_;
    const MuonHyper mh = muon ? hyper(gi) : MuonHyper{};
    const AdamWHyper adamw{lr_, options_.beta1, options_.beta2, options_.eps, groups_[gi].weight_decay};
    for (std::size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const Tensor& p = groups_[gi].params[pi];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (muon)
        step_matrix(p, grad, muon_state_[gi][pi], mh);
      else
        detail::adamw_step_param(p, grad, adamw_state_[gi - muon_groups_][pi], adamw);
    }
  }
}

}  // namespace zero::optim
