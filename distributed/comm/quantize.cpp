#include "distributed/comm/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace zero::dist {

// Note [int8 quantized reduce-scatter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// DeepSpeed's zero_quantized_gradients (ZeRO++'s qgZ, there for stage 3 only) here for the
// reduce-scatter of stages 1, 2 and 3 (Communicator::set_quantized_gradients). It is the fp32-accumulating
// all-to-all of Note [fp32-accumulating reduce-scatter] (communicator.cpp) with int8 on the wire:
//   1. rank r cuts its send buffer into the n destination slices (the reduce-scatter's counts) and
//      quantizes each slice on its own, in blocks of `block` elements from the slice's start, one fp32
//      scale per block (quantize_blocks: absmax/127, round to nearest even). Its own slice is quantized
//      too, so every element of the result is the same function of the n inputs whoever owns it;
//   2. it sends slice d's scales and values to rank d (segments of whole blocks: the blocks do not
//      depend on the segment size);
//   3. rank d dequantizes the n contributions and adds them in fp32 in rank order 0, 1, ..., n-1
//      (dequantize_accumulate), then rounds once to the gradient's dtype.
// Bytes on the wire: each rank sends every slice but its own once, n_d + 4·ceil(n_d / block) bytes
// for a slice of n_d elements, so the ledger counts (n-1)/n of the whole quantized buffer, as for the
// ring (Ledger::bus_bytes): 1/4 of an fp32 wire plus the scales (1/64 of it at block 256), about
// 0.254x; against a 16-bit wire about 0.508x.
// Error: each contribution is off by at most s/2 per element (s its block's scale), so a sum of n is
// off by at most sum of s_q/2 over the ranks, before the final rounding. Unlike the ring's, this
// bound does not grow with a rounding per hop, but it is large next to bf16's: measured in
// docs/collectives.md, "Reduction error" (bench/bench_reduction_error). Error feedback (Note [Error
// feedback] in gradient_reducer.cpp) carries what one step's quantization lost into the next.

double quantized_bytes(std::span<const std::size_t> counts, std::size_t block) {
  double bytes = 0;
  for (std::size_t c : counts) bytes += static_cast<double>(quantized_bytes(c, block));
  return bytes;
}

namespace {

template <typename T>
void quantize_as(const T* src, std::size_t n, std::size_t block, float* scales, std::int8_t* values) {
  for (std::size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const std::size_t end = std::min(n, begin + block);
    float absmax = 0.0f;
    bool finite = true;
    for (std::size_t i = begin; i < end; ++i) {
      const float x = static_cast<float>(src[i]);
      finite = finite && std::isfinite(x);
      absmax = std::max(absmax, std::fabs(x));
    }
    if (!finite) {
      scales[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(values + begin, values + end, std::int8_t{0});
      continue;
    }
    const float scale = absmax / 127.0f;
    scales[b] = scale;
    if (scale == 0.0f) {
      std::fill(values + begin, values + end, std::int8_t{0});
      continue;
    }
    for (std::size_t i = begin; i < end; ++i) {
      // nearbyint under the default rounding mode: to nearest, ties to even.
      const float q = std::nearbyint(static_cast<float>(src[i]) / scale);
      values[i] = static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
  }
}

}  // namespace

void quantize_blocks(const void* src, DType dtype, std::size_t n, std::size_t block, float* scales,
                     std::int8_t* values) {
  ZERO_CHECK(block >= 1, "quantize_blocks: block size must be >= 1, got {}", block);
  switch (dtype) {
    case DType::f32: return quantize_as(static_cast<const float*>(src), n, block, scales, values);
    case DType::f16: return quantize_as(static_cast<const half*>(src), n, block, scales, values);
    case DType::bf16: return quantize_as(static_cast<const bfloat16*>(src), n, block, scales, values);
    default: ZERO_CHECK(false, "quantize_blocks: unsupported dtype {} (f32, f16 or bf16)", dtype_name(dtype));
  }
}

void dequantize_accumulate(const float* scales, const std::int8_t* values, std::size_t n, std::size_t block,
                           float* acc, bool first) {
  for (std::size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const std::size_t end = std::min(n, begin + block);
    const float s = scales[b];
    if (first) {
      for (std::size_t i = begin; i < end; ++i) acc[i] = static_cast<float>(values[i]) * s;
    } else {
      for (std::size_t i = begin; i < end; ++i) acc[i] += static_cast<float>(values[i]) * s;
    }
  }
}

}  // namespace zero::dist
