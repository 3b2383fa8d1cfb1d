// How the CUDA backend's sum_to (core/backend.h: out[shape] = x[x_shape] summed down to `shape`, which
// broadcasts to x_shape) is carried out, decided from the shapes alone so it is tested without a GPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace zero::cuda::detail {

enum class SumToPlan {
  copy,  // as many elements out as in: the shapes differ by leading ones only, so a device memcpy
  rows,  // `shape` (without leading ones) is a suffix of x_shape: column sums of x as [numel / m, m]
  host,  // anything else (a reduction over inner dimensions): on the host, then back
};

/// The plan for sum_to(x_shape -> shape); `shape` must broadcast to x_shape (the caller checked).
/// Equal element counts mean every broadcast dimension is 1 and the row-major layouts coincide, so a
/// copy is exact, where the column-sum path would run a gemv against a vector of ones.
inline SumToPlan plan_sum_to(const std::vector<std::int64_t>& x_shape, const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1, m = 1;
  for (std::int64_t d : x_shape) n *= d;
  for (std::int64_t d : shape) m *= d;
  if (n == m) return SumToPlan::copy;
  std::vector<std::int64_t> core = shape;  // leading ones do not change the layout: [1, C] sums like [C]
  while (!core.empty() && core.front() == 1) core.erase(core.begin());
  if (core.size() <= x_shape.size() &&
      std::equal(core.begin(), core.end(), x_shape.end() - static_cast<std::ptrdiff_t>(core.size())))
    return SumToPlan::rows;
  return SumToPlan::host;
}

}  // namespace zero::cuda::detail
