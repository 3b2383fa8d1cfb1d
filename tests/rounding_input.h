// Test inputs whose sums round, so that the order of the additions shows in the bits of the result
// (the in-process and MPI communicator tests compare summation orders with them).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace zero::testing {

/// Rank `rank`'s element i: a 24-bit integer with a random sign, scaled by 2^-30 .. 2^-19. Integer
/// arithmetic and ldexp only, so every thread and every loop computes the same bits (a loop calling sin
/// or exp may be vectorised with a less exact libm than a scalar call).
inline float rounding_input(int rank, std::size_t i) {
  std::uint64_t h = (std::uint64_t(i) * 2654435761u + std::uint64_t(rank) * 40503u + 1) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  const float magnitude = std::ldexp(float(h & 0xFFFFFF), -30 + int((h >> 24) % 12));
  return (h >> 40) & 1 ? -magnitude : magnitude;
}

}  // namespace zero::testing
