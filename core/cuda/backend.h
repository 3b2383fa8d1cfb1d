// The CUDA backend: the object backend(Device::cuda) and kernels(Device::cuda) return. It declares every
// entry of core/backend.def and core/kernels.def as an override; the definitions are the CUDA host
// entries (argument checks, scratch buffers, the order of launches), each running asynchronously on the
// current stream (core/cuda/runtime.h) unless it returns a host value:
//   core/cuda/blas.cpp     the GEMMs (cuBLAS)
//   core/cuda/kernels.cpp  everything that launches the kernels of elementwise.cu, ops.cu and nn.cu
//                          (declared for the host in core/cuda/launch.h)
//   core/cuda/backend.cpp  memory and transfers, sum_to's plan
// Where the device's contract differs from the interface (the dropout seed, the bias gradient through
// cuBLAS), the adaptation is in the host entry and nowhere else.
#pragma once

#include "core/kernels.h"

namespace zero::cuda {

class CudaBackend final : public Kernels {
 public:
  CudaBackend() : Kernels(Device::cuda) {}

#define ZERO_KERNEL(result, name, params) result name params override;
#include "core/backend.def"
#include "core/kernels.def"
#undef ZERO_KERNEL
};

/// The process's CUDA backend (backend(Device::cuda) and kernels(Device::cuda) return it).
Kernels& cuda_backend();

}  // namespace zero::cuda
