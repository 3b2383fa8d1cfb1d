#include "optim/sgd.h"

namespace zero::optim {

void sgd_update(float* param, const float* grad, float* momentum_buffer, std::int64_t n, const SgdHyper& h,
                bool first_step) {
  ZERO_CHECK(n >= 0, "sgd_update: negative element count {}", n);
  ZERO_CHECK(h.momentum == 0.0f || momentum_buffer != nullptr, "sgd_update: momentum {} needs a buffer", h.momentum);
  const float lr = h.lr, mu = h.momentum, wd = h.weight_decay;
  for (std::int64_t i = 0; i < n; ++i) {
    float d = grad[i];
    if (wd != 0.0f) d += wd * param[i];
    if (mu != 0.0f) {
      const float buf = first_step ? d : mu * momentum_buffer[i] + d;
      momentum_buffer[i] = buf;
      d = h.nesterov ? d + mu * buf : buf;
    }
    param[i] -= lr * d;
  }
}

SGD::SGD(std::vector<ParamGroup> groups, SgdOptions options)
    : Optimizer(std::move(groups), options.lr), options_(options) {
  ZERO_CHECK(options.momentum >= 0.0f, "SGD: momentum must be >= 0, got {}", options.momentum);
  ZERO_CHECK(!options.nesterov || options.momentum > 0.0f, "SGD: nesterov momentum needs momentum > 0");
  for (const ParamGroup& g : groups_) state_.emplace_back(g.params.size());
}

const Tensor& SGD::momentum_buffer(std::size_t group, std::size_t index) const {
  ZERO_CHECK(group < state_.size() && index < state_[group].size(), "SGD: no parameter {} in group {}", index, group);
  return state_[group][index].momentum_buffer;
}

void SGD::step() {
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const SgdHyper h{lr_, options_.momentum, groups_[gi].weight_decay, options_.nesterov};
    for (std::size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const Tensor& p = groups_[gi].params[pi];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      detail::check_param_and_grad(p, grad);
      State& s = state_[gi][pi];
      const bool first_step = !s.momentum_buffer.defined();
      if (h.momentum != 0.0f && first_step) s.momentum_buffer = Tensor::empty({p.numel()}, DType::f32);
      float* buf = h.momentum != 0.0f ? s.momentum_buffer.data<float>() : nullptr;
      Tensor grad_scratch;
      sgd_update(detail::master_data(p, s.master), detail::grad_f32(grad, grad_scratch), buf, p.numel(), h,
                 first_step);
      detail::write_back(p, s.master);
    }
  }
}

}  // namespace zero::optim
