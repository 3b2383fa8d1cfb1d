// Double-precision references and per-element error bounds for the CUDA kernels' f32 arithmetic, shared
// by the GPU tests (test_cuda_kernels.cpp: device result against the double reference) and by the host
// stand-ins (test_cuda_kernel_math.cpp: the kernels' exact algorithm evaluated on the host, which runs
// without a GPU and shows that a correct kernel stays inside the bound, and by how much).
//
// Note [Kernel error bounds]
// Every bound is a first-order rounding-error analysis (Higham, "Accuracy and Stability of Numerical
// Algorithms", 2nd ed., ch. 2-4) of the formula the kernel evaluates, with u = 2^-24 the unit roundoff
// of f32: each f32 operation contributes at most u times the magnitude of its result, a sum of n terms
// in any order at most (n - 1) u times the sum of the terms' magnitudes, and a transcendental function
// (tanhf, expf) at most `ulps` units in the last place of its result (2 for CUDA's, CUDA C Programming
// Guide, "Mathematical Functions": tanhf 2, expf 2). An FMA rounds once where the formula counts two
// roundings, so the bounds hold whether or not nvcc contracts. Second-order terms (products of two u's)
// are below 1e-6 of the bound at these sizes; the bounds carry a factor 1.05 for them and nothing else,
// so a kernel that is a few ulp worse than its formula allows fails.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/kernel_math.h"

namespace zero::kernel_bounds {

/// n floats uniform in [lo, hi), the same for the same seed (std::mt19937_64).
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

constexpr double kU = 1.0 / 16777216.0;  // 2^-24, unit roundoff of f32
constexpr double kSecondOrder = 1.05;

/// The spacing of f32 numbers at |y| (2^(e - 23) for 2^e <= |y| < 2^(e+1)); the smallest normal's for
/// tiny y.
inline double ulp_f32(double y) {
  const double a = std::max(std::abs(y), static_cast<double>(std::numeric_limits<float>::min()));
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, 0.5 <= m < 1
  return std::ldexp(1.0, e - 24);
}

/// y moved by k units in the last place (f32), k of either sign.
inline float shift_ulps(float y, int k) {
  for (; k > 0; --k) y = std::nextafter(y, std::numeric_limits<float>::infinity());
  for (; k < 0; ++k) y = std::nextafter(y, -std::numeric_limits<float>::infinity());
  return y;
}

// ---- GELU ------------------------------------------------------------------------------------------------

// The formula in double, from the same f32 constants the kernel uses.
inline double gelu_arg_ref(float x) {
  const double xd = x;
  return static_cast<double>(cuda::detail::kGeluScale) *
         (xd + static_cast<double>(cuda::detail::kGeluCubic) * xd * xd * xd);
}
inline double gelu_ref(float x) { return 0.5 * x * (1.0 + std::tanh(gelu_arg_ref(x))); }
inline double gelu_backward_ref(float x, float dy) {
  const double xd = x, t = std::tanh(gelu_arg_ref(x));
  const double c = cuda::detail::kGeluCubic, s = cuda::detail::kGeluScale;
  return dy * (0.5 * (1.0 + t) + 0.5 * xd * (1.0 - t * t) * s * (1.0 + 3.0 * c * xd * xd));
}

// Error of the f32 t = tanhf(u(x)) against tanh of the exact argument: `ulps` ulp from tanhf itself, plus
// the argument's own error (5 roundings, all terms of one sign: <= 5 u |u(x)|) times dtanh/du = 1 - t^2.
inline double gelu_tanh_error(float x, double ulps) {
  const double a = gelu_arg_ref(x), t = std::tanh(a);
  return ulps * ulp_f32(t) + 5.0 * kU * std::abs(a) * (1.0 - t * t);
}

/// Bound on |gelu_from_tanh(x, tanhf(u)) - gelu(x)|: y = (0.5 x)(1 + t): 0.5 |x| (dt + u |1 + t|) + u |y|.
/// Where x << 0, 1 + t cancels and the bound is absolute, about 0.5 |x| dt.
inline double gelu_bound(float x, double tanh_ulps) {
  const double t = std::tanh(gelu_arg_ref(x)), dt = gelu_tanh_error(x, tanh_ulps);
  return kSecondOrder * (0.5 * std::abs(x) * (dt + kU * std::abs(1.0 + t)) + kU * std::abs(gelu_ref(x)));
}

// Note [GELU backward error]
// r = dy (A + B), A = 0.5 (1 + t), B = K' (1 - t^2), K' = 0.5 x sqrt(2/pi) (1 + 3·0.044715 x^2), K = |K'|.
// - The error dt of t moves r by |dy| dt |dA/dt + dB/dt| <= |dy| dt (0.5 + 2 K |t|). This is the
//   cancellation in 1 - t^2: near t = ±1 an error of one ulp of t (6e-8) costs 2 K ulp absolute, and K
//   grows like |x|^3 (K ≈ 16 at |x| = 5), while B itself goes to 0. A relative tolerance on r cannot
//   absorb it; an absolute one of 1e-6 does not either once two implementations' tanh differ by a few ulp.
// - Evaluating 1 - t*t in f32 errs by u t^2 + u |1 - t^2| <= 2u absolute, times K.
// - The remaining roundings are relative: 1 for A (1 + t), 7 for B (two products, 3c·x·x and + 1 inside
//   u', the final product), 1 for A + B, 1 for the product with dy.
inline double gelu_backward_bound(float x, float dy, double tanh_ulps) {
  const double xd = x, t = std::tanh(gelu_arg_ref(x)), dt = gelu_tanh_error(x, tanh_ulps);
  const double K = 0.5 * std::abs(xd) * cuda::detail::kGeluScale * (1.0 + 3.0 * cuda::detail::kGeluCubic * xd * xd);
  const double A = 0.5 * (1.0 + t), B = K * (1.0 - t * t);
  const double ady = std::abs(static_cast<double>(dy));
  const double inner = dt * (0.5 + 2.0 * K * std::abs(t)) + kU * (2.0 * K + A + 7.0 * B + std::abs(A + B));
  return kSecondOrder * (ady * inner + kU * std::abs(gelu_backward_ref(x, dy)));
}

// ---- LayerNorm parameter gradients -------------------------------------------------------------------------

/// dweight[c] = dw0[c] + sum_r (x[r,c] - mean[r]) rstd[r] dy[r,c] and dbias[c] = db0[c] + sum_r dy[r,c] in
/// double, from the f32 inputs (mean, rstd as the forward stored them), with the bound of the kernel's
/// reduction (kernel_math.h): a term of dweight takes 3 roundings ((x - m), × rstd, × dy), then passes
/// through at most L = ceil(N / (8 G)) additions in its row lane, 8 lane additions, G group additions and
/// the final += into dst, so |error| <= (3 + L + 8 + G + 1) u (sum_r |term_r| + |dw0|); dbias the same
/// without the 3.
struct LnParamsRef {
  std::vector<double> dweight, dbias, dweight_bound, dbias_bound;
};

inline LnParamsRef layernorm_params_ref(const std::vector<float>& dout, const std::vector<float>& inp,
                                        const std::vector<float>& mean, const std::vector<float>& rstd,
                                        const std::vector<float>& dw0, const std::vector<float>& db0, std::int64_t N,
                                        std::int64_t C) {
  const int G = cuda::detail::layernorm_param_groups(N);
  const std::int64_t lanes = static_cast<std::int64_t>(G) * cuda::detail::kLnRowLanes;
  const double L = static_cast<double>((N + lanes - 1) / lanes);
  const double chain = L + cuda::detail::kLnRowLanes + G + 1;
  LnParamsRef ref;
  ref.dweight.assign(C, 0.0);
  ref.dbias.assign(C, 0.0);
  std::vector<double> abs_w(C, 0.0), abs_b(C, 0.0);
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      const double dy = dout[r * C + c];
      const double term = (static_cast<double>(inp[r * C + c]) - mean[r]) * rstd[r] * dy;
      ref.dweight[c] += term;
      ref.dbias[c] += dy;
      abs_w[c] += std::abs(term);
      abs_b[c] += std::abs(dy);
    }
  ref.dweight_bound.resize(C);
  ref.dbias_bound.resize(C);
  for (std::int64_t c = 0; c < C; ++c) {
    ref.dweight[c] += dw0[c];
    ref.dbias[c] += db0[c];
    ref.dweight_bound[c] = kSecondOrder * (3.0 + chain) * kU * (abs_w[c] + std::abs(dw0[c]));
    ref.dbias_bound[c] = kSecondOrder * chain * kU * (abs_b[c] + std::abs(db0[c]));
  }
  return ref;
}

// ---- softmax rows (softmax, cross-entropy, the causal softmax of attention) --------------------------------

/// Additions a sum of `len` terms passes through in a warp-per-row kernel (lane chains of ceil(len/32),
/// then the 5-step butterfly).
inline double warp_chain(std::int64_t len) { return static_cast<double>((len + 31) / 32 + 5); }
/// The same for a block-per-row kernel: thread chains, a butterfly, the warp sums, a second butterfly.
inline double block_chain(std::int64_t len) {
  const int threads = cuda::detail::row_block_threads(static_cast<int>(len));
  return static_cast<double>((len + threads - 1) / threads + 10);
}

/// p[0..T) = softmax of a[0..len) in double, zeros from len on. The bound of the kernels' evaluation:
/// e_s = expf(a_s - m) errs by |a_s - m| u (the subtraction) + 2 exp_ulps u (relative); their sum by
/// `chain` u plus the largest e error; 1/sum and the product one u each. So |p_s error| <= p_s (err(e_s)
/// + err(sum) + 2u). Above `len` the kernels write exact zeros (bound 0).
template <class Elem>  // float, or double for scores that are themselves computed (attention)
void softmax_row_ref(std::vector<double>& p, std::vector<double>& bound, const Elem* a, std::int64_t len,
                     std::int64_t T, double chain, double exp_ulps) {
  p.assign(T, 0.0);
  bound.assign(T, 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t s = 0; s < len; ++s) m = std::max(m, static_cast<double>(a[s]));
  double sum = 0.0, worst_e = 0.0;
  for (std::int64_t s = 0; s < len; ++s) {
    p[s] = std::exp(a[s] - m);
    sum += p[s];
    worst_e = std::max(worst_e, std::abs(a[s] - m) * kU + 2.0 * exp_ulps * kU);
  }
  const double err_sum = chain * kU + worst_e;
  for (std::int64_t s = 0; s < len; ++s) {
    p[s] /= sum;
    bound[s] = kSecondOrder * p[s] * (std::abs(a[s] - m) * kU + 2.0 * exp_ulps * kU + err_sum + 2.0 * kU);
  }
}

/// Row t of a causal softmax (query position t of att[., T]): softmax_row_ref over a[0..t].
inline void causal_softmax_ref(std::vector<double>& p, std::vector<double>& bound, const std::vector<float>& a, int t,
                               int T, double exp_ulps) {
  softmax_row_ref(p, bound, a.data(), t + 1, T, warp_chain(t + 1), exp_ulps);
}

/// The backward row: g_s = p_s (dp_s - dot) scale, dot = sum_{s<len} p_s dp_s, in double from the f32 p
/// and dp. Bound: dot errs by (1 + chain) u sum |p dp| (a product, then the chain); then the
/// subtraction and the two products: 3 u |p (dp - dot) scale|.
inline void softmax_backward_row_ref(std::vector<double>& g, std::vector<double>& bound, const float* p,
                                     const float* dp, std::int64_t len, std::int64_t T, double scale, double chain) {
  g.assign(T, 0.0);
  bound.assign(T, 0.0);
  double dot = 0.0, abs_dot = 0.0;
  for (std::int64_t s = 0; s < len; ++s) {
    dot += static_cast<double>(p[s]) * dp[s];
    abs_dot += std::abs(static_cast<double>(p[s]) * dp[s]);
  }
  const double err_dot = (1.0 + chain) * kU * abs_dot;
  for (std::int64_t s = 0; s < len; ++s) {
    g[s] = p[s] * (dp[s] - dot) * scale;
    bound[s] = kSecondOrder * (std::abs(p[s] * scale) * err_dot + 3.0 * kU * std::abs(g[s]));
  }
}

inline void causal_softmax_backward_ref(std::vector<double>& g, std::vector<double>& bound, const std::vector<float>& p,
                                        const std::vector<float>& dp, int t, int T, double scale) {
  softmax_backward_row_ref(g, bound, p.data(), dp.data(), t + 1, T, scale, warp_chain(t + 1));
}

/// One row's cross-entropy as the kernel computes it, the log-softmax loss = log(S) - z with S = sum_s
/// exp(a_s - m), z = a_target - m <= 0, in double, and the bound of its f32 evaluation: S errs by `chain` u
/// plus the largest relative error of an exp term (as in softmax_row_ref), which log turns into the same
/// absolute error; logf adds log_ulps ulp of log(S); z one rounding (u |z|); the final subtraction u |loss|.
/// S >= 1 and -z >= 0, so the two terms add without cancelling and the bound stays small however small
/// the target's probability is.
struct CrossEntropyRowRef {
  double loss = 0, bound = 0;
};
inline CrossEntropyRowRef cross_entropy_row_ref(const float* a, std::int64_t len, std::int64_t target, double chain,
                                                double exp_ulps, double log_ulps) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t s = 0; s < len; ++s) m = std::max(m, static_cast<double>(a[s]));
  double sum = 0.0, worst_e = 0.0;
  for (std::int64_t s = 0; s < len; ++s) {
    sum += std::exp(a[s] - m);
    worst_e = std::max(worst_e, std::abs(a[s] - m) * kU + 2.0 * exp_ulps * kU);
  }
  const double z = a[target] - m, log_sum = std::log(sum);
  CrossEntropyRowRef r;
  r.loss = log_sum - z;
  r.bound = kSecondOrder * (chain * kU + worst_e + log_ulps * ulp_f32(log_sum) + kU * std::abs(z) +
                            kU * std::abs(r.loss));
  return r;
}

// ---- LayerNorm forward and input gradient (one warp per row) ------------------------------------------------

/// Row of LayerNorm in double from the f32 x, w, b: y, mean, rstd, with the bounds of the kernel's f32
/// evaluation (chain = warp_chain(C)):
/// - mean: (chain + 1) u sum|x| / C (the sum, the division);
/// - var = sum (x - m)^2 / C: the first-order effect of m's error cancels (sum (x - m) = 0), each term
///   takes 3 roundings (subtraction, doubled by the square, the square), then the chain and the division:
///   (chain + 4) u var;
/// - rstd = 1 / sqrtf(var + eps): half var's relative error (after + eps: one more u), sqrtf and the
///   division one u each;
/// - y = ((x - m) s) w + b: |w| (dm s + |x - m| s (ds/s + 2u)) + u |(x - m) s w| + u |y|.
struct LnRowRef {
  std::vector<double> y, y_bound;
  double mean = 0, rstd = 0, mean_bound = 0, rstd_bound = 0;
};
inline LnRowRef layernorm_row_ref(const float* x, const float* w, const float* b, std::int64_t C, float eps) {
  LnRowRef r;
  const double chain = warp_chain(C);
  double sum = 0, abs_sum = 0;
  for (std::int64_t i = 0; i < C; ++i) {
    sum += x[i];
    abs_sum += std::abs(static_cast<double>(x[i]));
  }
  const double m = sum / C;
  double var = 0;
  for (std::int64_t i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
  var /= C;
  const double s = 1.0 / std::sqrt(var + eps);
  const double dm = (chain + 1) * kU * abs_sum / C;
  const double dvar_rel = ((chain + 4) * kU * var + kU * (var + eps)) / (var + eps);
  const double ds_rel = 0.5 * dvar_rel + 2 * kU;
  r.mean = m;
  r.rstd = s;
  r.mean_bound = kSecondOrder * dm;
  r.rstd_bound = kSecondOrder * ds_rel * s;
  r.y.resize(C);
  r.y_bound.resize(C);
  for (std::int64_t i = 0; i < C; ++i) {
    const double z = (x[i] - m) * s * w[i];
    r.y[i] = z + b[i];
    r.y_bound[i] = kSecondOrder * (std::abs(w[i]) * (dm * s + std::abs(x[i] - m) * s * (ds_rel + 2 * kU)) +
                                   kU * std::abs(z) + kU * std::abs(r.y[i]));
  }
  return r;
}

/// dx of one row in double from the f32 dy, x, w and the f32 mean m and rstd s the forward stored:
/// dx = (w dy - A - norm B) s, norm = (x - m) s, A = mean(w dy), B = mean(w dy norm). Bound (chain =
/// warp_chain(C)): A errs by (chain + 2) u mean|w dy|, B by (chain + 5) u mean|w dy norm| (norm 2
/// roundings, the products, the chain, the division); then s (u |w dy| + dA + |norm| dB + 3 u |norm B|
/// + u |w dy - A| + u |w dy - A - norm B|) + u |dx|: two subtractions that may cancel, so the bound is
/// absolute in their inputs.
inline void layernorm_backward_row_ref(std::vector<double>& dx, std::vector<double>& bound, const float* dy,
                                       const float* x, const float* w, float m, float s, std::int64_t C) {
  const double chain = warp_chain(C);
  double A = 0, B = 0, absA = 0, absB = 0;
  for (std::int64_t i = 0; i < C; ++i) {
    const double norm = (x[i] - static_cast<double>(m)) * s, dn = static_cast<double>(w[i]) * dy[i];
    A += dn;
    B += dn * norm;
    absA += std::abs(dn);
    absB += std::abs(dn * norm);
  }
  A /= C;
  B /= C;
  const double dA = (chain + 2) * kU * absA / C, dB = (chain + 5) * kU * absB / C;
  dx.resize(C);
  bound.resize(C);
  for (std::int64_t i = 0; i < C; ++i) {
    const double norm = (x[i] - static_cast<double>(m)) * s, dn = static_cast<double>(w[i]) * dy[i];
    const double inner = dn - A - norm * B;
    dx[i] = inner * s;
    bound[i] = kSecondOrder * (s * (kU * std::abs(dn) + dA + std::abs(norm) * dB + 3 * kU * std::abs(norm * B) +
                                    kU * std::abs(dn - A) + kU * std::abs(inner)) +
                               kU * std::abs(dx[i]));
  }
}

// ---- causal attention (kernels.cpp: cuBLAS GEMMs around the causal softmax) --------------------------

/// Causal attention in double, per head, with first-order error bounds propagated through the device's
/// steps (core/cuda/kernels.cpp attention_forward / attention_backward): a cuBLAS dot product of length K
/// errs by K u sum|terms| in any summation order (Higham 2002, eq. 3.5), +1 u for alpha; the causal
/// softmax as above with the scores' error added (a shift da of the scores moves p_s by at most
/// p_s (|da_s| + max |da|)). The backward takes `att` (the attention weights the forward produced) as
/// its exact input, as the kernel does. qkv [B, T, 3C], dout [B, T, C], att [B, H, T, T].
struct AttentionRef {
  std::vector<double> att, att_bound, out, out_bound, dqkv, dqkv_bound;
};

inline AttentionRef attention_ref(const std::vector<float>& qkv, const std::vector<float>& att_in,
                                  const std::vector<float>& dout, std::int64_t B, std::int64_t T, std::int64_t C,
                                  std::int64_t H, double exp_ulps) {
  const std::int64_t D = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const double u = kU;
  AttentionRef r;
  r.att.assign(B * H * T * T, 0.0);
  r.att_bound.assign(B * H * T * T, 0.0);
  r.out.assign(B * T * C, 0.0);
  r.out_bound.assign(B * T * C, 0.0);
  r.dqkv.assign(B * T * 3 * C, 0.0);
  r.dqkv_bound.assign(B * T * 3 * C, 0.0);
  auto at = [&](std::int64_t part, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<double>(qkv[(b * T + t) * 3 * C + part * C + h * D + d]);
  };
  std::vector<double> scores(T), da(T), p, pb, dp(T), dp_err(T);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t head = (b * H + h) * T * T;
      std::vector<double> ds(T * T, 0.0), ds_err(T * T, 0.0);  // [query, key]
      for (std::int64_t t = 0; t < T; ++t) {
        // scores: scale q_t . k_s (length D)
        double worst_da = 0.0;
        for (std::int64_t s = 0; s <= t; ++s) {
          double dot = 0.0, abs_dot = 0.0;
          for (std::int64_t d = 0; d < D; ++d) {
            dot += at(0, b, t, h, d) * at(1, b, s, h, d);
            abs_dot += std::abs(at(0, b, t, h, d) * at(1, b, s, h, d));
          }
          scores[s] = scale * dot;
          da[s] = (D + 1) * u * scale * abs_dot;
          worst_da = std::max(worst_da, da[s]);
        }
        softmax_row_ref(p, pb, scores.data(), t + 1, T, warp_chain(t + 1), exp_ulps);
        for (std::int64_t s = 0; s <= t; ++s) {
          r.att[head + t * T + s] = p[s];
          r.att_bound[head + t * T + s] = pb[s] + kSecondOrder * p[s] * (da[s] + worst_da);
        }
        // out_t = sum_s att_ts v_s (length T; the zeros above the diagonal are exact)
        for (std::int64_t d = 0; d < D; ++d) {
          double o = 0.0, err = 0.0, abs_o = 0.0;
          for (std::int64_t s = 0; s <= t; ++s) {
            o += p[s] * at(2, b, s, h, d);
            abs_o += std::abs(p[s] * at(2, b, s, h, d));
            err += r.att_bound[head + t * T + s] * std::abs(at(2, b, s, h, d));
          }
          r.out[(b * T + t) * C + h * D + d] = o;
          r.out_bound[(b * T + t) * C + h * D + d] = kSecondOrder * (err + T * u * abs_o);
        }
        // backward from att_in's row: datt_s = dout_t . v_s (length D), then the causal softmax backward
        // with the score scale folded in
        const float* pr = att_in.data() + head + t * T;
        double dot = 0.0, abs_dot = 0.0, dot_err = 0.0;
        for (std::int64_t s = 0; s <= t; ++s) {
          double a = 0.0, abs_a = 0.0;
          for (std::int64_t d = 0; d < D; ++d) {
            const double g = dout[(b * T + t) * C + h * D + d];
            a += g * at(2, b, s, h, d);
            abs_a += std::abs(g * at(2, b, s, h, d));
          }
          dp[s] = a;
          dp_err[s] = D * u * abs_a;
          dot += pr[s] * a;
          abs_dot += std::abs(pr[s] * a);
          dot_err += std::abs(pr[s]) * dp_err[s];
        }
        dot_err += (1.0 + warp_chain(t + 1)) * u * abs_dot;
        for (std::int64_t s = 0; s <= t; ++s) {
          ds[t * T + s] = pr[s] * (dp[s] - dot) * scale;
          ds_err[t * T + s] = std::abs(pr[s] * scale) * (dp_err[s] + dot_err) + 3 * u * std::abs(ds[t * T + s]);
        }
      }
      // dq_t = sum_s ds_ts k_s; dk_t = sum_s ds_st q_s; dv_t = sum_s att_st dout_s (length T each)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t d = 0; d < D; ++d) {
          double dq = 0, dq_abs = 0, dq_err = 0, dk = 0, dk_abs = 0, dk_err = 0, dv = 0, dv_abs = 0;
          for (std::int64_t s = 0; s < T; ++s) {
            dq += ds[t * T + s] * at(1, b, s, h, d);
            dq_abs += std::abs(ds[t * T + s] * at(1, b, s, h, d));
            dq_err += ds_err[t * T + s] * std::abs(at(1, b, s, h, d));
            dk += ds[s * T + t] * at(0, b, s, h, d);
            dk_abs += std::abs(ds[s * T + t] * at(0, b, s, h, d));
            dk_err += ds_err[s * T + t] * std::abs(at(0, b, s, h, d));
            const double g = dout[(b * T + s) * C + h * D + d];
            dv += att_in[head + s * T + t] * g;
            dv_abs += std::abs(att_in[head + s * T + t] * g);
          }
          const std::int64_t row = (b * T + t) * 3 * C + h * D + d;
          r.dqkv[row] = dq;
          r.dqkv_bound[row] = kSecondOrder * (dq_err + T * u * dq_abs);
          r.dqkv[row + C] = dk;
          r.dqkv_bound[row + C] = kSecondOrder * (dk_err + T * u * dk_abs);
          r.dqkv[row + 2 * C] = dv;
          r.dqkv_bound[row + 2 * C] = kSecondOrder * T * u * dv_abs;
        }
    }
  return r;
}

/// Largest |got - want| / bound over the elements (<= 1 means within the bound); also the largest
/// |got - want| itself.
struct Worst {
  double ratio = 0.0, abs_error = 0.0;
  std::size_t index = 0;
  void add(std::size_t i, double got, double want, double bound) {
    const double err = std::abs(got - want);
    const double r = std::isnan(got)
                         ? std::numeric_limits<double>::infinity()
                         : (bound > 0 ? err / bound : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0));
    if (r > ratio) {
      ratio = r;
      index = i;
    }
    abs_error = std::max(abs_error, err);
  }
};

// ---- AdamW over a sequence of gradients (test_cuda_gpt.cpp, tests/distributed/test_zero_cuda.cpp) -----------

// Note [AdamW trajectory bound]
// Two f32 training runs cannot be compared within a worst-case bound through AdamW: its first update is
// about lr sign(g), so a gradient that is zero up to rounding moves a parameter by +-lr on one side and
// not the other. So the tests feed every implementation the same gradient values (up to a stated relative
// error rel_g: the rounding of the clip coefficient, a 16-bit gradient) and compare each with exact AdamW
// on those values, in double, with the f32 scalars the implementations form (optim::adamw_scalars: the
// same on every side). A near-zero gradient then moves every side alike. Per
// element and step, with c1 = 1 - b1 and c2 = 1 - b2 (exact in f32, Sterbenz's lemma), first order in u:
//   m' = b1 m + c1 g        e_m' = b1 e_m + c1 |g| rel_g + 3u (b1 |m| + c1 |g|)         (3 roundings)
//   v' = b2 v + c2 g g      e_v' = b2 e_v + 2 c2 g^2 rel_g + 4u v'                        (4; terms >= 0)
//   d = sqrt(v') / s2 + eps e_d = e_v' / (2 sqrt(v') s2) + 3u d                          (sqrt, /, +)
//   r = m' / d              e_r = (e_m' + |r| e_d) / d + u |r|
//   p' = p decay - k r      e_p' = decay e_p + k e_r + u (|p decay| + |k r| + |p'|)
// (k = step_size, s2 = bias_correction2_sqrt.) Every operation is counted as one rounding of u times its
// result, which also covers an FMA (one rounding where two are counted); kSecondOrder covers the rest.
// A gradient that is exactly 0 on every step keeps m = v = r = 0 exactly (bound 0 from them).
struct AdamWTrajectory {
  std::vector<double> param, exp_avg, exp_avg_sq;  // exact AdamW
  std::vector<double> bound, m_bound, v_bound;     // per element: |an f32 implementation - exact|
  std::int64_t step = 0;
  float lr, beta1, beta2, eps;

  AdamWTrajectory(std::vector<double> p0, float lr_, float beta1_, float beta2_, float eps_)
      : param(std::move(p0)), lr(lr_), beta1(beta1_), beta2(beta2_), eps(eps_) {
    const std::size_t n = param.size();
    exp_avg.assign(n, 0.0);
    exp_avg_sq.assign(n, 0.0);
    bound.assign(n, 0.0);
    m_bound.assign(n, 0.0);
    v_bound.assign(n, 0.0);
  }

  /// One step on gradient g (the exact values; the implementations may see them with relative error
  /// rel_g), element i decayed with weight_decay[i].
  void apply(const std::vector<double>& g, const std::vector<float>& weight_decay, double rel_g) {
    ++step;
    const double t = static_cast<double>(step);
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t), bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
    const double k = static_cast<float>(lr / bc1), s2 = static_cast<float>(std::sqrt(bc2));
    const double b1 = beta1, b2 = beta2, c1 = 1.0f - beta1, c2 = 1.0f - beta2;
    for (std::size_t i = 0; i < param.size(); ++i) {
      const double decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay[i]);
      const double gi = g[i], m = exp_avg[i], v = exp_avg_sq[i];
      const double m1 = b1 * m + c1 * gi, v1 = b2 * v + c2 * gi * gi;
      const double em = b1 * m_bound[i] + c1 * std::abs(gi) * rel_g + 3 * kU * (b1 * std::abs(m) + c1 * std::abs(gi));
      const double ev = b2 * v_bound[i] + 2 * c2 * gi * gi * rel_g + 4 * kU * v1;
      const double d = std::sqrt(v1) / s2 + eps;
      const double ed = (v1 > 0 ? ev / (2 * std::sqrt(v1) * s2) : 0.0) + 3 * kU * d;
      const double r = m1 / d;
      const double er = (em + std::abs(r) * ed) / d + kU * std::abs(r);
      const double p1 = param[i] * decay - k * r;
      bound[i] = kSecondOrder * (decay * bound[i] + k * er +
                                 kU * (std::abs(param[i] * decay) + std::abs(k * r) + std::abs(p1)));
      m_bound[i] = kSecondOrder * em;
      v_bound[i] = kSecondOrder * ev;
      param[i] = p1;
      exp_avg[i] = m1;
      exp_avg_sq[i] = v1;
    }
  }
};

/// |got[i] - want[i]| <= bound[i] everywhere (NaN never passes); the failure names the worst element
/// (by error / bound) and how far past its bound it is.
// Each comparison's worst error / bound goes into the running test's report as a property,
// error_bound_ratio_1, _2, ... in the order compared (the GoogleTest JSON of scripts/gpu_check.sh shows
// how close a kernel came to its bound, not only whether it stayed within it).
inline void record_error_bound_ratio(double ratio) {
  static const ::testing::TestInfo* test = nullptr;
  static int k = 0;
  const ::testing::TestInfo* now = ::testing::UnitTest::GetInstance()->current_test_info();
  if (now == nullptr) return;
  if (now != test) test = now, k = 0;
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", ratio);
  ::testing::Test::RecordProperty("error_bound_ratio_" + std::to_string(++k), text);
}

inline ::testing::AssertionResult within_bounds(const std::vector<float>& got, const std::vector<double>& want,
                                                const std::vector<double>& bound) {
  if (got.size() != want.size() || got.size() != bound.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << ", " << want.size() << ", "
                                         << bound.size();
  Worst w;
  for (std::size_t i = 0; i < got.size(); ++i) w.add(i, got[i], want[i], bound[i]);
  record_error_bound_ratio(w.ratio);
  if (w.ratio > 1.0)
    return ::testing::AssertionFailure() << "element " << w.index << " of " << got.size() << ": got " << got[w.index]
                                         << ", exact " << want[w.index] << ", bound " << bound[w.index] << " (error "
                                         << w.ratio << " times the bound)";
  return ::testing::AssertionSuccess() << "worst error " << w.abs_error << ", " << w.ratio << " of its bound";
}

}  // namespace zero::kernel_bounds
