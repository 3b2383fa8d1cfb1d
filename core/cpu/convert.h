// Bulk dtype conversion, accumulation and scaling on host buffers: the loops every 16-bit path runs (copy_
// between dtypes, gradient accumulation into a 16-bit gradient, the optimizer's master <-> model
// casts). Each is vectorised by the compiler (a scalar Eigen::half loop is ~1.5 ns per element, these
// are well under 0.1 on AVX2) and rounds exactly as Eigen::half / Eigen::bfloat16 (core/dtype.h) do:
// f32 -> f16/bf16 round to nearest even, 16-bit -> f32 is exact.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace zero::cpu {

/// dst[0:n] = src[0:n] converted from src_dtype to dst_dtype (f32, f16 or bf16; n elements, not
/// bytes). dst and src must not overlap unless they are the same buffer of the same dtype.
/// Throws zero::Error naming the dtype when either is not a floating-point type.
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n);

/// dst[0:n] += src[0:n]: both read as f32, added in f32, rounded once to dst_dtype (f32, f16 or
/// bf16; n elements). Throws zero::Error naming the dtype when either is not a floating-point type.
void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n);

/// x[0:n] *= factor in x's dtype: read as f32, multiplied in f32, rounded once to dtype (f32, f16 or
/// bf16; n elements). Throws zero::Error naming the dtype when it is not a floating-point type.
void scale(void* x, DType dtype, std::int64_t n, float factor);

}  // namespace zero::cpu
