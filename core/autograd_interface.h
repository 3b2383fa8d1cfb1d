// A tensor's autograd state, and the interface through which core/ reaches the autograd engine.
//
// Note [Autograd behind an interface]
// Tensor (core/tensor.h) has members that belong to autograd: requires_grad, grad, set_grad, is_leaf,
// backward, and the views and conversions (view, transpose, narrow, expand, contiguous, to(DType)),
// which record themselves in the graph. core/ is built and linked without autograd/ (the zero_core
// library; tests/core/test_core_alone.cpp links nothing else), so it holds what those members need and
// no more: the state below (a flag, the gradient, pointers to graph nodes it does not look into, the
// hooks), which the members read and write directly, and this interface to the engine, which
// autograd/autograd.cpp implements and installs when the program starts (PyTorch's c10 keeps its
// TensorImpl apart from libtorch's autograd the same way). The views are computed in core; the
// interface only records them and runs backward.
//
// So a program that links only zero_core (or a static link that pulled in no autograd/ object: one
// that never calls an op) has working tensors, views, gradients it sets itself and optimizers over
// them. Its views record nothing (no backward could run a graph), and backward() throws one
// zero::Error line saying that autograd is not linked.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace zero {

namespace autograd {

class Node;  // a graph node (autograd/autograd.h)

using HookFn = std::function<void(Tensor& param)>;
using UseHookFn = std::function<void(const Tensor& param)>;

/// The f32 copy a layer computes with for an f16/bf16 parameter, and what it was made from (Note
/// [Compute copies] in autograd/compute_copy.h).
struct ComputeCopy {
  std::weak_ptr<Storage> storage;  // the parameter's storage when `value` was made
  std::int64_t offset = 0;
  std::uint64_t version = 0;
  DType dtype = DType::f32;
  Shape shape;
  Tensor value;  // f32, contiguous, not tracked by autograd
};

/// Hangs off TensorImpl::autograd, made the first time autograd state is set.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;         // set on outputs of recorded ops
  std::weak_ptr<Node> grad_accumulator;  // leaves: their AccumulateGrad node, made on first use
  std::vector<std::pair<int, HookFn>> post_accumulate_grad_hooks;
  std::vector<std::pair<int, UseHookFn>> parameter_use_hooks;
  ComputeCopy compute_copy;  // parameters of f16/bf16 models: their f32 compute copy
};

/// `t`'s autograd state, made on first use.
AutogradMeta& meta_of(const Tensor& t);

}  // namespace autograd

namespace detail {

class AutogradInterface {
 public:
  virtual ~AutogradInterface() = default;
  /// autograd::backward(root) (autograd/autograd.h).
  virtual void backward(const Tensor& root) const = 0;
  /// Records `output = name(input)` in the graph when grad mode is on and `input` needs grad;
  /// `backward` maps dL/d(output) to dL/d(input) (autograd::record with one input).
  virtual void record(const char* name, const Tensor& input, Tensor& output,
                      std::function<Tensor(const Tensor&)> backward) const = 0;
  /// autograd's sum_to (autograd/ops.h): the backward of expand.
  virtual Tensor sum_to(const Tensor& x, const Shape& shape) const = 0;
};

/// Installs the implementation (autograd/autograd.cpp does, once, during static initialisation).
void set_autograd_interface(const AutogradInterface* impl);
/// The installed implementation, or null when autograd/ is not linked into the program.
const AutogradInterface* autograd_interface();

}  // namespace detail

}  // namespace zero
