#include "core/backend.h"

#include "core/check.h"

namespace zero {

void Backend::missing(const char* kernel) const {
  detail::fail(__FILE__, __LINE__, fmt::format("{}: no kernel on device {}", kernel, device_name(device_)));
}

// Note [Missing kernels]: every default says which kernel is missing on which device.
void Backend::gemm(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                   const float*, std::int64_t, float, float*, std::int64_t, const float*) {
  missing("gemm");
}
void Backend::gemm_batched(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                           std::int64_t, const float*, std::int64_t, std::int64_t, float, float*, std::int64_t,
                           std::int64_t, std::int64_t) {
  missing("gemm_batched");
}
void Backend::binary(float*, const float*, const float*, std::int64_t, std::int64_t, BinaryOp) { missing("binary"); }
void Backend::unary(float*, const float*, std::int64_t, UnaryOp, float) { missing("unary"); }
void Backend::scale(float*, const float*, std::int64_t, float) { missing("scale"); }
void Backend::accumulate(void*, DType, const void*, DType, std::int64_t) { missing("accumulate"); }
void Backend::dropout_mask(float*, Generator&, float, std::int64_t) { missing("dropout_mask"); }
void Backend::sum(float*, const float*, std::int64_t) { missing("sum"); }
void Backend::sum_rows(float*, const float*, std::int64_t, std::int64_t) { missing("sum_rows"); }
void Backend::sum_to(float*, const float*, const std::vector<std::int64_t>&, const std::vector<std::int64_t>&) {
  missing("sum_to");
}
void Backend::reduce_dim(float*, std::int64_t*, const float*, std::int64_t, std::int64_t, std::int64_t, ReduceOp) {
  missing("reduce_dim");
}
void Backend::scatter_dim(float*, const float*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t) {
  missing("scatter_dim");
}
void Backend::layernorm_forward(float*, float*, float*, const float*, const float*, const float*, std::int64_t,
                                std::int64_t, float) {
  missing("layernorm_forward");
}
void Backend::layernorm_backward(float*, float*, float*, const float*, const float*, const float*, const float*,
                                 const float*, std::int64_t, std::int64_t) {
  missing("layernorm_backward");
}
void Backend::gelu_forward(float*, const float*, std::int64_t) { missing("gelu_forward"); }
void Backend::gelu_backward(float*, const float*, const float*, std::int64_t) { missing("gelu_backward"); }
void Backend::softmax_forward(float*, const float*, std::int64_t, std::int64_t) { missing("softmax_forward"); }
void Backend::softmax_backward(float*, const float*, const float*, std::int64_t, std::int64_t) {
  missing("softmax_backward");
}
// All-f32 typed GEMMs are the plain ones on every backend, so an op has one body for f32 and 16-bit
// operands; 16-bit operands need a backend that overrides these.
void Backend::gemm_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                      const void* A, DType a_dtype, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb,
                      float beta, void* C, DType c_dtype, std::int64_t ldc, const float* bias) {
  if (a_dtype != DType::f32 || b_dtype != DType::f32 || c_dtype != DType::f32) missing("gemm_ex with 16-bit operands");
  gemm(trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb, beta,
       static_cast<float*>(C), ldc, bias);
}
void Backend::gemm_batched_ex(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                              const void* A, DType a_dtype, std::int64_t lda, std::int64_t stride_a, const void* B,
                              DType b_dtype, std::int64_t ldb, std::int64_t stride_b, float beta, void* C,
                              DType c_dtype, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  if (a_dtype != DType::f32 || b_dtype != DType::f32 || c_dtype != DType::f32)
    missing("gemm_batched_ex with 16-bit operands");
  gemm_batched(trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(A), lda, stride_a,
               static_cast<const float*>(B), ldb, stride_b, beta, static_cast<float*>(C), ldc, stride_c, batch);
}
void Backend::attention_forward_ex(float*, float*, const float*, std::int64_t, std::int64_t, std::int64_t,
                                   std::int64_t, DType) {
  missing("attention_forward_ex");
}
void Backend::attention_backward_ex(float*, const float*, const float*, const float*, std::int64_t, std::int64_t,
                                    std::int64_t, std::int64_t, DType) {
  missing("attention_backward_ex");
}
void Backend::attention_forward(float*, float*, const float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t) {
  missing("attention_forward");
}
void Backend::attention_backward(float*, const float*, const float*, const float*, std::int64_t, std::int64_t,
                                 std::int64_t, std::int64_t) {
  missing("attention_backward");
}
void Backend::cross_entropy_forward(float*, float*, const float*, const std::int64_t*, std::int64_t, std::int64_t) {
  missing("cross_entropy_forward");
}
void Backend::cross_entropy_backward(float*, const float*, const std::int64_t*, const float*, std::int64_t,
                                     std::int64_t) {
  missing("cross_entropy_backward");
}
void Backend::embedding_forward(float*, const float*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t) {
  missing("embedding_forward");
}
void Backend::embedding_backward(float*, const float*, const std::int64_t*, std::int64_t, std::int64_t,
                                 std::int64_t) {
  missing("embedding_backward");
}

Backend& backend(Device device) {
  if (device == Device::cpu) return cpu::cpu_backend();
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) return cuda::cuda_backend();
#endif
  detail::fail(__FILE__, __LINE__,
               fmt::format("device {}: no backend in this build (configure with -DZERO_CUDA=ON)", device_name(device)));
}

}  // namespace zero
