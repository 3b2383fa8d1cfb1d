#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/backend.h"
#include "core/check.h"

namespace zero::optim {

namespace {

// A float tensor as contiguous memory: itself, or a contiguous copy.
Tensor dense_float(const Tensor& t, const char* what) {
  ZERO_CHECK(is_floating(t.dtype()), "{}: needs an f32, f16 or bf16 tensor, got {}", what, dtype_name(t.dtype()));
  return t.is_contiguous() ? t : t.clone();
}

}  // namespace

double grad_sq_norm(const Tensor& grad) {
  if (!grad.defined()) return 0.0;
  const Tensor g = dense_float(grad, "grad_sq_norm");
  return g.numel() > 0 ? backend(g.device()).sum_squares(g.raw_data(), g.dtype(), g.numel()) : 0.0;
}

void scale_grad_(const Tensor& grad, float factor) {
  Tensor g = dense_float(grad, "scale_grad_");
  if (g.numel() > 0) backend(g.device()).scale(g.raw_data(), g.raw_data(), g.dtype(), g.numel(), factor);
  if (!g.same(grad)) Tensor(grad).copy_(g);  // a strided gradient was scaled in a contiguous copy
}

float clip_grad_norm(const std::vector<Tensor>& params, float max_norm) {
  double sq = 0.0;
  for (const Tensor& p : params) sq += grad_sq_norm(p.grad());
  const double norm = std::sqrt(sq);
  if (max_norm > 0.0f && std::isfinite(norm)) {
    const double clip_coef = static_cast<double>(max_norm) / (norm + 1e-6);
    if (clip_coef < 1.0)
      for (const Tensor& p : params)
        if (p.grad().defined()) scale_grad_(p.grad(), static_cast<float>(clip_coef));
  }
  return static_cast<float>(norm);
}

}  // namespace zero::optim
