// The CUDA backend's GEMMs (core/kernels.def's row-major contract) through cuBLAS, and the column sums
// (cuBLAS gemv).
#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>

#include "core/check.h"
#include "core/cuda/backend.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch.h"
#include "core/cuda/runtime.h"
#include "core/gemm_precision.h"

namespace zero::cuda {

namespace {

std::atomic<bool> g_allow_tf32{false};

// One handle for the process, created on first use; calls are serialised because a handle's stream is
// state (set to the caller's current stream before every call, which is cheap).
struct Blas {
  std::mutex mutex;
  cublasHandle_t handle = nullptr;
  // A device vector of ones for sum_rows, grown on demand.
  float* ones = nullptr;
  std::int64_t ones_size = 0;
};

Blas& blas() {
  static auto* b = new Blas();  // never destroyed: cublasDestroy after the runtime is gone fails
  return *b;
}

// Locks the handle and points it at the current stream.
class HandleLock {
 public:
  HandleLock() : lock_(blas().mutex) {
    Blas& b = blas();
    if (b.handle == nullptr) {
      ZERO_CHECK(cuda_available(), "CUDA is not available on this machine (no device or driver)");
      ZERO_CUBLAS_CHECK(cublasCreate(&b.handle));
    }
    ZERO_CUBLAS_CHECK(cublasSetStream(b.handle, current_stream()));
  }
  cublasHandle_t handle() const { return blas().handle; }

 private:
  std::lock_guard<std::mutex> lock_;
};

int as_int(std::int64_t v, const char* what) {
  ZERO_CHECK(v >= 0 && v <= INT_MAX, "gemm: {} = {} outside [0, 2^31) (cuBLAS takes int)", what, v);
  return static_cast<int>(v);
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  ZERO_CHECK(false, "gemm: unsupported element type {}", dtype_name(t));
}

// Note [Row-major GEMM on cuBLAS]
// cuBLAS is column-major. A row-major [R, S] matrix with row stride ld is, read column-major, its
// transpose [S, R] with leading dimension ld. So the row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T: swap the operands (B first), keep each one's transpose flag, and
// swap M and N. No data moves.
void gemm_any(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const void* A,
              DType a_type, std::int64_t lda, std::int64_t stride_a, const void* B, DType b_type, std::int64_t ldb,
              std::int64_t stride_b, float beta, void* C, DType c_type, std::int64_t ldc, std::int64_t stride_c,
              std::int64_t batch) {
  ZERO_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, "gemm: negative size (M={}, N={}, K={}, batch={})", M, N, K,
             batch);
  if (M == 0 || N == 0 || batch == 0) return;
  // Validates the dtypes and picks the compute type (Note [Tensor cores for 16-bit models]).
  const GemmPlan plan = cuda_gemm_plan(a_type, b_type, c_type, g_allow_tf32.load(std::memory_order_relaxed));
  const int m = as_int(N, "N"), n = as_int(M, "M"), k = as_int(K, "K");
  // Minimum leading dimensions of the stored (row-major) operands, as the CPU GEMM assumes.
  ZERO_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
             "gemm: leading dimensions lda={} ldb={} ldc={} too small for M={} N={} K={} (trans_a={}, trans_b={})",
             lda, ldb, ldc, M, N, K, trans_a, trans_b);
  const int ld_a = std::max(as_int(lda, "lda"), 1), ld_b = std::max(as_int(ldb, "ldb"), 1),
            ld_c = std::max(as_int(ldc, "ldc"), 1);
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (K == 0) {
    // An empty sum: C = beta C (zeros when beta is 0, C unread), done here rather than trusting every
    // cuBLAS version to accept k = 0.
    detail::launch_scale_matrix(C, static_cast<detail::Elem>(static_cast<int>(c_type)), beta, M, N, ldc, stride_c,
                                batch, current_stream());
    return;
  }
  const cublasComputeType_t compute =
      plan.compute == GemmCompute::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  HandleLock h;
  if (batch == 1) {
    ZERO_CUBLAS_CHECK(cublasGemmEx(h.handle(), op_b, op_a, m, n, k, &alpha, B, cuda_type(b_type), ld_b, A,
                                   cuda_type(a_type), ld_a, &beta, C, cuda_type(c_type), ld_c, compute,
                                   CUBLAS_GEMM_DEFAULT));
  } else {
    ZERO_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h.handle(), op_b, op_a, m, n, k, &alpha, B, cuda_type(b_type), ld_b,
                                                 stride_b, A, cuda_type(a_type), ld_a, stride_a, &beta, C,
                                                 cuda_type(c_type), ld_c, stride_c, as_int(batch, "batch"), compute,
                                                 CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool allow_tf32() { return g_allow_tf32.load(); }

void CudaBackend::gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                       const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                       std::int64_t ldc, const float* bias) {
  gemm_any(trans_a, trans_b, M, N, K, alpha, A, DType::f32, lda, 0, B, DType::f32, ldb, 0, beta, C, DType::f32, ldc,
           0, 1);
  if (bias != nullptr) detail::launch_add_bias_rows(C, ldc, bias, M, N, current_stream());
}

void CudaBackend::gemm_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const void* A, DType a_type, std::int64_t lda, const void* B, DType b_type, std::int64_t ldb,
                          float beta, void* C, DType c_type, std::int64_t ldc, const float* bias) {
  ZERO_CHECK(bias == nullptr || c_type == DType::f32, "gemm_ex: a bias needs an f32 output, got {}",
             dtype_name(c_type));
  gemm_any(trans_a, trans_b, M, N, K, alpha, A, a_type, lda, 0, B, b_type, ldb, 0, beta, C, c_type, ldc, 0, 1);
  if (bias != nullptr) detail::launch_add_bias_rows(static_cast<float*>(C), ldc, bias, M, N, current_stream());
}

void CudaBackend::gemm_batched_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                                  float alpha, const void* A, DType a_type, std::int64_t lda, std::int64_t stride_a,
                                  const void* B, DType b_type, std::int64_t ldb, std::int64_t stride_b, float beta,
                                  void* C, DType c_type, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  gemm_any(trans_a, trans_b, M, N, K, alpha, A, a_type, lda, stride_a, B, b_type, ldb, stride_b, beta, C, c_type, ldc,
           stride_c, batch);
}

void CudaBackend::gemm_batched(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                               const float* A, std::int64_t lda, std::int64_t stride_a, const float* B,
                               std::int64_t ldb, std::int64_t stride_b, float beta, float* C, std::int64_t ldc,
                               std::int64_t stride_c, std::int64_t batch) {
  gemm_any(trans_a, trans_b, M, N, K, alpha, A, DType::f32, lda, stride_a, B, DType::f32, ldb, stride_b, beta, C,
           DType::f32, ldc, stride_c, batch);
}

void sum_rows(float* out, const float* x, std::int64_t N, std::int64_t C, bool accumulate) {
  ZERO_CHECK(N >= 0 && C >= 0, "sum_rows: negative size [{}, {}]", N, C);
  if (C == 0) return;
  if (N == 0) {
    if (!accumulate) cuda_backend().fill(out, DType::f32, 0.0f, C);
    return;
  }
  const int rows = as_int(N, "N"), cols = as_int(C, "C");
  HandleLock h;
  Blas& b = blas();
  if (b.ones_size < N) {
    device_free(b.ones);
    b.ones = nullptr;
    b.ones_size = 0;
    b.ones = static_cast<float*>(device_alloc(sizeof(float) * static_cast<std::size_t>(N)));
    b.ones_size = N;
    cuda_backend().fill(b.ones, DType::f32, 1.0f, N);
  }
  // Row-major x[N, C] is column-major [C, N] (ld C): out = that matrix times ones[N].
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  ZERO_CUBLAS_CHECK(cublasSgemv(h.handle(), CUBLAS_OP_N, cols, rows, &alpha, x, cols, b.ones, 1, &beta, out, 1));
}

void CudaBackend::sum_rows(float* out, const float* x, std::int64_t N, std::int64_t C) {
  cuda::sum_rows(out, x, N, C, false);
}

}  // namespace zero::cuda
