// The op table: one row per differentiable op (and per interesting shape of it). Each row drives, on
// every device this build has (cpu, and cuda when built with it; ggml's test-backend-ops does the same),
//   - a forward check against a plain-loop reference written here, in double, from the host inputs, and
//   - a numerical gradient check of every f32 input (tests/unit/gradcheck.h), on that device.
// Device rows skip when the device is not present. Adding an op means adding one row to op_cases():
// it is then tested on every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/ops.h"
#include "core/kernels.h"
#include "core/tensor.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/runtime.h"
#endif
#include "tests/unit/gradcheck.h"

namespace zero {

// gtest prints the device of a row by name (found by argument-dependent lookup).
void PrintTo(Device d, std::ostream* os) { *os << device_name(d); }

namespace {

using test::GradcheckOptions;

// ---- how a row describes its inputs ----

struct Input {
  enum Kind { param, constant, indices, positive, fixed };
  Shape shape;
  Kind kind = param;                  // param: randn, requires grad; constant: randn, no grad;
                                      // positive: 0.5 + |randn|, requires grad (sqrt, log, divisors);
                                      // fixed: the values given, requires grad (edge regions)
  float std = 1.0f;                   // spread of the random values
  std::vector<std::int64_t> idx = {};  // values of an indices (i64) input
  std::vector<float> values = {};      // values of a fixed input, row-major
};
Input param(Shape s, float std = 1.0f) { return {std::move(s), Input::param, std}; }
Input constant(Shape s) { return {std::move(s), Input::constant}; }
Input indices(std::vector<std::int64_t> v, Shape s) { return {std::move(s), Input::indices, 1.0f, std::move(v)}; }
Input positive(Shape s) { return {std::move(s), Input::positive}; }
// Inputs pinned to a region random ones rarely reach: exp's overflow (above ln(FLT_MAX) = 88.72) or
// underflow, a tie, a denormal.
Input fixed(std::vector<float> v, Shape s) { return {std::move(s), Input::fixed, 1.0f, {}, std::move(v)}; }

// The expected output: shape and row-major values.
struct Ref {
  Shape shape;
  std::vector<double> v;
};
using RefFn = std::function<Ref(const std::vector<Tensor>&)>;

struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  test::GradcheckFn op;
  RefFn reference;             // null where the forward is checked by its own tests below
  double fwd_rtol = 1e-5;      // forward: |y - ref| <= fwd_atol + fwd_rtol * |ref|
  double fwd_atol = 1e-5;
  GradcheckOptions grad = {};  // gradient: eps and tolerance
};

// ---- small helpers for the references (all independent of the code under test but to_vector) ----

std::vector<double> vals(const Tensor& t) {
  std::vector<double> out;
  for (float f : t.to_vector()) out.push_back(f);
  return out;
}
std::vector<std::int64_t> idx_vals(const Tensor& t) {
  return std::vector<std::int64_t>(t.data<std::int64_t>(), t.data<std::int64_t>() + t.numel());
}
std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}
// Multi-index of row-major position i in shape s.
Shape unravel(std::int64_t i, const Shape& s) {
  Shape ix(s.size());
  for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
    ix[d] = i % s[d];
    i /= s[d];
  }
  return ix;
}
// Row-major position in shape s of the index ix, right-aligned; dimensions of size 1 read index 0.
std::int64_t ravel_broadcast(const Shape& ix, const Shape& s) {
  std::int64_t pos = 0;
  const std::size_t lead = ix.size() - s.size();
  for (std::size_t d = 0; d < s.size(); ++d) pos = pos * s[d] + (s[d] == 1 ? 0 : ix[lead + d]);
  return pos;
}

Ref elementwise_ref(const Tensor& a, const Tensor& b, const Shape& out_shape, double (*f)(double, double)) {
  const auto av = vals(a), bv = vals(b);
  Ref r{out_shape, {}};
  for (std::int64_t i = 0; i < numel_of(out_shape); ++i) {
    const Shape ix = unravel(i, out_shape);
    r.v.push_back(f(av[ravel_broadcast(ix, a.shape())], bv[ravel_broadcast(ix, b.shape())]));
  }
  return r;
}
double add_f(double x, double y) { return x + y; }
double sub_f(double x, double y) { return x - y; }
double mul_f(double x, double y) { return x * y; }
double div_f(double x, double y) { return x / y; }

Ref map_ref(const Tensor& x, const std::function<double(double)>& f) {
  Ref r{x.shape(), vals(x)};
  for (auto& v : r.v) v = f(v);
  return r;
}

// Sum or max of x over dimension d (keepdim keeps it as 1).
Ref reduce_ref(const Tensor& x, int d, bool keepdim, bool max) {
  const auto xv = vals(x);
  const Shape& s = x.shape();
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[i];
  for (std::size_t i = d + 1; i < s.size(); ++i) inner *= s[i];
  Ref r{{}, {}};
  for (std::size_t i = 0; i < s.size(); ++i)
    if (static_cast<int>(i) != d || keepdim) r.shape.push_back(static_cast<int>(i) == d ? 1 : s[i]);
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      double acc = max ? -INFINITY : 0.0;
      for (std::int64_t j = 0; j < s[d]; ++j) {
        const double v = xv[(o * s[d] + j) * inner + i];
        acc = max ? std::max(acc, v) : acc + v;
      }
      r.v.push_back(acc);
    }
  return r;
}

// Sum of x down to `target` (right-aligned, size-1 dimensions summed).
Ref sum_to_ref(const Tensor& x, const Shape& target) {
  const auto xv = vals(x);
  Ref r{target, std::vector<double>(static_cast<std::size_t>(numel_of(target)), 0.0)};
  for (std::int64_t i = 0; i < x.numel(); ++i) r.v[ravel_broadcast(unravel(i, x.shape()), target)] += xv[i];
  return r;
}

// out[b, m, n] = sum_k a[b, m, k] * b[b?, k, n]; b shared when it is 2-D.
Ref matmul_ref(const Tensor& a, const Tensor& b) {
  const auto av = vals(a), bv = vals(b);
  const std::int64_t M = a.shape()[a.dim() - 2], K = a.shape()[a.dim() - 1], N = b.shape()[b.dim() - 1];
  const std::int64_t batch = a.numel() / (M * K);
  const bool shared = b.dim() == 2;
  Shape os = a.shape();
  os.back() = N;
  Ref r{os, {}};
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double acc = 0.0;
        for (std::int64_t k = 0; k < K; ++k) acc += av[(i * M + m) * K + k] * bv[(shared ? 0 : i * K * N) + k * N + n];
        r.v.push_back(acc);
      }
  return r;
}

Ref linear_ref(const Tensor& x, const Tensor& w, const Tensor* b) {
  const auto xv = vals(x), wv = vals(w);
  const std::int64_t in = w.shape()[1], out = w.shape()[0], N = x.numel() / in;
  Shape os = x.shape();
  os.back() = out;
  Ref r{os, {}};
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = b ? vals(*b)[o] : 0.0;
      for (std::int64_t i = 0; i < in; ++i) acc += xv[n * in + i] * wv[o * in + i];
      r.v.push_back(acc);
    }
  return r;
}

Ref layer_norm_ref(const Tensor& x, const Tensor& w, const Tensor& b) {
  const auto xv = vals(x), wv = vals(w), bv = vals(b);
  const std::int64_t C = x.shape().back(), N = x.numel() / C;
  Ref r{x.shape(), {}};
  for (std::int64_t n = 0; n < N; ++n) {
    double mu = 0.0, var = 0.0;
    for (std::int64_t c = 0; c < C; ++c) mu += xv[n * C + c] / C;
    for (std::int64_t c = 0; c < C; ++c) var += (xv[n * C + c] - mu) * (xv[n * C + c] - mu) / C;
    for (std::int64_t c = 0; c < C; ++c) r.v.push_back((xv[n * C + c] - mu) / std::sqrt(var + 1e-5) * wv[c] + bv[c]);
  }
  return r;
}

Ref softmax_ref(const Tensor& x) {
  const auto xv = vals(x);
  const std::int64_t C = x.shape().back(), N = x.numel() / C;
  Ref r{x.shape(), {}};
  for (std::int64_t n = 0; n < N; ++n) {
    double z = 0.0;
    for (std::int64_t c = 0; c < C; ++c) z += std::exp(xv[n * C + c]);
    for (std::int64_t c = 0; c < C; ++c) r.v.push_back(std::exp(xv[n * C + c]) / z);
  }
  return r;
}

// Naive causal attention: for each batch b, head h, query t: softmax over s <= t of q.k / sqrt(D),
// then the weighted sum of v rows.
Ref attention_ref(const Tensor& qkv, std::int64_t H) {
  const auto x = vals(qkv);
  const std::int64_t B = qkv.shape()[0], T = qkv.shape()[1], C = qkv.shape()[2] / 3, D = C / H;
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h, std::int64_t d) {
    return x[(b * T + t) * 3 * C + part * C + h * D + d];
  };
  Ref r{{B, T, C}, std::vector<double>(static_cast<std::size_t>(B * T * C), 0.0)};
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        std::vector<double> score(T, -INFINITY);  // masked (s > t) entries stay -inf: weight 0
        double mx = -INFINITY;
        for (std::int64_t s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < D; ++d) dot += at(b, t, 0, h, d) * at(b, s, 1, h, d);
          score[s] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, score[s]);
        }
        double z = 0.0;
        for (std::int64_t s = 0; s < T; ++s) z += std::exp(score[s] - mx);
        for (std::int64_t s = 0; s < T; ++s) {
          const double p = std::exp(score[s] - mx) / z;
          for (std::int64_t d = 0; d < D; ++d) r.v[(b * T + t) * C + h * D + d] += p * at(b, s, 2, h, d);
        }
      }
  return r;
}

// Mean over rows of logsumexp(logits[n]) - logits[n, target[n]].
Ref cross_entropy_ref(const Tensor& logits, const Tensor& targets) {
  const auto l = vals(logits);
  const auto t = idx_vals(targets);
  const std::int64_t N = logits.shape()[0], V = logits.shape()[1];
  double loss = 0.0;
  for (std::int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY, z = 0.0;
    for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, l[n * V + v]);
    for (std::int64_t v = 0; v < V; ++v) z += std::exp(l[n * V + v] - mx);
    loss += mx + std::log(z) - l[n * V + t[n]];
  }
  return {{}, {loss / N}};
}

// y[perm(ix)] = x[ix] for a 2-D or 3-D transpose of dimensions d0 and d1.
Ref transpose_ref(const Tensor& x, int d0, int d1) {
  const auto xv = vals(x);
  Shape os = x.shape();
  std::swap(os[d0], os[d1]);
  Ref r{os, {}};
  for (std::int64_t i = 0; i < numel_of(os); ++i) {
    Shape ix = unravel(i, os);
    std::swap(ix[d0], ix[d1]);
    std::int64_t pos = 0;
    for (std::size_t d = 0; d < ix.size(); ++d) pos = pos * x.shape()[d] + ix[d];
    r.v.push_back(xv[pos]);
  }
  return r;
}

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

// Conversions round to the dtype's grid: the value moves by at most half a unit in the last place.
constexpr double kHalfUlpF16 = 1.0 / 2048;  // 2^-11, relative
constexpr double kHalfUlpBf16 = 1.0 / 256;  // 2^-8, relative
// Rounding makes x -> to(x) a staircase around the identity. With a wide step h the difference
// quotient is off by (rounding error at x + h, minus the one at x - h) / 2h times the output weight:
// at most about 2^-11 (f16) or 2^-8 (bf16) times |x| / h. With h = 0.5 the fixed inputs here measure
// 4.5e-4 (f16) and 3.5e-3 (bf16); a wrong gradient (missing, doubled) is off by |w| ~ 1.
constexpr GradcheckOptions kF16Staircase{.eps = 0.5, .tol = 5e-3};
constexpr GradcheckOptions kBf16Staircase{.eps = 0.5, .tol = 3e-2};

// ---- the table ----

std::vector<OpCase> op_cases() {
  using In = std::vector<Tensor>;
  return {
      // elementwise, with broadcasting
      {"add", {param({2, 3, 4}), param({2, 3, 4})}, [](const In& x) { return add(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, add_f); }},
      {"add_broadcast_suffix", {param({2, 3, 4}), param({4})}, [](const In& x) { return add(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, add_f); }},
      {"add_broadcast_lhs", {param({4}), param({2, 3, 4})}, [](const In& x) { return add(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, add_f); }},
      {"sub", {param({2, 3, 4}), param({2, 3, 4})}, [](const In& x) { return sub(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, sub_f); }},
      {"sub_broadcast", {param({2, 3, 4}), param({3, 1})}, [](const In& x) { return sub(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, sub_f); }},
      {"mul", {param({2, 3, 4}), param({2, 3, 4})}, [](const In& x) { return mul(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, mul_f); }},
      {"mul_broadcast_both", {param({2, 1, 4}), param({3, 1})}, [](const In& x) { return mul(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, mul_f); }},
      {"mul_constant_operand", {param({2, 3}), constant({2, 3})}, [](const In& x) { return mul(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3}, mul_f); }},
      {"mul_self", {param({2, 3})}, [](const In& x) { return mul(x[0], x[0]); },
       [](const In& x) { return elementwise_ref(x[0], x[0], {2, 3}, mul_f); }},
      {"mul_scalar", {param({2, 3, 4})}, [](const In& x) { return mul(x[0], 2.5f); },
       [](const In& x) {
         Ref r{{2, 3, 4}, vals(x[0])};
         for (auto& v : r.v) v *= 2.5;
         return r;
       }},
      {"add_scalar", {param({2, 3})}, [](const In& x) { return add(x[0], 0.75f); },
       [](const In& x) { return map_ref(x[0], [](double v) { return v + 0.75; }); }},
      {"div", {param({2, 3, 4}), positive({2, 3, 4})}, [](const In& x) { return div(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, div_f); }},
      {"div_broadcast", {param({2, 3, 4}), positive({3, 1})}, [](const In& x) { return div(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 3, 4}, div_f); }},
      {"div_suffix_lhs", {positive({4}), positive({2, 4})}, [](const In& x) { return div(x[0], x[1]); },
       [](const In& x) { return elementwise_ref(x[0], x[1], {2, 4}, div_f); }},

      // elementwise functions of one tensor
      {"sqrt", {positive({2, 3, 4})}, [](const In& x) { return sqrt(x[0]); },
       [](const In& x) { return map_ref(x[0], [](double v) { return std::sqrt(v); }); }},
      {"rsqrt", {positive({2, 3, 4})}, [](const In& x) { return rsqrt(x[0]); },
       [](const In& x) { return map_ref(x[0], [](double v) { return 1.0 / std::sqrt(v); }); }},
      {"exp", {param({2, 3, 4})}, [](const In& x) { return exp(x[0]); },
       [](const In& x) { return map_ref(x[0], [](double v) { return std::exp(v); }); }},
      {"log", {positive({2, 3, 4})}, [](const In& x) { return log(x[0]); },
       [](const In& x) { return map_ref(x[0], [](double v) { return std::log(v); }); }},
      {"pow_2", {param({2, 3, 4})}, [](const In& x) { return pow(x[0], 2.0f); },
       [](const In& x) { return map_ref(x[0], [](double v) { return v * v; }); }},
      {"pow_3", {param({2, 3, 4})}, [](const In& x) { return pow(x[0], 3.0f); },
       [](const In& x) { return map_ref(x[0], [](double v) { return v * v * v; }); }},
      {"pow_fractional", {positive({2, 3, 4})}, [](const In& x) { return pow(x[0], -1.5f); },
       [](const In& x) { return map_ref(x[0], [](double v) { return std::pow(v, -1.5); }); }},

      // reductions
      {"sum", {param({2, 3, 4})}, [](const In& x) { return sum(x[0]); },
       [](const In& x) { return sum_to_ref(x[0], {}); }},
      {"mean", {param({2, 3, 4})}, [](const In& x) { return mean(x[0]); },
       [](const In& x) {
         Ref r = sum_to_ref(x[0], {});
         r.v[0] /= 24.0;
         return r;
       }},
      {"sum_to_keepdim", {param({2, 3, 4})}, [](const In& x) { return sum_to(x[0], {3, 1}); },
       [](const In& x) { return sum_to_ref(x[0], {3, 1}); }},
      {"sum_to_suffix", {param({2, 3, 4})}, [](const In& x) { return sum_to(x[0], {4}); },
       [](const In& x) { return sum_to_ref(x[0], {4}); }},
      {"sum_to_inner", {param({2, 3, 4})}, [](const In& x) { return sum_to(x[0], {2, 1, 4}); },
       [](const In& x) { return sum_to_ref(x[0], {2, 1, 4}); }},
      {"sum_dim", {param({2, 3, 4})}, [](const In& x) { return sum(x[0], 1); },
       [](const In& x) { return reduce_ref(x[0], 1, false, false); }},
      {"sum_dim_last_keepdim", {param({2, 3, 4})}, [](const In& x) { return sum(x[0], -1, true); },
       [](const In& x) { return reduce_ref(x[0], 2, true, false); }},
      {"mean_dim_keepdim", {param({2, 3, 4})}, [](const In& x) { return mean(x[0], -1, true); },
       [](const In& x) {
         Ref r = reduce_ref(x[0], 2, true, false);
         for (auto& v : r.v) v /= 4.0;
         return r;
       }},
      {"mean_dim_first", {param({3, 5})}, [](const In& x) { return mean(x[0], 0); },
       [](const In& x) {
         Ref r = reduce_ref(x[0], 0, false, false);
         for (auto& v : r.v) v /= 3.0;
         return r;
       }},
      {"max_dim", {param({2, 3, 4})}, [](const In& x) { return max(x[0], 1); },
       [](const In& x) { return reduce_ref(x[0], 1, false, true); }},
      {"max_dim_last_keepdim", {param({3, 5})}, [](const In& x) { return max(x[0], -1, true); },
       [](const In& x) { return reduce_ref(x[0], 1, true, true); }},

      // linear algebra
      {"matmul_2d", {param({3, 4}), param({4, 5})}, [](const In& x) { return matmul(x[0], x[1]); },
       [](const In& x) { return matmul_ref(x[0], x[1]); }},
      {"matmul_batched", {param({2, 3, 4}), param({2, 4, 5})}, [](const In& x) { return matmul(x[0], x[1]); },
       [](const In& x) { return matmul_ref(x[0], x[1]); }},
      {"matmul_shared_rhs", {param({2, 3, 4}), param({4, 5})}, [](const In& x) { return matmul(x[0], x[1]); },
       [](const In& x) { return matmul_ref(x[0], x[1]); }},
      {"linear_bias", {param({2, 3, 4}), param({5, 4}), param({5})},
       [](const In& x) { return linear(x[0], x[1], x[2]); },
       [](const In& x) { return linear_ref(x[0], x[1], &x[2]); }},
      {"linear_no_bias", {param({3, 4}), param({5, 4})}, [](const In& x) { return linear(x[0], x[1], Tensor()); },
       [](const In& x) { return linear_ref(x[0], x[1], nullptr); }},
      // The CPU GEMM's edges (core/cpu/kernels.cpp): 9 rows = a whole register tile + 1, 33 outputs = a
      // tile of 32 columns + 1, 257 inputs = two depth blocks of 256; the bias is added in the tile store.
      {"linear_bias_gemm_edges", {param({9, 257}), param({33, 257}, 0.1f), param({33})},
       [](const In& x) { return linear(x[0], x[1], x[2]); },
       [](const In& x) { return linear_ref(x[0], x[1], &x[2]); }},
      {"matmul_gemm_edges", {param({2, 9, 257}, 0.3f), param({257, 33}, 0.3f)},
       [](const In& x) { return matmul(x[0], x[1]); }, [](const In& x) { return matmul_ref(x[0], x[1]); }},

      // neural-network ops
      {"embedding_repeated_indices", {param({6, 4}), indices({1, 3, 1, 5, 0, 1}, {2, 3})},
       [](const In& x) { return embedding(x[0], x[1]); },
       [](const In& x) {
         const auto w = vals(x[0]);
         Ref r{{2, 3, 4}, {}};
         for (std::int64_t i : idx_vals(x[1]))
           for (int c = 0; c < 4; ++c) r.v.push_back(w[i * 4 + c]);
         return r;
       }},
      {"layer_norm", {param({2, 3, 8}), param({8}), param({8})},
       [](const In& x) { return layer_norm(x[0], x[1], x[2]); },
       [](const In& x) { return layer_norm_ref(x[0], x[1], x[2]); }},
      {"gelu", {param({2, 3, 4}, 2.0f)}, [](const In& x) { return gelu(x[0]); },
       [](const In& x) {
         Ref r{x[0].shape(), vals(x[0])};
         for (auto& v : r.v) v = gelu_ref(v);
         return r;
       }},
      {"softmax", {param({2, 3, 5}, 2.0f)}, [](const In& x) { return softmax(x[0]); },
       [](const In& x) { return softmax_ref(x[0]); }},
      // exp's edges: scores above ln(FLT_MAX) = 88.72, whose exp overflows unless the row's max is
      // subtracted first, and a row whose every exp underflows (0 / 0 without it).
      {"softmax_exp_overflow_rows",
       {fixed({88.8f, 80.0f, 0.0f, -20.0f, 89.5f, 88.0f, -100.0f, -88.8f, -150.0f, -89.0f, -200.0f, -95.0f}, {2, 6})},
       [](const In& x) { return softmax(x[0]); }, [](const In& x) { return softmax_ref(x[0]); }},
      {"causal_self_attention", {param({2, 5, 24})},
       [](const In& x) { return causal_self_attention(x[0], 2); },
       [](const In& x) { return attention_ref(x[0], 2); }},
      // The attention kernel's two paths: T a multiple of 32 and D = 32 read q, k, v and write the
      // scores in place; T = 33 (one row past a padded block) and D = 40 (a column tile and a part)
      // go through the zero-padded copies.
      {"causal_self_attention_in_place", {param({1, 32, 96})},
       [](const In& x) { return causal_self_attention(x[0], 1); },
       [](const In& x) { return attention_ref(x[0], 1); }},
      {"causal_self_attention_padded", {param({1, 33, 120}, 0.5f)},
       [](const In& x) { return causal_self_attention(x[0], 1); },
       [](const In& x) { return attention_ref(x[0], 1); }},
      // T = 32 but D = 16 (two heads of C = 32), less than the 32-column padded head: the padded path
      // (the in-place one would write into the next head's columns and past the last row).
      {"causal_self_attention_head_dim_16", {param({2, 32, 96})},
       [](const In& x) { return causal_self_attention(x[0], 2); },
       [](const In& x) { return attention_ref(x[0], 2); }},
      // T = 7 and D = 6: neither a whole number of the 4×4 blocks the transposing pack moves through
      // registers, so both of its remainders (rows and columns) run.
      {"causal_self_attention_odd_shape", {param({1, 7, 18}, 0.5f)},
       [](const In& x) { return causal_self_attention(x[0], 1); },
       [](const In& x) { return attention_ref(x[0], 1); }},
      {"cross_entropy", {param({4, 6}, 2.0f), indices({0, 5, 2, 2}, {4})},
       [](const In& x) { return cross_entropy(x[0], x[1]); },
       [](const In& x) { return cross_entropy_ref(x[0], x[1]); }},
      // The mask is drawn inside; a fresh Generator per call gives every evaluation the same mask.
      // Its forward is checked by the Dropout* tests below.
      {"dropout_training", {param({4, 8})},
       [](const In& x) {
         Generator gen(99);
         return dropout(x[0], 0.3f, /*training=*/true, gen);
       },
       nullptr},

      // views and conversions (the non-contiguous results feed the loss's mul, or a following op)
      {"view", {param({2, 3, 4})}, [](const In& x) { return x[0].view({4, -1}); },
       [](const In& x) { return Ref{{4, 6}, vals(x[0])}; }},
      {"reshape_of_transpose", {param({3, 4})}, [](const In& x) { return x[0].transpose(0, 1).reshape({12}); },
       [](const In& x) {
         Ref r = transpose_ref(x[0], 0, 1);
         r.shape = {12};
         return r;
       }},
      {"transpose", {param({2, 3, 4})}, [](const In& x) { return x[0].transpose(0, 2); },
       [](const In& x) { return transpose_ref(x[0], 0, 2); }},
      {"transpose_into_matmul", {param({2, 4, 3}), param({4, 5})},
       [](const In& x) { return matmul(x[0].transpose(1, 2), x[1]); },
       [](const In& x) {
         const Ref t = transpose_ref(x[0], 1, 2);
         return matmul_ref(Tensor::from_vector(std::vector<float>(t.v.begin(), t.v.end()), t.shape), x[1]);
       }},
      {"transpose_into_add", {param({3, 2}), param({2, 3})}, [](const In& x) { return add(x[0].transpose(0, 1), x[1]); },
       [](const In& x) {
         Ref t = transpose_ref(x[0], 0, 1);
         const auto b = vals(x[1]);
         for (std::size_t i = 0; i < t.v.size(); ++i) t.v[i] += b[i];
         return t;
       }},
      {"narrow", {param({3, 5})}, [](const In& x) { return x[0].narrow(1, 1, 3); },
       [](const In& x) {
         const auto v = vals(x[0]);
         Ref r{{3, 3}, {}};
         for (int i = 0; i < 3; ++i)
           for (int j = 1; j < 4; ++j) r.v.push_back(v[i * 5 + j]);
         return r;
       }},
      {"narrow_into_gelu", {param({4, 3})}, [](const In& x) { return gelu(x[0].narrow(0, 1, 2)); },
       [](const In& x) {
         const auto v = vals(x[0]);
         Ref r{{2, 3}, {}};
         for (int i = 3; i < 9; ++i) r.v.push_back(gelu_ref(v[i]));
         return r;
       }},
      {"expand", {param({3, 1})}, [](const In& x) { return x[0].expand({2, 3, 4}); },
       [](const In& x) {
         const auto v = vals(x[0]);
         Ref r{{2, 3, 4}, {}};
         for (std::int64_t i = 0; i < 24; ++i) r.v.push_back(v[unravel(i, {2, 3, 4})[1]]);
         return r;
       }},
      {"contiguous", {param({3, 4})}, [](const In& x) { return x[0].transpose(0, 1).contiguous(); },
       [](const In& x) { return transpose_ref(x[0], 0, 1); }},
      {"to_f16_and_back", {param({2, 3, 4})}, [](const In& x) { return x[0].to(DType::f16).to(DType::f32); },
       [](const In& x) { return Ref{{2, 3, 4}, vals(x[0])}; }, kHalfUlpF16, 0.0, kF16Staircase},
      {"to_bf16_and_back", {param({2, 3, 4})}, [](const In& x) { return x[0].to(DType::bf16).to(DType::f32); },
       [](const In& x) { return Ref{{2, 3, 4}, vals(x[0])}; }, kHalfUlpBf16, 0.0, kBf16Staircase},
  };
}

// gtest prints a failing parameter; the row's name says which one.
void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// The row's inputs on the host (what the references read).
std::vector<Tensor> make_inputs(const OpCase& c) {
  Generator gen(2024);
  std::vector<Tensor> in;
  for (const Input& spec : c.inputs) {
    if (spec.kind == Input::indices) {
      in.push_back(Tensor::from_indices(spec.idx, spec.shape));
      continue;
    }
    if (spec.kind == Input::fixed) {
      Tensor t = Tensor::from_vector(spec.values, spec.shape);
      t.set_requires_grad(true);
      in.push_back(t);
      continue;
    }
    Tensor t = Tensor::randn(spec.shape, gen, 0.0f, spec.std);
    if (spec.kind == Input::positive) {
      std::vector<float> v = t.to_vector();
      for (float& e : v) e = 0.5f + std::abs(e);
      t = Tensor::from_vector(v, spec.shape);
    }
    if (spec.kind != Input::constant) t.set_requires_grad(true);
    in.push_back(t);
  }
  return in;
}

// The same inputs as leaves on `device`.
std::vector<Tensor> on_device(const std::vector<Tensor>& host, Device device) {
  if (device == Device::cpu) return host;
  std::vector<Tensor> out;
  for (const Tensor& t : host) {
    Tensor d = t.detach().to(device);
    if (t.requires_grad()) d.set_requires_grad(true);
    out.push_back(d);
  }
  return out;
}

bool device_present(Device device) {
  if (device == Device::cpu) return true;
#ifdef ZERO_HAS_CUDA
  return cuda::cuda_available();
#else
  return false;
#endif
}

// Every device this build has a backend for; rows of an absent device skip.
std::vector<Device> backends() {
#ifdef ZERO_HAS_CUDA
  return {Device::cpu, Device::cuda};
#else
  return {Device::cpu};
#endif
}

using Row = std::tuple<OpCase, Device>;
class OpTable : public ::testing::TestWithParam<Row> {
 protected:
  void SetUp() override {
    if (!device_present(std::get<1>(GetParam()))) GTEST_SKIP() << "no " << device_name(std::get<1>(GetParam()));
  }
};

TEST_P(OpTable, ForwardMatchesReference) {
  const auto& [c, device] = GetParam();
  if (!c.reference) GTEST_SKIP() << c.name << ": forward checked by its own tests";
  const std::vector<Tensor> host = make_inputs(c);
  const Tensor y = c.op(on_device(host, device));
  EXPECT_EQ(y.device(), device) << c.name << ": the output left the inputs' device";
  const Ref ref = c.reference(host);
  ASSERT_EQ(y.shape(), ref.shape);
  const std::vector<float> got = y.to_vector();
  ASSERT_EQ(got.size(), ref.v.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - ref.v[i]);
    worst = std::max(worst, err);
    EXPECT_LE(err, c.fwd_atol + c.fwd_rtol * std::abs(ref.v[i])) << c.name << " element " << i << ": got " << got[i]
                                                                  << ", reference " << ref.v[i];
  }
  RecordProperty("max_abs_error", std::to_string(worst));
}

TEST_P(OpTable, GradientMatchesCentralDifferences) {
  const auto& [c, device] = GetParam();
  const test::GradcheckResult r = test::gradcheck(c.op, on_device(make_inputs(c), device), c.grad);
  EXPECT_TRUE(r.ok) << c.name << ": " << r.message;
  EXPECT_GT(r.checked, 0);
  RecordProperty("max_error", std::to_string(r.max_error));
  std::printf("[ gradcheck] %-28s %-4s max error %.2e over %lld elements (tol %.0e)\n", c.name.c_str(),
              std::string(device_name(device)).c_str(), r.max_error, static_cast<long long>(r.checked), c.grad.tol);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::Combine(::testing::ValuesIn(op_cases()), ::testing::ValuesIn(backends())),
                         [](const ::testing::TestParamInfo<Row>& info) {
                           return std::get<0>(info.param).name + "_" + std::string(device_name(std::get<1>(info.param)));
                         });

// Every op named in the list below (the ops of autograd/ops.h and the differentiable views of
// core/tensor.h, kept by hand) has at least one row; the names are the rows' prefixes. A listed op whose
// row is removed fails here; a new op is checked only once its name is added to the list.
TEST(OpTableCoverage, EveryOpHasARow) {
  const std::vector<std::string> ops = {
      "add", "add_scalar", "sub", "mul", "mul_scalar", "div", "sqrt", "rsqrt", "exp", "log", "pow", "sum",
      "mean", "sum_to", "sum_dim", "mean_dim", "max_dim", "matmul", "linear", "embedding", "layer_norm", "gelu",
      "softmax", "causal_self_attention", "cross_entropy", "dropout", "view", "reshape", "transpose", "narrow",
      "expand", "contiguous", "to_f16", "to_bf16"};
  const std::vector<OpCase> rows = op_cases();
  for (const std::string& op : ops) {
    bool found = false;
    for (const OpCase& c : rows) found = found || c.name.rfind(op, 0) == 0;
    EXPECT_TRUE(found) << op << " has no row in the op table";
  }
}

// Note [Missing kernels]: a case a device cannot run fails with one line naming the kernel and the
// device, before writing anything (the CPU has no 16-bit GEMM operands).
TEST(Backend, MissingKernelNamesTheKernelAndTheDevice) {
  const half a(1.0f), b(2.0f);
  float c = -1.0f;
  try {
    kernels(Device::cpu)
        .gemm_ex(false, false, 1, 1, 1, 1.0f, &a, DType::f16, 1, &b, DType::f16, 1, 0.0f, &c, DType::f32, 1, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_ex with 16-bit operands: no kernel on device cpu"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c, -1.0f);  // nothing was written
}

TEST(Backend, MixedDevicesNameTheOpAndBothDevices) {
  if (!device_present(Device::cuda)) GTEST_SKIP() << "needs a cuda device";
  const Tensor a = Tensor::ones({3}), b = Tensor::ones({3}).to(Device::cuda);
  try {
    add(a, b);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add: inputs are on different devices (cpu and cuda)"), std::string::npos)
        << e.what();
  }
}

// ---- the checker itself must be able to fail ----

TEST(Gradcheck, DetectsAWrongBackward) {
  // y = 2x forward, but the recorded backward claims dy/dx = 3.
  auto wrong = [](const std::vector<Tensor>& in) {
    Tensor out = mul(in[0].detach(), 2.0f);
    autograd::record("wrong_double", {in[0]}, out, [](const Tensor& g) -> std::vector<Tensor> { return {mul(g, 3.0f)}; });
    return out;
  };
  Tensor x = Tensor::from_vector({1.0f, -2.0f, 0.5f}, {3});
  x.set_requires_grad(true);
  const test::GradcheckResult r = test::gradcheck(wrong, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_GT(r.max_error, 0.1);  // |num - ana| / max(1, |num|) = |w| / max(1, 2|w|) for output weight w
  EXPECT_FALSE(r.message.empty());
}

TEST(Gradcheck, DetectsAMissingGradient) {
  // The op records no backward at all: autograd gives no gradient, the numerical one is 2.
  auto untracked = [](const std::vector<Tensor>& in) { return mul(in[0].detach(), 2.0f); };
  Tensor x = Tensor::from_vector({1.0f, 2.0f}, {2});
  x.set_requires_grad(true);
  EXPECT_FALSE(test::gradcheck(untracked, {x}).ok);
}

TEST(Gradcheck, LeavesInputValuesAndGradientsAsTheyWere) {
  Tensor x = Tensor::from_vector({1.0f, 2.0f, 3.0f}, {3});
  x.set_requires_grad(true);
  const Tensor old_grad = Tensor::from_vector({7.0f, 8.0f, 9.0f}, {3});
  x.set_grad(old_grad);
  const auto r = test::gradcheck([](const std::vector<Tensor>& in) { return mul(in[0], in[0]); }, {x});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(x.to_vector(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_TRUE(x.grad().same(old_grad));
}

// ---- dropout's forward (its gradient is a table row) ----

TEST(Dropout, TrainingZeroesOrScalesEachElement) {
  Generator init(5);
  const Tensor x = Tensor::randn({100, 100}, init);
  Generator gen(11);
  const Tensor y = dropout(x, 0.3f, /*training=*/true, gen);
  const auto xv = x.to_vector(), yv = y.to_vector();
  std::int64_t dropped = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] == 0.0f) {
      ++dropped;
    } else {
      EXPECT_NEAR(yv[i], xv[i] / 0.7, 1e-6 * std::abs(xv[i] / 0.7)) << "element " << i;
    }
  }
  // 10,000 Bernoulli(0.3) draws: standard deviation 0.0046, so 0.3 +- 0.02 is over four sigmas.
  EXPECT_NEAR(static_cast<double>(dropped) / 10000.0, 0.3, 0.02);
}

TEST(Dropout, SameSeedGivesSameMaskOtherSeedDiffers) {
  const Tensor x = Tensor::ones({64});
  Generator g1(3), g2(3), g3(4);
  const auto a = dropout(x, 0.5f, true, g1).to_vector();
  EXPECT_EQ(a, dropout(x, 0.5f, true, g2).to_vector());
  EXPECT_NE(a, dropout(x, 0.5f, true, g3).to_vector());
}

TEST(Dropout, ZeroProbabilityAndEvalAreIdentityAndPassTheGradient) {
  const Tensor c = Tensor::from_vector({1.0f, -2.0f, 3.0f}, {3});
  for (const auto& [p, training] : {std::pair{0.0f, true}, std::pair{0.5f, false}}) {
    Tensor x = Tensor::from_vector({0.5f, 1.5f, -2.5f}, {3});
    x.set_requires_grad(true);
    Generator gen(1);
    const Tensor y = dropout(x, p, training, gen);
    EXPECT_EQ(y.to_vector(), x.to_vector()) << "p=" << p << " training=" << training;
    sum(mul(y, c)).backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().to_vector(), c.to_vector());
  }
}

TEST(Dropout, RejectsProbabilityOne) {
  Generator gen(1);
  EXPECT_THROW(dropout(Tensor::ones({2}), 1.0f, true, gen), Error);
}

}  // namespace
}  // namespace zero
