// Backend: the one place a device is chosen. Every function that touches a device's memory is a
// virtual function of Backend or of Kernels (core/kernels.h, the ops' kernels), and backend(device) /
// kernels(device) return the object whose functions run there: Tensor's copies and fills
// (core/tensor.cpp), Storage's memory (core/storage.cpp), the optimizers' update, norm, scale and
// overflow check (optim/) and ZeRO (distributed/) call backend(t.device()).function(...); the
// differentiable ops (autograd/ops.cpp) call kernels(device). None of them branches on the device.
// (minitorch's TensorBackend, ggml's per-backend function tables.)
//
// The functions are listed once, in core/backend.def and core/kernels.def (Note [One list of kernels]
// there): Backend and Kernels declare each pure virtual, CpuBackend (core/cpu/backend.h) and CudaBackend
// (core/cuda/backend.h) override each. A kernel is therefore written in four places: its line in the
// list (signature and contract), the CPU implementation (core/cpu/*.cpp), the CUDA host entry
// (core/cuda/*.cpp: argument checks, scratch buffers, the launch) and the CUDA kernel (core/cuda/*.cu,
// declared for the host in core/cuda/launch.h). docs/adding_a_layer.md walks through one.
//
// Note [Missing kernels]
// Every backend implements every function: the lists are pure virtual, so a backend that lacks one does
// not link. A device that cannot run a case (16-bit GEMM operands on the CPU) says so with one
// zero::Error line "<kernel>: no kernel on device <device>" (Backend::missing) before touching memory.
//
// Buffers are raw pointers on the backend's device (host pointers for cpu, device pointers for cuda),
// contiguous and row-major unless a function takes strides; sizes are in elements unless named
// nbytes. Unless a function says otherwise its output is fully overwritten, and the CPU implementation
// is the reference the CUDA one is tested against (tests/unit/test_gradcheck.cpp runs every op on every
// device present; tests/unit/test_cuda_kernels.cpp compares kernel by kernel). Work is queued on the
// device in call order (the current stream on cuda, core/cuda/runtime.h): a function returns before
// it is done unless it returns a host value or says it waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/adamw_step.h"
#include "core/dtype.h"

namespace zero {

/// A strided view of a buffer on one device (what Backend::copy reads and writes): element with
/// multi-index (i_0, ..., i_k) of `shape` lives at base + (offset + sum_d i_d * strides[d]) elements
/// of dtype. A Tensor without ownership or autograd.
struct StridedView {
  void* base;
  DType dtype;
  const std::vector<std::int64_t>& shape;
  const std::vector<std::int64_t>& strides;
  std::int64_t offset;
};

class Backend {
 public:
  explicit Backend(Device device) : device_(device) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  Device device() const { return device_; }

#define ZERO_KERNEL(result, name, params) virtual result name params = 0;
#include "core/backend.def"
#undef ZERO_KERNEL

 protected:
  /// Throws "<kernel>: no kernel on device <device>" (Note [Missing kernels]).
  [[noreturn]] void missing(const char* kernel) const;

 private:
  Device device_;
};

/// The backend of `device`. Throws zero::Error for a device this build has no backend for.
Backend& backend(Device device);

}  // namespace zero
