// Ring arithmetic shared by the CPU communicators: the even split all-reduce and reduce use for their
// internal reduce-scatter, the fp16/bf16 <-> fp32 casts, and one hop of a ring reduction (Note [Wire
// dtype] in communicator.cpp). MpiCommunicator runs the ring over messages; InProcessCommunicator reads
// the same partial sums from its peers' buffers in the same order (Note [The ring's order] in
// inprocess_communicator.cpp). Both call these functions, so both round exactly alike.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "distributed/comm/communicator.h"

namespace zero::dist::detail {

/// Rank r's share of `count` elements split as evenly as possible over n ranks (the first count % n
/// ranks get one more): the layout all_reduce and reduce use for their internal reduce-scatter.
inline std::vector<std::size_t> split_even(std::size_t count, int n) {
  std::vector<std::size_t> counts(n, count / n);
  for (std::size_t r = 0; r < count % n; ++r) counts[r] += 1;
  return counts;
}

/// offsets[r] = counts[0] + .. + counts[r-1] (elements).
inline std::vector<std::size_t> prefix_offsets(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> offsets(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}

// f16/bf16 <-> f32 through Eigen's vectorised casts.
template <typename T>
void widen_as(const void* src, float* dst, std::size_t n) {
  using In = Eigen::Array<T, Eigen::Dynamic, 1>;
  using Out = Eigen::Array<float, Eigen::Dynamic, 1>;
  Eigen::Map<Out>(dst, Eigen::Index(n)) =
      Eigen::Map<const In>(static_cast<const T*>(src), Eigen::Index(n)).template cast<float>();
}
template <typename T>
void narrow_as(const float* src, void* dst, std::size_t n) {
  using In = Eigen::Array<float, Eigen::Dynamic, 1>;
  using Out = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<Out>(static_cast<T*>(dst), Eigen::Index(n)) =
      Eigen::Map<const In>(src, Eigen::Index(n)).template cast<T>();
}
/// dst[i] = float(src[i]) for n elements of f16 or bf16 `dtype`.
inline void widen(const void* src, DType dtype, float* dst, std::size_t n) {
  if (dtype == DType::f16) widen_as<half>(src, dst, n);
  else widen_as<bfloat16>(src, dst, n);
}
/// dst[i] = src[i] rounded (to nearest even) to f16 or bf16 `dtype`, n elements.
inline void narrow(const float* src, void* dst, DType dtype, std::size_t n) {
  if (dtype == DType::f16) narrow_as<half>(src, dst, n);
  else narrow_as<bfloat16>(src, dst, n);
}

/// out[0, len) = the n 16-bit contributions parts[0..n) (each len elements of f16/bf16 `dtype`) widened,
/// added in fp32 in rank order (parts[0] + parts[1] + ... + parts[n-1]) and rounded once (Note
/// [fp32-accumulating reduce-scatter] in communicator.cpp). acc and tmp: len floats of scratch. out may
/// alias any part (it is written last).
inline void sum_in_fp32(const std::vector<const void*>& parts, DType dtype, float* acc, float* tmp, void* out,
                        std::size_t len) {
  widen(parts[0], dtype, acc, len);
  for (std::size_t q = 1; q < parts.size(); ++q) {
    widen(parts[q], dtype, tmp, len);
    for (std::size_t i = 0; i < len; ++i) acc[i] += tmp[i];
  }
  narrow(acc, out, dtype, len);
}

/// Bus bytes of a ring all-reduce of `count` fp16/bf16 elements on n ranks that reduces in fp32
/// (reduce_in_fp32): its reduce-scatter half moves fp32, its all-gather half the narrowed 16-bit slices.
/// The one collective of the ring whose wire dtype is mixed (Communicator::wire_bus_bytes).
inline double widened_all_reduce_bus_bytes(std::size_t count, DType dtype, int n) {
  return (n - 1.0) / n * double(count) * double(sizeof(float) + dtype_size(dtype));
}

/// One hop of a ring reduction: dst[i] = in[i] (op) own[i], where `in` is the partial result that
/// arrived and `own` this rank's contribution. dst may alias in or own (same index only).
inline void combine(float* dst, const float* in, const float* own, std::size_t n, ReduceOp op) {
  if (op == ReduceOp::sum) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = in[i] + own[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = std::max(in[i], own[i]);
  }
}
/// 16-bit: both operands widened to fp32, combined, rounded once (one hop of Note [Wire dtype]).
template <typename T>
void combine(T* dst, const T* in, const T* own, std::size_t n, ReduceOp op) {
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  const Eigen::Map<const A> a(in, Eigen::Index(n)), b(own, Eigen::Index(n));
  Eigen::Map<A> out(dst, Eigen::Index(n));
  if (op == ReduceOp::sum)
    out = (a.template cast<float>() + b.template cast<float>()).template cast<T>();
  else
    out = a.template cast<float>().max(b.template cast<float>()).template cast<T>();
}

}  // namespace zero::dist::detail
