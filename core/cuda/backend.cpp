// The CUDA backend's memory and transfers, and sum_to (a plan over the device's reductions, or the
// host for the rare inner-dimension case); core/cuda/backend.h lists where the other kernels are.
#include "core/cuda/backend.h"

#include <algorithm>
#include <vector>

#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#include "core/cuda/sum_to_plan.h"
#include "core/tensor.h"

namespace zero::cuda {

// ---- memory and transfers (core/cuda/runtime.h) ----

void* CudaBackend::allocate(std::size_t nbytes) { return device_alloc(nbytes); }

void CudaBackend::deallocate(void* ptr) { device_free(ptr); }

void CudaBackend::copy_bytes(void* dst, const void* src, std::size_t nbytes) {
  if (is_device_pointer(dst)) {
    copy_async(dst, src, nbytes);  // a pageable source is staged before this returns
  } else {
    cuda::copy(dst, src, nbytes);  // waits: on return the host holds the data
  }
}

void CudaBackend::synchronize() { cuda::synchronize_all(); }

// ---- adaptations ----

void CudaBackend::sum_to(float* out, const float* x, const Shape& x_shape, const Shape& shape) {
  const std::int64_t m = shape_numel(shape), n = shape_numel(x_shape);
  switch (detail::plan_sum_to(x_shape, shape)) {
    case detail::SumToPlan::copy: copy_async(out, x, static_cast<std::size_t>(n) * sizeof(float)); return;
    case detail::SumToPlan::rows: cuda::sum_rows(out, x, n / std::max<std::int64_t>(1, m), m, false); return;
    case detail::SumToPlan::host: break;
  }
  // Reductions over inner dimensions (rare in the models here): on the host, then back.
  std::vector<float> hx(static_cast<std::size_t>(n)), hy(static_cast<std::size_t>(m));
  cuda::copy(hx.data(), x, hx.size() * sizeof(float));
  kernels(Device::cpu).sum_to(hy.data(), hx.data(), x_shape, shape);
  cuda::copy(out, hy.data(), hy.size() * sizeof(float));
}

Kernels& cuda_backend() {
  static CudaBackend* b = new CudaBackend();  // never destroyed, like the allocators
  return *b;
}

}  // namespace zero::cuda
