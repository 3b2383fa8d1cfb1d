#include "core/gemm_precision.h"

#include <atomic>

#include "core/check.h"

namespace zero {

namespace {
std::atomic<bool> g_16bit_gemms{true};
}  // namespace

void set_16bit_gemms(bool on) { g_16bit_gemms.store(on); }
bool use_16bit_gemms() { return g_16bit_gemms.load(std::memory_order_relaxed); }

GemmPlan cuda_gemm_plan(DType a, DType b, DType c, bool allow_tf32) {
  ZERO_CHECK(a == b, "gemm: A is {} but B is {} (the operands must share one dtype)", dtype_name(a), dtype_name(b));
  ZERO_CHECK(is_floating(a) && is_floating(c), "gemm: unsupported types A {} C {}", dtype_name(a), dtype_name(c));
  if (a == DType::f32) {
    ZERO_CHECK(c == DType::f32, "gemm: f32 inputs need an f32 output, got {}", dtype_name(c));
    return allow_tf32 ? GemmPlan{GemmCompute::tf32, true} : GemmPlan{GemmCompute::f32, false};
  }
  ZERO_CHECK(c == DType::f32 || c == a, "gemm: {} inputs need an f32 or {} output, got {}", dtype_name(a),
             dtype_name(a), dtype_name(c));
  return GemmPlan{GemmCompute::f32, true};
}

DType gemm_operand_dtype(Device device, DType dtype) {
  if (device == Device::cuda && (dtype == DType::f16 || dtype == DType::bf16) && use_16bit_gemms()) return dtype;
  return DType::f32;
}

MatmulPrecision matmul_precision(Device device, DType model_dtype, bool allow_tf32) {
  switch (gemm_operand_dtype(device, model_dtype)) {
    case DType::f16: return MatmulPrecision::fp16;
    case DType::bf16: return MatmulPrecision::bf16;
    default: break;
  }
  return device == Device::cuda && allow_tf32 ? MatmulPrecision::tf32 : MatmulPrecision::fp32;
}

std::string_view matmul_precision_name(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::fp32: return "fp32";
    case MatmulPrecision::tf32: return "tf32";
    case MatmulPrecision::fp16: return "fp16";
    case MatmulPrecision::bf16: return "bf16";
  }
  return "?";
}

}  // namespace zero
