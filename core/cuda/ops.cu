// Kernels of the op set that layers compose from (launchers declared in launch.h): elementwise
// functions of one tensor and reductions over one dimension. One thread per output element, each
// reducing in index order, so sums match the CPU's order and max picks the same element.
#include "core/cuda/device_util.cuh"

namespace zero::cuda::detail {

namespace {

template <int Op> __global__ void unary_kernel(float* out, const float* x, std::int64_t n, float p) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const float v = x[i];
    if (Op == 0) out[i] = sqrtf(v);
    if (Op == 1) out[i] = 1.0f / sqrtf(v);  // not rsqrtf: that is approximate (2 ulp)
    if (Op == 2) out[i] = expf(v);
    if (Op == 3) out[i] = logf(v);
    if (Op == 4) out[i] = p == 2.0f ? v * v : powf(v, p);
  }
}

// out[o, i] = sum_j x[o, j, i] (Op 0) or max_j with the first argmax (Op 1; NaN propagates).
template <int Op>
__global__ void reduce_dim_kernel(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                                  std::int64_t inner) {
  const std::int64_t total = outer * inner;
  for (std::int64_t k = global_thread(); k < total; k += grid_stride()) {
    const std::int64_t o = k / inner, i = k % inner;
    const float* xo = x + o * n * inner + i;
    if (Op == 0) {
      float acc = 0.0f;
      for (std::int64_t j = 0; j < n; ++j) acc += xo[j * inner];
      out[k] = acc;
    } else {
      float best = xo[0];
      std::int64_t at = 0;
      for (std::int64_t j = 1; j < n && !isnan(best); ++j) {
        const float v = xo[j * inner];
        if (v > best || isnan(v)) {
          best = v;
          at = j;
        }
      }
      out[k] = best;
      argmax[k] = at;
    }
  }
}

__global__ void scatter_dim_kernel(float* dx, const float* g, const std::int64_t* argmax, std::int64_t n,
                                   std::int64_t inner, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_stride()) {
    const std::int64_t i = e % inner, j = (e / inner) % n, o = e / (inner * n);
    const std::int64_t k = o * inner + i;
    dx[e] = argmax[k] == j ? g[k] : 0.0f;
  }
}

}  // namespace

void launch_unary(float* out, const float* x, std::int64_t n, int op, float p, cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  switch (op) {
    case 0: unary_kernel<0><<<grid, kThreads, 0, s>>>(out, x, n, p); break;
    case 1: unary_kernel<1><<<grid, kThreads, 0, s>>>(out, x, n, p); break;
    case 2: unary_kernel<2><<<grid, kThreads, 0, s>>>(out, x, n, p); break;
    case 3: unary_kernel<3><<<grid, kThreads, 0, s>>>(out, x, n, p); break;
    default: unary_kernel<4><<<grid, kThreads, 0, s>>>(out, x, n, p); break;
  }
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_reduce_dim(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                       std::int64_t inner, int op, cudaStream_t s) {
  const std::int64_t total = outer * inner;
  if (total <= 0) return;
  if (op == 0)
    reduce_dim_kernel<0><<<grid_for(total), kThreads, 0, s>>>(out, argmax, x, outer, n, inner);
  else
    reduce_dim_kernel<1><<<grid_for(total), kThreads, 0, s>>>(out, argmax, x, outer, n, inner);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_scatter_dim(float* dx, const float* g, const std::int64_t* argmax, std::int64_t outer, std::int64_t n,
                        std::int64_t inner, cudaStream_t s) {
  const std::int64_t total = outer * n * inner;
  if (total <= 0) return;
  scatter_dim_kernel<<<grid_for(total), kThreads, 0, s>>>(dx, g, argmax, n, inner, total);
  ZERO_CUDA_CHECK_LAUNCH();
}

}  // namespace zero::cuda::detail
