#include "autograd/ops.h"

#include <algorithm>

#include "autograd/ops_cuda.h"
#include "core/cpu/kernels.h"
#include "core/strided.h"

namespace zero {

namespace detail {

Tensor dense(const Tensor& t) { return t.is_contiguous() ? t.detach() : t.detach().clone(); }

Tensor materialize_broadcast(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return dense(t);
  const int nd = static_cast<int>(shape.size()), td = t.dim();
  Shape strides(nd, 0);
  for (int i = 0; i < td; ++i) {
    const int o = nd - td + i;
    strides[o] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return t.as_strided(shape, strides, t.offset()).clone();
}

}  // namespace detail

using autograd::record;
using detail::dense;
using detail::materialize_broadcast;

namespace {

void check_f32(const Tensor& t, const char* op, const char* what) {
  ZERO_CHECK(t.defined(), "{}: {} is undefined", op, what);
  ZERO_CHECK(t.dtype() == DType::f32, "{}: {} must be f32, got {} (convert with .to(DType::f32))", op, what,
             dtype_name(t.dtype()));
}

enum class BinaryOp { add, sub, mul };

Tensor binary(const Tensor& a, const Tensor& b, BinaryOp op, const char* name) {
  check_f32(a, name, "a");
  check_f32(b, name, "b");
  const Shape shape = broadcast_shapes(a.shape(), b.shape());
  Tensor out = Tensor::empty(shape);
  const std::int64_t n = out.numel();
  float* y = out.data<float>();
  const Tensor ad = materialize_broadcast(a, shape);
  // A trailing-suffix operand (a bias [C] against [N, C]) is read cyclically instead of copied.
  const bool b_suffix = b.is_contiguous() && b.numel() > 0 && b.dim() <= a.dim() && a.shape() == shape &&
                        std::equal(b.shape().begin(), b.shape().end(), shape.end() - b.dim());
  const Tensor bd = b_suffix ? b.detach() : materialize_broadcast(b, shape);
  const float* x0 = ad.data<float>();
  const float* x1 = bd.data<float>();
  // b is either full-size or a suffix repeated every m elements; loop over the repeats.
  const std::int64_t m = bd.numel();
  for (std::int64_t base = 0; base < n; base += m) {
    float* yb = y + base;
    const float* ab = x0 + base;
    switch (op) {
      case BinaryOp::add:
        for (std::int64_t i = 0; i < m; ++i) yb[i] = ab[i] + x1[i];
        break;
      case BinaryOp::sub:
        for (std::int64_t i = 0; i < m; ++i) yb[i] = ab[i] - x1[i];
        break;
      case BinaryOp::mul:
        for (std::int64_t i = 0; i < m; ++i) yb[i] = ab[i] * x1[i];
        break;
    }
  }
  return out;
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const std::size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (std::size_t i = 0; i < nd; ++i) {
    const std::int64_t da = i < nd - a.size() ? 1 : a[i - (nd - a.size())];
    const std::int64_t db = i < nd - b.size() ? 1 : b[i - (nd - b.size())];
    ZERO_CHECK(da == db || da == 1 || db == 1, "shapes {} and {} do not broadcast", shape_str(a), shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&a, &b})) return detail::cuda_add(a, b);  // Note [Op device dispatch]
#endif
  Tensor out = binary(a, b, BinaryOp::add, "add");
  record("add", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, sa), sum_to(g, sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&a, &b})) return detail::cuda_sub(a, b);  // Note [Op device dispatch]
#endif
  Tensor out = binary(a, b, BinaryOp::sub, "sub");
  record("sub", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, sa), mul(sum_to(g, sb), -1.0f)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&a, &b})) return detail::cuda_mul(a, b);  // Note [Op device dispatch]
#endif
  Tensor out = binary(a, b, BinaryOp::mul, "mul");
  record("mul", {a, b}, out, [a, b](const Tensor& g) -> std::vector<Tensor> {
    Tensor ga = autograd::needs_grad(a) ? sum_to(mul(g, b.detach()), a.shape()) : Tensor();
    Tensor gb = autograd::needs_grad(b) ? sum_to(mul(g, a.detach()), b.shape()) : Tensor();
    return {ga, gb};
  });
  return out;
}

Tensor mul(const Tensor& a, float s) {
  check_f32(a, "mul", "a");
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&a})) return detail::cuda_mul_scalar(a, s);  // Note [Op device dispatch]
#endif
  Tensor ad = dense(a);
  Tensor out = Tensor::empty(a.shape());
  const float* x = ad.data<float>();
  float* y = out.data<float>();
  const std::int64_t n = out.numel();
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
  record("mul_scalar", {a}, out, [s](const Tensor& g) -> std::vector<Tensor> { return {mul(g, s)}; });
  return out;
}

namespace {
// y[i] = round(float(y[i]) + float(x[i])) for f16/bf16 elements.
template <typename T> void add_16bit(T* y, const T* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(static_cast<float>(y[i]) + static_cast<float>(x[i]));
}
}  // namespace

void add_(Tensor& dst, const Tensor& src) {
  ZERO_CHECK(dst.numel() == src.numel(), "add_: {} elements {} into {} elements {}", src.numel(),
             shape_str(src.shape()), dst.numel(), shape_str(dst.shape()));
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&dst, &src})) return detail::cuda_add_(dst, src);  // Note [Op device dispatch]
#endif
  if (dst.dtype() == DType::f32 && src.dtype() == DType::f32 && dst.is_contiguous() && src.is_contiguous()) {
    float* y = dst.data<float>();
    const float* x = src.data<float>();
    const std::int64_t n = dst.numel();  // numel() multiplies the shape out: not in the loop condition
    for (std::int64_t i = 0; i < n; ++i) y[i] += x[i];
    return;
  }
  // A 16-bit gradient accumulating into a 16-bit buffer (ZeRO stages 0/1 in fp16/bf16): add in f32,
  // round once, without leaving the buffer.
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.dtype() == DType::f16) return add_16bit(dst.data<half>(), src.data<half>(), dst.numel());
    if (dst.dtype() == DType::bf16) return add_16bit(dst.data<bfloat16>(), src.data<bfloat16>(), dst.numel());
  }
  // Anything else (mixed dtypes, strided views): the same arithmetic through f32 copies.
  std::vector<float> a = dst.to_vector(), b = src.to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  dst.copy_(Tensor::from_vector(a, dst.shape()));
}

Tensor sum(const Tensor& x) {
  check_f32(x, "sum", "x");
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&x})) return detail::cuda_sum(x);  // Note [Op device dispatch]
#endif
  Tensor xd = dense(x);
  double acc = 0.0;
  const float* p = xd.data<float>();
  const std::int64_t n = xd.numel();
  for (std::int64_t i = 0; i < n; ++i) acc += p[i];
  Tensor out = Tensor::full({}, static_cast<float>(acc));
  record("sum", {x}, out, [shape = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {Tensor::full(shape, g.item())};
  });
  return out;
}

Tensor mean(const Tensor& x) { return mul(sum(x), 1.0f / static_cast<float>(std::max<std::int64_t>(1, x.numel()))); }

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  check_f32(x, "sum_to", "x");
  ZERO_CHECK(broadcast_shapes(shape, x.shape()) == x.shape(), "sum_to: {} does not broadcast to {}",
             shape_str(shape), shape_str(x.shape()));
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&x})) return detail::cuda_sum_to(x, shape);  // Note [Op device dispatch]
#endif
  Tensor out = Tensor::zeros(shape);
  // View `out` with x's shape and stride 0 on the broadcast dimensions, then accumulate through it.
  const int nd = x.dim(), od = static_cast<int>(shape.size());
  const Shape ostrides = contiguous_strides(shape);
  Shape strides(nd, 0);
  for (int i = 0; i < od; ++i) strides[nd - od + i] = shape[i] == 1 ? 0 : ostrides[i];
  Tensor xd = dense(x);
  const float* src = xd.data<float>();
  float* dst = out.data<float>();
  // A suffix of x's shape (a bias [C] or positions [T, C] under [B, T, C]): add whole contiguous blocks.
  const bool suffix = od <= nd && std::equal(shape.begin(), shape.end(), x.shape().end() - od);
  if (suffix) {
    const std::int64_t m = out.numel(), n = x.numel();
    for (std::int64_t base = 0; base < n; base += m) {
      const float* block = src + base;
#pragma omp simd
      for (std::int64_t i = 0; i < m; ++i) dst[i] += block[i];
    }
  } else {
    std::int64_t k = 0;
    for_each_offset(x.shape(), strides, 0, [&](std::int64_t off) { dst[off] += src[k++]; });
  }
  record("sum_to", {x}, out, [xs = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {g.expand(xs).contiguous()};
  });
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_f32(a, "matmul", "a");
  check_f32(b, "matmul", "b");
  ZERO_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: needs at least 2-D operands, got {} and {}", shape_str(a.shape()),
             shape_str(b.shape()));
  const std::int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const bool shared_b = b.dim() == 2;
  ZERO_CHECK(b.size(-2) == K && (shared_b || Shape(a.shape().begin(), a.shape().end() - 2) ==
                                                 Shape(b.shape().begin(), b.shape().end() - 2)),
             "matmul: shapes {} and {} do not match", shape_str(a.shape()), shape_str(b.shape()));
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&a, &b})) return detail::cuda_matmul(a, b);  // Note [Op device dispatch]
#endif
  Tensor ad = dense(a), bd = dense(b);
  Shape oshape = a.shape();
  oshape.back() = N;
  Tensor out = Tensor::empty(oshape);
  const std::int64_t batch = a.numel() / std::max<std::int64_t>(1, M * K);
  if (shared_b) {
    cpu::gemm(false, false, batch * M, N, K, 1.0f, ad.data<float>(), K, bd.data<float>(), N, 0.0f, out.data<float>(), N);
  } else {
    for (std::int64_t i = 0; i < batch; ++i)
      cpu::gemm(false, false, M, N, K, 1.0f, ad.data<float>() + i * M * K, K, bd.data<float>() + i * K * N, N, 0.0f,
                out.data<float>() + i * M * N, N);
  }
  record("matmul", {a, b}, out, [ad, bd, M, N, K, batch, shared_b](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g);
    Tensor ga = Tensor::empty(ad.shape()), gb = Tensor::empty(bd.shape());  // both fully written (beta 0)
    if (shared_b) {
      cpu::gemm(false, true, batch * M, K, N, 1.0f, gd.data<float>(), N, bd.data<float>(), N, 0.0f, ga.data<float>(), K);
      cpu::gemm(true, false, K, N, batch * M, 1.0f, ad.data<float>(), K, gd.data<float>(), N, 0.0f, gb.data<float>(), N);
    } else {
      for (std::int64_t i = 0; i < batch; ++i) {
        cpu::gemm(false, true, M, K, N, 1.0f, gd.data<float>() + i * M * N, N, bd.data<float>() + i * K * N, N, 0.0f,
                  ga.data<float>() + i * M * K, K);
        cpu::gemm(true, false, K, N, M, 1.0f, ad.data<float>() + i * M * K, K, gd.data<float>() + i * M * N, N, 0.0f,
                  gb.data<float>() + i * K * N, N);
      }
    }
    return {ga, gb};
  });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_f32(x, "linear", "input");
  check_f32(weight, "linear", "weight");
  ZERO_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
             "linear: input {} does not match weight {} ([out, in])", shape_str(x.shape()), shape_str(weight.shape()));
  const std::int64_t in = weight.size(1), out_f = weight.size(0), N = x.numel() / std::max<std::int64_t>(1, in);
  if (bias.defined()) {
    check_f32(bias, "linear", "bias");
    ZERO_CHECK(bias.shape() == Shape{out_f}, "linear: bias {} for weight {}", shape_str(bias.shape()),
               shape_str(weight.shape()));
  }
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&x, &weight, &bias})) return detail::cuda_linear(x, weight, bias);  // Note [Op device dispatch]
#endif
  Tensor xd = dense(x), wd = dense(weight), bd = bias.defined() ? dense(bias) : Tensor();
  Shape oshape = x.shape();
  oshape.back() = out_f;
  Tensor out = Tensor::empty(oshape);
  // y[N, out] = x[N, in] @ W[out, in]^T + b[out]: the bias is added as the GEMM stores its tiles.
  cpu::gemm(false, true, N, out_f, in, 1.0f, xd.data<float>(), in, wd.data<float>(), in, 0.0f, out.data<float>(), out_f,
            bias.defined() ? bd.data<float>() : nullptr);
  record("linear", {x, weight, bias}, out, [xd, wd, N, in, out_f, has_bias = bias.defined()](const Tensor& g) {
    Tensor gd = dense(g);
    Tensor gx = Tensor::empty(xd.shape()), gw = Tensor::empty(wd.shape()), gb;
    // dx[N, in] = g[N, out] @ W[out, in];  dW[out, in] = g^T @ x (g read transposed in place).
    cpu::gemm(false, false, N, in, out_f, 1.0f, gd.data<float>(), out_f, wd.data<float>(), in, 0.0f, gx.data<float>(), in);
    cpu::gemm(true, false, out_f, in, N, 1.0f, gd.data<float>(), out_f, xd.data<float>(), in, 0.0f, gw.data<float>(), in);
    if (has_bias) {
      // db[out] = sum over rows of g: row by row, so the inner loop runs along contiguous memory.
      gb = Tensor::zeros({out_f});
      float* b = gb.data<float>();
      const float* src = gd.data<float>();
      for (std::int64_t n = 0; n < N; ++n) {
        const float* row = src + n * out_f;
#pragma omp simd
        for (std::int64_t o = 0; o < out_f; ++o) b[o] += row[o];
      }
    }
    return std::vector<Tensor>{gx, gw, gb};
  });
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& idx) {
  check_f32(weight, "embedding", "weight");
  ZERO_CHECK(idx.dtype() == DType::i64, "embedding: indices must be i64, got {}", dtype_name(idx.dtype()));
  ZERO_CHECK(weight.dim() == 2, "embedding: weight must be [V, C], got {}", shape_str(weight.shape()));
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&weight, &idx})) return detail::cuda_embedding(weight, idx);  // Note [Op device dispatch]
#endif
  const std::int64_t V = weight.size(0), C = weight.size(1), N = idx.numel();
  Tensor wd = dense(weight), id = idx.is_contiguous() ? idx.detach() : idx.clone();
  Shape oshape = idx.shape();
  oshape.push_back(C);
  Tensor out = Tensor::empty(oshape);
  cpu::embedding_forward(out.data<float>(), wd.data<float>(), id.data<std::int64_t>(), N, V, C);
  record("embedding", {weight}, out, [id, V, C, N](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gw = Tensor::zeros({V, C});
    cpu::embedding_backward(gw.data<float>(), gd.data<float>(), id.data<std::int64_t>(), N, C);
    return {gw};
  });
  return out;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  check_f32(x, "layer_norm", "input");
  check_f32(weight, "layer_norm", "weight");
  check_f32(bias, "layer_norm", "bias");
  const std::int64_t C = x.size(-1), N = x.numel() / std::max<std::int64_t>(1, C);
  ZERO_CHECK(weight.shape() == Shape{C} && bias.shape() == Shape{C}, "layer_norm: weight {} / bias {} for input {}",
             shape_str(weight.shape()), shape_str(bias.shape()), shape_str(x.shape()));
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&x, &weight, &bias})) return detail::cuda_layer_norm(x, weight, bias, eps);  // Note [Op device dispatch]
#endif
  Tensor xd = dense(x), wd = dense(weight), bd = dense(bias);
  Tensor out = Tensor::empty(x.shape()), mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  cpu::layernorm_forward(out.data<float>(), mean.data<float>(), rstd.data<float>(), xd.data<float>(),
                         wd.data<float>(), bd.data<float>(), N, C, eps);
  record("layer_norm", {x, weight, bias}, out, [xd, wd, mean, rstd, N, C](const Tensor& g) {
    Tensor gd = dense(g);
    Tensor gx = Tensor::empty(xd.shape()), gw = Tensor::zeros({C}), gb = Tensor::zeros({C});
    cpu::layernorm_backward(gx.data<float>(), gw.data<float>(), gb.data<float>(), gd.data<float>(), xd.data<float>(),
                            wd.data<float>(), mean.data<float>(), rstd.data<float>(), N, C);
    return std::vector<Tensor>{gx, gw, gb};
  });
  return out;
}

Tensor gelu(const Tensor& x) {
  check_f32(x, "gelu", "input");
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&x})) return detail::cuda_gelu(x);  // Note [Op device dispatch]
#endif
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(x.shape());
  cpu::gelu_forward(out.data<float>(), xd.data<float>(), x.numel());
  record("gelu", {x}, out, [xd](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gx = Tensor::empty(xd.shape());
    cpu::gelu_backward(gx.data<float>(), xd.data<float>(), gd.data<float>(), xd.numel());
    return {gx};
  });
  return out;
}

Tensor softmax(const Tensor& x) {
  check_f32(x, "softmax", "input");
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&x})) return detail::cuda_softmax(x);  // Note [Op device dispatch]
#endif
  const std::int64_t C = x.size(-1), N = x.numel() / std::max<std::int64_t>(1, C);
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(x.shape());
  cpu::softmax_forward(out.data<float>(), xd.data<float>(), N, C);
  record("softmax", {x}, out, [y = out.detach(), N, C](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gx = Tensor::empty(y.shape());
    cpu::softmax_backward(gx.data<float>(), y.data<float>(), gd.data<float>(), N, C);
    return {gx};
  });
  return out;
}

Tensor causal_self_attention(const Tensor& qkv, std::int64_t n_head) {
  check_f32(qkv, "causal_self_attention", "qkv");
  ZERO_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "causal_self_attention: qkv must be [B, T, 3C], got {}",
             shape_str(qkv.shape()));
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  ZERO_CHECK(n_head > 0 && C % n_head == 0, "causal_self_attention: {} channels do not split into {} heads", C, n_head);
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&qkv})) return detail::cuda_causal_self_attention(qkv, n_head);  // Note [Op device dispatch]
#endif
  Tensor qd = dense(qkv);
  Tensor out = Tensor::empty({B, T, C}), att = Tensor::empty({B, n_head, T, T});
  cpu::attention_forward(out.data<float>(), att.data<float>(), qd.data<float>(), B, T, C, n_head);
  record("causal_self_attention", {qkv}, out, [qd, att, B, T, C, n_head](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gqkv = Tensor::empty(qd.shape());
    cpu::attention_backward(gqkv.data<float>(), gd.data<float>(), qd.data<float>(), att.data<float>(), B, T, C, n_head);
    return {gqkv};
  });
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  check_f32(logits, "cross_entropy", "logits");
  ZERO_CHECK(targets.dtype() == DType::i64, "cross_entropy: targets must be i64, got {}", dtype_name(targets.dtype()));
  ZERO_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
             "cross_entropy: logits must be [N, V] and targets [N], got {} and {}", shape_str(logits.shape()),
             shape_str(targets.shape()));
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&logits, &targets})) return detail::cuda_cross_entropy(logits, targets);  // Note [Op device dispatch]
#endif
  const std::int64_t N = logits.size(0), V = logits.size(1);
  Tensor ld = dense(logits), td = targets.is_contiguous() ? targets.detach() : targets.clone();
  Tensor probs = Tensor::empty({N, V});
  const float loss = cpu::cross_entropy_forward(probs.data<float>(), ld.data<float>(), td.data<std::int64_t>(), N, V);
  Tensor out = Tensor::full({}, loss);
  record("cross_entropy", {logits}, out, [probs, td, N, V](const Tensor& g) -> std::vector<Tensor> {
    Tensor gl = Tensor::empty({N, V});
    cpu::cross_entropy_backward(gl.data<float>(), probs.data<float>(), td.data<std::int64_t>(), g.item(), N, V);
    return {gl};
  });
  return out;
}

Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  ZERO_CHECK(p >= 0.0f && p < 1.0f, "dropout: probability must be in [0, 1), got {}", p);
  if (!training || p == 0.0f) return x;
  check_f32(x, "dropout", "input");
#ifdef ZERO_HAS_CUDA
  if (detail::any_cuda({&x})) return detail::cuda_dropout(x, p, gen);  // Note [Op device dispatch]
#endif
  Tensor mask = Tensor::empty(x.shape());
  float* m = mask.data<float>();
  const float keep = 1.0f / (1.0f - p);
  for (std::int64_t i = 0; i < mask.numel(); ++i) m[i] = gen.uniform() < p ? 0.0f : keep;
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = mul(x, mask);
  }
  record("dropout", {x}, out, [mask](const Tensor& g) -> std::vector<Tensor> { return {mul(g, mask)}; });
  return out;
}

}  // namespace zero
