// The CUDA host entries of core/backend.def and core/kernels.def (CudaBackend, core/cuda/backend.h), but
// for the GEMMs (blas.cpp) and memory (backend.cpp), and the CUDA-only helpers of core/cuda/kernels.h:
// argument checks, scratch buffers and the order of launches. The device code is in elementwise.cu,
// ops.cu and nn.cu.
#include "core/cuda/kernels.h"

#include <climits>
#include <cmath>

#include "core/check.h"
#include "core/cuda/backend.h"
#include "core/cuda/launch.h"
#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace zero::cuda {

namespace {

using detail::Elem;

static_assert(static_cast<int>(DType::f32) == static_cast<int>(Elem::f32) &&
                  static_cast<int>(DType::f16) == static_cast<int>(Elem::f16) &&
                  static_cast<int>(DType::bf16) == static_cast<int>(Elem::bf16) &&
                  static_cast<int>(DType::i32) == static_cast<int>(Elem::i32) &&
                  static_cast<int>(DType::i64) == static_cast<int>(Elem::i64),
              "detail::Elem must mirror zero::DType");
static_assert(kEmbeddingIndexOutOfRange == detail::kEmbeddingIndexBit &&
                  kCrossEntropyTargetOutOfRange == detail::kCrossEntropyTargetBit,
              "device error bits must agree between runtime.h and launch.h");

Elem elem(DType t) { return static_cast<Elem>(static_cast<int>(t)); }

void check_float(DType t, const char* what) {
  ZERO_CHECK(is_floating(t), "{}: dtype {} is not a float type (f32, f16, bf16)", what, dtype_name(t));
}

// A row length the kernels index with int.
int as_int(std::int64_t v, const char* what) {
  ZERO_CHECK(v >= 0 && v <= INT_MAX, "{}: size {} outside [0, 2^31)", what, v);
  return static_cast<int>(v);
}

void check_count(std::int64_t n, const char* what) { ZERO_CHECK(n >= 0, "{}: negative size {}", what, n); }

}  // namespace

// ---- neural-network kernels ----------------------------------------------------------------------------

void CudaBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                    const float* bias, std::int64_t N, std::int64_t C, float eps) {
  check_count(N, "layernorm_forward");
  detail::launch_layernorm_forward(out, mean, rstd, inp, weight, bias, N, as_int(C, "layernorm_forward"), eps,
                                   current_stream());
}

void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                     const float* weight, const float* mean, const float* rstd, std::int64_t N,
                                     std::int64_t C) {
  check_count(N, "layernorm_backward");
  const int c = as_int(C, "layernorm_backward");
  if (N == 0 || c == 0) return;
  cudaStream_t s = current_stream();
  detail::launch_layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, c, s);
  const int groups = detail::layernorm_param_groups(N);
  DeviceBuffer partials(sizeof(float) * 2 * static_cast<std::size_t>(groups) * c);
  float* part_dw = partials.as<float>();
  float* part_db = part_dw + static_cast<std::size_t>(groups) * c;
  detail::launch_layernorm_backward_params(part_dw, part_db, groups, dout, inp, mean, rstd, N, c, s);
  detail::launch_column_finalize(dweight, part_dw, groups, c, s);
  detail::launch_column_finalize(dbias, part_db, groups, c, s);
}

void CudaBackend::gelu_forward(float* out, const float* inp, std::int64_t n) {
  check_count(n, "gelu_forward");
  detail::launch_gelu_forward(out, inp, n, current_stream());
}

void CudaBackend::gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  check_count(n, "gelu_backward");
  detail::launch_gelu_backward(dinp, inp, dout, n, current_stream());
}

void CudaBackend::softmax_forward(float* out, const float* inp, std::int64_t N, std::int64_t C) {
  check_count(N, "softmax_forward");
  detail::launch_softmax_forward(out, inp, N, as_int(C, "softmax_forward"), current_stream());
}

void CudaBackend::softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, std::int64_t C) {
  check_count(N, "softmax_backward");
  detail::launch_softmax_backward(dinp, out, dout, N, as_int(C, "softmax_backward"), current_stream());
}

namespace {
struct AttentionDims {
  int B, T, H, D;
  std::int64_t BH, TD, TT, n;  // heads, elements per head of q/k/v, of att, elements of one q/k/v
};

AttentionDims attention_dims(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H, const char* what) {
  ZERO_CHECK(H > 0 && C % H == 0, "{}: C = {} is not a multiple of H = {}", what, C, H);
  AttentionDims d{};
  d.B = as_int(B, what);
  d.T = as_int(T, what);
  d.H = as_int(H, what);
  d.D = as_int(C / H, what);
  d.BH = B * H;
  d.TD = T * (C / H);
  d.TT = T * T;
  d.n = B * T * C;
  return d;
}
}  // namespace

// Note [Attention on the GPU]
// The CPU kernel runs one head at a time straight out of qkv's strided layout. cuBLAS batches need a
// constant stride between heads, which [B, T, 3C] does not have across both b and h, so q, k and v are
// first gathered head-major ([B, H, T, D], as llm.c does); then each product is ONE strided-batched
// GEMM over all B*H heads, and the causal softmax runs in place on the scores in `att`. Products over
// the masked upper triangle are computed and thrown away: at T = 256 that wastes less than a
// FlashAttention-style kernel would save in a first version, and keeps this code next to the CPU one.
namespace {
// A GEMM operand in the attention's GEMM dtype: the f32 buffer itself, or a copy rounded to 16 bits.
class Operand {
 public:
  Operand(const float* x, std::int64_t n, DType dtype) : dtype_(dtype), ptr_(x) {
    if (dtype == DType::f32) return;
    copy_ = DeviceBuffer(dtype_size(dtype) * static_cast<std::size_t>(n));
    cast(copy_.get(), dtype, x, DType::f32, n);
    ptr_ = copy_.get();
  }
  const void* get() const { return ptr_; }
  DType dtype() const { return dtype_; }

 private:
  DType dtype_;
  const void* ptr_;
  DeviceBuffer copy_;
};

// out[batch x [M, N]] (f32) = alpha * op(a) op(b) over strided batches of the attention's operands.
void batched(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const Operand& a,
             std::int64_t lda, std::int64_t sa, const Operand& b, std::int64_t ldb, std::int64_t sb, float* out,
             std::int64_t ldc, std::int64_t sc, std::int64_t batch) {
  cuda_backend().gemm_batched_ex(ta, tb, M, N, K, alpha, a.get(), a.dtype(), lda, sa, b.get(), b.dtype(), ldb, sb, 0.0f,
                                 out, DType::f32, ldc, sc, batch);
}

void check_gemm_dtype(DType t, const char* what) {
  ZERO_CHECK(t == DType::f32 || t == DType::f16 || t == DType::bf16, "{}: GEMM dtype must be f32, f16 or bf16, got {}",
             what, dtype_name(t));
}
}  // namespace

void CudaBackend::attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T,
                                    std::int64_t C, std::int64_t H) {
  attention_forward_ex(out, att, qkv, B, T, C, H, DType::f32);
}

void CudaBackend::attention_forward_ex(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T,
                                       std::int64_t C, std::int64_t H, DType gemm_dtype) {
  const AttentionDims d = attention_dims(B, T, C, H, "attention_forward");
  check_gemm_dtype(gemm_dtype, "attention_forward");
  if (d.n == 0) return;
  cudaStream_t s = current_stream();
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(d.n);
  DeviceBuffer q(bytes), k(bytes), v(bytes), y(bytes);
  detail::launch_rows_to_heads(q.as<float>(), qkv, 3 * C, d.B, d.T, d.H, d.D, s);
  detail::launch_rows_to_heads(k.as<float>(), qkv + C, 3 * C, d.B, d.T, d.H, d.D, s);
  detail::launch_rows_to_heads(v.as<float>(), qkv + 2 * C, 3 * C, d.B, d.T, d.H, d.D, s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  // att = scale * q k^T  ([T,T] per head)
  {
    const Operand qo(q.as<float>(), d.n, gemm_dtype), ko(k.as<float>(), d.n, gemm_dtype);
    batched(false, true, T, T, d.D, scale, qo, d.D, d.TD, ko, d.D, d.TD, att, T, d.TT, d.BH);
  }
  detail::launch_causal_softmax_forward(att, d.BH * T, d.T, s);
  // y = att v  ([T,D] per head); the probabilities are rounded to gemm_dtype as the GEMM's operand only
  const Operand ao(att, d.BH * d.TT, gemm_dtype), vo(v.as<float>(), d.n, gemm_dtype);
  batched(false, false, T, d.D, T, 1.0f, ao, T, d.TT, vo, d.D, d.TD, y.as<float>(), d.D, d.TD, d.BH);
  detail::launch_heads_to_rows(out, C, y.as<float>(), d.B, d.T, d.H, d.D, s);
}

void CudaBackend::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                                     std::int64_t T, std::int64_t C, std::int64_t H) {
  attention_backward_ex(dqkv, dout, qkv, att, B, T, C, H, DType::f32);
}

void CudaBackend::attention_backward_ex(float* dqkv, const float* dout, const float* qkv, const float* att,
                                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t H,
                                        DType gemm_dtype) {
  const AttentionDims d = attention_dims(B, T, C, H, "attention_backward");
  check_gemm_dtype(gemm_dtype, "attention_backward");
  if (d.n == 0) return;
  cudaStream_t s = current_stream();
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(d.n);
  DeviceBuffer q(bytes), k(bytes), v(bytes), dy(bytes), dq(bytes), dk(bytes), dv(bytes);
  DeviceBuffer datt(sizeof(float) * static_cast<std::size_t>(d.BH * d.TT));
  detail::launch_rows_to_heads(q.as<float>(), qkv, 3 * C, d.B, d.T, d.H, d.D, s);
  detail::launch_rows_to_heads(k.as<float>(), qkv + C, 3 * C, d.B, d.T, d.H, d.D, s);
  detail::launch_rows_to_heads(v.as<float>(), qkv + 2 * C, 3 * C, d.B, d.T, d.H, d.D, s);
  detail::launch_rows_to_heads(dy.as<float>(), dout, C, d.B, d.T, d.H, d.D, s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  // dv = att^T dy ; datt = dy v^T
  {
    const Operand ao(att, d.BH * d.TT, gemm_dtype), dyo(dy.as<float>(), d.n, gemm_dtype),
        vo(v.as<float>(), d.n, gemm_dtype);
    batched(true, false, T, d.D, T, 1.0f, ao, T, d.TT, dyo, d.D, d.TD, dv.as<float>(), d.D, d.TD, d.BH);
    batched(false, true, T, T, d.D, 1.0f, dyo, d.D, d.TD, vo, d.D, d.TD, datt.as<float>(), T, d.TT, d.BH);
  }
  // softmax backward on the causal rows (f32), folding in the score scale
  detail::launch_causal_softmax_backward(datt.as<float>(), att, d.BH * T, d.T, scale, s);
  // dq = dscores k ; dk = dscores^T q
  {
    const Operand dso(datt.as<float>(), d.BH * d.TT, gemm_dtype), ko(k.as<float>(), d.n, gemm_dtype),
        qo(q.as<float>(), d.n, gemm_dtype);
    batched(false, false, T, d.D, T, 1.0f, dso, T, d.TT, ko, d.D, d.TD, dq.as<float>(), d.D, d.TD, d.BH);
    batched(true, false, T, d.D, T, 1.0f, dso, T, d.TT, qo, d.D, d.TD, dk.as<float>(), d.D, d.TD, d.BH);
  }
  detail::launch_heads_to_rows(dqkv, 3 * C, dq.as<float>(), d.B, d.T, d.H, d.D, s);
  detail::launch_heads_to_rows(dqkv + C, 3 * C, dk.as<float>(), d.B, d.T, d.H, d.D, s);
  detail::launch_heads_to_rows(dqkv + 2 * C, 3 * C, dv.as<float>(), d.B, d.T, d.H, d.D, s);
}

void CudaBackend::cross_entropy_forward(float* loss, float* probs, const float* logits, const std::int64_t* targets,
                                        std::int64_t N, std::int64_t V) {
  check_count(N, "cross_entropy_forward");
  const int v = as_int(V, "cross_entropy_forward");
  ZERO_CHECK(N > 0 && v > 0, "cross_entropy_forward: empty logits [{}, {}]", N, V);
  cudaStream_t s = current_stream();
  DeviceBuffer losses(sizeof(float) * static_cast<std::size_t>(N));
  const int blocks = detail::reduction_blocks(N);
  DeviceBuffer partials(sizeof(double) * static_cast<std::size_t>(blocks));
  detail::launch_cross_entropy_forward(probs, losses.as<float>(), logits, targets, N, v, device_error_flag(), s);
  detail::launch_sum_partials(partials.as<double>(), blocks, losses.get(), Elem::f32, N, false, s);
  detail::launch_sum_finalize(nullptr, loss, partials.as<double>(), blocks, 1.0 / static_cast<double>(N), false, s);
}

void CudaBackend::cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets,
                                         const float* dloss, std::int64_t N, std::int64_t V) {
  check_count(N, "cross_entropy_backward");
  ZERO_CHECK(dloss != nullptr, "cross_entropy_backward: null dloss");
  detail::launch_cross_entropy_backward(dlogits, probs, targets, 0.0f, dloss, N, as_int(V, "cross_entropy_backward"),
                                        current_stream());
}

void CudaBackend::embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N,
                                    std::int64_t V, std::int64_t C) {
  check_count(N, "embedding_forward");
  check_count(V, "embedding_forward");
  detail::launch_embedding_forward(out, weight, idx, N, V, as_int(C, "embedding_forward"), device_error_flag(),
                                   current_stream());
}

/// Indices outside [0, V) are skipped (embedding_forward reported them).
void CudaBackend::embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N,
                                     std::int64_t V, std::int64_t C) {
  check_count(N, "embedding_backward");
  detail::launch_embedding_backward(dweight, dout, idx, N, V, as_int(C, "embedding_backward"), current_stream());
}

// ---- elementwise ------------------------------------------------------------------------------------

void CudaBackend::binary(float* out, const float* a, const float* b, std::int64_t n, std::int64_t m, BinaryOp op) {
  check_count(n, "binary");
  if (n == 0) return;
  ZERO_CHECK(m > 0 && n % m == 0, "binary: operand of {} elements does not repeat evenly into {}", m, n);
  detail::launch_binary(out, a, b, n, m, static_cast<int>(op), current_stream());
}

void CudaBackend::unary(float* out, const float* x, std::int64_t n, UnaryOp op, float p) {
  check_count(n, "unary");
  detail::launch_unary(out, x, n, static_cast<int>(op), p, current_stream());
}

void CudaBackend::reduce_dim(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                             std::int64_t inner, ReduceOp op) {
  const bool max = op == ReduceOp::max;
  check_count(outer, "reduce_dim");
  check_count(n, "reduce_dim");
  check_count(inner, "reduce_dim");
  ZERO_CHECK(!max || (n > 0 && argmax != nullptr), "reduce_dim: max needs a non-empty dimension and argmax");
  detail::launch_reduce_dim(out, argmax, x, outer, n, inner, max ? 1 : 0, current_stream());
}

void CudaBackend::scatter_dim(float* dx, const float* g, const std::int64_t* argmax, std::int64_t outer, std::int64_t n,
                              std::int64_t inner) {
  check_count(outer, "scatter_dim");
  check_count(n, "scatter_dim");
  check_count(inner, "scatter_dim");
  detail::launch_scatter_dim(dx, g, argmax, outer, n, inner, current_stream());
}

void copy_rows(float* out, const float* row, std::int64_t N, std::int64_t C) {
  check_count(N, "copy_rows");
  check_count(C, "copy_rows");
  detail::launch_copy_rows(out, row, N, C, current_stream());
}

void CudaBackend::dropout_mask(float* mask, Generator& gen, float p, std::int64_t n) {
  ZERO_CHECK(p >= 0.0f && p < 1.0f, "dropout_mask: probability must be in [0, 1), got {}", p);
  check_count(n, "dropout_mask");
  // One 64-bit seed from gen, hashed with each index on the device (the mask differs from the CPU's).
  detail::launch_dropout_mask(mask, gen.engine()(), p, n, current_stream());
}

void CudaBackend::scale(void* out, const void* x, DType dtype, std::int64_t n, float s) {
  check_float(dtype, "scale");
  check_count(n, "scale");
  detail::launch_scale(out, x, elem(dtype), s, n, current_stream());
}

void CudaBackend::fill(void* dst, DType dtype, float value, std::int64_t n) {
  check_count(n, "fill");
  detail::launch_fill(dst, elem(dtype), value, n, current_stream());
}

void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) {
  check_count(n, "cast");
  if (dst_dtype == src_dtype) {
    copy_async(dst, src, static_cast<std::size_t>(n) * dtype_size(dst_dtype));
    return;
  }
  check_float(dst_dtype, "cast");
  check_float(src_dtype, "cast");
  detail::launch_cast(dst, elem(dst_dtype), src, elem(src_dtype), n, current_stream());
}

void CudaBackend::accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) {
  check_float(dst_dtype, "accumulate");
  check_float(src_dtype, "accumulate");
  check_count(n, "accumulate");
  detail::launch_accumulate(dst, elem(dst_dtype), src, elem(src_dtype), 1.0f, n, current_stream());
}

void strided_copy(void* dst_base, const std::vector<std::int64_t>& dst_strides, std::int64_t dst_offset,
                  const void* src_base, const std::vector<std::int64_t>& src_strides, std::int64_t src_offset,
                  const std::vector<std::int64_t>& shape, std::size_t elem_size) {
  const std::size_t nd = shape.size();
  ZERO_CHECK(nd <= static_cast<std::size_t>(detail::kMaxDims), "strided_copy: {} dimensions (at most {})", nd,
             detail::kMaxDims);
  ZERO_CHECK(dst_strides.size() == nd && src_strides.size() == nd, "strided_copy: strides and shape differ in rank");
  detail::StridedLayout layout{};
  layout.ndim = static_cast<int>(nd);
  std::int64_t n = 1;
  for (std::size_t i = 0; i < nd; ++i) {
    ZERO_CHECK(shape[i] >= 0, "strided_copy: negative dimension");
    layout.shape[i] = shape[i];
    layout.src_strides[i] = src_strides[i];
    layout.dst_strides[i] = dst_strides[i];
    n *= shape[i];
  }
  if (n == 0) return;
  const auto esize = static_cast<std::int64_t>(elem_size);
  void* dst = static_cast<char*>(dst_base) + dst_offset * esize;
  const void* src = static_cast<const char*>(src_base) + src_offset * esize;
  detail::launch_strided_copy(dst, src, static_cast<int>(elem_size), layout, n, current_stream());
}

namespace {
char* first_element(const StridedView& v) {
  return static_cast<char*>(v.base) + v.offset * static_cast<std::int64_t>(dtype_size(v.dtype));
}
}  // namespace

void CudaBackend::copy(const StridedView& dst, const StridedView& src) {
  const std::int64_t n = shape_numel(dst.shape);
  if (n == 0) return;
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dst.dtype);
  // `s`: a contiguous buffer of dst's dtype holding src's elements in row-major order.
  const void* s = first_element(src);
  DeviceBuffer dense, converted, fresh;  // freed in stream order, after the copies below
  if (!is_contiguous(src.shape, src.strides)) {
    dense = DeviceBuffer(static_cast<std::size_t>(n) * dtype_size(src.dtype));
    strided_copy(dense.get(), contiguous_strides(src.shape), 0, src.base, src.strides, src.offset, src.shape,
                 dtype_size(src.dtype));
    s = dense.get();
  }
  if (src.dtype != dst.dtype) {
    converted = DeviceBuffer(bytes);
    cast(converted.get(), dst.dtype, s, src.dtype, n);
    s = converted.get();
  } else if (s == first_element(src) && src.base == dst.base) {  // views of one buffer may overlap; cudaMemcpy must not
    fresh = DeviceBuffer(bytes);
    copy_async(fresh.get(), s, bytes);
    s = fresh.get();
  }
  if (is_contiguous(dst.shape, dst.strides)) {
    copy_async(first_element(dst), s, bytes);
  } else {
    strided_copy(dst.base, dst.strides, dst.offset, s, contiguous_strides(dst.shape), 0, dst.shape,
                 dtype_size(dst.dtype));
  }
}

// ---- reductions --------------------------------------------------------------------------------------

namespace {
// *dst_d (device) = or += the sum (of squares) of x.
void reduce_into(double* dst_d, bool accumulate, const void* x, DType dtype, std::int64_t n, bool squares) {
  cudaStream_t s = current_stream();
  const int blocks = detail::reduction_blocks(n);
  DeviceBuffer partials(sizeof(double) * static_cast<std::size_t>(blocks));
  detail::launch_sum_partials(partials.as<double>(), blocks, x, elem(dtype), n, squares, s);
  detail::launch_sum_finalize(dst_d, nullptr, partials.as<double>(), blocks, 1.0, accumulate, s);
}

double reduce_to_host(const void* x, DType dtype, std::int64_t n, bool squares, const char* what) {
  check_float(dtype, what);
  check_count(n, what);
  if (n == 0) return 0.0;
  DeviceBuffer result(sizeof(double));
  reduce_into(result.as<double>(), false, x, dtype, n, squares);
  double host = 0.0;
  cuda::copy(&host, result.get(), sizeof(double));
  return host;
}
}  // namespace

double sum(const void* x, DType dtype, std::int64_t n) { return reduce_to_host(x, dtype, n, false, "sum"); }

void CudaBackend::sum(float* out, const float* x, std::int64_t n) {
  check_count(n, "sum");
  if (n == 0) return fill(out, DType::f32, 0.0f, 1);
  cudaStream_t s = current_stream();
  const int blocks = detail::reduction_blocks(n);
  DeviceBuffer partials(sizeof(double) * static_cast<std::size_t>(blocks));  // freed in stream order
  detail::launch_sum_partials(partials.as<double>(), blocks, x, elem(DType::f32), n, false, s);
  detail::launch_sum_finalize(nullptr, out, partials.as<double>(), blocks, 1.0, false, s);
}

double CudaBackend::sum_squares(const void* x, DType dtype, std::int64_t n) {
  return reduce_to_host(x, dtype, n, true, "sum_squares");
}

void sum_squares_async(double* acc, const void* x, DType dtype, std::int64_t n) {
  check_float(dtype, "sum_squares_async");
  check_count(n, "sum_squares_async");
  if (n == 0) return;
  reduce_into(acc, true, x, dtype, n, true);
}

bool CudaBackend::has_inf_or_nan(const void* x, DType dtype, std::int64_t n) {
  check_float(dtype, "has_inf_or_nan");
  check_count(n, "has_inf_or_nan");
  if (n == 0) return false;
  DeviceBuffer flag(sizeof(int));
  memset_async(flag.get(), 0, sizeof(int));
  detail::launch_nonfinite(flag.as<int>(), x, elem(dtype), n, current_stream());
  int host = 0;
  cuda::copy(&host, flag.get(), sizeof(int));
  return host != 0;
}

void has_inf_or_nan_async(int* flag, const void* x, DType dtype, std::int64_t n) {
  check_float(dtype, "has_inf_or_nan_async");
  check_count(n, "has_inf_or_nan_async");
  detail::launch_nonfinite(flag, x, elem(dtype), n, current_stream());
}

// ---- AdamW ---------------------------------------------------------------------------------------------

void CudaBackend::adamw_update(float* master, const void* grad, DType grad_dtype, float grad_factor, float* exp_avg,
                               float* exp_avg_sq, void* model_out, DType model_dtype, std::int64_t n,
                               const AdamWScalars& s) {
  check_float(grad_dtype, "adamw_update");
  if (model_out != nullptr) check_float(model_dtype, "adamw_update");
  check_count(n, "adamw_update");
  detail::launch_adamw(master, grad, elem(grad_dtype), grad_factor, exp_avg, exp_avg_sq, model_out,
                       elem(model_out != nullptr ? model_dtype : DType::f32), n, s, current_stream());
}

}  // namespace zero::cuda
