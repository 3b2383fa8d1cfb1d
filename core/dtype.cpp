#include "core/dtype.h"

#include "core/check.h"

namespace zero {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

DType parse_float_dtype(std::string_view text) {
  if (text == "fp32" || text == "f32" || text == "float32") return DType::f32;
  if (text == "fp16" || text == "f16" || text == "float16") return DType::f16;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  ZERO_CHECK(false, "unknown dtype '{}' (expected fp32, fp16 or bf16)", text);
}

}  // namespace zero
