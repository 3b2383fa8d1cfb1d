// Numerical gradient check: compares autograd's gradients with central differences.
//
// Used by the op table (test_gradcheck.cpp) and by any suite that adds a layer: build the inputs, mark
// the ones to check with set_requires_grad(true), and pass a function that computes the output.
//
//   auto r = zero::test::gradcheck([&](const std::vector<Tensor>& in) { return layer.forward(in[0]); },
//                                  {x, layer.weight, layer.bias});
//   EXPECT_TRUE(r.ok) << r.message;
//
// How it measures (minitorch / ggml test-backend-ops style):
// - The output may have any shape. A one-element output is the loss itself; otherwise the loss is
//   sum(output * W) with fixed random weights W (zero::mul and zero::sum on the autograd side), so
//   every output element and a wrong sign anywhere show up.
// - Analytic: one backward of that loss. Numerical: for every element of every input that requires
//   grad, (L(x + h) - L(x - h)) / (2h), where L is evaluated in double from the float outputs and h is
//   the perturbation actually representable in f32 around that element.
// - An element passes if |num - ana| <= tol * max(1, |num|).
// - Defaults: eps 1e-2 balances truncation (O(eps^2)) against f32 rounding of the outputs (O(1/eps));
//   every op in the table stays below 1e-4 with them (eps 1e-3 is ~10x noisier). A wrong gradient is
//   off by O(1). Deep compositions with many outputs may need a larger tol.
//
// Inputs are perturbed in place (element by element, always restored), so the function may read
// them from its argument or capture them (a module's parameters). Inputs on a device are perturbed
// through a host copy; the output weights W live on the output's device. It must be deterministic: an op that
// draws random numbers (dropout) makes its own Generator with a fixed seed on every call. The inputs'
// existing .grad() values are put back afterwards.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/strided.h"
#include "core/tensor.h"

namespace zero::test {

struct GradcheckOptions {
  double eps = 1e-2;         // perturbation, in input units
  double tol = 1e-3;         // allowed |num - ana| / max(1, |num|)
  std::uint64_t seed = 4242;  // for the output weights W
};

struct GradcheckResult {
  bool ok = true;
  double max_error = 0.0;       // max over checked elements of |num - ana| / max(1, |num|)
  std::int64_t checked = 0;     // number of input elements compared
  std::string message;          // the worst element (and the count of failures) when !ok
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

namespace detail {

// Storage offsets (in elements) of every element of t, in row-major order of the view.
inline std::vector<std::int64_t> element_offsets(const Tensor& t) {
  std::vector<std::int64_t> offs;
  offs.reserve(static_cast<std::size_t>(t.numel()));
  for_each_offset(t.shape(), t.strides(), t.offset(), [&](std::int64_t off) { offs.push_back(off); });
  return offs;
}

// L = sum_i w_i * out_i in double (w empty: the output is the one-element loss itself).
inline double weighted_loss(const Tensor& out, const std::vector<float>& w) {
  const std::vector<float> y = out.to_vector();
  if (w.empty()) return static_cast<double>(y.at(0));
  double acc = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) acc += static_cast<double>(w[i]) * static_cast<double>(y[i]);
  return acc;
}

}  // namespace detail

/// Compares autograd gradients of every input with requires_grad() (f32 leaves) against central
/// differences of fn. Inputs that do not require grad (indices, constants) are passed through.
inline GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                                 const GradcheckOptions& opt = {}) {
  GradcheckResult r;
  std::vector<std::size_t> checked_inputs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    ZERO_CHECK(t.is_leaf() && t.dtype() == DType::f32, "gradcheck: input {} must be an f32 leaf", i);
    checked_inputs.push_back(i);
  }
  ZERO_CHECK(!checked_inputs.empty(), "gradcheck: no input requires grad");

  // ---- analytic: one backward of the weighted loss, with the inputs' old gradients set aside ----
  std::vector<Tensor> saved_grads;
  for (std::size_t i : checked_inputs) {
    Tensor p = inputs[i];
    saved_grads.push_back(p.grad());
    p.set_grad(Tensor());
  }
  std::vector<float> w;
  std::vector<std::vector<float>> analytic;
  {
    Tensor out = fn(inputs);
    ZERO_CHECK(out.dtype() == DType::f32, "gradcheck: output must be f32, got {}", dtype_name(out.dtype()));
    Tensor loss = out;
    if (out.numel() != 1) {
      Generator gen(opt.seed);
      Tensor wt = Tensor::randn(out.shape(), gen);
      w = wt.to_vector();
      wt = wt.to(out.device());
      loss = sum(mul(out, wt));
    }
    // An output that does not require grad has no gradient path at all: zeros, checked below.
    if (loss.requires_grad()) autograd::backward(loss);
  }
  for (std::size_t k = 0; k < checked_inputs.size(); ++k) {
    Tensor p = inputs[checked_inputs[k]];
    Tensor g = p.grad();
    ZERO_CHECK(!g.defined() || g.numel() == p.numel(), "gradcheck: input {} has a gradient of shape {}, expected {}",
               checked_inputs[k], shape_str(g.shape()), shape_str(p.shape()));
    // No gradient at all reads as zeros: the numerical side then shows whether that was right.
    analytic.push_back(g.defined() ? g.to_vector() : std::vector<float>(static_cast<std::size_t>(p.numel()), 0.0f));
    p.set_grad(saved_grads[k]);
  }

  // ---- numerical: central differences, one element at a time ----
  autograd::NoGradGuard no_grad;
  std::int64_t failures = 0;
  double worst = -1.0;
  for (std::size_t k = 0; k < checked_inputs.size(); ++k) {
    const Tensor& p = inputs[checked_inputs[k]];
    // A device input is perturbed through a host copy written back whole (small tensors only).
    const bool on_host = p.device() == Device::cpu;
    Tensor host = on_host ? p : p.detach().to(Device::cpu);
    float* base = static_cast<float*>(host.storage()->data());
    const std::vector<std::int64_t> offs = detail::element_offsets(host);
    auto sync = [&] {
      if (!on_host) Tensor(p).copy_(host);
    };
    for (std::size_t e = 0; e < offs.size(); ++e) {
      float& x = base[offs[e]];
      const float orig = x;
      const float xp = static_cast<float>(orig + opt.eps), xm = static_cast<float>(orig - opt.eps);
      x = xp;
      sync();
      const double lp = detail::weighted_loss(fn(inputs), w);
      x = xm;
      sync();
      const double lm = detail::weighted_loss(fn(inputs), w);
      x = orig;
      sync();
      const double num = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
      const double ana = analytic[k][e];
      const double err = std::abs(num - ana) / std::max(1.0, std::abs(num));
      ++r.checked;
      r.max_error = std::max(r.max_error, err);
      if (!(err <= opt.tol)) {  // also catches NaN
        ++failures;
        if (!(err <= worst)) {
          worst = std::isnan(err) ? INFINITY : err;
          r.message = fmt::format("input {} (shape {}) element {}: numerical {:.6g}, autograd {:.6g}, error {:.3g} > {:.3g}",
                                  checked_inputs[k], shape_str(p.shape()), e, num, ana, err, opt.tol);
        }
      }
    }
  }
  if (failures > 0) {
    r.ok = false;
    r.message = fmt::format("{} of {} elements differ; worst: {}", failures, r.checked, r.message);
  }
  return r;
}

}  // namespace zero::test
