// Neural-network kernels in f32 (launchers declared in launch.h): LayerNorm, GELU, softmax, the pieces of
// attention around its cuBLAS GEMMs, cross-entropy and embedding. Formulas match core/cpu/kernels.cpp.
//
// Row-wise kernels give each row to one warp when rows are short (LayerNorm, the causal softmax: C and T
// in the hundreds) and to one block otherwise (softmax, cross-entropy over a vocabulary), so each row's
// statistics come from shuffles without a second pass through memory.
#include "core/cuda/device_util.cuh"
#include "core/cuda/kernel_math.h"

namespace zero::cuda::detail {

namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }
// The first row of a warp-per-row kernel's warp, and the step to its next row (Note [Row grids],
// kernel_math.h). Every lane of a warp has the same rows, so the warp shuffles stay converged.
__device__ __forceinline__ std::int64_t warp_row() {
  return static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
}
__device__ __forceinline__ std::int64_t warp_row_stride() {
  return static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
}
inline int warp_rows_grid(std::int64_t rows) { return row_grid(rows, kWarpsPerBlock); }

// ---- LayerNorm (Ba et al. 2016; llm.c's formulation) ----

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                         const float* bias, std::int64_t N, int C, float eps) {
  const int lane = lane_id();
  for (std::int64_t row = warp_row(); row < N; row += warp_row_stride()) {  // whole warps
    const float* x = inp + row * C;
    float sum = 0.0f;
    for (int i = lane; i < C; i += 32) sum += x[i];
    const float m = warp_sum(sum) / static_cast<float>(C);
    float var = 0.0f;
    for (int i = lane; i < C; i += 32) {
      const float d = x[i] - m;
      var += d * d;
    }
    var = warp_sum(var) / static_cast<float>(C);
    const float s = 1.0f / sqrtf(var + eps);
    float* y = out + row * C;
    for (int i = lane; i < C; i += 32) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = s;
    }
  }
}

__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                                const float* mean, const float* rstd, std::int64_t N, int C) {
  const int lane = lane_id();
  for (std::int64_t row = warp_row(); row < N; row += warp_row_stride()) {
    const float* dy = dout + row * C;
    const float* x = inp + row * C;
    const float m = mean[row], s = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int i = lane; i < C; i += 32) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean = warp_sum(dnorm_mean) / static_cast<float>(C);
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / static_cast<float>(C);
    float* dx = dinp + row * C;
    for (int i = lane; i < C; i += 32) {
      const float norm = (x[i] - m) * s;
      dx[i] = (weight[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

// dweight and dbias are sums over all N rows. Atomics would make them depend on scheduling, so each block
// (32 columns x 8 row lanes) sums a fixed set of rows into one partial per column and row group; a second
// kernel adds the G partials in order (the exact order is spelled out in kernel_math.h). Threads of a warp
// read 32 consecutive columns of one row.
__global__ void layernorm_backward_params_kernel(float* part_dweight, float* part_dbias, const float* dout,
                                                 const float* inp, const float* mean, const float* rstd,
                                                 std::int64_t N, int C) {
  __shared__ float s_dw[kLnRowLanes][kLnColumns + 1];
  __shared__ float s_db[kLnRowLanes][kLnColumns + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kLnColumns + tx;
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * kLnRowLanes + ty; r < N;
         r += static_cast<std::int64_t>(gridDim.y) * kLnRowLanes) {
      const float dy = dout[r * C + c];
      dw += (inp[r * C + c] - mean[r]) * rstd[r] * dy;
      db += dy;
    }
  }
  s_dw[ty][tx] = dw;
  s_db[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < kLnRowLanes; ++k) {
      tw += s_dw[k][tx];
      tb += s_db[k][tx];
    }
    part_dweight[static_cast<std::int64_t>(blockIdx.y) * C + c] = tw;
    part_dbias[static_cast<std::int64_t>(blockIdx.y) * C + c] = tb;
  }
}

__global__ void column_finalize_kernel(float* dst, const float* partials, int groups, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int g = 0; g < groups; ++g) acc += partials[static_cast<std::int64_t>(g) * C + c];
  dst[c] += acc;
}

// ---- GELU, tanh approximation (Hendrycks & Gimpel 2016) ----

__global__ void gelu_forward_kernel(float* out, const float* inp, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const float x = inp[i];
    out[i] = gelu_from_tanh(x, tanhf(gelu_tanh_arg(x)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const float x = inp[i];
    dinp[i] = gelu_backward_from_tanh(x, tanhf(gelu_tanh_arg(x)), dout[i]);
  }
}

// ---- softmax over rows, one block per row ----

// Block b handles rows b, b + gridDim.x, ... (Note [Row grids], kernel_math.h); the loop condition is
// the same for every thread of the block, so all of them reach each block_max / block_sum barrier.
__global__ void softmax_forward_kernel(float* out, const float* inp, std::int64_t N, int C) {
  __shared__ float scratch[32];
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float* x = inp + row * C;
    float* y = out + row * C;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < C; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
      const float e = expf(x[i] - mx);
      y[i] = e;  // read back below by this same thread
      sum += e;
    }
    const float inv = 1.0f / block_sum(sum, scratch);
    for (int i = threadIdx.x; i < C; i += blockDim.x) y[i] *= inv;
  }
}

__global__ void softmax_backward_kernel(float* dinp, const float* out, const float* dout, std::int64_t N, int C) {
  __shared__ float scratch[32];
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float* y = out + row * C;
    const float* dy = dout + row * C;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dot += y[i] * dy[i];
    dot = block_sum(dot, scratch);
    float* dx = dinp + row * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dx[i] = y[i] * (dy[i] - dot);
  }
}

// ---- attention: head layout changes and the causal softmax (the GEMMs are cuBLAS) ----

__global__ void rows_to_heads_kernel(float* dst, const float* src, std::int64_t row_stride, int T, int H, int D,
                                     std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    // i indexes dst[b, h, t, d]
    const int d = static_cast<int>(i % D);
    const int t = static_cast<int>((i / D) % T);
    const std::int64_t bh = i / (static_cast<std::int64_t>(D) * T);
    const int h = static_cast<int>(bh % H);
    const std::int64_t b = bh / H;
    dst[i] = src[(b * T + t) * row_stride + static_cast<std::int64_t>(h) * D + d];
  }
}

__global__ void heads_to_rows_kernel(float* dst, std::int64_t row_stride, const float* src, int T, int H, int D,
                                     std::int64_t n) {
  const std::int64_t C = static_cast<std::int64_t>(H) * D;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    // i indexes the logical [B, T, C] rows, so writes of neighbouring threads are neighbours
    const std::int64_t c = i % C;
    const std::int64_t bt = i / C;
    const int t = static_cast<int>(bt % T);
    const std::int64_t b = bt / T;
    const int h = static_cast<int>(c / D);
    const int d = static_cast<int>(c % D);
    dst[bt * row_stride + c] = src[((b * H + h) * T + t) * D + d];
  }
}

__global__ void causal_softmax_forward_kernel(float* att, std::int64_t rows, int T) {
  const int lane = lane_id();
  for (std::int64_t row = warp_row(); row < rows; row += warp_row_stride()) {
    const int t = static_cast<int>(row % T);
    float* a = att + row * T;
    float mx = -INFINITY;
    for (int s = lane; s <= t; s += 32) mx = fmaxf(mx, a[s]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int s = lane; s <= t; s += 32) {
      const float e = expf(a[s] - mx);
      a[s] = e;  // re-read below by this same lane
      sum += e;
    }
    const float inv = 1.0f / warp_sum(sum);
    for (int s = lane; s < T; s += 32) a[s] = s <= t ? a[s] * inv : 0.0f;
  }
}

__global__ void causal_softmax_backward_kernel(float* datt, const float* att, std::int64_t rows, int T, float scale) {
  const int lane = lane_id();
  for (std::int64_t row = warp_row(); row < rows; row += warp_row_stride()) {
    const int t = static_cast<int>(row % T);
    const float* p = att + row * T;
    float* dp = datt + row * T;
    float dot = 0.0f;
    for (int s = lane; s <= t; s += 32) dot += p[s] * dp[s];
    dot = warp_sum(dot);
    for (int s = lane; s < T; s += 32) dp[s] = s <= t ? p[s] * (dp[s] - dot) * scale : 0.0f;
  }
}

// ---- cross-entropy, fused with its softmax: one block per row ----

__global__ void cross_entropy_forward_kernel(float* probs, float* losses, const float* logits,
                                             const std::int64_t* targets, std::int64_t N, int V, int* error_flag) {
  __shared__ float scratch[32];
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {  // Note [Row grids]
    const float* x = logits + row * V;
    float* y = probs + row * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float e = expf(x[i] - mx);
      y[i] = e;
      sum += e;
    }
    const float total = block_sum(sum, scratch);
    const float inv = 1.0f / total;
    for (int i = threadIdx.x; i < V; i += blockDim.x) y[i] *= inv;
    if (threadIdx.x == 0) {
      const std::int64_t target = targets[row];
      if (target < 0 || target >= V) {
        atomicOr(error_flag, kCrossEntropyTargetBit);
        losses[row] = 0.0f;
      } else {
        // -log softmax(x)[target] = log(sum_i exp(x_i - max)) - (x[target] - max): both terms >= 0 (the
        // sum holds exp(0) = 1), so nothing cancels and nothing saturates, however small the probability
        // (-log(p) of a p that underflowed to 0 would be inf, or a clamp's 69).
        losses[row] = logf(total) - (x[target] - mx);
      }
    }
  }
}

__global__ void cross_entropy_backward_kernel(float* dlogits, const float* probs, const std::int64_t* targets,
                                              float dloss, const float* dloss_dev, std::int64_t N, int V) {
  const float s = (dloss_dev != nullptr ? *dloss_dev : dloss) / static_cast<float>(N);
  const std::int64_t n = N * V;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const std::int64_t row = i / V;
    const int v = static_cast<int>(i % V);
    const float g = probs[i] * s;
    dlogits[i] = v == targets[row] ? g - s : g;
  }
}

// ---- embedding ----

__global__ void embedding_forward_kernel(float* out, const float* weight, const std::int64_t* idx, std::int64_t V,
                                         int C, std::int64_t n, int* error_flag) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const std::int64_t row = i / C;
    const int c = static_cast<int>(i % C);
    const std::int64_t id = idx[row];
    if (id < 0 || id >= V) {
      if (c == 0) atomicOr(error_flag, kEmbeddingIndexBit);
      out[i] = 0.0f;
    } else {
      out[i] = weight[id * C + c];
    }
  }
}

// Rows that share an index add into the same weight row: atomics (the order of the additions, and so the
// last bits of dweight, can vary from run to run).
__global__ void embedding_backward_kernel(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t V,
                                          int C, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const std::int64_t row = i / C;
    const int c = static_cast<int>(i % C);
    const std::int64_t id = idx[row];
    if (id >= 0 && id < V) atomicAdd(dweight + id * C + c, dout[i]);
  }
}

}  // namespace

void launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, std::int64_t N, int C, float eps, cudaStream_t s) {
  if (N <= 0) return;
  layernorm_forward_kernel<<<warp_rows_grid(N), kThreads, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                                     const float* mean, const float* rstd, std::int64_t N, int C, cudaStream_t s) {
  if (N <= 0) return;
  layernorm_backward_input_kernel<<<warp_rows_grid(N), kThreads, 0, s>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  ZERO_CUDA_CHECK_LAUNCH();
}


void launch_layernorm_backward_params(float* part_dweight, float* part_dbias, int groups, const float* dout,
                                      const float* inp, const float* mean, const float* rstd, std::int64_t N, int C,
                                      cudaStream_t s) {
  if (C <= 0) return;
  const dim3 grid((C + kLnColumns - 1) / kLnColumns, groups);
  const dim3 block(kLnColumns, kLnRowLanes);
  layernorm_backward_params_kernel<<<grid, block, 0, s>>>(part_dweight, part_dbias, dout, inp, mean, rstd, N, C);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_column_finalize(float* dst, const float* partials, int groups, int C, cudaStream_t s) {
  if (C <= 0) return;
  column_finalize_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, s>>>(dst, partials, groups, C);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_gelu_forward(float* out, const float* inp, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(out, inp, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(dinp, inp, dout, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_softmax_forward(float* out, const float* inp, std::int64_t N, int C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  softmax_forward_kernel<<<row_grid(N, 1), row_block_threads(C), 0, s>>>(out, inp, N, C);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, int C,
                             cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  softmax_backward_kernel<<<row_grid(N, 1), row_block_threads(C), 0, s>>>(dinp, out, dout, N, C);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_rows_to_heads(float* dst, const float* src, std::int64_t row_stride, int B, int T, int H, int D,
                          cudaStream_t s) {
  const std::int64_t n = static_cast<std::int64_t>(B) * T * H * D;
  if (n <= 0) return;
  rows_to_heads_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, src, row_stride, T, H, D, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_heads_to_rows(float* dst, std::int64_t row_stride, const float* src, int B, int T, int H, int D,
                          cudaStream_t s) {
  const std::int64_t n = static_cast<std::int64_t>(B) * T * H * D;
  if (n <= 0) return;
  heads_to_rows_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, row_stride, src, T, H, D, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_causal_softmax_forward(float* att, std::int64_t rows, int T, cudaStream_t s) {
  if (rows <= 0) return;
  causal_softmax_forward_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(att, rows, T);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_causal_softmax_backward(float* datt, const float* att, std::int64_t rows, int T, float scale,
                                    cudaStream_t s) {
  if (rows <= 0) return;
  causal_softmax_backward_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(datt, att, rows, T, scale);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_cross_entropy_forward(float* probs, float* losses, const float* logits, const std::int64_t* targets,
                                  std::int64_t N, int V, int* error_flag, cudaStream_t s) {
  if (N <= 0) return;
  cross_entropy_forward_kernel<<<row_grid(N, 1), row_block_threads(V), 0, s>>>(probs, losses, logits, targets, N, V,
                                                                               error_flag);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets, float dloss,
                                   const float* dloss_dev, std::int64_t N, int V, cudaStream_t s) {
  const std::int64_t n = N * V;
  if (n <= 0) return;
  cross_entropy_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(dlogits, probs, targets, dloss, dloss_dev, N, V);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N,
                              std::int64_t V, int C, int* error_flag, cudaStream_t s) {
  const std::int64_t n = N * C;
  if (n <= 0) return;
  embedding_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(out, weight, idx, V, C, n, error_flag);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N,
                               std::int64_t V, int C, cudaStream_t s) {
  const std::int64_t n = N * C;
  if (n <= 0) return;
  embedding_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(dweight, dout, idx, V, C, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

}  // namespace zero::cuda::detail
