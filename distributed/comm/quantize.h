// Blockwise int8 quantization of gradients: the wire format of the quantized reduce-scatter
// (DeepSpeed's zero_quantized_gradients; Note [int8 quantized reduce-scatter] in quantize.cpp) and the
// compact store of its error-feedback residual.
//
// A run of n values is cut into blocks of `block` elements from its first element (the last block may
// be shorter). Each block b gets one fp32 scale s_b = absmax_b / 127 and each value x the int8
//   q = round_to_nearest_even(x / s_b), clamped to [-127, 127]   (q = 0 when s_b = 0),
// which dequantizes to q·s_b, within s_b / 2 of x (plus the rounding of the fp32 division). A block
// holding an inf or NaN gets the scale NaN and all-zero values, so its dequantized values are NaN and
// an overflow check downstream still sees the non-finite gradient.
//
// The quantized form of a run on the wire: the ceil(n / block) fp32 scales, then the n int8 values
// (quantized_bytes). The CPU communicators (MpiCommunicator, InProcessCommunicator) and the error
// feedback of GradientReducer all call these functions, so they quantize bit for bit alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace zero::dist {

/// Blocks of a run of n elements: ceil(n / block). block >= 1.
inline std::size_t quantized_blocks(std::size_t n, std::size_t block) { return (n + block - 1) / block; }

/// Bytes of the quantized form of a run of n elements: 4·ceil(n / block) scale bytes + n value bytes.
inline std::size_t quantized_bytes(std::size_t n, std::size_t block) { return 4 * quantized_blocks(n, block) + n; }

/// The quantized bytes of a reduce-scatter's whole buffer: sum over ranks of quantized_bytes(counts[r]),
/// each rank's slice being quantized on its own (blocks never straddle two ranks' slices).
double quantized_bytes(std::span<const std::size_t> counts, std::size_t block);

/// Quantizes n elements of `src` (f32, f16 or bf16 `dtype`): scales[ceil(n/block)] and values[n] as
/// described above. Throws zero::Error for another dtype or block < 1.
void quantize_blocks(const void* src, DType dtype, std::size_t n, std::size_t block, float* scales,
                     std::int8_t* values);

/// acc[i] (+)= values[i] · scales[i / block] for i < n, in fp32: assigns when `first`, adds otherwise.
/// One out-of-line function, so every caller gets the same instructions (hence the same bits, whatever
/// the compiler would contract into an FMA).
void dequantize_accumulate(const float* scales, const std::int8_t* values, std::size_t n, std::size_t block,
                           float* acc, bool first);

}  // namespace zero::dist
