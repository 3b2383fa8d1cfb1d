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
void Backend::gemm_ex(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const void*, DType, std::int64_t,
                      const void*, DType, std::int64_t, float, void*, DType, std::int64_t, const float*) {
  missing("gemm_ex");
}
void Backend::gemm_batched_ex(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const void*, DType,
                              std::int64_t, std::int64_t, const void*, DType, std::int64_t, std::int64_t, float, void*,
                              DType, std::int64_t, std::int64_t, std::int64_t) {
  missing("gemm_batched_ex");
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
