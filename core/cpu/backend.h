// The CPU backend: the object backend(Device::cpu) and kernels(Device::cpu) return. It declares every
// entry of core/backend.def and core/kernels.def as an override; the definitions are the CPU
// implementations:
//   core/cpu/kernels.cpp      GEMM (our blocked register-tile GEMM) and the neural-network kernels
//   core/cpu/elementwise.cpp  dtype-generic loops: copy, fill, scale, accumulate, the norm, the
//                             overflow check and the AdamW update
//   core/cpu/backend.cpp      memory, the small f32 loops of the ops (binary, unary, reductions)
// Every loop keeps a fixed summation order, so results do not depend on the thread count.
// Internal to core/: everything else reaches these through backend(device) or kernels(device).
#pragma once

#include "core/kernels.h"

namespace zero::cpu {

class CpuBackend final : public Kernels {
 public:
  CpuBackend() : Kernels(Device::cpu) {}

#define ZERO_KERNEL(result, name, params) result name params override;
#include "core/backend.def"
#include "core/kernels.def"
#undef ZERO_KERNEL
};

}  // namespace zero::cpu
