// Module: the base of every layer. Holds named parameters (with per-parameter metadata), child
// modules, and the train/eval flag; gives PyTorch's vocabulary: named_parameters(), parameters(),
// train(), eval(), state_dict(), load_state_dict(), to(dtype).
//
// A new layer is one header: register its parameters and children in the constructor and compose
// ops (autograd/ops.h) in forward(); it never writes a backward.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autograd/compute_copy.h"
#include "core/gemm_precision.h"
#include "core/tensor.h"

namespace zero::nn {

/// A parameter as seen from the model: its dotted name, the tensor (a handle shared with the module),
/// and whether AdamW applies weight decay to it (true for weights of rank >= 2, nanoGPT's rule).
struct NamedParameter {
  std::string name;
  Tensor tensor;
  bool decay = true;
};

class Module {
 public:
  virtual ~Module() = default;

  /// Parameters of this module and its children, depth-first in registration order, names joined
  /// with '.'. A tensor registered under two names (tied weights) is listed once, under its first name.
  std::vector<NamedParameter> named_parameters() const;
  std::vector<Tensor> parameters() const;
  /// Total elements over parameters().
  std::int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  /// Name -> detached tensor sharing the parameter's storage.
  std::map<std::string, Tensor> state_dict() const;
  /// Copies values in (converted to each parameter's dtype). Throws zero::Error naming the first
  /// missing/unexpected key or mismatched shape; nothing is copied unless every entry matches.
  void load_state_dict(const std::map<std::string, Tensor>& state);
  /// Converts every parameter to `dtype` in place (same handles, new storage; requires_grad kept).
  void to(DType dtype);
  /// Moves every parameter to `device` in place (same handles, so optimizers and hooks built on them
  /// stay valid; new storage there; requires_grad kept; gradients are dropped). Call before building
  /// an optimizer or a flat buffer. Throws zero::Error for cuda without a usable device.
  void to(Device device);

 protected:
  /// Registers a parameter (marked requires_grad). Returns the handle the module keeps.
  Tensor register_parameter(const std::string& name, Tensor value, bool decay);
  template <typename M> std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    children_.emplace_back(name, child);
    return child;
  }
  /// The f32 tensor to compute with: `p` itself, or a differentiable f32 copy of an f16/bf16
  /// parameter (its gradient flows back in the parameter's dtype), converted again only after the
  /// parameter changed (Note [Compute copies] in autograd/compute_copy.h). Every read of a parameter in a
  /// forward goes through here, after the parameter's use hooks (autograd::register_parameter_use_hook)
  /// have run.
  Tensor compute(const Tensor& p) const {
    autograd::run_parameter_use_hooks(p);
    return p.dtype() == DType::f32 ? p : to_f32_cached(p, autograd::meta_of(p).compute_copy);
  }
  /// The tensor a GEMM (linear, matmul) reads for parameter `p`: `p` itself where the device's GEMMs
  /// take its dtype (f16/bf16 on cuda: tensor cores, no f32 copy; Note [Tensor cores for 16-bit
  /// models] in core/gemm_precision.h), else compute(p) (cpu: the cached f32 copy, today's numerics).
  Tensor gemm_operand(const Tensor& p) const {
    if (gemm_operand_dtype(p.device(), p.dtype()) != p.dtype()) return compute(p);
    autograd::run_parameter_use_hooks(p);
    return p;
  }

 private:
  void collect(const std::string& prefix, std::vector<NamedParameter>& out) const;

  std::vector<NamedParameter> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace zero::nn
