// CUDA-only helpers beside the CUDA backend's kernels (core/cuda/backend.h: every kernel of
// core/kernels.def, reached through kernels(Device::cuda)): the TF32 switch, dtype conversion and
// strided copies the backend's copy is built from, and device-resident variants of reductions that
// keep their result on the device.
//
// All of them run asynchronously on the current stream (core/cuda/runtime.h) unless they return a host
// value, which synchronizes. tests/unit/test_cuda_kernels.cpp checks each against a double-precision
// reference or the CPU backend (Note [CUDA test tolerances] in tests/unit/cuda_test_util.h). Sizes must
// fit the kernels' index types: rows N, sizes n up to 2^63 (row kernels loop over rows past the grid's
// 2^31 - 1 blocks: Note [Row grids] in kernel_math.h), a row length (C, V, T) up to 2^31 - 1; GEMM
// dimensions and leading dimensions up to 2^31 - 1 (cuBLAS). Validation that needs the data (embedding
// indices, cross-entropy targets) is deferred: the kernel skips the bad element and sets a device flag;
// the next check_device_errors() (synchronize() calls it) throws zero::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace zero::cuda {

/// Whether f32 GEMMs may use TF32 tensor cores (default false, PyTorch's default for matmul).
void set_allow_tf32(bool allow);
bool allow_tf32();

/// out[N,C] = row[C] in every row.
void copy_rows(float* out, const float* row, std::int64_t N, std::int64_t C);
/// dst[i] = src[i] converted (f32, f16, bf16 in any combination; round to nearest even). Same dtype
/// is a device copy.
void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n);
/// Copies the strided view (shape, src_strides, src_offset; in elements) of src_base into the strided
/// view of dst_base, element by element (no dtype conversion; elem_size bytes each). At most 8 dims.
void strided_copy(void* dst_base, const std::vector<std::int64_t>& dst_strides, std::int64_t dst_offset,
                  const void* src_base, const std::vector<std::int64_t>& src_strides, std::int64_t src_offset,
                  const std::vector<std::int64_t>& shape, std::size_t elem_size);

// ---- reductions --------------------------------------------------------------------------------------
// fp64 partials over a fixed grid, then one block adds them in order: deterministic for a given n.

/// Column sums: out[C] (= or +=) sum over rows of x[N,C], fp32 accumulation (cuBLAS gemv against
/// ones). The bias gradient of a linear layer.
void sum_rows(float* out, const float* x, std::int64_t N, std::int64_t C, bool accumulate);
/// Sum of x[n] (f32, f16, bf16) in double. Synchronizes.
double sum(const void* x, DType dtype, std::int64_t n);
/// *acc (device double) += sum of squares of x. No synchronization: sum many tensors, read once.
void sum_squares_async(double* acc, const void* x, DType dtype, std::int64_t n);
/// Sets *flag (device int) to 1 if any element is +-inf or NaN; leaves it alone otherwise.
void has_inf_or_nan_async(int* flag, const void* x, DType dtype, std::int64_t n);

}  // namespace zero::cuda
