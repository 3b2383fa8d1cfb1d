// The backend registry: the one function that maps a Device to the object whose functions run there.
#include "core/backend.h"

#include "core/check.h"
#include "core/kernels.h"

namespace zero {

namespace cpu {
Kernels& cpu_backend();  // core/cpu/backend.cpp
}
#ifdef ZERO_HAS_CUDA
namespace cuda {
Kernels& cuda_backend();  // core/cuda/backend.cpp
}
#endif

void Backend::missing(const char* kernel) const {
  detail::fail(__FILE__, __LINE__, fmt::format("{}: no kernel on device {}", kernel, device_name(device_)));
}

Backend& backend(Device device) { return kernels(device); }

Kernels& kernels(Device device) {
  if (device == Device::cpu) return cpu::cpu_backend();
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) return cuda::cuda_backend();
#endif
  detail::fail(__FILE__, __LINE__,
               fmt::format("device {}: no backend in this build (configure with -DZERO_CUDA=ON)", device_name(device)));
}

}  // namespace zero
