// Error checks for CUDA runtime and cuBLAS calls (NCCL's is in distributed/comm/nccl_communicator.cpp).
//
// Every call into a CUDA library is wrapped: a failure throws zero::Error naming the call, the library's
// own error string and file:line, like ZERO_CHECK (core/check.h). Kernel launches are followed by
// ZERO_CUDA_CHECK_LAUNCH(), which reports a bad launch configuration at once; faults inside a kernel
// surface at the next checked call that synchronizes.
//
// This header is free of Eigen and fmt so that nvcc-compiled files (core/cuda/*.cu) can include it; the
// throwing functions are defined in core/cuda/runtime.cpp.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

namespace zero::cuda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line);
/// Throws zero::Error with `message` at file:line (for checks in device-code files, which have no fmt).
[[noreturn]] void throw_message(const char* message, const char* file, int line);
}  // namespace zero::cuda::detail

#define ZERO_CUDA_CHECK(call)                                                                       \
  do {                                                                                              \
    const cudaError_t zero_cuda_rc_ = (call);                                                       \
    if (zero_cuda_rc_ != cudaSuccess)                                                               \
      ::zero::cuda::detail::throw_cuda_error(zero_cuda_rc_, #call, __FILE__, __LINE__);             \
  } while (0)

#define ZERO_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                              \
    const cublasStatus_t zero_cublas_rc_ = (call);                                                  \
    if (zero_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                                   \
      ::zero::cuda::detail::throw_cublas_error(zero_cublas_rc_, #call, __FILE__, __LINE__);         \
  } while (0)

/// After a kernel launch (<<<...>>>): throws if the launch failed (bad configuration, no device, or an
/// earlier asynchronous error that is still pending).
#define ZERO_CUDA_CHECK_LAUNCH() ZERO_CUDA_CHECK(cudaGetLastError())
