// The CPU backend: the class whose functions core/backend.h's backend(Device::cpu) returns. It declares
// every entry of core/kernels.def as an override; the definitions are the CPU implementations:
//   core/cpu/kernels.cpp      GEMM (our blocked register-tile GEMM) and the neural-network kernels
//   core/cpu/elementwise.cpp  dtype-generic loops: copy, fill, scale, accumulate, the norm, the
//                             overflow check and the AdamW update
//   core/cpu/backend.cpp      memory, the small f32 loops of the ops (binary, unary, reductions)
// Every loop keeps a fixed summation order, so results do not depend on the thread count.
// Internal to core/: everything else reaches these through backend(device).
#pragma once

#include "core/backend.h"

namespace zero::cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend() : Backend(Device::cpu) {}

#define ZERO_KERNEL(result, name, params) result name params override;
#include "core/kernels.def"
#undef ZERO_KERNEL
};

}  // namespace zero::cpu
