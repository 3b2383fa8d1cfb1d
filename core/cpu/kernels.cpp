// The CPU implementations of GEMM and the neural-network kernels of core/kernels.def (CpuBackend,
// core/cpu/backend.h), and the CPU thread count (core/cpu/kernels.h).
#include "core/cpu/kernels.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/cpu/backend.h"

namespace zero::cpu {

namespace {
// Below this many elements of work a kernel stays on the calling thread: waking the team costs more
// than it saves (a few microseconds against ~10 µs of work at 32 K floats).
constexpr std::int64_t kParallelMinWork = 1 << 15;

std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

// Short copies (a row of a tile: 32-256 floats) as an inline vector loop: std::copy_n becomes a call
// to memmove, whose fixed cost dominates at these lengths (the profile showed it at ~4% of a step).
inline void copy_floats(float* dst, const float* src, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i];
}
// The same for short fills (std::fill of zeros becomes a memset call).
inline void fill_floats(float* dst, std::int64_t n, float value) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dst[i] = value;
}

// Eigen vectorises exp, max and sum, but on a buffer that is not aligned to a packet it peels scalar
// elements (one libm expf each) until it is. Rows of odd length (V = 65) are therefore staged in an
// aligned buffer padded to whole vectors of kRowVector floats.
constexpr std::int64_t kRowVector = 16;  // floats per AVX-512 register
using AlignedBuffer = std::vector<float, Eigen::aligned_allocator<float>>;
using AlignedRow = Eigen::Map<Eigen::ArrayXf, Eigen::AlignedMax>;

// buf grown to at least n floats. It never shrinks: a resize down and back up would zero the
// regrown part each time, and scratch reused by products of different sizes would pay a memset for it.
float* at_least(AlignedBuffer& buf, std::int64_t n) {
  if (static_cast<std::int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// A per-thread aligned scratch row of at least n floats, kept between calls.
float* scratch_row(std::int64_t n) {
  thread_local AlignedBuffer buf;
  return at_least(buf, n);
}

// y[n] = softmax(x[n]). Masked-out padding is -inf, whose exp is 0.
void softmax_row(float* y, const float* x, std::int64_t n) {
  const std::int64_t np = round_up(n, kRowVector);
  float* buf = scratch_row(np);
  copy_floats(buf, x, n);
  fill_floats(buf + n, np - n, -INFINITY);
  AlignedRow r(buf, np);
  r = (r - r.maxCoeff()).exp();
  const float inv = 1.0f / r.sum();
  for (std::int64_t i = 0; i < n; ++i) y[i] = buf[i] * inv;
}

// ---- the register tile: the inner loop of every matrix product here ----
//
// One call computes a kTileRows × kTileCols block of C. Each row of the block is kTileVectors whole
// vector registers of accumulators; each step of k broadcasts one A value per row and does
// kTileRows · kTileVectors fused multiply-adds against one row of B. The vectors are GCC/Clang vector
// types (no intrinsics, the same code for SSE2, AVX2 and AVX-512): left to plain loops, GCC 12
// vectorised this for AVX-512 but kept scalar FMAs for AVX2 (4 GFLOP/s instead of ~60 on one core).
// Every element of C is still one FMA chain over k in order, so the results do not depend on the ISA.
// kTileRows divides the attention kernels' padding (kPad); the GEMM, which has no such constraint,
// uses kGemmTileRows: with AVX2's 16 ymm registers, 12 accumulators hide the FMA latency that 8 do not
// (gemm_peak on an AVX2 EPYC: ~60 GFLOP/s against ~40 with 4 rows).
#if defined(__AVX512F__)
constexpr std::int64_t kVectorFloats = 16, kTileRows = 8, kGemmTileRows = 8;  // 16 zmm accumulators (of 32)
#elif defined(__AVX__)
constexpr std::int64_t kVectorFloats = 8, kTileRows = 4, kGemmTileRows = 6;   // 8 or 12 ymm accumulators (of 16)
#else
constexpr std::int64_t kVectorFloats = 4, kTileRows = 4, kGemmTileRows = 4;   // 8 xmm accumulators (of 16): SSE2
#endif
constexpr std::int64_t kTileVectors = 2, kTileCols = kTileVectors * kVectorFloats;
using FloatVector = float __attribute__((vector_size(kVectorFloats * sizeof(float))));

inline FloatVector load_vector(const float* p) {
  FloatVector v;
  __builtin_memcpy(&v, p, sizeof v);  // unaligned load
  return v;
}
inline void store_vector(float* p, FloatVector v) { __builtin_memcpy(p, &v, sizeof v); }

// c[Rows, kTileCols] = alpha * sum over k in [k0, k1) of A(r, k) * b[k, 0:kTileCols]
//                           + beta * c (c not read when beta == 0) + bias[0:kTileCols] (if not null).
// A(r, k) = a[r * a_rs + k * a_cs]: a row-major A has a_rs = lda, a_cs = 1, a transposed one the
// reverse. Rows of b are ldb apart and have kTileCols readable columns.
template <std::int64_t Rows>
inline void tile_product(const float* a, std::int64_t a_rs, std::int64_t a_cs, const float* b, std::int64_t ldb,
                         std::int64_t k0, std::int64_t k1, float alpha, float beta, const float* bias, float* c,
                         std::int64_t ldc) {
  FloatVector acc[Rows][kTileVectors] = {};
  for (std::int64_t k = k0; k < k1; ++k) {
    const float* bk = b + k * ldb;
    FloatVector bv[kTileVectors];
    for (std::int64_t v = 0; v < kTileVectors; ++v) bv[v] = load_vector(bk + v * kVectorFloats);
    for (std::int64_t r = 0; r < Rows; ++r) {
      const float ar = a[r * a_rs + k * a_cs];
      for (std::int64_t v = 0; v < kTileVectors; ++v) acc[r][v] += ar * bv[v];
    }
  }
  for (std::int64_t r = 0; r < Rows; ++r) {
    float* cr = c + r * ldc;
    for (std::int64_t v = 0; v < kTileVectors; ++v) {
      FloatVector out = alpha * acc[r][v];
      if (beta != 0.0f) out += beta * load_vector(cr + v * kVectorFloats);
      if (bias != nullptr) out += load_vector(bias + v * kVectorFloats);
      store_vector(cr + v * kVectorFloats, out);
    }
  }
}

// ---- GEMM on the register tile (Goto / BLIS blocking, reduced to what these shapes need) ----
//
// C is computed kc rows of B at a time (kc = kGemmKc) and nc columns at a time (nc = kGemmNc): that
// block of op(B) is packed into column panels [kc, kTileCols] (one panel, 32 KB, stays in L1 while a
// tile runs over it; the block, 512 KB, stays in L2), zero-padded past N, so every tile reads whole
// registers; a transposed B is transposed by this packing, never by a separate copy. A is read in
// place when it is row-major (kGemmTileRows streams along k; the next row tile is prefetched while one
// runs), and packed into a [kc, kGemmTileRows] panel only for a last tile of fewer than kGemmTileRows
// rows. A transposed A (its columns are lda apart: a new cache line for every k) is packed once per
// depth block, all of this thread's rows at once, into one such panel per row tile.
// Each element of C is summed over k in order, whatever the thread count: results are reproducible.
constexpr std::int64_t kGemmKc = 256;
constexpr std::int64_t kGemmNc = 512;
static_assert(kGemmNc % kTileCols == 0);
// A product smaller than this (in multiply-adds) runs on one thread.
constexpr double kGemmParallelMinWork = 1 << 19;
// Products from this size on report how their threads kept pace (Note [Threads on a busy machine]):
// large enough (~50 µs on one core) that waking the team does not skew a thread's rate.
constexpr double kGemmMeasuredWork = 1 << 22;
constexpr int kMaxTeam = 256;  // teams above this run unmeasured

struct GemmScratch {
  AlignedBuffer b;  // packed block of op(B): [nc / kTileCols][kc][kTileCols]
  AlignedBuffer a;  // packed op(A): [kc][kGemmTileRows], or [row tiles][kc][kGemmTileRows] (+16) if transposed
  AlignedBuffer c;  // an edge tile of C: [kGemmTileRows][kTileCols]
  static GemmScratch& for_this_thread() {
    thread_local GemmScratch w;
    return w;
  }
};

// Brings a row tile of a row-major A, [rows, kc] with rows lda floats apart, into L2. gemm_rows asks
// for the next row tile before it starts the current one: an operand another op wrote a while ago has
// left the caches, and the tile loop's short runs along k (a cache line per row per 16 steps of k) end
// before the hardware prefetcher has caught up with them.
inline void prefetch_tile(const float* a, std::int64_t lda, std::int64_t rows, std::int64_t kc) {
  constexpr std::int64_t kLineFloats = 16;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* p = a + r * lda;
    for (std::int64_t k = 0; k < kc; k += kLineFloats) __builtin_prefetch(p + k, 0, 2);
    __builtin_prefetch(p + kc - 1, 0, 2);  // the last line, when the row does not start on one
  }
}

// op(A)[0:rows, 0:kc] of a transposed A (op(A)(i, k) = a[k * lda + i]) into panels
// [ceil(rows / kGemmTileRows)][kc][kGemmTileRows], zero-padded past rows. It reads A's kc rows in
// order, runs of `rows` floats, and prefetches the row 4 ahead; packing tile by tile instead read a
// new cache line lda floats on for each k of each tile, which stalls on an operand out of cache.
// Panels lie kc * kGemmTileRows floats apart plus one cache line (16 floats), so that the panels of
// one thread do not all start a power of two apart (8 KiB at kc = 256) and compete for the same L1 sets.
std::int64_t transposed_a_panel_stride(std::int64_t kc) { return kc * kGemmTileRows + 16; }
void pack_transposed_a(float* dst, const float* a, std::int64_t lda, std::int64_t rows, std::int64_t kc) {
  const std::int64_t panels = (rows + kGemmTileRows - 1) / kGemmTileRows, ps = transposed_a_panel_stride(kc);
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* src = a + k * lda;
    if (k + 4 < kc)
      for (std::int64_t i = 0; i < rows; i += 16) __builtin_prefetch(src + 4 * lda + i, 0, 3);
    for (std::int64_t p = 0; p < panels; ++p) {
      float* d = dst + p * ps + k * kGemmTileRows;
      const std::int64_t n = std::min(kGemmTileRows, rows - p * kGemmTileRows);
      if (n == kGemmTileRows) {
        __builtin_memcpy(d, src + p * kGemmTileRows, sizeof(float) * kGemmTileRows);
        continue;
      }
      copy_floats(d, src + p * kGemmTileRows, n);
      fill_floats(d + n, kGemmTileRows - n, 0.0f);
    }
  }
}

// Rows [m0, m1) of C = alpha * op(A) op(B) + beta * C + bias (see gemm in kernels.h), on this thread.
void gemm_rows(bool trans_a, bool trans_b, std::int64_t m0, std::int64_t m1, std::int64_t N, std::int64_t K,
               float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
               std::int64_t ldc, const float* bias) {
  GemmScratch& w = GemmScratch::for_this_thread();
  float* ap = at_least(w.a, trans_a ? transposed_a_panel_stride(kGemmKc) * round_up(m1 - m0, kGemmTileRows) / kGemmTileRows
                                   : kGemmKc * kGemmTileRows);
  float* ct = at_least(w.c, kGemmTileRows * kTileCols);
  alignas(64) float bias_edge[kTileCols];
  // K == 0 still runs one (empty) depth block, which applies beta and the bias.
  for (std::int64_t k0 = 0; k0 < std::max<std::int64_t>(K, 1); k0 += kGemmKc) {
    const std::int64_t kc = std::min(kGemmKc, K - k0);
    // Later depth blocks add onto the partial sums the first one stored.
    const float beta_k = k0 == 0 ? beta : 1.0f;
    const float* bias_k = k0 == 0 ? bias : nullptr;
    if (trans_a) pack_transposed_a(ap, A + k0 * lda + m0, lda, m1 - m0, kc);
    for (std::int64_t n0 = 0; n0 < N; n0 += kGemmNc) {
      const std::int64_t nc = std::min(kGemmNc, N - n0), ncp = round_up(nc, kTileCols);
      float* bp = at_least(w.b, std::max<std::int64_t>(kc, 1) * ncp);
      // Pack op(B)[k0:k0+kc, n0:n0+nc] into panels; op(B)(k, n) is B[k*ldb + n], or B[n*ldb + k] if trans_b.
      for (std::int64_t j0 = 0; j0 < ncp; j0 += kTileCols) {
        float* panel = bp + j0 * kc;
        const std::int64_t cols = std::clamp<std::int64_t>(nc - j0, 0, kTileCols);
        if (cols < kTileCols) std::fill(panel, panel + kc * kTileCols, 0.0f);
        if (!trans_b) {
          for (std::int64_t k = 0; k < kc; ++k) copy_floats(panel + k * kTileCols, B + (k0 + k) * ldb + n0 + j0, cols);
        } else {
          for (std::int64_t j = 0; j < cols; ++j) {
            const float* src = B + (n0 + j0 + j) * ldb + k0;  // contiguous along k
            for (std::int64_t k = 0; k < kc; ++k) panel[k * kTileCols + j] = src[k];
          }
        }
      }
      for (std::int64_t i0 = m0; i0 < m1; i0 += kGemmTileRows) {
        const std::int64_t rows = std::min(kGemmTileRows, m1 - i0);
        // op(A)[i0:i0+kGemmTileRows, k0:k0+kc] as (pointer, row stride, column stride).
        const float* a = A + i0 * lda + k0;
        std::int64_t a_rs = lda, a_cs = 1;
        if (trans_a) {
          a = ap + (i0 - m0) / kGemmTileRows * transposed_a_panel_stride(kc);  // its panel
          a_rs = 1;
          a_cs = kGemmTileRows;
        } else if (rows < kGemmTileRows) {
          std::fill(ap, ap + kc * kGemmTileRows, 0.0f);
          for (std::int64_t k = 0; k < kc; ++k)
            for (std::int64_t r = 0; r < rows; ++r) ap[k * kGemmTileRows + r] = A[(i0 + r) * lda + k0 + k];
          a = ap;
          a_rs = 1;
          a_cs = kGemmTileRows;
        }
        const std::int64_t next = i0 + kGemmTileRows;
        if (!trans_a && next < m1) prefetch_tile(A + next * lda + k0, lda, std::min(kGemmTileRows, m1 - next), kc);
        for (std::int64_t j0 = 0; j0 < nc; j0 += kTileCols) {
          const float* panel = bp + j0 * kc;
          float* c = C + i0 * ldc + n0 + j0;
          const float* bj = bias_k != nullptr ? bias_k + n0 + j0 : nullptr;
          const std::int64_t cols = std::min(kTileCols, nc - j0);
          if (rows == kGemmTileRows && cols == kTileCols) {
            tile_product<kGemmTileRows>(a, a_rs, a_cs, panel, kTileCols, 0, kc, alpha, beta_k, bj, c, ldc);
            continue;
          }
          // An edge tile: run the whole tile on a staging copy and write back the part inside C.
          for (std::int64_t r = 0; r < rows; ++r) copy_floats(ct + r * kTileCols, c + r * ldc, beta_k != 0.0f ? cols : 0);
          if (bj != nullptr) {
            std::fill(bias_edge, bias_edge + kTileCols, 0.0f);
            copy_floats(bias_edge, bj, cols);
            bj = bias_edge;
          }
          tile_product<kGemmTileRows>(a, a_rs, a_cs, panel, kTileCols, 0, kc, alpha, beta_k, bj, ct, kTileCols);
          for (std::int64_t r = 0; r < rows; ++r) copy_floats(c + r * ldc, ct + r * kTileCols, cols);
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                      const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                      std::int64_t ldc, const float* bias) {
  if (M == 0 || N == 0) return;
  // Threads take contiguous runs of row tiles: no synchronisation inside, each packs its own copy of
  // op(B) (K·N floats, small beside its share of the 2·M·N·K flops).
  const std::int64_t tiles = (M + kGemmTileRows - 1) / kGemmTileRows;
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const bool measured = work >= kGemmMeasuredWork && !omp_in_parallel();
  const int team = measured ? detail::gemm_team() : active_threads();
  const int threads = omp_in_parallel()
                          ? 1
                          : static_cast<int>(std::min<double>({static_cast<double>(team), static_cast<double>(tiles),
                                                               std::max(1.0, work / kGemmParallelMinWork)}));
  if (threads <= 1) {
    gemm_rows(trans_a, trans_b, 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    return;
  }
  // Each thread's rows and finishing time feed the thread policy (Note [Threads on a busy machine]).
  using Clock = std::chrono::steady_clock;
  std::array<Clock::time_point, kMaxTeam> finish{};
  std::array<long long, kMaxTeam> rows{};
  const bool report = measured && threads == team && team <= kMaxTeam;
  const Clock::time_point start = Clock::now();
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const std::int64_t m0 = std::min(M, tiles * t / nt * kGemmTileRows), m1 = std::min(M, tiles * (t + 1) / nt * kGemmTileRows);
    if (m0 < m1) gemm_rows(trans_a, trans_b, m0, m1, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    if (report && t < kMaxTeam) {
      rows[t] = m1 - m0;
      finish[t] = Clock::now();
    }
  }
  if (report) detail::note_gemm_team(team, start, finish.data(), rows.data());
}

void CpuBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                   const float* bias, std::int64_t N, std::int64_t C, float eps) {
  // inp, out: [N,C]; weight, bias: [C]; mean, rstd: [N]. Rows are independent: threads split them.
  // Two passes over the (cached) row keep the variance accurate; `omp simd reduction` lets the
  // compiler vectorise the float sums (it may not reorder them otherwise).
#pragma omp parallel for schedule(static) num_threads(active_threads()) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t i = 0; i < C; ++i) sum += x[i];
    const float m = sum / static_cast<float>(C);
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (std::int64_t i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
    const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
    float* y = out + n * C;
#pragma omp simd
    for (std::int64_t i = 0; i < C; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                    const float* weight, const float* mean, const float* rstd, std::int64_t N,
                                    std::int64_t C) {
  // dinp, dout, inp: [N,C]; dweight, dbias: [C] (accumulated into); weight: [C]; mean, rstd: [N].
  // dweight and dbias are sums over rows. Rows are cut into fixed blocks of kRowsPerBlock, each block
  // sums into its own partial [2,C], and the partials are added in block order at the end: the result
  // is the same for any number of threads.
  constexpr std::int64_t kRowsPerBlock = 32;
  const std::int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<float> partial(static_cast<std::size_t>(blocks * 2 * C), 0.0f);  // [blocks][dweight | dbias]
#pragma omp parallel for schedule(static) num_threads(active_threads()) if (N * C >= kParallelMinWork)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    float* pw = partial.data() + blk * 2 * C;
    float* pb = pw + C;
    for (std::int64_t n = blk * kRowsPerBlock; n < std::min(N, (blk + 1) * kRowsPerBlock); ++n) {
      const float* dy = dout + n * C;
      const float* x = inp + n * C;
      const float m = mean[n], s = rstd[n];
      // dnorm = weight * dy; dx = (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd.
      float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma omp simd reduction(+ : dnorm_sum, dnorm_norm_sum)
      for (std::int64_t i = 0; i < C; ++i) {
        const float norm = (x[i] - m) * s;
        const float dnorm = weight[i] * dy[i];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
        pb[i] += dy[i];
        pw[i] += norm * dy[i];
      }
      const float dnorm_mean = dnorm_sum / static_cast<float>(C);
      const float dnorm_norm_mean = dnorm_norm_sum / static_cast<float>(C);
      float* dx = dinp + n * C;
#pragma omp simd
      for (std::int64_t i = 0; i < C; ++i) {
        const float norm = (x[i] - m) * s;
        dx[i] = (weight[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  }
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const float* pw = partial.data() + blk * 2 * C;
    const float* pb = pw + C;
#pragma omp simd
    for (std::int64_t i = 0; i < C; ++i) {
      dweight[i] += pw[i];
      dbias[i] += pb[i];
    }
  }
}

// GELU works in chunks so Eigen's vectorised tanh (a rational approximation, accurate to float
// rounding) replaces one libm call per element. It is compute-bound (~1 cycle per element, mostly the
// division inside tanh); the sigmoid form x / (1 + exp(-2u)) measured no faster.
namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;
constexpr std::int64_t kGeluChunk = 4096;
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;
}  // namespace

void CpuBackend::gelu_forward(float* out, const float* inp, std::int64_t n) {
  // inp, out: [n].
#pragma omp parallel for schedule(static) num_threads(active_threads()) if (n >= kParallelMinWork)
  for (std::int64_t c = 0; c < n; c += kGeluChunk) {
    const std::int64_t len = std::min(kGeluChunk, n - c);
    ConstArrayMap x(inp + c, len);
    ArrayMap y(out + c, len);
    y = 0.5f * x * (1.0f + (kGeluScale * (x + kGeluCubic * x.cube())).tanh());
  }
}

void CpuBackend::gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  // inp, dout, dinp: [n].
#pragma omp parallel for schedule(static) num_threads(active_threads()) if (n >= kParallelMinWork)
  for (std::int64_t c = 0; c < n; c += kGeluChunk) {
    const std::int64_t len = std::min(kGeluChunk, n - c);
    ConstArrayMap x(inp + c, len), dy(dout + c, len);
    ArrayMap dx(dinp + c, len);
    alignas(64) float tbuf[kGeluChunk];  // tanh(u), used three times below (on the stack: no malloc)
    ArrayMap t(tbuf, len);
    t = (kGeluScale * (x + kGeluCubic * x.cube())).tanh();
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x),  u' = sqrt(2/pi)(1 + 3·0.044715 x^2)
    dx = dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t.square()) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x.square()));
  }
}

void CpuBackend::softmax_forward(float* out, const float* inp, std::int64_t N, std::int64_t C) {
  // inp, out: [N,C].
#pragma omp parallel for schedule(static) num_threads(active_threads()) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) softmax_row(out + n * C, inp + n * C, C);
}

void CpuBackend::softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, std::int64_t C) {
  // out, dout, dinp: [N,C].
#pragma omp parallel for schedule(static) num_threads(active_threads()) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const float* y = out + n * C;
    const float* dy = dout + n * C;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t i = 0; i < C; ++i) dot += y[i] * dy[i];
    float* dx = dinp + n * C;
#pragma omp simd
    for (std::int64_t i = 0; i < C; ++i) dx[i] = y[i] * (dy[i] - dot);
  }
}

// ---- attention: small products on zero-padded per-head buffers ----
//
// One head's products are tiny (T×D by D×T with T = 64, D = 32 in the CPU recipe), where a general
// GEMM spends as long deciding and packing as multiplying. Instead each head's operands are copied
// into zero-padded scratch buffers (rows and columns rounded up to kPad), so every product is a whole
// number of register tiles, and the causal structure bounds each tile's loops: a query tile only meets
// the keys at or before its last row. That skips ~25% of the score work at T = 64 and ~45% at T = 256.
namespace {

constexpr std::int64_t kPad = 32;  // a multiple of both tile sizes and of kRowVector
static_assert(kPad % kTileRows == 0 && kPad % kTileCols == 0 && kPad % kRowVector == 0);

// rows×cols block of src (row stride lds) into dst[rows_p, cols_p] (row stride cols_p), zero-padded;
// with transpose, dst[cols_p, rows_p] receives src^T.
void pack(float* dst, const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, std::int64_t rows_p,
          std::int64_t cols_p, bool transpose) {
  if (!transpose) {
    for (std::int64_t r = 0; r < rows_p; ++r) {
      float* d = dst + r * cols_p;
      if (r < rows) {
        copy_floats(d, src + r * lds, cols);
        fill_floats(d + cols, cols_p - cols, 0.0f);
      } else {
        fill_floats(d, cols_p, 0.0f);
      }
    }
    return;
  }
  // Whole 4×4 blocks through registers: four row loads, eight shuffles, four column stores (the
  // strided element loop below compiles to gathers, ~2.5 cycles an element: ~20% of the forward).
  using Quad = float __attribute__((vector_size(4 * sizeof(float))));
  using QuadIndex = std::int32_t __attribute__((vector_size(4 * sizeof(std::int32_t))));
  const std::int64_t r4 = rows / 4 * 4, c4 = cols / 4 * 4;
  for (std::int64_t c0 = 0; c0 < c4; c0 += 4)
    for (std::int64_t r0 = 0; r0 < r4; r0 += 4) {
      Quad a[4];
      for (int i = 0; i < 4; ++i) __builtin_memcpy(&a[i], src + (r0 + i) * lds + c0, sizeof(Quad));
      const Quad t0 = __builtin_shuffle(a[0], a[1], QuadIndex{0, 4, 1, 5});  // a0[0] a1[0] a0[1] a1[1]
      const Quad t1 = __builtin_shuffle(a[0], a[1], QuadIndex{2, 6, 3, 7});  // a0[2] a1[2] a0[3] a1[3]
      const Quad t2 = __builtin_shuffle(a[2], a[3], QuadIndex{0, 4, 1, 5});
      const Quad t3 = __builtin_shuffle(a[2], a[3], QuadIndex{2, 6, 3, 7});
      const Quad col[4] = {
          __builtin_shuffle(t0, t2, QuadIndex{0, 1, 4, 5}), __builtin_shuffle(t0, t2, QuadIndex{2, 3, 6, 7}),
          __builtin_shuffle(t1, t3, QuadIndex{0, 1, 4, 5}), __builtin_shuffle(t1, t3, QuadIndex{2, 3, 6, 7})};
      for (int j = 0; j < 4; ++j) __builtin_memcpy(dst + (c0 + j) * rows_p + r0, &col[j], sizeof(Quad));
    }
  // The rest column by column: contiguous stores, strided loads (all in L1 at a head's size).
  for (std::int64_t c = 0; c < cols_p; ++c) {
    float* d = dst + c * rows_p;
    if (c < cols) {
#pragma omp simd
      for (std::int64_t r = c < c4 ? r4 : 0; r < rows; ++r) d[r] = src[r * lds + c];
      fill_floats(d + rows, rows_p - rows, 0.0f);
    } else {
      fill_floats(d, rows_p, 0.0f);
    }
  }
}

// Scratch for one head: Tp = T rounded up to kPad, Dp = D likewise. One per thread, kept between calls
// (thread_local) so a training step allocates nothing here after its first.
struct HeadScratch {
  std::int64_t Tp = 0, Dp = 0;
  // q, k, v, dy, res: [Tp,Dp]; kt: [Dp,Tp] (k or v transposed); s, ds: [Tp,Tp]. Aligned for Eigen's
  // packets, so that row maps (rows start at multiples of kPad floats) need no scalar prologue.
  AlignedBuffer q, k, v, kt, dy, res, s, ds;
  static HeadScratch& for_this_thread(std::int64_t T, std::int64_t D) {
    thread_local HeadScratch w;
    w.Tp = round_up(T, kPad);
    w.Dp = round_up(D, kPad);
    for (auto* buf : {&w.q, &w.k, &w.v, &w.dy, &w.res}) buf->resize(w.Tp * w.Dp);
    w.kt.resize(w.Dp * w.Tp);
    w.s.resize(w.Tp * w.Tp);
    w.ds.resize(w.Tp * w.Tp);
    return w;
  }
};

}  // namespace

namespace {
// When T and D are whole numbers of kPad (so the padded sizes Tp, Dp equal T, D) and att is aligned for
// Eigen's packets, a head's operands are read and written where they lie (q, k, v, dy in qkv / dout,
// the scores in att) instead of through the padded copies; only the transposed operand is still
// packed. The tile loops run over Dp columns, so D must equal Dp here: with D = 16 (Dp = 32) they would
// read and write the next head's columns, and past the end of the buffer for the last one. True for
// both recipes here (T 64 / 256, D 32 / 64).
bool attention_in_place(const float* att, std::int64_t T, std::int64_t D) {
  return T % kPad == 0 && D % kPad == 0 && reinterpret_cast<std::uintptr_t>(att) % EIGEN_MAX_ALIGN_BYTES == 0;
}
}  // namespace

void CpuBackend::attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T,
                                   std::int64_t C, std::int64_t H) {
  const std::int64_t D = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool in_place = attention_in_place(att, T, D);
  // Heads are independent: threads split the B·H heads, each with its own scratch.
#pragma omp parallel num_threads(active_threads()) if (B * H > 1 && B * T * C >= kParallelMinWork)
  {
    HeadScratch& w = HeadScratch::for_this_thread(T, D);
    const std::int64_t Tp = w.Tp, Dp = w.Dp;
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < B * H; ++bh) {
      const std::int64_t b = bh / H, h = bh % H;
      const float* q = qkv + b * T * C3 + h * D;  // [T,D], row stride 3C; k and v follow at +C, +2C
      float* o = out + b * T * C + h * D;         // [T,D], row stride C
      float* a = att + bh * T * T;                // [T,T]
      // Operands as (pointer, row stride): in place, or zero-padded copies.
      const float* qa = q;
      const float* vb = q + 2 * C;
      std::int64_t ldq = C3, ldv = C3, lds = T, ldo = C;
      float* sc = a;  // scores, then probabilities
      float* ob = o;  // the output tiles
      if (!in_place) {
        pack(w.q.data(), q, C3, T, D, Tp, Dp, false);
        pack(w.v.data(), q + 2 * C, C3, T, D, Tp, Dp, false);
        qa = w.q.data(), vb = w.v.data(), sc = w.s.data(), ob = w.res.data();
        ldq = ldv = ldo = Dp;
        lds = Tp;
      }
      pack(w.kt.data(), q + C, C3, T, D, Tp, Dp, true);  // k^T [Dp,Tp]
      // s = scale · q k^T, lower triangle: query tile i0 needs keys [0, i0 + kTileRows).
      for (std::int64_t i0 = 0; i0 < Tp; i0 += kTileRows)
        for (std::int64_t j0 = 0; j0 < std::min(i0 + kTileRows, T); j0 += kTileCols)
          tile_product<kTileRows>(qa + i0 * ldq, ldq, 1, w.kt.data() + j0, Tp, 0, D, scale, 0.0f, nullptr, sc + i0 * lds + j0, lds);
      // Row softmax over keys s <= t; the rest of the row (and padding rows) becomes 0. The row is
      // processed over whole vectors (n rounded up to kRowVector, masked keys set to -inf): Eigen's
      // vectorised max / exp / sum then run without scalar tails. Eigen's exp clamps its argument, so
      // exp(-inf) comes out as a denormal (~3e-39), not 0: the masked keys are zeroed afterwards.
      for (std::int64_t t = 0; t < Tp; ++t) {
        float* row = sc + t * lds;
        const std::int64_t n = t < T ? round_up(t + 1, kRowVector) : 0;
        if (n > 0) {
          fill_floats(row + t + 1, n - (t + 1), -INFINITY);
          AlignedRow x(row, n);
          x = (x - x.maxCoeff()).exp();
          x *= 1.0f / x.sum();
          fill_floats(row + t + 1, n - (t + 1), 0.0f);
        }
        fill_floats(row + n, lds - n, 0.0f);
        if (!in_place && t < T) copy_floats(a + t * T, row, T);
      }
      // out = p v: query tile i0 reads values [0, i0 + kTileRows) only (p is 0 above the diagonal).
      for (std::int64_t i0 = 0; i0 < Tp; i0 += kTileRows)
        for (std::int64_t j0 = 0; j0 < Dp; j0 += kTileCols)
          tile_product<kTileRows>(sc + i0 * lds, lds, 1, vb + j0, ldv, 0, std::min(i0 + kTileRows, T), 1.0f, 0.0f, nullptr,
                       ob + i0 * ldo + j0, ldo);
      if (!in_place)
        for (std::int64_t t = 0; t < T; ++t) copy_floats(o + t * C, ob + t * Dp, D);
    }
  }
}

void CpuBackend::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                                    std::int64_t T, std::int64_t C, std::int64_t H) {
  const std::int64_t D = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool in_place = attention_in_place(att, T, D);
#pragma omp parallel num_threads(active_threads()) if (B * H > 1 && B * T * C >= kParallelMinWork)
  {
    HeadScratch& w = HeadScratch::for_this_thread(T, D);
    const std::int64_t Tp = w.Tp, Dp = w.Dp;
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < B * H; ++bh) {
      const std::int64_t b = bh / H, h = bh % H;
      const float* q = qkv + b * T * C3 + h * D;     // k, v at +C, +2C; row stride 3C
      const float* dy = dout + b * T * C + h * D;    // [T,D], row stride C
      float* dq = dqkv + b * T * C3 + h * D;         // dk, dv at +C, +2C
      // Operands as (pointer, row stride): in place, or zero-padded copies; results go straight into
      // dqkv, or through the staging tile res.
      const float* p = att + bh * T * T;
      const float* qa = q;
      const float* ka = q + C;
      const float* dya = dy;
      std::int64_t ldp = T, ldq = C3, ldy = C, ldr = C3;
      if (!in_place) {
        pack(w.s.data(), p, T, T, T, Tp, Tp, false);
        pack(w.q.data(), q, C3, T, D, Tp, Dp, false);
        pack(w.k.data(), q + C, C3, T, D, Tp, Dp, false);
        pack(w.dy.data(), dy, C, T, D, Tp, Dp, false);
        p = w.s.data(), qa = w.q.data(), ka = w.k.data(), dya = w.dy.data();
        ldp = Tp;
        ldq = ldy = ldr = Dp;
      }
      pack(w.kt.data(), q + 2 * C, C3, T, D, Tp, Dp, true);  // v^T [Dp,Tp]
      // Where the tiles of dq / dk / dv go, and how they reach dqkv.
      auto target = [&](float* dst) { return in_place ? dst : w.res.data(); };
      auto finish = [&](float* dst) {
        if (!in_place)
          for (std::int64_t t = 0; t < T; ++t) copy_floats(dst + t * C3, w.res.data() + t * Dp, D);
      };
      // dv = p^T dy: key tile s0 gathers the queries t >= s0 (p[t, s] = 0 for t < s).
      float* r = target(dq + 2 * C);
      for (std::int64_t s0 = 0; s0 < Tp; s0 += kTileRows)
        for (std::int64_t j0 = 0; j0 < Dp; j0 += kTileCols)
          tile_product<kTileRows>(p + s0, 1, ldp, dya + j0, ldy, std::min(s0, T), T, 1.0f, 0.0f, nullptr, r + s0 * ldr + j0, ldr);
      finish(dq + 2 * C);
      // dp = dy v^T, lower triangle only.
      for (std::int64_t i0 = 0; i0 < Tp; i0 += kTileRows)
        for (std::int64_t j0 = 0; j0 < std::min(i0 + kTileRows, T); j0 += kTileCols)
          tile_product<kTileRows>(dya + i0 * ldy, ldy, 1, w.kt.data() + j0, Tp, 0, D, 1.0f, 0.0f, nullptr,
                       w.ds.data() + i0 * Tp + j0, Tp);
      // Softmax backward on the causal rows, folding in the score scale: ds = p (dp - <p, dp>) · scale.
      for (std::int64_t t = 0; t < Tp; ++t) {
        float* dsr = w.ds.data() + t * Tp;
        // Whole vectors again: p is 0 past t, so the extra terms add nothing and ds stays 0 there.
        const std::int64_t n = t < T ? round_up(t + 1, kRowVector) : 0;
        if (n > 0) {
          AlignedRow d(dsr, n);
          Eigen::Map<const Eigen::ArrayXf, Eigen::AlignedMax> pr(p + t * ldp, n);
          const float dot = (pr * d).sum();
          d = pr * (d - dot) * scale;
        }
        fill_floats(dsr + n, Tp - n, 0.0f);
      }
      // dq = ds k: query tile i0 reads keys [0, i0 + kTileRows).
      r = target(dq);
      for (std::int64_t i0 = 0; i0 < Tp; i0 += kTileRows)
        for (std::int64_t j0 = 0; j0 < Dp; j0 += kTileCols)
          tile_product<kTileRows>(w.ds.data() + i0 * Tp, Tp, 1, ka + j0, ldq, 0, std::min(i0 + kTileRows, T), 1.0f, 0.0f,
                       nullptr, r + i0 * ldr + j0, ldr);
      finish(dq);
      // dk = ds^T q: key tile s0 gathers the queries t >= s0.
      r = target(dq + C);
      for (std::int64_t s0 = 0; s0 < Tp; s0 += kTileRows)
        for (std::int64_t j0 = 0; j0 < Dp; j0 += kTileCols)
          tile_product<kTileRows>(w.ds.data() + s0, 1, Tp, qa + j0, ldq, std::min(s0, T), T, 1.0f, 0.0f, nullptr,
                       r + s0 * ldr + j0, ldr);
      finish(dq + C);
    }
  }
}

void CpuBackend::cross_entropy_forward(float* loss, float* probs, const float* logits, const std::int64_t* targets,
                                       std::int64_t N, std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n)
    ZERO_CHECK(targets[n] >= 0 && targets[n] < V, "cross_entropy: target {} at row {} outside [0, {})", targets[n], n, V);
  softmax_forward(probs, logits, N, V);
  double sum = 0.0;
  for (std::int64_t n = 0; n < N; ++n) sum -= std::log(std::max(probs[n * V + targets[n]], 1e-30f));
  loss[0] = static_cast<float>(sum / static_cast<double>(N));
}

void CpuBackend::cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets,
                                        const float* dloss, std::int64_t N, std::int64_t V) {
  const float s = dloss[0] / static_cast<float>(N);
#pragma omp parallel for schedule(static) num_threads(active_threads()) if (N * V >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t i = 0; i < V; ++i) dlogits[n * V + i] = probs[n * V + i] * s;
    dlogits[n * V + targets[n]] -= s;
  }
}

void CpuBackend::embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N,
                                   std::int64_t V, std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) {
    ZERO_CHECK(idx[n] >= 0 && idx[n] < V, "embedding: index {} at position {} outside [0, {})", idx[n], n, V);
    copy_floats(out + n * C, weight + idx[n] * C, C);
  }
}

void CpuBackend::embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N,
                                    std::int64_t, std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) {
    float* row = dweight + idx[n] * C;
    const float* g = dout + n * C;
    for (std::int64_t i = 0; i < C; ++i) row[i] += g[i];
  }
}

}  // namespace zero::cpu
