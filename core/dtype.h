// Element types and devices.
//
// DType names the element type of a tensor or a communication buffer. f16 and bf16 are stored as
// Eigen::half / Eigen::bfloat16 (IEEE binary16 and the top 16 bits of binary32); arithmetic on them is
// done in f32.
#pragma once

#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zero {

enum class DType { f32, f16, bf16, i32, i64 };
enum class Device { cpu, cuda };

using half = Eigen::half;
using bfloat16 = Eigen::bfloat16;

/// Bytes per element of `t`.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

std::string_view dtype_name(DType t);
std::string_view device_name(Device d);
/// Parses "fp32"/"f32"/"float32", "fp16"/"f16"/"float16", "bf16"/"bfloat16". Throws zero::Error naming
/// the text otherwise.
DType parse_float_dtype(std::string_view text);

/// Maps a C++ element type to its DType (float, half, bfloat16, int32_t, int64_t).
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<half>() { return DType::f16; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }

/// Element i of a host buffer of dtype t, converted to float (16-bit floats exactly; integers rounded).
inline float load_as_float(const void* base, std::int64_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return static_cast<float>(static_cast<const half*>(base)[i]);
    case DType::bf16: return static_cast<float>(static_cast<const bfloat16*>(base)[i]);
    case DType::i32: return static_cast<float>(static_cast<const std::int32_t*>(base)[i]);
    case DType::i64: return static_cast<float>(static_cast<const std::int64_t*>(base)[i]);
  }
  return 0.0f;
}

/// Stores v into element i of a host buffer of dtype t (16-bit floats round to nearest even; integers
/// truncate).
inline void store_from_float(void* base, std::int64_t i, DType t, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; break;
    case DType::f16: static_cast<half*>(base)[i] = half(v); break;
    case DType::bf16: static_cast<bfloat16*>(base)[i] = bfloat16(v); break;
    case DType::i32: static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v); break;
    case DType::i64: static_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(v); break;
  }
}

}  // namespace zero
