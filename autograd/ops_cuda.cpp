// The CUDA twins of autograd/ops.cpp (Note [Op device dispatch] in autograd/ops_cuda.h). Shapes and
// dtypes were validated by the op in ops.cpp before it dispatched here; what is left to check is that
// every input is on cuda. Tensors created here live on cuda; every kernel runs on the current stream.
#ifdef ZERO_HAS_CUDA

#include "autograd/ops_cuda.h"

#include <algorithm>

#include "autograd/ops.h"
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"

namespace zero::detail {

using autograd::record;

namespace {

constexpr Device kCuda = Device::cuda;

void check_cuda(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    ZERO_CHECK(!t->defined() || t->device() == Device::cuda,
               "{}: inputs are on different devices (one on cuda, one on {}); move them with .to(Device)", op,
               t->device() == Device::cpu ? "cpu" : "cuda");
  }
}

float* f32(const Tensor& t) { return t.data<float>(); }

Tensor binary(const Tensor& a, const Tensor& b, cuda::BinaryOp op, const char* name) {
  check_cuda(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, DType::f32, kCuda);
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  const Tensor ad = materialize_broadcast(a, shape);
  // A trailing-suffix operand (a bias [C] against [N, C]) is read cyclically by the kernel.
  const bool b_suffix = b.is_contiguous() && b.numel() > 0 && b.dim() <= a.dim() && a.shape() == shape &&
                        std::equal(b.shape().begin(), b.shape().end(), shape.end() - b.dim());
  const Tensor bd = b_suffix ? b.detach() : materialize_broadcast(b, shape);
  cuda::binary(f32(out), f32(ad), f32(bd), n, bd.numel(), op);
  return out;
}

}  // namespace

Tensor cuda_add(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, cuda::BinaryOp::add, "add");
  record("add", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, sa), sum_to(g, sb)};
  });
  return out;
}

Tensor cuda_sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, cuda::BinaryOp::sub, "sub");
  record("sub", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, sa), mul(sum_to(g, sb), -1.0f)};
  });
  return out;
}

Tensor cuda_mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary(a, b, cuda::BinaryOp::mul, "mul");
  record("mul", {a, b}, out, [a, b](const Tensor& g) -> std::vector<Tensor> {
    Tensor ga = autograd::needs_grad(a) ? sum_to(mul(g, b.detach()), a.shape()) : Tensor();
    Tensor gb = autograd::needs_grad(b) ? sum_to(mul(g, a.detach()), b.shape()) : Tensor();
    return {ga, gb};
  });
  return out;
}

Tensor cuda_mul_scalar(const Tensor& a, float s) {
  check_cuda("mul", {&a});
  Tensor ad = dense(a);
  Tensor out = Tensor::empty(a.shape(), DType::f32, kCuda);
  cuda::scale(out.raw_data(), ad.raw_data(), DType::f32, s, out.numel());
  record("mul_scalar", {a}, out, [s](const Tensor& g) -> std::vector<Tensor> { return {mul(g, s)}; });
  return out;
}

void cuda_add_(Tensor& dst, const Tensor& src) {
  check_cuda("add_", {&dst, &src});
  const Tensor s = src.is_contiguous() ? src : src.clone();
  if (dst.is_contiguous()) {
    cuda::accumulate(dst.raw_data(), dst.dtype(), s.raw_data(), s.dtype(), 1.0f, dst.numel());
    return;
  }
  Tensor d = dst.clone();
  cuda::accumulate(d.raw_data(), d.dtype(), s.raw_data(), s.dtype(), 1.0f, d.numel());
  dst.copy_(d);
}

Tensor cuda_sum(const Tensor& x) {
  check_cuda("sum", {&x});
  Tensor xd = dense(x);
  // Deterministic fp64 reduction, like the CPU loop (the order differs, so the last bits may too).
  const double acc = xd.numel() ? cuda::sum(xd.raw_data(), DType::f32, xd.numel()) : 0.0;
  Tensor out = Tensor::full({}, static_cast<float>(acc), DType::f32, kCuda);
  record("sum", {x}, out, [shape = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    // g[] broadcast to every element, without a round trip through the host.
    return {g.detach().expand(shape).contiguous()};
  });
  return out;
}

Tensor cuda_sum_to(const Tensor& x, const Shape& shape) {
  check_cuda("sum_to", {&x});
  // Leading ones do not change the layout: [1, C] sums like [C].
  Shape core = shape;
  while (!core.empty() && core.front() == 1) core.erase(core.begin());
  const int nd = x.dim(), cd = static_cast<int>(core.size());
  const bool suffix = cd <= nd && std::equal(core.begin(), core.end(), x.shape().end() - cd);
  Tensor out;
  if (suffix) {
    out = Tensor::empty(shape, DType::f32, kCuda);
    const std::int64_t m = out.numel();
    Tensor xd = dense(x);
    if (m > 0) cuda::sum_rows(f32(out), f32(xd), x.numel() / m, m, false);
  } else {
    // Reductions over inner dimensions (rare in the models here): on the host, then back.
    autograd::NoGradGuard no_grad;
    out = sum_to(x.detach().to(Device::cpu), shape).to(kCuda);
  }
  record("sum_to", {x}, out, [xs = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {g.expand(xs).contiguous()};
  });
  return out;
}

Tensor cuda_matmul(const Tensor& a, const Tensor& b) {
  check_cuda("matmul", {&a, &b});
  const std::int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const bool shared_b = b.dim() == 2;
  Tensor ad = dense(a), bd = dense(b);
  Shape oshape = a.shape();
  oshape.back() = N;
  Tensor out = Tensor::empty(oshape, DType::f32, kCuda);
  const std::int64_t batch = a.numel() / std::max<std::int64_t>(1, M * K);
  if (shared_b) {
    cuda::gemm(false, false, batch * M, N, K, 1.0f, f32(ad), K, f32(bd), N, 0.0f, f32(out), N);
  } else {
    cuda::gemm_strided_batched(false, false, M, N, K, 1.0f, f32(ad), K, M * K, f32(bd), N, K * N, 0.0f, f32(out), N,
                               M * N, batch);
  }
  record("matmul", {a, b}, out, [ad, bd, M, N, K, batch, shared_b](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g);
    Tensor ga = Tensor::empty(ad.shape(), DType::f32, kCuda), gb = Tensor::empty(bd.shape(), DType::f32, kCuda);
    if (shared_b) {
      cuda::gemm(false, true, batch * M, K, N, 1.0f, f32(gd), N, f32(bd), N, 0.0f, f32(ga), K);
      cuda::gemm(true, false, K, N, batch * M, 1.0f, f32(ad), K, f32(gd), N, 0.0f, f32(gb), N);
    } else {
      cuda::gemm_strided_batched(false, true, M, K, N, 1.0f, f32(gd), N, M * N, f32(bd), N, K * N, 0.0f, f32(ga), K,
                                 M * K, batch);
      cuda::gemm_strided_batched(true, false, K, N, M, 1.0f, f32(ad), K, M * K, f32(gd), N, M * N, 0.0f, f32(gb), N,
                                 K * N, batch);
    }
    return {ga, gb};
  });
  return out;
}

Tensor cuda_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_cuda("linear", {&x, &weight, &bias});
  const std::int64_t in = weight.size(1), out_f = weight.size(0), N = x.numel() / std::max<std::int64_t>(1, in);
  Tensor xd = dense(x), wd = dense(weight), bd = bias.defined() ? dense(bias) : Tensor();
  Shape oshape = x.shape();
  oshape.back() = out_f;
  Tensor out = Tensor::empty(oshape, DType::f32, kCuda);
  // y[N, out] = x[N, in] @ W[out, in]^T + b[out]
  cuda::gemm(false, true, N, out_f, in, 1.0f, f32(xd), in, f32(wd), in, 0.0f, f32(out), out_f,
             bias.defined() ? f32(bd) : nullptr);
  record("linear", {x, weight, bias}, out, [xd, wd, N, in, out_f, has_bias = bias.defined()](const Tensor& g) {
    Tensor gd = dense(g);
    Tensor gx = Tensor::empty(xd.shape(), DType::f32, kCuda), gw = Tensor::empty(wd.shape(), DType::f32, kCuda), gb;
    // dx[N, in] = g[N, out] @ W[out, in];  dW[out, in] = g^T @ x;  db[out] = column sums of g.
    cuda::gemm(false, false, N, in, out_f, 1.0f, f32(gd), out_f, f32(wd), in, 0.0f, f32(gx), in);
    cuda::gemm(true, false, out_f, in, N, 1.0f, f32(gd), out_f, f32(xd), in, 0.0f, f32(gw), in);
    if (has_bias) {
      gb = Tensor::empty({out_f}, DType::f32, kCuda);
      cuda::sum_rows(f32(gb), f32(gd), N, out_f, false);
    }
    return std::vector<Tensor>{gx, gw, gb};
  });
  return out;
}

Tensor cuda_embedding(const Tensor& weight, const Tensor& idx) {
  check_cuda("embedding", {&weight, &idx});
  const std::int64_t V = weight.size(0), C = weight.size(1), N = idx.numel();
  Tensor wd = dense(weight), id = idx.is_contiguous() ? idx.detach() : idx.clone();
  Shape oshape = idx.shape();
  oshape.push_back(C);
  Tensor out = Tensor::empty(oshape, DType::f32, kCuda);
  cuda::embedding_forward(f32(out), f32(wd), id.data<std::int64_t>(), N, V, C);
  record("embedding", {weight}, out, [id, V, C, N](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gw = Tensor::zeros({V, C}, DType::f32, kCuda);
    cuda::embedding_backward(f32(gw), f32(gd), id.data<std::int64_t>(), N, C, V);
    return {gw};
  });
  return out;
}

Tensor cuda_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  check_cuda("layer_norm", {&x, &weight, &bias});
  const std::int64_t C = x.size(-1), N = x.numel() / std::max<std::int64_t>(1, C);
  Tensor xd = dense(x), wd = dense(weight), bd = dense(bias);
  Tensor out = Tensor::empty(x.shape(), DType::f32, kCuda), mean = Tensor::empty({N}, DType::f32, kCuda),
         rstd = Tensor::empty({N}, DType::f32, kCuda);
  cuda::layernorm_forward(f32(out), f32(mean), f32(rstd), f32(xd), f32(wd), f32(bd), N, C, eps);
  record("layer_norm", {x, weight, bias}, out, [xd, wd, mean, rstd, N, C](const Tensor& g) {
    Tensor gd = dense(g);
    Tensor gx = Tensor::empty(xd.shape(), DType::f32, kCuda), gw = Tensor::zeros({C}, DType::f32, kCuda),
           gb = Tensor::zeros({C}, DType::f32, kCuda);
    cuda::layernorm_backward(f32(gx), f32(gw), f32(gb), f32(gd), f32(xd), f32(wd), f32(mean), f32(rstd), N, C);
    return std::vector<Tensor>{gx, gw, gb};
  });
  return out;
}

Tensor cuda_gelu(const Tensor& x) {
  check_cuda("gelu", {&x});
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(x.shape(), DType::f32, kCuda);
  cuda::gelu_forward(f32(out), f32(xd), x.numel());
  record("gelu", {x}, out, [xd](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gx = Tensor::empty(xd.shape(), DType::f32, kCuda);
    cuda::gelu_backward(f32(gx), f32(xd), f32(gd), xd.numel());
    return {gx};
  });
  return out;
}

Tensor cuda_softmax(const Tensor& x) {
  check_cuda("softmax", {&x});
  const std::int64_t C = x.size(-1), N = x.numel() / std::max<std::int64_t>(1, C);
  Tensor xd = dense(x);
  Tensor out = Tensor::empty(x.shape(), DType::f32, kCuda);
  cuda::softmax_forward(f32(out), f32(xd), N, C);
  record("softmax", {x}, out, [y = out.detach(), N, C](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gx = Tensor::empty(y.shape(), DType::f32, kCuda);
    cuda::softmax_backward(f32(gx), f32(y), f32(gd), N, C);
    return {gx};
  });
  return out;
}

Tensor cuda_causal_self_attention(const Tensor& qkv, std::int64_t n_head) {
  check_cuda("causal_self_attention", {&qkv});
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  Tensor qd = dense(qkv);
  Tensor out = Tensor::empty({B, T, C}, DType::f32, kCuda), att = Tensor::empty({B, n_head, T, T}, DType::f32, kCuda);
  cuda::attention_forward(f32(out), f32(att), f32(qd), B, T, C, n_head);
  record("causal_self_attention", {qkv}, out, [qd, att, B, T, C, n_head](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gqkv = Tensor::empty(qd.shape(), DType::f32, kCuda);
    cuda::attention_backward(f32(gqkv), f32(gd), f32(qd), f32(att), B, T, C, n_head);
    return {gqkv};
  });
  return out;
}

Tensor cuda_cross_entropy(const Tensor& logits, const Tensor& targets) {
  check_cuda("cross_entropy", {&logits, &targets});
  const std::int64_t N = logits.size(0), V = logits.size(1);
  Tensor ld = dense(logits), td = targets.is_contiguous() ? targets.detach() : targets.clone();
  Tensor probs = Tensor::empty({N, V}, DType::f32, kCuda);
  // The loss stays on the device: no synchronization per step (bad targets surface at the next
  // check_device_errors(), e.g. when the caller reads the loss with item()).
  Tensor out = Tensor::empty({}, DType::f32, kCuda);
  cuda::cross_entropy_forward_async(f32(out), f32(probs), f32(ld), td.data<std::int64_t>(), N, V);
  record("cross_entropy", {logits}, out, [probs, td, N, V](const Tensor& g) -> std::vector<Tensor> {
    Tensor gd = dense(g), gl = Tensor::empty({N, V}, DType::f32, kCuda);
    cuda::cross_entropy_backward(f32(gl), f32(probs), td.data<std::int64_t>(), f32(gd), N, V);
    return {gl};
  });
  return out;
}

Tensor cuda_dropout(const Tensor& x, float p, Generator& gen) {
  check_cuda("dropout", {&x});
  // The mask is drawn on the device from one 64-bit seed taken from `gen` (so runs repeat, but the
  // mask differs from the CPU's, which draws every element from gen).
  Tensor mask = Tensor::empty(x.shape(), DType::f32, kCuda);
  cuda::dropout_mask(f32(mask), gen.engine()(), p, mask.numel());
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = mul(x, mask);
  }
  record("dropout", {x}, out, [mask](const Tensor& g) -> std::vector<Tensor> { return {mul(g, mask)}; });
  return out;
}

}  // namespace zero::detail

#endif  // ZERO_HAS_CUDA
