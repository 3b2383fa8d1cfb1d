// Elementwise kernels, reductions, the overflow check and AdamW (launchers declared in launch.h).
// Memory-bound code: one grid-stride pass per kernel, arithmetic in f32 (fp64 for reductions).
#include "core/cuda/device_util.cuh"

namespace zero::cuda::detail {

namespace {

// Runs `body` with T bound to the C++ type of float element type `e`.
#define ZERO_DISPATCH_FLOAT(e, T, ...)                                                    \
  switch (e) {                                                                            \
    case Elem::f32: {                                                                     \
      using T = float;                                                                    \
      __VA_ARGS__;                                                                        \
      break;                                                                              \
    }                                                                                     \
    case Elem::f16: {                                                                     \
      using T = __half;                                                                   \
      __VA_ARGS__;                                                                        \
      break;                                                                              \
    }                                                                                     \
    case Elem::bf16: {                                                                    \
      using T = __nv_bfloat16;                                                            \
      __VA_ARGS__;                                                                        \
      break;                                                                              \
    }                                                                                     \
    default: throw_message("CUDA kernel: expected a float element type", __FILE__, __LINE__); \
  }

template <typename T> __global__ void fill_kernel(T* dst, T value, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) dst[i] = value;
}

template <typename D, typename S> __global__ void cast_kernel(D* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) dst[i] = from_float<D>(to_float(src[i]));
}

template <typename T>
__global__ void strided_copy_kernel(T* dst, const T* src, StridedLayout layout, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    std::int64_t rem = i, so = 0, dof = 0;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      const std::int64_t idx = rem % layout.shape[d];
      rem /= layout.shape[d];
      so += idx * layout.src_strides[d];
      dof += idx * layout.dst_strides[d];
    }
    dst[dof] = src[so];
  }
}

template <int Op>
__global__ void binary_kernel(float* out, const float* a, const float* b, std::int64_t n, std::int64_t m) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const float x = a[i], y = b[m == n ? i : i % m];
    out[i] = Op == 0 ? x + y : (Op == 1 ? x - y : (Op == 2 ? x * y : x / y));
  }
}

__global__ void copy_rows_kernel(float* out, const float* row, std::int64_t n, std::int64_t C) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) out[i] = row[i % C];
}

// A counter-based generator (splitmix64's finaliser over seed + i): element i's draw depends on nothing
// else, so the mask is the same whatever the launch shape.
__global__ void dropout_mask_kernel(float* mask, std::uint64_t seed, float p, float keep, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // 24 bits: exact in f32
    mask[i] = u < p ? 0.0f : keep;
  }
}

__global__ void add_bias_rows_kernel(float* C, std::int64_t ldc, const float* bias, std::int64_t n, std::int64_t N) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) C[(i / N) * ldc + i % N] += bias[i % N];
}

template <typename T> __global__ void scale_kernel(T* out, const T* x, float factor, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) out[i] = from_float<T>(to_float(x[i]) * factor);
}

// C[b, r, c] = beta C[b, r, c] for rows r < rows and columns c < cols of `batch` matrices (rows ldc
// apart, matrices stride apart); beta == 0 stores zeros without reading C.
template <typename T>
__global__ void scale_matrix_kernel(T* C, float beta, std::int64_t rows, std::int64_t cols, std::int64_t ldc,
                                    std::int64_t stride, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const std::int64_t c = i % cols, r = (i / cols) % rows, b = i / (cols * rows);
    T& x = C[b * stride + r * ldc + c];
    x = beta == 0.0f ? from_float<T>(0.0f) : from_float<T>(to_float(x) * beta);
  }
}

template <typename D, typename S>
__global__ void accumulate_kernel(D* dst, const S* src, float alpha, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride())
    dst[i] = from_float<D>(to_float(dst[i]) + alpha * to_float(src[i]));
}

template <typename T, bool Squares>
__global__ void sum_partials_kernel(double* partials, const T* x, std::int64_t n) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const double v = static_cast<double>(to_float(x[i]));
    acc += Squares ? v * v : v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_finalize_kernel(double* dst_d, float* dst_f, const double* partials, int blocks, double scale,
                                    bool accumulate) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch) * scale;
  if (threadIdx.x == 0) {
    if (dst_d != nullptr) *dst_d = accumulate ? *dst_d + acc : acc;
    if (dst_f != nullptr) *dst_f = static_cast<float>(acc);
  }
}

// inf and NaN are the values whose exponent bits are all ones.
__device__ __forceinline__ bool nonfinite(float x) { return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u; }
__device__ __forceinline__ bool nonfinite(__half x) { return (__half_as_ushort(x) & 0x7c00u) == 0x7c00u; }
__device__ __forceinline__ bool nonfinite(__nv_bfloat16 x) {
  return (__bfloat16_as_ushort(x) & 0x7f80u) == 0x7f80u;
}

template <typename T> __global__ void nonfinite_kernel(int* flag, const T* x, std::int64_t n) {
  int found = 0;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) found |= nonfinite(x[i]) ? 1 : 0;
  if (__syncthreads_or(found) && threadIdx.x == 0) *flag = 1;
}

// The CPU kernel's per-element step (adamw_step, core/adamw_step.h: torch's _single_tensor_adamw).
template <typename G, typename P>
__global__ void adamw_kernel(float* param, const G* grad, float grad_mul, float* exp_avg, float* exp_avg_sq,
                             P* param_out, std::int64_t n, AdamWScalars sc) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const float p = adamw_step(param[i], exp_avg[i], exp_avg_sq[i], to_float(grad[i]) * grad_mul, sc);
    if (param_out != nullptr) param_out[i] = from_float<P>(p);
  }
}

}  // namespace

void launch_fill(void* dst, Elem t, float value, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  switch (t) {
    case Elem::f32: fill_kernel<<<grid, kThreads, 0, s>>>(static_cast<float*>(dst), value, n); break;
    case Elem::f16: fill_kernel<<<grid, kThreads, 0, s>>>(static_cast<__half*>(dst), __float2half_rn(value), n); break;
    case Elem::bf16:
      fill_kernel<<<grid, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), __float2bfloat16_rn(value), n);
      break;
    case Elem::i32:
      fill_kernel<<<grid, kThreads, 0, s>>>(static_cast<std::int32_t*>(dst), static_cast<std::int32_t>(value), n);
      break;
    case Elem::i64:
      fill_kernel<<<grid, kThreads, 0, s>>>(static_cast<std::int64_t*>(dst), static_cast<std::int64_t>(value), n);
      break;
  }
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_cast(void* dst, Elem dt, const void* src, Elem st, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  ZERO_DISPATCH_FLOAT(dt, D, ZERO_DISPATCH_FLOAT(st, S, cast_kernel<<<grid, kThreads, 0, s>>>(
                                                            static_cast<D*>(dst), static_cast<const S*>(src), n)));
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_strided_copy(void* dst, const void* src, int elem_bytes, const StridedLayout& layout, std::int64_t n,
                         cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  switch (elem_bytes) {
    case 1:
      strided_copy_kernel<<<grid, kThreads, 0, s>>>(static_cast<std::uint8_t*>(dst),
                                                    static_cast<const std::uint8_t*>(src), layout, n);
      break;
    case 2:
      strided_copy_kernel<<<grid, kThreads, 0, s>>>(static_cast<std::uint16_t*>(dst),
                                                    static_cast<const std::uint16_t*>(src), layout, n);
      break;
    case 4:
      strided_copy_kernel<<<grid, kThreads, 0, s>>>(static_cast<std::uint32_t*>(dst),
                                                    static_cast<const std::uint32_t*>(src), layout, n);
      break;
    case 8:
      strided_copy_kernel<<<grid, kThreads, 0, s>>>(static_cast<std::uint64_t*>(dst),
                                                    static_cast<const std::uint64_t*>(src), layout, n);
      break;
    default: throw_message("strided_copy: element size must be 1, 2, 4 or 8 bytes", __FILE__, __LINE__);
  }
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_binary(float* out, const float* a, const float* b, std::int64_t n, std::int64_t m, int op,
                   cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  switch (op) {
    case 0: binary_kernel<0><<<grid, kThreads, 0, s>>>(out, a, b, n, m); break;
    case 1: binary_kernel<1><<<grid, kThreads, 0, s>>>(out, a, b, n, m); break;
    case 2: binary_kernel<2><<<grid, kThreads, 0, s>>>(out, a, b, n, m); break;
    default: binary_kernel<3><<<grid, kThreads, 0, s>>>(out, a, b, n, m); break;
  }
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_copy_rows(float* out, const float* row, std::int64_t N, std::int64_t C, cudaStream_t s) {
  const std::int64_t n = N * C;
  if (n <= 0) return;
  copy_rows_kernel<<<grid_for(n), kThreads, 0, s>>>(out, row, n, C);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_dropout_mask(float* mask, std::uint64_t seed, float p, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dropout_mask_kernel<<<grid_for(n), kThreads, 0, s>>>(mask, seed, p, 1.0f / (1.0f - p), n);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_add_bias_rows(float* C, std::int64_t ldc, const float* bias, std::int64_t M, std::int64_t N,
                          cudaStream_t s) {
  const std::int64_t n = M * N;
  if (n <= 0) return;
  add_bias_rows_kernel<<<grid_for(n), kThreads, 0, s>>>(C, ldc, bias, n, N);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_scale(void* out, const void* x, Elem t, float factor, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  ZERO_DISPATCH_FLOAT(t, T, scale_kernel<<<grid, kThreads, 0, s>>>(static_cast<T*>(out), static_cast<const T*>(x),
                                                                    factor, n));
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_scale_matrix(void* C, Elem t, float beta, std::int64_t rows, std::int64_t cols, std::int64_t ldc,
                         std::int64_t stride, std::int64_t batch, cudaStream_t s) {
  const std::int64_t n = batch * rows * cols;
  if (n <= 0) return;
  const int grid = grid_for(n);
  ZERO_DISPATCH_FLOAT(t, T, scale_matrix_kernel<<<grid, kThreads, 0, s>>>(static_cast<T*>(C), beta, rows, cols, ldc,
                                                                          stride, n));
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_accumulate(void* dst, Elem dt, const void* src, Elem st, float alpha, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  ZERO_DISPATCH_FLOAT(dt, D, ZERO_DISPATCH_FLOAT(st, S, accumulate_kernel<<<grid, kThreads, 0, s>>>(
                                                            static_cast<D*>(dst), static_cast<const S*>(src), alpha, n)));
  ZERO_CUDA_CHECK_LAUNCH();
}

int reduction_blocks(std::int64_t n) {
  // About 4 elements per thread, at most 1024 partials (one finalize block of 1024 threads reads them).
  const std::int64_t blocks = (n + 4 * kThreads - 1) / (4 * kThreads);
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks));
}

void launch_sum_partials(double* partials, int blocks, const void* x, Elem t, std::int64_t n, bool squares,
                         cudaStream_t s) {
  if (squares) {
    ZERO_DISPATCH_FLOAT(t, T, sum_partials_kernel<T, true><<<blocks, kThreads, 0, s>>>(partials,
                                                                                        static_cast<const T*>(x), n));
  } else {
    ZERO_DISPATCH_FLOAT(t, T, sum_partials_kernel<T, false><<<blocks, kThreads, 0, s>>>(partials,
                                                                                         static_cast<const T*>(x), n));
  }
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_sum_finalize(double* dst_d, float* dst_f, const double* partials, int blocks, double scale,
                         bool accumulate, cudaStream_t s) {
  sum_finalize_kernel<<<1, 1024, 0, s>>>(dst_d, dst_f, partials, blocks, scale, accumulate);
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_nonfinite(int* flag, const void* x, Elem t, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  ZERO_DISPATCH_FLOAT(t, T, nonfinite_kernel<<<grid, kThreads, 0, s>>>(flag, static_cast<const T*>(x), n));
  ZERO_CUDA_CHECK_LAUNCH();
}

void launch_adamw(float* param, const void* grad, Elem gt, float grad_mul, float* exp_avg, float* exp_avg_sq,
                  void* param_out, Elem pt, std::int64_t n, const AdamWScalars& sc, cudaStream_t s) {
  if (n <= 0) return;
  const int grid = grid_for(n);
  if (param_out == nullptr) pt = Elem::f32;  // any instantiation; the store is skipped
  ZERO_DISPATCH_FLOAT(gt, G, ZERO_DISPATCH_FLOAT(pt, P, adamw_kernel<<<grid, kThreads, 0, s>>>(
                                                            param, static_cast<const G*>(grad), grad_mul, exp_avg,
                                                            exp_avg_sq, static_cast<P*>(param_out), n, sc)));
  ZERO_CUDA_CHECK_LAUNCH();
}

}  // namespace zero::cuda::detail
