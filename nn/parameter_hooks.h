// Parameter-use hooks: a callback that runs before a layer's forward reads a parameter.
//
// A layer reads each parameter through Module::compute(p), which first calls every registered hook
// with p. Code that fills parameters asynchronously registers one to make a forward wait for exactly
// the parameters it is about to use, and no others: ZeroOptimizer's overlap_param_gather all-gathers
// the partitions after the step in forward order and waits here, range by range (docs/zero.md,
// "Overlapping the parameter all-gather"). Layers never see who registered a hook, so nn/ does not
// depend on distributed/. The same role as a pre-forward hook in PyTorch (Module.register_forward_pre_hook),
// at the granularity of one parameter.
//
// Hooks are process-wide and run on the thread that runs the forward; registering or removing one while
// a forward runs on another thread is not supported. With no hook registered compute() costs one
// relaxed atomic load.
#pragma once

#include <atomic>
#include <functional>

#include "core/tensor.h"

namespace zero::nn {

/// Called with the parameter tensor (the module's handle) before a forward reads it. May block; an
/// exception it throws propagates out of the forward.
using ParameterUseHook = std::function<void(const Tensor& parameter)>;

/// Registers `hook`; returns an id for remove_parameter_use_hook.
int add_parameter_use_hook(ParameterUseHook hook);
/// Removes the hook registered under `id` (unknown ids are ignored).
void remove_parameter_use_hook(int id);

namespace detail {
extern std::atomic<int> g_parameter_use_hooks;  // how many are registered
void run_parameter_use_hooks(const Tensor& parameter);
}  // namespace detail

/// Runs the registered hooks for `parameter` (Module::compute calls it).
inline void before_parameter_use(const Tensor& parameter) {
  if (detail::g_parameter_use_hooks.load(std::memory_order_relaxed) > 0) detail::run_parameter_use_hooks(parameter);
}

}  // namespace zero::nn
