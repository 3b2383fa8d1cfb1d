// Kernels: the ops' kernels of every device (GEMM, elementwise, reductions, the neural-network
// kernels), listed once in core/kernels.def. A Kernels is also its device's Backend (core/backend.h):
// kernels(device) and backend(device) are the same object, seen through the interface each caller
// needs, so a new kernel rebuilds only what includes this header (Note [One list of kernels]).
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"

namespace zero {

class Generator;

enum class BinaryOp { add, sub, mul, div };
enum class UnaryOp { sqrt, rsqrt, exp, log, pow };
enum class ReduceOp { sum, max };

class Kernels : public Backend {
 public:
  using Backend::Backend;

#define ZERO_KERNEL(result, name, params) virtual result name params = 0;
#include "core/kernels.def"
#undef ZERO_KERNEL
};

/// The kernels of `device` (the same object as backend(device)). Throws zero::Error for a device this
/// build has no backend for.
Kernels& kernels(Device device);

}  // namespace zero
