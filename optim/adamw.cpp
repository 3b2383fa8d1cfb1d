#include "optim/adamw.h"

#include <cmath>

#include "core/backend.h"

namespace zero::optim {

AdamWScalars adamw_scalars(const AdamWHyper& h, std::int64_t step) {
  ZERO_CHECK(step >= 1, "adamw_update: step is 1-based, got {}", step);
  // Scalars as PyTorch forms them: Python floats (double), rounded to f32 where they meet the tensors.
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  AdamWScalars s{};
  s.decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  s.step_size = static_cast<float>(h.lr / bias_correction1);
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.eps = h.eps;
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  return s;
}

void adamw_update(Device device, float* master, const void* grad, DType grad_dtype, float grad_factor, float* exp_avg,
                  float* exp_avg_sq, void* model_out, DType model_dtype, std::int64_t n, const AdamWHyper& h,
                  std::int64_t step) {
  const AdamWScalars s = adamw_scalars(h, step);
  ZERO_CHECK(n >= 0, "adamw_update: negative element count {}", n);
  ZERO_CHECK(is_floating(grad_dtype) && (model_out == nullptr || is_floating(model_dtype)),
             "adamw_update: gradient ({}) and model ({}) must be f32, f16 or bf16", dtype_name(grad_dtype),
             dtype_name(model_dtype));
  if (n == 0) return;
  backend(device).adamw_update(master, grad, grad_dtype, grad_factor, exp_avg, exp_avg_sq, model_out, model_dtype, n,
                               s);
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer(std::move(groups), options.lr), options_(options) {
  ZERO_CHECK(options.eps >= 0.0f, "AdamW: eps must be >= 0, got {}", options.eps);
  ZERO_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f, "AdamW: beta1 must be in [0, 1), got {}", options.beta1);
  ZERO_CHECK(options.beta2 >= 0.0f && options.beta2 < 1.0f, "AdamW: beta2 must be in [0, 1), got {}", options.beta2);
  for (const ParamGroup& g : groups_) state_.emplace_back(g.params.size());
}

AdamWHyper AdamW::hyper(std::size_t group) const {
  ZERO_CHECK(group < groups_.size(), "AdamW: group {} out of range ({} groups)", group, groups_.size());
  return {lr_, options_.beta1, options_.beta2, options_.eps, groups_[group].weight_decay};
}

const AdamWState& AdamW::state(std::size_t group, std::size_t index) const {
  ZERO_CHECK(group < state_.size() && index < state_[group].size(), "AdamW: no parameter {} in group {}", index,
             group);
  return state_[group][index];
}

void detail::adamw_step_param(const Tensor& p, const Tensor& grad, AdamWState& s, const AdamWHyper& h) {
  check_param_and_grad(p, grad, /*allow_cuda=*/true);
  if (s.step == 0) {  // optimizer state lives with the parameter
    s.exp_avg = Tensor::zeros({p.numel()}, DType::f32, p.device());
    s.exp_avg_sq = Tensor::zeros({p.numel()}, DType::f32, p.device());
  }
  s.step += 1;
  const Tensor g = grad.is_contiguous() ? grad : grad.clone();  // the kernel reads any float dtype
  adamw_update(p.device(), master_data(p, s.master), g.raw_data(), g.dtype(), 1.0f, s.exp_avg.data<float>(),
               s.exp_avg_sq.data<float>(), nullptr, DType::f32, p.numel(), h, s.step);
  write_back(p, s.master);
}

void AdamW::step() {
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const AdamWHyper h = hyper(gi);
    for (std::size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const Tensor& p = groups_[gi].params[pi];
      const Tensor grad = p.grad();
      if (grad.defined()) detail::adamw_step_param(p, grad, state_[gi][pi], h);
    }
  }
}

}  // namespace zero::optim
