#include "core/cpu/convert.h"

#include <omp.h>

#include <bit>
#include <cstring>

#include "core/check.h"

namespace zero::cpu {

namespace {

// One codec per floating-point dtype: load(p, i) reads element i as f32, store(p, i, v) writes v
// rounded to the dtype. All are inline branch-free arithmetic, so the loops below vectorise (GCC -O3:
// F16C's vcvtph2ps / vcvtps2ph for f16, integer shifts and a blend for bf16) while rounding exactly
// as Eigen::half / Eigen::bfloat16 do element by element.
struct F32 {
  static float load(const void* p, std::int64_t i) { return static_cast<const float*>(p)[i]; }
  static void store(void* p, std::int64_t i, float v) { static_cast<float*>(p)[i] = v; }
};
// IEEE binary16 through the compiler's _Float16 (round to nearest even, overflow to infinity, as
// Eigen::half). The may_alias type lets it read Eigen::half storage.
using AliasedF16 = _Float16 __attribute__((may_alias));
struct F16 {
  static float load(const void* p, std::int64_t i) { return static_cast<float>(static_cast<const AliasedF16*>(p)[i]); }
  static void store(void* p, std::int64_t i, float v) { static_cast<AliasedF16*>(p)[i] = static_cast<_Float16>(v); }
};
// bfloat16: the top half of the f32 bits. Rounding to nearest even adds 0x7fff plus the kept lsb;
// a NaN becomes the quiet NaN 0x7fc0 with its sign (Eigen's float_to_bfloat16_rtne), so rounding can
// never turn it into an infinity.
using AliasedU16 = std::uint16_t __attribute__((may_alias));
struct BF16 {
  static float load(const void* p, std::int64_t i) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<const AliasedU16*>(p)[i]) << 16);
  }
  static void store(void* p, std::int64_t i, float v) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    const std::uint32_t is_nan = 0u - static_cast<std::uint32_t>((u & 0x7fffffffu) > 0x7f800000u);  // all ones
    static_cast<AliasedU16*>(p)[i] = static_cast<std::uint16_t>((rounded & ~is_nan) | (quiet_nan & is_nan));
  }
};

// Runs body(begin, end) over [0, n), split across the OpenMP team when n is large enough to pay for
// waking it. Each element is converted independently, so the split does not change any result.
template <typename Body> void parallel_range(std::int64_t n, Body&& body) {
  constexpr std::int64_t kParallelMin = 1 << 16;
  if (n < kParallelMin || omp_in_parallel() || omp_get_max_threads() == 1) return body(std::int64_t{0}, n);
#pragma omp parallel
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    body(n * t / nt, n * (t + 1) / nt);
  }
}

// Calls f(Codec{}) for the floating-point dtype t.
template <typename F> void with_codec(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: return f(F32{});
    case DType::f16: return f(F16{});
    case DType::bf16: return f(BF16{});
    default: ZERO_CHECK(false, "{}: {} is not a floating-point dtype", what, dtype_name(t));
  }
}

// The loops, on pointers passed by value: inside a lambda that captures them by reference GCC cannot
// keep them in registers across the stores (a store might alias the closure) and gives up vectorising.
template <typename D, typename S>
void convert_range(void* __restrict dst, const void* __restrict src, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) D::store(dst, i, S::load(src, i));
}
template <typename D, typename S>
void accumulate_range(void* dst, const void* src, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) D::store(dst, i, D::load(dst, i) + S::load(src, i));
}

template <typename D> void scale_range(void* x, float factor, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) D::store(x, i, D::load(x, i) * factor);
}

}  // namespace

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) {
  if (dst_dtype == src_dtype && (dst_dtype == DType::f32 || dst_dtype == DType::f16 || dst_dtype == DType::bf16)) {
    if (dst != src) std::memcpy(dst, src, static_cast<std::size_t>(n) * dtype_size(dst_dtype));
    return;
  }
  with_codec(dst_dtype, "convert", [&](auto d) {
    with_codec(src_dtype, "convert", [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      parallel_range(n, [&](std::int64_t begin, std::int64_t end) { convert_range<D, S>(dst, src, begin, end); });
    });
  });
}

void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) {
  with_codec(dst_dtype, "accumulate", [&](auto d) {
    with_codec(src_dtype, "accumulate", [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      parallel_range(n, [&](std::int64_t begin, std::int64_t end) { accumulate_range<D, S>(dst, src, begin, end); });
    });
  });
}

void scale(void* x, DType dtype, std::int64_t n, float factor) {
  with_codec(dtype, "scale", [&](auto d) {
    using D = decltype(d);
    parallel_range(n, [&](std::int64_t begin, std::int64_t end) { scale_range<D>(x, factor, begin, end); });
  });
}

}  // namespace zero::cpu
