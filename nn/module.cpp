#include "nn/module.h"

#include <algorithm>

namespace zero::nn {

void Module::collect(const std::string& prefix, std::vector<NamedParameter>& out) const {
  for (const auto& p : params_) {
    const bool seen = std::any_of(out.begin(), out.end(), [&](const NamedParameter& q) { return q.tensor.same(p.tensor); });
    if (!seen) out.push_back({prefix + p.name, p.tensor, p.decay});
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<NamedParameter> Module::named_parameters() const {
  std::vector<NamedParameter> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (auto& p : named_parameters()) n += p.tensor.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (auto& p : named_parameters()) out[p.name] = p.tensor.detach();
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto params = named_parameters();
  for (auto& p : params) {
    auto it = state.find(p.name);
    ZERO_CHECK(it != state.end(), "load_state_dict: missing key '{}'", p.name);
    ZERO_CHECK(it->second.shape() == p.tensor.shape(), "load_state_dict: '{}' has shape {}, expected {}", p.name,
               shape_str(it->second.shape()), shape_str(p.tensor.shape()));
  }
  for (auto& [name, t] : state) {
    const bool known = std::any_of(params.begin(), params.end(), [&](const NamedParameter& p) { return p.name == name; });
    ZERO_CHECK(known, "load_state_dict: unexpected key '{}'", name);
  }
  for (auto& p : params) p.tensor.copy_(state.at(p.name));
}

void Module::to(DType dtype) {
  ZERO_CHECK(is_floating(dtype), "Module::to: parameters must be a float dtype, got {}", dtype_name(dtype));
  for (auto& p : named_parameters()) {
    if (p.tensor.dtype() == dtype) continue;
    Tensor converted = Tensor::empty(p.tensor.shape(), dtype, p.tensor.device());
    converted.copy_(p.tensor);
    p.tensor.set_data(converted);
  }
}

void Module::to(Device device) {
  for (auto& p : named_parameters()) {
    if (p.tensor.device() == device) continue;
    p.tensor.set_data(p.tensor.to(device));
    p.tensor.set_grad(Tensor());
  }
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool decay) {
  value.set_requires_grad(true);
  params_.push_back({name, value, decay});
  return value;
}

}  // namespace zero::nn
