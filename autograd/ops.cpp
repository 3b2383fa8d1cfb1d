#include "autograd/ops.h"

#include <algorithm>

#include "core/gemm_precision.h"
#include "core/kernels.h"

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

Device op_device(const char* op, std::initializer_list<const Tensor*> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (!t->defined()) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    ZERO_CHECK(t->device() == first->device(),
               "{}: inputs are on different devices ({} and {}); move them with .to(Device)", op,
               device_name(first->device()), device_name(t->device()));
  }
  return first == nullptr ? Device::cpu : first->device();
}

}  // namespace detail

using autograd::record;
using detail::dense;
using detail::materialize_broadcast;
using detail::op_device;

namespace {

void check_f32(const Tensor& t, const char* op, const char* what) {
  ZERO_CHECK(t.defined(), "{}: {} is undefined", op, what);
  ZERO_CHECK(t.dtype() == DType::f32, "{}: {} must be f32, got {} (convert with .to(DType::f32))", op, what,
             dtype_name(t.dtype()));
}

float* f32(const Tensor& t) { return t.data<float>(); }

// `t` (dense) in dtype `to`, not tracked: a GEMM operand rounded once (Note [Tensor cores for 16-bit models]).
Tensor operand(const Tensor& t, DType to) {
  autograd::NoGradGuard no_grad;
  return t.dtype() == to ? dense(t) : dense(t).to(to);
}

void check_float(const Tensor& t, const char* op, const char* what) {
  ZERO_CHECK(t.defined(), "{}: {} is undefined", op, what);
  ZERO_CHECK(is_floating(t.dtype()), "{}: {} must be f32, f16 or bf16, got {}", op, what, dtype_name(t.dtype()));
}

// The forward of add/sub/mul/div: both operands broadcast to one shape.
Tensor binary(const Tensor& a, const Tensor& b, BinaryOp op, const char* name) {
  check_f32(a, name, "a");
  check_f32(b, name, "b");
  const Device dev = op_device(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, DType::f32, dev);
  if (out.numel() == 0) return out;
  const Tensor ad = materialize_broadcast(a, shape);
  // A trailing-suffix operand (a bias [C] against [N, C]) is read cyclically instead of copied.
  const bool b_suffix = b.is_contiguous() && b.numel() > 0 && b.dim() <= a.dim() && a.shape() == shape &&
                        std::equal(b.shape().begin(), b.shape().end(), shape.end() - b.dim());
  const Tensor bd = b_suffix ? b.detach() : materialize_broadcast(b, shape);
  kernels(dev).binary(f32(out), f32(ad), f32(bd), out.numel(), bd.numel(), op);
  return out;
}

// The forward of the elementwise functions of one tensor.
Tensor unary(const Tensor& x, UnaryOp op, float p, const char* name) {
  check_f32(x, name, "input");
  const Device dev = op_device(name, {&x});
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(x.shape(), DType::f32, dev);
  if (out.numel() > 0) kernels(dev).unary(f32(out), f32(xd), out.numel(), op, p);
  return out;
}

// x viewed as [outer, n, inner] around dimension `dim`.
struct DimSplit {
  std::int64_t outer = 1, n = 1, inner = 1;
  Shape out_shape;   // without the dimension, or with it as 1 when keepdim
  Shape keep_shape;  // with it as 1
};

DimSplit split_at(const Tensor& x, int dim, bool keepdim, const char* op) {
  const int nd = x.dim();
  const int d = dim < 0 ? dim + nd : dim;
  ZERO_CHECK(d >= 0 && d < nd, "{}: dimension {} out of range for shape {}", op, dim, shape_str(x.shape()));
  DimSplit s;
  for (int i = 0; i < nd; ++i) {
    const std::int64_t size = x.shape()[i];
    if (i < d) s.outer *= size;
    if (i > d) s.inner *= size;
    if (i == d) s.n = size;
    s.keep_shape.push_back(i == d ? 1 : size);
    if (i != d || keepdim) s.out_shape.push_back(i == d ? 1 : size);
  }
  return s;
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

// ---- elementwise ----

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, BinaryOp::add, "add");
  record("add", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, sa), sum_to(g, sb)};
  });
  return out;
}

Tensor add(const Tensor& a, float s) {
  return add(a, Tensor::full({}, s, DType::f32, a.defined() ? a.device() : Device::cpu));
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, BinaryOp::sub, "sub");
  record("sub", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, sa), mul(sum_to(g, sb), -1.0f)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
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
  const Device dev = op_device("mul", {&a});
  Tensor ad = dense(a);
  Tensor out = Tensor::empty(a.shape(), DType::f32, dev);
  if (out.numel() > 0) kernels(dev).scale(f32(out), f32(ad), DType::f32, out.numel(), s);
  record("mul_scalar", {a}, out, [s](const Tensor& g) -> std::vector<Tensor> { return {mul(g, s)}; });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, BinaryOp::div, "div");
  // d(a/b)/da = 1/b; d(a/b)/db = -a/b² = -(a/b)/b.
  record("div", {a, b}, out, [a, b, y = out.detach()](const Tensor& g) -> std::vector<Tensor> {
    Tensor ga = autograd::needs_grad(a) ? sum_to(div(g, b.detach()), a.shape()) : Tensor();
    Tensor gb = autograd::needs_grad(b) ? sum_to(mul(div(mul(g, y), b.detach()), -1.0f), b.shape()) : Tensor();
    return {ga, gb};
  });
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary(x, UnaryOp::sqrt, 0.0f, "sqrt");
  record("sqrt", {x}, out, [y = out.detach()](const Tensor& g) -> std::vector<Tensor> {
    return {div(mul(g, 0.5f), y)};  // d sqrt(x) = 1 / (2 sqrt(x))
  });
  return out;
}

Tensor rsqrt(const Tensor& x) {
  Tensor out = unary(x, UnaryOp::rsqrt, 0.0f, "rsqrt");
  record("rsqrt", {x}, out, [y = out.detach()](const Tensor& g) -> std::vector<Tensor> {
    return {mul(mul(g, mul(y, mul(y, y))), -0.5f)};  // d x^(-1/2) = -x^(-3/2) / 2
  });
  return out;
}

Tensor exp(const Tensor& x) {
  Tensor out = unary(x, UnaryOp::exp, 0.0f, "exp");
  record("exp", {x}, out, [y = out.detach()](const Tensor& g) -> std::vector<Tensor> { return {mul(g, y)}; });
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = unary(x, UnaryOp::log, 0.0f, "log");
  record("log", {x}, out, [xd = x.detach()](const Tensor& g) -> std::vector<Tensor> { return {div(g, xd)}; });
  return out;
}

Tensor pow(const Tensor& x, float p) {
  Tensor out = unary(x, UnaryOp::pow, p, "pow");
  record("pow", {x}, out, [xd = x.detach(), p](const Tensor& g) -> std::vector<Tensor> {
    return {mul(mul(g, pow(xd, p - 1.0f)), p)};
  });
  return out;
}

void add_(Tensor& dst, const Tensor& src) {
  ZERO_CHECK(dst.numel() == src.numel(), "add_: {} elements {} into {} elements {}", src.numel(),
             shape_str(src.shape()), dst.numel(), shape_str(dst.shape()));
  const Device dev = op_device("add_", {&dst, &src});
  ZERO_CHECK(is_floating(dst.dtype()) && is_floating(src.dtype()), "add_: needs float tensors, got {} += {}",
             dtype_name(dst.dtype()), dtype_name(src.dtype()));
  if (dst.numel() == 0) return;
  // Added in f32 and rounded once to dst's dtype (a 16-bit gradient accumulates without leaving its buffer).
  const Tensor s = dense(src);
  if (dst.is_contiguous()) {
    kernels(dev).accumulate(dst.raw_data(), dst.dtype(), s.raw_data(), s.dtype(), dst.numel());
    return;
  }
  Tensor d = dst.clone();
  kernels(dev).accumulate(d.raw_data(), d.dtype(), s.raw_data(), s.dtype(), d.numel());
  dst.copy_(d);
}

// ---- reductions ----

Tensor sum(const Tensor& x) {
  check_f32(x, "sum", "x");
  const Device dev = op_device("sum", {&x});
  Tensor xd = dense(x);
  Tensor out = Tensor::empty({}, DType::f32, dev);
  kernels(dev).sum(f32(out), f32(xd), xd.numel());
  record("sum", {x}, out, [shape = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {g.detach().expand(shape).contiguous()};  // g[] broadcast to every element
  });
  return out;
}

Tensor mean(const Tensor& x) { return mul(sum(x), 1.0f / static_cast<float>(std::max<std::int64_t>(1, x.numel()))); }

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  check_f32(x, "sum", "x");
  const Device dev = op_device("sum", {&x});
  const DimSplit s = split_at(x, dim, keepdim, "sum");
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(s.out_shape, DType::f32, dev);
  if (out.numel() > 0) kernels(dev).reduce_dim(f32(out), nullptr, f32(xd), s.outer, s.n, s.inner, ReduceOp::sum);
  record("sum_dim", {x}, out, [keep = s.keep_shape, xs = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {g.reshape(keep).expand(xs).contiguous()};
  });
  return out;
}

Tensor mean(const Tensor& x, int dim, bool keepdim) {
  const DimSplit s = split_at(x, dim, keepdim, "mean");
  return mul(sum(x, dim, keepdim), 1.0f / static_cast<float>(std::max<std::int64_t>(1, s.n)));
}

Tensor max(const Tensor& x, int dim, bool keepdim) {
  check_f32(x, "max", "x");
  const Device dev = op_device("max", {&x});
  const DimSplit s = split_at(x, dim, keepdim, "max");
  ZERO_CHECK(s.n > 0, "max: dimension {} of shape {} is empty", dim, shape_str(x.shape()));
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(s.out_shape, DType::f32, dev);
  Tensor argmax = Tensor::empty(s.out_shape, DType::i64, dev);
  if (out.numel() > 0)
    kernels(dev).reduce_dim(f32(out), argmax.data<std::int64_t>(), f32(xd), s.outer, s.n, s.inner, ReduceOp::max);
  record("max_dim", {x}, out, [argmax, s, xs = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gx = Tensor::empty(xs, DType::f32, g.device());
    if (gx.numel() > 0)
      kernels(g.device()).scatter_dim(f32(gx), f32(gd), argmax.data<std::int64_t>(), s.outer, s.n, s.inner);
    return {gx};
  });
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  check_f32(x, "sum_to", "x");
  ZERO_CHECK(broadcast_shapes(shape, x.shape()) == x.shape(), "sum_to: {} does not broadcast to {}",
             shape_str(shape), shape_str(x.shape()));
  const Device dev = op_device("sum_to", {&x});
  Tensor out = Tensor::empty(shape, DType::f32, dev);
  Tensor xd = dense(x);
  if (out.numel() > 0) kernels(dev).sum_to(f32(out), f32(xd), x.shape(), shape);
  record("sum_to", {x}, out, [xs = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {g.expand(xs).contiguous()};
  });
  return out;
}

// ---- linear algebra ----

namespace {
// matmul of operands already in the GEMM dtype `gt`: f32, or 16-bit on a device with 16-bit GEMMs. The
// output and the gradients' GEMMs accumulate in fp32; y and both gradients come out in f32 (a 16-bit
// leaf's AccumulateGrad rounds its gradient once; an f32 operand's gradient passes its `to` node
// unrounded). One body, so the backward is written once for every dtype.
Tensor matmul_gemm(const Tensor& a, const Tensor& b, DType gt, std::int64_t M, std::int64_t N, std::int64_t K,
                 bool shared_b) {
  const Device dev = a.device();
  Kernels& be = kernels(dev);
  Tensor ad = dense(a), bd = dense(b);
  Shape oshape = a.shape();
  oshape.back() = N;
  const std::int64_t batch = a.numel() / std::max<std::int64_t>(1, M * K);
  // A checkpointed segment's re-run may hand back the output it kept (Note [Save or recompute]).
  Tensor out = autograd::kept_output("matmul", oshape);
  if (!out.defined()) {
    out = Tensor::empty(oshape, DType::f32, dev);
    if (shared_b)
      be.gemm_ex(false, false, batch * M, N, K, 1.0f, ad.raw_data(), gt, K, bd.raw_data(), gt, N, 0.0f,
                 out.raw_data(), DType::f32, N, nullptr);
    else
      be.gemm_batched_ex(false, false, M, N, K, 1.0f, ad.raw_data(), gt, K, M * K, bd.raw_data(), gt, N, K * N,
                         0.0f, out.raw_data(), DType::f32, N, M * N, batch);
  }
  record("matmul", {a, b}, out, [&be, ad, bd, gt, M, N, K, batch, shared_b](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = operand(g, gt);
    Tensor ga = Tensor::empty(ad.shape(), DType::f32, ad.device());
    Tensor gb = Tensor::empty(bd.shape(), DType::f32, bd.device());
    if (shared_b) {
      be.gemm_ex(false, true, batch * M, K, N, 1.0f, gd.raw_data(), gt, N, bd.raw_data(), gt, N, 0.0f, ga.raw_data(),
                 DType::f32, K, nullptr);
      be.gemm_ex(true, false, K, N, batch * M, 1.0f, ad.raw_data(), gt, K, gd.raw_data(), gt, N, 0.0f, gb.raw_data(),
                 DType::f32, N, nullptr);
    } else {
      be.gemm_batched_ex(false, true, M, K, N, 1.0f, gd.raw_data(), gt, N, M * N, bd.raw_data(), gt, N, K * N, 0.0f,
                         ga.raw_data(), DType::f32, K, M * K, batch);
      be.gemm_batched_ex(true, false, K, N, M, 1.0f, ad.raw_data(), gt, K, M * K, gd.raw_data(), gt, N, M * N, 0.0f,
                         gb.raw_data(), DType::f32, N, K * N, batch);
    }
    return {ga, gb};
  });
  return out;
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_float(a, "matmul", "a");
  check_float(b, "matmul", "b");
  ZERO_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: needs at least 2-D operands, got {} and {}", shape_str(a.shape()),
             shape_str(b.shape()));
  const std::int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const bool shared_b = b.dim() == 2;
  ZERO_CHECK(b.size(-2) == K && (shared_b || Shape(a.shape().begin(), a.shape().end() - 2) ==
                                                 Shape(b.shape().begin(), b.shape().end() - 2)),
             "matmul: shapes {} and {} do not match", shape_str(a.shape()), shape_str(b.shape()));
  const Device dev = op_device("matmul", {&a, &b});
  if (a.dtype() != DType::f32 || b.dtype() != DType::f32) {
    // A 16-bit operand: on a device with 16-bit GEMMs both operands go in that dtype (an f32 one is
    // rounded to it; f16 with bf16 is ambiguous); elsewhere both go in f32, as `to` would convert them.
    const DType half_t = a.dtype() != DType::f32 ? a.dtype() : b.dtype();
    ZERO_CHECK(a.dtype() == DType::f32 || b.dtype() == DType::f32 || a.dtype() == b.dtype(),
               "matmul: operands are {} and {}; convert one with .to()", dtype_name(a.dtype()), dtype_name(b.dtype()));
    const DType gt = gemm_operand_dtype(dev, half_t);
    const Tensor ac = a.dtype() == gt ? a : a.to(gt), bc = b.dtype() == gt ? b : b.to(gt);
    return matmul_gemm(ac, bc, gt, M, N, K, shared_b);
  }
  return matmul_gemm(a, b, DType::f32, M, N, K, shared_b);
}

namespace {
// linear with the weight read by the GEMM as it is: f32, or 16-bit on a device with 16-bit GEMMs (tensor
// cores; Note [Tensor cores for 16-bit models]). x and the incoming gradient are rounded to the weight's
// dtype once (a no-op for f32); y and dx come out in f32, dW in the weight's dtype (the fp32 accumulator
// rounded once, as the `to` node of a compute copy would round an f32 dW). bias is f32 or undefined.
// y[N, out] = x[N, in] @ W[out, in]^T + b (the bias added as the GEMM stores its tiles);
// dx = g @ W; dW = g^T @ x (g read transposed in place); db = column sums of g. One body for every dtype.
Tensor linear_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t N, std::int64_t in,
                   std::int64_t out_f) {
  const DType wt = weight.dtype();
  const Device dev = weight.device();
  Kernels& be = kernels(dev);
  Tensor xh = operand(x, wt), wd = dense(weight), bd = bias.defined() ? dense(bias) : Tensor();
  Shape oshape = x.shape();
  oshape.back() = out_f;
  // A checkpointed segment's re-run may hand back the output it kept (Note [Save or recompute]).
  Tensor out = autograd::kept_output("linear", oshape);
  if (!out.defined()) {
    out = Tensor::empty(oshape, DType::f32, dev);
    be.gemm_ex(false, true, N, out_f, in, 1.0f, xh.raw_data(), wt, in, wd.raw_data(), wt, in, 0.0f, out.raw_data(),
               DType::f32, out_f, bias.defined() ? f32(bd) : nullptr);
  }
  record("linear", {x, weight, bias}, out, [&be, xh, wd, wt, N, in, out_f, has_bias = bias.defined()](const Tensor& g) {
    Tensor gd = dense(g), gh = operand(gd, wt);
    Tensor gx = Tensor::empty(xh.shape(), DType::f32, xh.device());
    Tensor gw = Tensor::empty(wd.shape(), wt, wd.device()), gb;
    be.gemm_ex(false, false, N, in, out_f, 1.0f, gh.raw_data(), wt, out_f, wd.raw_data(), wt, in, 0.0f, gx.raw_data(),
               DType::f32, in, nullptr);
    be.gemm_ex(true, false, out_f, in, N, 1.0f, gh.raw_data(), wt, out_f, xh.raw_data(), wt, in, 0.0f, gw.raw_data(),
               wt, in, nullptr);
    if (has_bias) {
      gb = Tensor::empty({out_f}, DType::f32, gd.device());
      be.sum_rows(f32(gb), f32(gd), N, out_f);  // from the f32 gradient
    }
    return std::vector<Tensor>{gx, gw, gb};
  });
  return out;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_f32(x, "linear", "input");
  check_float(weight, "linear", "weight");
  ZERO_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
             "linear: input {} does not match weight {} ([out, in])", shape_str(x.shape()), shape_str(weight.shape()));
  const std::int64_t in = weight.size(1), out_f = weight.size(0), N = x.numel() / std::max<std::int64_t>(1, in);
  if (bias.defined()) {
    check_float(bias, "linear", "bias");
    ZERO_CHECK(bias.shape() == Shape{out_f}, "linear: bias {} for weight {}", shape_str(bias.shape()),
               shape_str(weight.shape()));
  }
  const Device dev = op_device("linear", {&x, &weight, &bias});
  // A 16-bit bias is added in f32 (a vector: its conversion is negligible next to the GEMM).
  if (bias.defined() && bias.dtype() != DType::f32) return linear(x, weight, bias.to(DType::f32));
  if (weight.dtype() != DType::f32) {
    const DType gt = gemm_operand_dtype(dev, weight.dtype());
    // No 16-bit GEMM here (cpu): the f32 copy's GEMM, as a layer's compute copy would (Note [Compute copies]).
    if (gt == DType::f32) return linear(x, weight.to(DType::f32), bias);
  }
  return linear_gemm(x, weight, bias, N, in, out_f);
}

// ---- neural-network ops ----

Tensor embedding(const Tensor& weight, const Tensor& idx) {
  check_f32(weight, "embedding", "weight");
  ZERO_CHECK(idx.dtype() == DType::i64, "embedding: indices must be i64, got {}", dtype_name(idx.dtype()));
  ZERO_CHECK(weight.dim() == 2, "embedding: weight must be [V, C], got {}", shape_str(weight.shape()));
  const Device dev = op_device("embedding", {&weight, &idx});
  const std::int64_t V = weight.size(0), C = weight.size(1), N = idx.numel();
  Tensor wd = dense(weight), id = dense(idx);
  Shape oshape = idx.shape();
  oshape.push_back(C);
  Tensor out = Tensor::empty(oshape, DType::f32, dev);
  kernels(dev).embedding_forward(f32(out), f32(wd), id.data<std::int64_t>(), N, V, C);
  record("embedding", {weight}, out, [id, V, C, N](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gw = Tensor::zeros({V, C}, DType::f32, g.device());
    kernels(g.device()).embedding_backward(f32(gw), f32(gd), id.data<std::int64_t>(), N, V, C);
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
  const Device dev = op_device("layer_norm", {&x, &weight, &bias});
  Tensor xd = dense(x), wd = dense(weight), bd = dense(bias);
  Tensor out = Tensor::empty(x.shape(), DType::f32, dev), mean = Tensor::empty({N}, DType::f32, dev),
         rstd = Tensor::empty({N}, DType::f32, dev);
  kernels(dev).layernorm_forward(f32(out), f32(mean), f32(rstd), f32(xd), f32(wd), f32(bd), N, C, eps);
  record("layer_norm", {x, weight, bias}, out, [xd, wd, mean, rstd, N, C](const Tensor& g) {
    const Device d = g.device();
    Tensor gd = dense(g);
    Tensor gx = Tensor::empty(xd.shape(), DType::f32, d), gw = Tensor::zeros({C}, DType::f32, d),
           gb = Tensor::zeros({C}, DType::f32, d);
    kernels(d).layernorm_backward(f32(gx), f32(gw), f32(gb), f32(gd), f32(xd), f32(wd), f32(mean), f32(rstd), N, C);
    return std::vector<Tensor>{gx, gw, gb};
  });
  return out;
}

Tensor gelu(const Tensor& x) {
  check_f32(x, "gelu", "input");
  const Device dev = op_device("gelu", {&x});
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(x.shape(), DType::f32, dev);
  kernels(dev).gelu_forward(f32(out), f32(xd), x.numel());
  record("gelu", {x}, out, [xd](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gx = Tensor::empty(xd.shape(), DType::f32, g.device());
    kernels(g.device()).gelu_backward(f32(gx), f32(xd), f32(gd), xd.numel());
    return {gx};
  });
  return out;
}

Tensor softmax(const Tensor& x) {
  check_f32(x, "softmax", "input");
  const Device dev = op_device("softmax", {&x});
  const std::int64_t C = x.size(-1), N = x.numel() / std::max<std::int64_t>(1, C);
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(x.shape(), DType::f32, dev);
  kernels(dev).softmax_forward(f32(out), f32(xd), N, C);
  record("softmax", {x}, out, [y = out.detach(), N, C](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gx = Tensor::empty(y.shape(), DType::f32, g.device());
    kernels(g.device()).softmax_backward(f32(gx), f32(y), f32(gd), N, C);
    return {gx};
  });
  return out;
}

Tensor causal_self_attention(const Tensor& qkv, std::int64_t n_head, DType gemm_dtype) {
  check_f32(qkv, "causal_self_attention", "qkv");
  ZERO_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "causal_self_attention: qkv must be [B, T, 3C], got {}",
             shape_str(qkv.shape()));
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  ZERO_CHECK(n_head > 0 && C % n_head == 0, "causal_self_attention: {} channels do not split into {} heads", C, n_head);
  ZERO_CHECK(is_floating(gemm_dtype), "causal_self_attention: GEMM dtype must be f32, f16 or bf16, got {}",
             dtype_name(gemm_dtype));
  const Device dev = op_device("causal_self_attention", {&qkv});
  // f32 unless the device has 16-bit GEMMs (cpu: always f32, today's kernel).
  const DType gt = gemm_operand_dtype(dev, gemm_dtype);
  Tensor qd = dense(qkv);
  Tensor out = Tensor::empty({B, T, C}, DType::f32, dev), att = Tensor::empty({B, n_head, T, T}, DType::f32, dev);
  if (gt == DType::f32)
    kernels(dev).attention_forward(f32(out), f32(att), f32(qd), B, T, C, n_head);
  else
    kernels(dev).attention_forward_ex(f32(out), f32(att), f32(qd), B, T, C, n_head, gt);
  record("causal_self_attention", {qkv}, out, [qd, att, B, T, C, n_head, gt](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gqkv = Tensor::empty(qd.shape(), DType::f32, g.device());
    if (gt == DType::f32)
      kernels(g.device()).attention_backward(f32(gqkv), f32(gd), f32(qd), f32(att), B, T, C, n_head);
    else
      kernels(g.device()).attention_backward_ex(f32(gqkv), f32(gd), f32(qd), f32(att), B, T, C, n_head, gt);
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
  const Device dev = op_device("cross_entropy", {&logits, &targets});
  const std::int64_t N = logits.size(0), V = logits.size(1);
  Tensor ld = dense(logits), td = dense(targets);
  Tensor probs = Tensor::empty({N, V}, DType::f32, dev);
  // The loss stays on the op's device: on cuda no synchronization per step (a bad target surfaces at the
  // next check_device_errors(), e.g. when the caller reads the loss with item()).
  Tensor out = Tensor::empty({}, DType::f32, dev);
  kernels(dev).cross_entropy_forward(f32(out), f32(probs), f32(ld), td.data<std::int64_t>(), N, V);
  record("cross_entropy", {logits}, out, [probs, td, N, V](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gl = Tensor::empty({N, V}, DType::f32, g.device());
    kernels(g.device()).cross_entropy_backward(f32(gl), f32(probs), td.data<std::int64_t>(), f32(gd), N, V);
    return {gl};
  });
  return out;
}

Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  ZERO_CHECK(p >= 0.0f && p < 1.0f, "dropout: probability must be in [0, 1), got {}", p);
  if (!training || p == 0.0f) return x;
  check_f32(x, "dropout", "input");
  const Device dev = op_device("dropout", {&x});
  // cpu draws every element from gen; cuda draws one 64-bit seed from it and hashes (seed, i), so runs
  // repeat on either device but the masks differ between them.
  Tensor mask = Tensor::empty(x.shape(), DType::f32, dev);
  autograd::note_random_use(gen);  // a checkpointed segment replays the draws (Note [Save or recompute])
  if (mask.numel() > 0) kernels(dev).dropout_mask(f32(mask), gen, p, mask.numel());
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = mul(x, mask);
  }
  record("dropout", {x}, out, [mask](const Tensor& g) -> std::vector<Tensor> { return {mul(g, mask)}; });
  return out;
}

}  // namespace zero
