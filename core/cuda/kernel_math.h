// The per-element formulas and launch plans of core/cuda/nn.cu, in plain C++ that compiles both as
// device code (nvcc) and as host code without a CUDA toolkit.
//
// The kernels call these functions, so a host program can evaluate exactly the arithmetic a kernel does
// (same operations in the same order, f32 throughout) and measure its error against a double-precision
// reference with no GPU present; tests/unit/test_cuda_kernel_math.cpp does that. What the host cannot
// reproduce is the device's transcendental functions (tanhf, expf: within 2 ulp, CUDA C Programming
// Guide, "Mathematical Functions") and nvcc's contraction of a*b + c into one FMA; the error bounds the
// tests use are derived per operation, so they hold with or without either.
//
// Plain C++17 (the device code's standard), no CUDA headers: ZERO_HD (core/host_device.h) is
// __host__ __device__ under nvcc and nothing otherwise.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace zero::cuda::detail {

// ---- GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. in section 2) ----
// gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3). The kernels compute t = tanhf(u)
// themselves (device tanhf) and hand it to the formulas below.

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi), rounded to f32
constexpr float kGeluCubic = 0.044715f;

/// u(x), the argument of tanh.
ZERO_HD inline float gelu_tanh_arg(float x) { return kGeluScale * (x + kGeluCubic * x * x * x); }

/// gelu(x) given t = tanh(gelu_tanh_arg(x)).
ZERO_HD inline float gelu_from_tanh(float x, float t) { return 0.5f * x * (1.0f + t); }

/// dy * gelu'(x) given t = tanh(gelu_tanh_arg(x)):
/// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x),  u'(x) = sqrt(2/pi) (1 + 3·0.044715 x^2).
/// Where t is near ±1 the factor 1 - t^2 cancels: an error of k ulp in t becomes an absolute error of
/// about 2 |t| k ulp(t) in 1 - t^2, times 0.5 |x| u'(x), which grows like |x|^3 (Note [GELU backward
/// error] in tests/unit/kernel_bounds.h bounds it).
ZERO_HD inline float gelu_backward_from_tanh(float x, float t, float dy) {
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x));
}

// ---- LayerNorm parameter gradients: the two-pass deterministic reduction ----
// Pass 1 (layernorm_backward_params_kernel): block (kLnColumns x kLnRowLanes) threads, grid
// (ceil(C / kLnColumns), G). Thread (tx, ty) of row group g sums, in f32 and in order, the rows
// r = g * kLnRowLanes + ty, r += G * kLnRowLanes; then thread ty = 0 adds the kLnRowLanes lane sums in
// order ty = 0..7 into partial[g, c]. Pass 2 (column_finalize_kernel): dst[c] += (sum over g = 0..G-1
// of partial[g, c], in order, starting from 0).

constexpr int kLnColumns = 32;
constexpr int kLnRowLanes = 8;
constexpr int kLnRowsPerLane = 16;  // at least this many rows per lane before another group is used
constexpr int kLnMaxGroups = 256;

/// Number of row groups G for N rows: 1 for N <= 128, then one more per 128 rows, at most 256.
ZERO_HD constexpr int layernorm_param_groups(std::int64_t N) {
  const std::int64_t g = (N + kLnRowLanes * kLnRowsPerLane - 1) / (kLnRowLanes * kLnRowsPerLane);
  return static_cast<int>(g < 1 ? 1 : (g > kLnMaxGroups ? kLnMaxGroups : g));
}

// ---- row grids ----
// Note [Row grids]
// Kernels that give each row to a block or to a warp launch at most kMaxRowGrid blocks and loop: block b
// handles rows b, b + gridDim.x, ... (warp w of block b: rows (b * warps + w) + k * gridDim.x * warps).
// grid.x may be up to 2^31 - 1 on every GPU this code targets (compute capability >= 3.0), so casting a
// 64-bit row count to the grid size would silently drop rows past that (or, through `unsigned`, wrap);
// the loop makes any N up to 2^63 correct, and a cap far above the number of resident blocks costs
// nothing.

constexpr std::int64_t kMaxRowGrid = (std::int64_t{1} << 31) - 1;

/// Blocks for `rows` rows at `rows_per_block` rows per block (1 for block-per-row kernels, warps per
/// block for warp-per-row kernels): ceil(rows / rows_per_block), at least 1, at most kMaxRowGrid.
ZERO_HD constexpr int row_grid(std::int64_t rows, int rows_per_block) {
  const std::int64_t b = (rows + rows_per_block - 1) / rows_per_block;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxRowGrid ? kMaxRowGrid : b));
}

/// Threads per block of a block-per-row kernel (softmax, cross-entropy) over rows of C: a multiple of 32,
/// at least 32, at most 256. Thread i sums elements i, i + threads, ... in order, then block_sum (a warp
/// butterfly, the warp sums through shared memory, a second butterfly) adds the threads.
ZERO_HD constexpr int row_block_threads(int C) {
  const int t = (C + 31) / 32 * 32;
  return t < 32 ? 32 : (t > 256 ? 256 : t);
}

}  // namespace zero::cuda::detail
