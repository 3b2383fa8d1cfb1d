#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/cpu/convert.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/kernels.h"
#endif

namespace zero::optim {

namespace {

constexpr std::int64_t kChunk = 1 << 16;

template <typename T>
double sum_sq(const T* x, std::int64_t n) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<std::size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t end = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
    for (std::int64_t i = c * kChunk; i < end; ++i) {
      const double v = static_cast<float>(x[i]);
      s += v * v;
    }
    partial[c] = s;
  }
  return std::accumulate(partial.begin(), partial.end(), 0.0);
}

#ifdef ZERO_HAS_CUDA
void check_float(const Tensor& t, const char* what) {
  ZERO_CHECK(is_floating(t.dtype()), "{}: needs an f32, f16 or bf16 tensor, got {}", what, dtype_name(t.dtype()));
}
#endif

void check_cpu_float(const Tensor& t, const char* what) {
  ZERO_CHECK(t.device() == Device::cpu, "{}: only CPU tensors are supported, got {}", what, device_name(t.device()));
  ZERO_CHECK(is_floating(t.dtype()), "{}: needs an f32, f16 or bf16 tensor, got {}", what, dtype_name(t.dtype()));
}

}  // namespace

double grad_sq_norm(const Tensor& grad) {
  if (!grad.defined()) return 0.0;
#ifdef ZERO_HAS_CUDA
  if (grad.device() == Device::cuda) {  // fp64 partials in a fixed order, like the loop below
    check_float(grad, "grad_sq_norm");
    const Tensor g = grad.is_contiguous() ? grad : grad.clone();
    return g.numel() ? cuda::sum_squares(g.raw_data(), g.dtype(), g.numel()) : 0.0;
  }
#endif
  check_cpu_float(grad, "grad_sq_norm");
  const Tensor g = grad.is_contiguous() ? grad : grad.clone();
  switch (g.dtype()) {
    case DType::f16: return sum_sq(g.data<half>(), g.numel());
    case DType::bf16: return sum_sq(g.data<bfloat16>(), g.numel());
    default: return sum_sq(g.data<float>(), g.numel());
  }
}

void scale_grad_(const Tensor& grad, float factor) {
#ifdef ZERO_HAS_CUDA
  if (grad.device() == Device::cuda) {
    check_float(grad, "scale_grad_");
    Tensor g = grad.is_contiguous() ? grad : grad.clone();
    cuda::scale(g.raw_data(), g.raw_data(), g.dtype(), factor, g.numel());
    if (!g.same(grad)) Tensor(grad).copy_(g);
    return;
  }
#endif
  check_cpu_float(grad, "scale_grad_");
  Tensor g = grad.is_contiguous() ? grad : grad.clone();
  cpu::scale(g.raw_data(), g.dtype(), g.numel(), factor);
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
