// The CPU implementations of core/backend.def's dtype-generic loops (CpuBackend, core/cpu/backend.h):
// copy (with dtype conversion), fill, scale, accumulate, the squared norm, the overflow check and the
// AdamW update. These are the loops every 16-bit path runs (copy_ between dtypes, gradient
// accumulation into a 16-bit gradient, the optimizer's master <-> model casts). Each is vectorised by
// the compiler (a scalar Eigen::half loop is ~1.5 ns per element, these are well under 0.1 on AVX2)
// and rounds exactly as Eigen::half / Eigen::bfloat16 (core/dtype.h) do: f32 -> f16/bf16 round to
// nearest even, 16-bit -> f32 is exact.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cpu/backend.h"
#include "core/cpu/kernels.h"
#include "core/strided.h"

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
  // GCC 12 does not vectorise the element conversions above when the target has AVX512-FP16 (each
  // becomes a scalar vcvtsh2ss / vcvtss2sh, ~6x slower than the bf16 loops), so f16 loops go through
  // these block conversions: the packed form of the same instructions (vcvtph2ps exact; vcvtps2ph
  // with round to nearest even, which is what the scalar cast does, NaNs and overflow included).
  static void load_block(const void* p, std::int64_t i, std::int64_t n, float* __restrict out) {
    [[maybe_unused]] const auto* h = static_cast<const std::uint16_t*>(p) + i;
    std::int64_t k = 0;
#if defined(__AVX512F__)
    // The all-lanes maskz form: the plain _mm512_cvtph_ps passes an _mm512_undefined_ps() that GCC 12
    // reports as used uninitialized when this is inlined into some loops.
    for (; k + 16 <= n; k += 16)
      _mm512_storeu_ps(out + k,
                       _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + k))));
#endif
#if defined(__F16C__)
    for (; k + 8 <= n; k += 8)
      _mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + k))));
#endif
    for (; k < n; ++k) out[k] = load(p, i + k);
  }
  static void store_block(void* p, std::int64_t i, std::int64_t n, const float* __restrict in) {
    [[maybe_unused]] auto* h = static_cast<std::uint16_t*>(p) + i;
    std::int64_t k = 0;
#if defined(__AVX512F__)
    for (; k + 16 <= n; k += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + k),
                          _mm512_cvtps_ph(_mm512_loadu_ps(in + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#if defined(__F16C__)
    for (; k + 8 <= n; k += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(h + k),
                       _mm256_cvtps_ph(_mm256_loadu_ps(in + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; k < n; ++k) store(p, i + k, in[k]);
  }
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
template <typename Body>
void parallel_range(std::int64_t n, Body&& body) {
  constexpr std::int64_t kParallelMin = 1 << 16;
  const int threads = active_threads();
  if (n < kParallelMin || omp_in_parallel() || threads == 1) return body(std::int64_t{0}, n);
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    body(n * t / nt, n * (t + 1) / nt);
  }
}

// Calls f(Codec{}) for the floating-point dtype t.
template <typename F>
void with_codec(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: return f(F32{});
    case DType::f16: return f(F16{});
    case DType::bf16: return f(BF16{});
    default: ZERO_CHECK(false, "{}: {} is not a floating-point dtype", what, dtype_name(t));
  }
}

// The loops, on pointers passed by value: inside a lambda that captures them by reference GCC cannot
// keep them in registers across the stores (a store might alias the closure) and gives up vectorising.
//
// A loop that touches f16 runs over blocks of kBlock elements instead: the f16 operands are converted
// into f32 buffers on the stack (in L1), the f32 loop body runs on the buffers, and the result block is
// converted back. Each element sees the same conversions and arithmetic as in the element loop.
template <typename C>
inline constexpr bool kBlocked = std::is_same_v<C, F16>;
constexpr std::int64_t kBlock = 512;

// buf[0:m] = elements [b, b + m) of p as f32; and back, rounded to the codec's dtype.
template <typename C>
void load_f32(float* __restrict buf, const void* p, std::int64_t b, std::int64_t m) {
  if constexpr (kBlocked<C>) {
    C::load_block(p, b, m, buf);
  } else {
    for (std::int64_t k = 0; k < m; ++k) buf[k] = C::load(p, b + k);
  }
}
template <typename C>
void store_f32(void* p, std::int64_t b, std::int64_t m, const float* __restrict buf) {
  if constexpr (kBlocked<C>) {
    C::store_block(p, b, m, buf);
  } else {
    for (std::int64_t k = 0; k < m; ++k) C::store(p, b + k, buf[k]);
  }
}

template <typename D, typename S>
void convert_range(void* __restrict dst, const void* __restrict src, std::int64_t begin, std::int64_t end) {
  if constexpr (kBlocked<D> || kBlocked<S>) {
    alignas(64) float buf[kBlock];
    for (std::int64_t b = begin; b < end; b += kBlock) {
      const std::int64_t m = std::min(kBlock, end - b);
      load_f32<S>(buf, src, b, m);
      store_f32<D>(dst, b, m, buf);
    }
  } else {
    for (std::int64_t i = begin; i < end; ++i) D::store(dst, i, S::load(src, i));
  }
}
template <typename D, typename S>
void accumulate_range(void* dst, const void* src, std::int64_t begin, std::int64_t end) {
  if constexpr (kBlocked<D> || kBlocked<S>) {
    alignas(64) float acc[kBlock], x[kBlock];
    for (std::int64_t b = begin; b < end; b += kBlock) {
      const std::int64_t m = std::min(kBlock, end - b);
      load_f32<D>(acc, dst, b, m);
      load_f32<S>(x, src, b, m);
      for (std::int64_t k = 0; k < m; ++k) acc[k] += x[k];
      store_f32<D>(dst, b, m, acc);
    }
  } else {
    for (std::int64_t i = begin; i < end; ++i) D::store(dst, i, D::load(dst, i) + S::load(src, i));
  }
}

template <typename D>
void scale_range(void* out, const void* x, float factor, std::int64_t begin, std::int64_t end) {
  if constexpr (kBlocked<D>) {
    alignas(64) float buf[kBlock];
    for (std::int64_t b = begin; b < end; b += kBlock) {
      const std::int64_t m = std::min(kBlock, end - b);
      load_f32<D>(buf, x, b, m);
      for (std::int64_t k = 0; k < m; ++k) buf[k] *= factor;
      store_f32<D>(out, b, m, buf);
    }
  } else {
    for (std::int64_t i = begin; i < end; ++i) D::store(out, i, D::load(x, i) * factor);
  }
}

// dst[0:n] = src[0:n] converted from src_dtype to dst_dtype (f32, f16 or bf16). dst and src must not
// overlap unless they are the same buffer of the same dtype.
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) {
  if (dst_dtype == src_dtype && is_floating(dst_dtype)) {
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

bool is_dense(const StridedView& v) { return is_contiguous(v.shape, v.strides); }
char* first(const StridedView& v) {
  return static_cast<char*>(v.base) + v.offset * static_cast<std::int64_t>(dtype_size(v.dtype));
}

// Sum of squares of x[n] in double: fixed chunks of kChunk elements, one partial each summed in index
// order, the partials added in chunk order, so the result is the same for any thread count.
//
// Each partial is a chain of dependent double additions (4 cycles each: ~1 ms on 0.81 M elements).
// sum_chunks runs up to kLanes chunks side by side, one chain per chunk, so the additions of different
// chunks overlap; each chunk's own sum keeps its order, so every partial has the same bits.
constexpr std::int64_t kSquaresChunk = 1 << 16;
constexpr int kSquaresLanes = 8;

// partial[c] for the Lanes chunks from c0 (all of length kSquaresChunk except perhaps the last: `last`).
template <typename S, int Lanes>
void sum_chunks(const void* x, std::int64_t c0, std::int64_t last, double* partial) {
  double s[Lanes] = {};
  const std::int64_t base = c0 * kSquaresChunk;
  if constexpr (kBlocked<S>) {
    // f16 through f32 blocks: GCC folds an f16 -> f32 -> f64 load into one f16 -> f64 conversion, which
    // without AVX512-FP16 is a libgcc call (__extendhfdf2) per element, ~10% of an fp16 step. Both are
    // exact, so each lane's sum sees the same values in the same order.
    static_assert(kSquaresChunk % kBlock == 0);
    alignas(64) float buf[Lanes * kBlock];  // lane l's block at buf + l * kBlock
    for (std::int64_t b = 0; b < kSquaresChunk; b += kBlock) {
      const std::int64_t in_last = std::clamp<std::int64_t>(last - b, 0, kBlock);  // the last lane's share
      for (int l = 0; l < Lanes; ++l)
        load_f32<S>(buf + l * kBlock, x, base + l * kSquaresChunk + b, l + 1 < Lanes ? kBlock : in_last);
      for (std::int64_t k = 0; k < in_last; ++k)
        for (int l = 0; l < Lanes; ++l) s[l] += static_cast<double>(buf[l * kBlock + k]) * buf[l * kBlock + k];
      for (std::int64_t k = in_last; k < kBlock; ++k)
        for (int l = 0; l + 1 < Lanes; ++l) s[l] += static_cast<double>(buf[l * kBlock + k]) * buf[l * kBlock + k];
    }
    for (int l = 0; l < Lanes; ++l) partial[l] = s[l];
    return;
  }
  std::int64_t i = 0;
  for (; i < last; ++i)
    for (int l = 0; l < Lanes; ++l) {
      const double v = S::load(x, base + l * kSquaresChunk + i);
      s[l] += v * v;
    }
  for (; i < kSquaresChunk; ++i)  // the full chunks go on past the short last one
    for (int l = 0; l + 1 < Lanes; ++l) {
      const double v = S::load(x, base + l * kSquaresChunk + i);
      s[l] += v * v;
    }
  for (int l = 0; l < Lanes; ++l) partial[l] = s[l];
}

template <typename S, int Lanes = kSquaresLanes>
void sum_chunks_n(const void* x, std::int64_t c0, int lanes, std::int64_t last, double* partial) {
  if constexpr (Lanes > 1) {
    if (lanes < Lanes) return sum_chunks_n<S, Lanes - 1>(x, c0, lanes, last, partial);
  }
  sum_chunks<S, Lanes>(x, c0, last, partial);
}

template <typename S>
double sum_squares_of(const void* x, std::int64_t n) {
  const std::int64_t chunks = (n + kSquaresChunk - 1) / kSquaresChunk;
  const std::int64_t groups = (chunks + kSquaresLanes - 1) / kSquaresLanes;
  std::vector<double> partial(static_cast<std::size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) num_threads(active_threads()) if (groups > 1)
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t c0 = g * kSquaresLanes, c1 = std::min(chunks, c0 + kSquaresLanes);
    const std::int64_t last = std::min(n, c1 * kSquaresChunk) - (c1 - 1) * kSquaresChunk;
    sum_chunks_n<S>(x, c0, static_cast<int>(c1 - c0), last, partial.data() + c0);
  }
  return std::accumulate(partial.begin(), partial.end(), 0.0);
}

template <typename S>
bool any_non_finite(const void* x, std::int64_t n) {
  int bad = 0;
  // No early exit: a branch-free scan vectorises, and overflow is the rare case.
#pragma omp simd reduction(| : bad)
  for (std::int64_t i = 0; i < n; ++i) bad |= !std::isfinite(S::load(x, i));
  return bad != 0;
}

// Two loops, with and without the rounded model copy, on restrict pointers and with the scalars in
// locals: a test of model_out inside the loop, or a store through model_out that might alias master
// or the scalars, kept GCC from vectorising the 16-bit variants (6x slower than f32 on 0.81 M
// parameters). The arithmetic per element is adamw_step's, unchanged.
template <typename G, typename M>
void adamw_range(float* __restrict master, const void* __restrict grad, float grad_factor, float* __restrict exp_avg,
                 float* __restrict exp_avg_sq, void* __restrict model_out, std::int64_t begin, std::int64_t end,
                 const AdamWScalars& scalars) {
  const AdamWScalars s = scalars;
  if constexpr (kBlocked<G> || kBlocked<M>) {
    alignas(64) float g[kBlock], out[kBlock];
    for (std::int64_t b = begin; b < end; b += kBlock) {
      const std::int64_t m = std::min(kBlock, end - b);
      load_f32<G>(g, grad, b, m);
      float* __restrict pb = master + b;
      float* __restrict mb = exp_avg + b;
      float* __restrict vb = exp_avg_sq + b;
      for (std::int64_t k = 0; k < m; ++k) out[k] = adamw_step(pb[k], mb[k], vb[k], g[k] * grad_factor, s);
      if (model_out != nullptr) store_f32<M>(model_out, b, m, out);
    }
    return;
  }
  if (model_out == nullptr) {
    for (std::int64_t i = begin; i < end; ++i)
      adamw_step(master[i], exp_avg[i], exp_avg_sq[i], G::load(grad, i) * grad_factor, s);
    return;
  }
  for (std::int64_t i = begin; i < end; ++i)
    M::store(model_out, i, adamw_step(master[i], exp_avg[i], exp_avg_sq[i], G::load(grad, i) * grad_factor, s));
}

}  // namespace

void CpuBackend::fill(void* dst, DType dtype, float value, std::int64_t n) {
  switch (dtype) {
    case DType::f32: std::fill_n(static_cast<float*>(dst), n, value); return;
    case DType::f16:
    case DType::bf16: {
      std::uint16_t bits;  // the value rounded once, then replicated
      store_from_float(&bits, 0, dtype, value);
      std::fill_n(static_cast<std::uint16_t*>(dst), n, bits);
      return;
    }
    case DType::i32: std::fill_n(static_cast<std::int32_t*>(dst), n, static_cast<std::int32_t>(value)); return;
    case DType::i64: std::fill_n(static_cast<std::int64_t*>(dst), n, static_cast<std::int64_t>(value)); return;
  }
}

void CpuBackend::copy(const StridedView& dst, const StridedView& src) {
  const std::int64_t n = shape_numel(dst.shape);
  if (src.dtype == dst.dtype && is_dense(src) && is_dense(dst)) {
    std::memmove(first(dst), first(src), static_cast<std::size_t>(n) * dtype_size(dst.dtype));
    return;
  }
  if (is_dense(src) && is_dense(dst) && is_floating(src.dtype) && is_floating(dst.dtype) && src.base != dst.base) {
    // Vectorised, same bits as the element loop below (tests/unit/test_tensor.cpp checks).
    convert(first(dst), dst.dtype, first(src), src.dtype, n);
    return;
  }
  std::vector<std::int64_t> src_offsets;
  src_offsets.reserve(static_cast<std::size_t>(n));
  for_each_offset(src.shape, src.strides, src.offset, [&](std::int64_t off) { src_offsets.push_back(off); });
  std::int64_t k = 0;
  for_each_offset(dst.shape, dst.strides, dst.offset, [&](std::int64_t off) {
    store_from_float(dst.base, off, dst.dtype, load_as_float(src.base, src_offsets[k++], src.dtype));
  });
}

void CpuBackend::accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) {
  with_codec(dst_dtype, "accumulate", [&](auto d) {
    with_codec(src_dtype, "accumulate", [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      parallel_range(n, [&](std::int64_t begin, std::int64_t end) { accumulate_range<D, S>(dst, src, begin, end); });
    });
  });
}

void CpuBackend::scale(void* out, const void* x, DType dtype, std::int64_t n, float s) {
  with_codec(dtype, "scale", [&](auto d) {
    using D = decltype(d);
    parallel_range(n, [&](std::int64_t begin, std::int64_t end) { scale_range<D>(out, x, s, begin, end); });
  });
}

double CpuBackend::sum_squares(const void* x, DType dtype, std::int64_t n) {
  double result = 0.0;
  with_codec(dtype, "sum_squares", [&](auto c) { result = sum_squares_of<decltype(c)>(x, n); });
  return result;
}

bool CpuBackend::has_inf_or_nan(const void* x, DType dtype, std::int64_t n) {
  bool result = false;
  with_codec(dtype, "has_inf_or_nan", [&](auto c) { result = any_non_finite<decltype(c)>(x, n); });
  return result;
}

void CpuBackend::adamw_update(float* master, const void* grad, DType grad_dtype, float grad_factor, float* exp_avg,
                              float* exp_avg_sq, void* model_out, DType model_dtype, std::int64_t n,
                              const AdamWScalars& s) {
  // Memory-bound (five to seven streams): threads help on large ranges and cost more than they save on
  // small ones (parallel_range's threshold). Elements are independent, so any split gives the same bits.
  with_codec(grad_dtype, "adamw_update", [&](auto g) {
    with_codec(model_out != nullptr ? model_dtype : DType::f32, "adamw_update", [&](auto m) {
      using G = decltype(g);
      using M = decltype(m);
      parallel_range(n, [&](std::int64_t begin, std::int64_t end) {
        adamw_range<G, M>(master, grad, grad_factor, exp_avg, exp_avg_sq, model_out, begin, end, s);
      });
    });
  });
}

}  // namespace zero::cpu
