#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/convert.h"

#ifdef ZERO_HAS_CUDA
#include "core/cuda/kernels.h"
#endif

namespace zero::optim {

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                  const AdamWHyper& h, std::int64_t step) {
  ZERO_CHECK(step >= 1, "adamw_update: step is 1-based, got {}", step);
  ZERO_CHECK(n >= 0, "adamw_update: negative element count {}", n);
  // Scalars as PyTorch forms them: Python floats (double), rounded to f32 where they meet the tensors.
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  const float decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  const float step_size = static_cast<float>(h.lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps;
  // Memory-bound (5 streams); threads help on large ranges and cost more than they save on small ones.
#pragma omp parallel for simd schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float m = b1 * exp_avg[i] + (1.0f - b1) * g;
    const float v = b2 * exp_avg_sq[i] + (1.0f - b2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    param[i] = param[i] * decay - step_size * (m / denom);
  }
}

void adamw_update_mixed(Device device, float* master, const void* grad, DType grad_dtype, float grad_factor,
                        float* exp_avg, float* exp_avg_sq, void* model_out, DType model_dtype, std::int64_t n,
                        const AdamWHyper& h, std::int64_t step) {
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) {
    cuda::adamw_update_mixed(master, grad, grad_dtype, grad_factor, exp_avg, exp_avg_sq, model_out, model_dtype, n,
                             cuda::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step));
    return;
  }
#endif
  ZERO_CHECK(device == Device::cpu, "adamw_update_mixed: no kernel on device {}", device_name(device));
  constexpr std::int64_t kChunk = 1 << 16;  // bounds the f32 scratch
  const std::size_t grad_size = dtype_size(grad_dtype), model_size = dtype_size(model_dtype);
  std::vector<float> scratch;
  for (std::int64_t done = 0; done < n; done += kChunk) {
    const std::int64_t len = std::min(kChunk, n - done);
    const void* g = static_cast<const char*>(grad) + done * static_cast<std::int64_t>(grad_size);
    const float* g32 = static_cast<const float*>(g);
    if (grad_dtype != DType::f32 || grad_factor != 1.0f) {
      scratch.resize(static_cast<std::size_t>(len));
      cpu::convert(scratch.data(), DType::f32, g, grad_dtype, len);
      if (grad_factor != 1.0f)
        for (float& x : scratch) x *= grad_factor;
      g32 = scratch.data();
    }
    adamw_update(master + done, g32, exp_avg + done, exp_avg_sq + done, len, h, step);
    if (model_out != nullptr)
      cpu::convert(static_cast<char*>(model_out) + done * static_cast<std::int64_t>(model_size), model_dtype,
                   master + done, DType::f32, len);
  }
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

void AdamW::step() {
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const AdamWHyper h = hyper(gi);
    for (std::size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const Tensor& p = groups_[gi].params[pi];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      detail::check_param_and_grad(p, grad, /*allow_cuda=*/true);
      AdamWState& s = state_[gi][pi];
      if (s.step == 0) {  // optimizer state lives with the parameter
        s.exp_avg = Tensor::zeros({p.numel()}, DType::f32, p.device());
        s.exp_avg_sq = Tensor::zeros({p.numel()}, DType::f32, p.device());
      }
      s.step += 1;
      Tensor grad_scratch;
#ifdef ZERO_HAS_CUDA
      if (p.device() == Device::cuda) {  // the same update, on the current stream (core/cuda/kernels.h)
        cuda::adamw_update(detail::master_data(p, s.master), detail::grad_f32(grad, grad_scratch),
                           s.exp_avg.data<float>(), s.exp_avg_sq.data<float>(), p.numel(),
                           cuda::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, s.step));
        detail::write_back(p, s.master);
        continue;
      }
#endif
      adamw_update(detail::master_data(p, s.master), detail::grad_f32(grad, grad_scratch), s.exp_avg.data<float>(),
                   s.exp_avg_sq.data<float>(), p.numel(), h, s.step);
      detail::write_back(p, s.master);
    }
  }
}

}  // namespace zero::optim
