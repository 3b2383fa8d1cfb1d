// The CUDA backend (core/backend.h) over core/cuda/kernels.h: every kernel runs asynchronously on the
// current stream (core/cuda/runtime.h). Where the CUDA kernel's contract differs from the interface
// (the dropout seed, the bias gradient through cuBLAS), the adaptation is here and nowhere else.
#include <algorithm>
#include <vector>

#include "core/backend.h"
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#include "core/cuda/sum_to_plan.h"
#include "core/tensor.h"

namespace zero::cuda {

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend() : Backend(Device::cuda) {}

  void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
            std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
            const float* bias) override {
    cuda::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
  }
  void gemm_batched(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                    const float* A, std::int64_t lda, std::int64_t stride_a, const float* B, std::int64_t ldb,
                    std::int64_t stride_b, float beta, float* C, std::int64_t ldc, std::int64_t stride_c,
                    std::int64_t batch) override {
    cuda::gemm_strided_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                               stride_c, batch);
  }

  void gemm_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const void* A,
               DType a_dtype, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float beta, void* C,
               DType c_dtype, std::int64_t ldc, const float* bias) override {
    cuda::gemm_ex(trans_a, trans_b, M, N, K, alpha, A, a_dtype, lda, B, b_dtype, ldb, beta, C, c_dtype, ldc, bias);
  }
  void gemm_batched_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                       const void* A, DType a_dtype, std::int64_t lda, std::int64_t stride_a, const void* B,
                       DType b_dtype, std::int64_t ldb, std::int64_t stride_b, float beta, void* C, DType c_dtype,
                       std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) override {
    cuda::gemm_strided_batched_ex(trans_a, trans_b, M, N, K, alpha, A, a_dtype, lda, stride_a, B, b_dtype, ldb,
                                  stride_b, beta, C, c_dtype, ldc, stride_c, batch);
  }
  void attention_forward_ex(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                            std::int64_t H, DType gemm_dtype) override {
    cuda::attention_forward(out, att, qkv, B, T, C, H, gemm_dtype);
  }
  void attention_backward_ex(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                             std::int64_t T, std::int64_t C, std::int64_t H, DType gemm_dtype) override {
    cuda::attention_backward(dqkv, dout, qkv, att, B, T, C, H, gemm_dtype);
  }

  void binary(float* out, const float* a, const float* b, std::int64_t n, std::int64_t m, BinaryOp op) override {
    cuda::binary(out, a, b, n, m, op);
  }
  void unary(float* out, const float* x, std::int64_t n, UnaryOp op, float p) override {
    cuda::unary(out, x, n, op, p);
  }
  void scale(float* out, const float* x, std::int64_t n, float s) override {
    cuda::scale(out, x, DType::f32, s, n);
  }
  void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) override {
    cuda::accumulate(dst, dst_dtype, src, src_dtype, 1.0f, n);
  }
  void dropout_mask(float* mask, Generator& gen, float p, std::int64_t n) override {
    // One 64-bit seed from gen, hashed with each index on the device (the mask differs from the CPU's).
    cuda::dropout_mask(mask, gen.engine()(), p, n);
  }

  void sum(float* out, const float* x, std::int64_t n) override { cuda::sum_async(out, x, n); }
  void sum_rows(float* out, const float* x, std::int64_t N, std::int64_t C) override {
    cuda::sum_rows(out, x, N, C, false);
  }
  void sum_to(float* out, const float* x, const Shape& x_shape, const Shape& shape) override {
    const std::int64_t m = shape_numel(shape), n = shape_numel(x_shape);
    switch (detail::plan_sum_to(x_shape, shape)) {
      case detail::SumToPlan::copy: cuda::copy_async(out, x, static_cast<std::size_t>(n) * sizeof(float)); return;
      case detail::SumToPlan::rows: cuda::sum_rows(out, x, n / std::max<std::int64_t>(1, m), m, false); return;
      case detail::SumToPlan::host: break;
    }
    // Reductions over inner dimensions (rare in the models here): on the host, then back.
    std::vector<float> hx(static_cast<std::size_t>(n)), hy(static_cast<std::size_t>(m));
    cuda::copy(hx.data(), x, hx.size() * sizeof(float));
    cpu::cpu_backend().sum_to(hy.data(), hx.data(), x_shape, shape);
    cuda::copy(out, hy.data(), hy.size() * sizeof(float));
  }
  void reduce_dim(float* out, std::int64_t* argmax, const float* x, std::int64_t outer, std::int64_t n,
                  std::int64_t inner, ReduceOp op) override {
    cuda::reduce_dim(out, argmax, x, outer, n, inner, op == ReduceOp::max);
  }
  void scatter_dim(float* dx, const float* g, const std::int64_t* argmax, std::int64_t outer, std::int64_t n,
                   std::int64_t inner) override {
    cuda::scatter_dim(dx, g, argmax, outer, n, inner);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, std::int64_t N, std::int64_t C, float eps) override {
    cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, std::int64_t N,
                          std::int64_t C) override {
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, std::int64_t n) override { cuda::gelu_forward(out, inp, n); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) override {
    cuda::gelu_backward(dinp, inp, dout, n);
  }
  void softmax_forward(float* out, const float* inp, std::int64_t N, std::int64_t C) override {
    cuda::softmax_forward(out, inp, N, C);
  }
  void softmax_backward(float* dinp, const float* out, const float* dout, std::int64_t N, std::int64_t C) override {
    cuda::softmax_backward(dinp, out, dout, N, C);
  }
  void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                         std::int64_t H) override {
    cuda::attention_forward(out, att, qkv, B, T, C, H);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, std::int64_t B,
                          std::int64_t T, std::int64_t C, std::int64_t H) override {
    cuda::attention_backward(dqkv, dout, qkv, att, B, T, C, H);
  }
  void cross_entropy_forward(float* loss, float* probs, const float* logits, const std::int64_t* targets,
                             std::int64_t N, std::int64_t V) override {
    cuda::cross_entropy_forward_async(loss, probs, logits, targets, N, V);
  }
  void cross_entropy_backward(float* dlogits, const float* probs, const std::int64_t* targets, const float* dloss,
                              std::int64_t N, std::int64_t V) override {
    cuda::cross_entropy_backward(dlogits, probs, targets, dloss, N, V);
  }
  void embedding_forward(float* out, const float* weight, const std::int64_t* idx, std::int64_t N, std::int64_t V,
                         std::int64_t C) override {
    cuda::embedding_forward(out, weight, idx, N, V, C);
  }
  void embedding_backward(float* dweight, const float* dout, const std::int64_t* idx, std::int64_t N, std::int64_t V,
                          std::int64_t C) override {
    cuda::embedding_backward(dweight, dout, idx, N, C, V);
  }
};

}  // namespace

Backend& cuda_backend() {
  static CudaBackend* b = new CudaBackend();  // never destroyed, like the allocators
  return *b;
}

}  // namespace zero::cuda
