// Iteration over the elements of a strided view.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace zero {

/// Calls fn(storage_offset) for every element of the view (shape, strides, offset), in row-major order.
/// Offsets are in elements. Used by the generic (non-contiguous) paths of copies and reductions.
template <typename Fn>
inline void for_each_offset(const Shape& shape, const Shape& strides, std::int64_t offset, Fn fn) {
  const int nd = static_cast<int>(shape.size());
  const std::int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<std::int64_t> idx(nd, 0);
  std::int64_t off = offset;
  for (std::int64_t k = 0; k < n; ++k) {
    fn(off);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}


}  // namespace zero
