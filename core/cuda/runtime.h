// The CUDA runtime layer: is there a device, which one, which stream, device and pinned memory, copies.
//
// One process drives one GPU (one rank per GPU, or several ranks sharing GPU 0 in the host-staged test
// mode, distributed/comm/nccl_communicator.h). Call set_device() before the first allocation if the process
// should not use device 0.
//
// Streams. Work is issued on the calling thread's *current stream*: by default one non-blocking stream
// per process (created on first use), replaceable per thread with StreamGuard. Every helper here and
// every kernel in core/cuda/kernels.h runs on it asynchronously unless it says it synchronizes. The NCCL
// communicator runs collectives on a stream of its own, ordered against this one with events.
//
// Device memory comes from a caching allocator (Note [Device caching allocator] in runtime.cpp): freed
// blocks are kept and handed out again, so a training loop stops calling cudaMalloc after its first
// step. Pinned (page-locked) host memory, for fast and truly asynchronous copies, is cached the same way.
//
// Without a usable device (no GPU, or a driver too old: cudaGetDeviceCount fails) cuda_available() is
// false and every other function here throws zero::Error from the first CUDA call it makes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/cuda/check.h"
#include "core/storage.h"

namespace zero::cuda {

/// True if at least one CUDA device can be used. Never throws: any error (no driver, "CUDA driver
/// version is insufficient", no device) gives false. The answer is computed once per process. Setting
/// the environment variable ZERO_DISABLE_CUDA=1 forces false (to test the CPU paths on a GPU machine).
bool cuda_available() noexcept;
/// Number of usable devices; 0 when cuda_available() is false. Never throws.
int device_count() noexcept;

/// Makes `device` current for the calling thread (cudaSetDevice). Throws zero::Error if out of range.
void set_device(int device);
int current_device();

/// The calling thread's current stream (see the file comment). Creates the process stream on first use.
cudaStream_t current_stream();

/// Makes `stream` the calling thread's current stream until destruction, then restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
  bool had_previous_;
};

/// Blocks until the current stream's work is done, then throws zero::Error if a kernel recorded a
/// deferred error since the last check (see check_device_errors()).
void synchronize();

// ---- side streams ------------------------------------------------------------------------------------
// Streams other layers issue device work on besides the compute stream: the NCCL communicator's
// communication stream, registered for its lifetime. Backend::synchronize (synchronize_all) waits for
// them too, as its contract ("every function queued on this device so far") requires.

/// Registers `stream` as a side stream. Registering one stream twice needs two unregisters.
void register_side_stream(cudaStream_t stream);
/// Undoes one register_side_stream(stream); a stream not registered is ignored. Never throws.
void unregister_side_stream(cudaStream_t stream) noexcept;
/// The registered side streams, in registration order (a snapshot).
std::vector<cudaStream_t> side_streams();
/// Blocks until the current stream and every registered side stream are done, then throws as
/// synchronize() does. Backend::synchronize on cuda.
void synchronize_all();

// ---- deferred kernel errors --------------------------------------------------------------------------
// Kernels cannot throw. Those that validate input (embedding indices, cross-entropy targets) set a bit
// in a device-resident flag instead and skip the bad element; the next check_device_errors() (called by
// synchronize() and by every function that returns a host value, e.g. cross_entropy_forward) throws.

/// Bits of the device error flag.
enum DeviceError : int {
  kEmbeddingIndexOutOfRange = 1,
  kCrossEntropyTargetOutOfRange = 2,
};
/// The device-resident int that kernels OR their DeviceError bits into (allocated on first use).
int* device_error_flag();
/// Synchronizes the current stream, reads and clears the flag; throws zero::Error naming the errors.
void check_device_errors();

// ---- device memory -----------------------------------------------------------------------------------

/// `nbytes` of device memory (256-byte aligned) from the caching allocator, for use in order on `stream`
/// (the current stream by default). A freed block is reused only by requests on the same stream, so
/// stream order makes reuse safe without synchronizing. Memory read or written by another stream must
/// stay allocated until that stream's work is done. Throws zero::Error when the device is out of memory
/// even after the cache was released.
void* device_alloc(std::size_t nbytes);
void* device_alloc(std::size_t nbytes, cudaStream_t stream);
/// Returns a block from device_alloc to the cache. Null is ignored. Never throws (reports to stderr).
void device_free(void* ptr) noexcept;
/// in_use / peak_in_use / cached in bytes (rounded block sizes); mallocs counts cudaMalloc calls.
AllocatorStats allocator_stats();
void reset_allocator_peak();
/// Synchronizes the device and cudaFree's every cached block.
void empty_cache();

/// RAII scratch buffer from device_alloc (on the current stream at construction).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t nbytes) : ptr_(nbytes ? device_alloc(nbytes) : nullptr), nbytes_(nbytes) {}
  ~DeviceBuffer() { device_free(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), nbytes_(o.nbytes_) { o.ptr_ = nullptr; o.nbytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      device_free(ptr_);
      ptr_ = o.ptr_;
      nbytes_ = o.nbytes_;
      o.ptr_ = nullptr;
      o.nbytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  std::size_t nbytes() const { return nbytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t nbytes_ = 0;
};

// ---- pinned host memory ------------------------------------------------------------------------------

/// `nbytes` of page-locked host memory (cudaHostAlloc, portable), from a cache of exact-size blocks.
void* pinned_alloc(std::size_t nbytes);
/// Returns a pinned block to the cache. The caller must make sure no copy still uses it. Never throws.
void pinned_free(void* ptr) noexcept;
AllocatorStats pinned_allocator_stats();

/// A growable pinned host buffer (contents are not kept when it grows).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { pinned_free(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  /// At least `nbytes` bytes; returns the data pointer.
  void* reserve(std::size_t nbytes);
  void* get() const { return ptr_; }
  std::size_t capacity() const { return capacity_; }

 private:
  void* ptr_ = nullptr;
  std::size_t capacity_ = 0;
};

// ---- copies ------------------------------------------------------------------------------------------
// Pointers may be host (pageable or pinned) or device memory, in any combination (unified addressing).

/// Enqueues a copy of `nbytes` on the current stream. A pageable host source may be reused on return;
/// a host destination is valid only after the stream is synchronized.
void copy_async(void* dst, const void* src, std::size_t nbytes);
/// copy_async, then waits for the current stream: on return `dst` holds the data.
void copy(void* dst, const void* src, std::size_t nbytes);
/// Enqueues dst[0, nbytes) = byte `value` on the current stream.
void memset_async(void* dst, int value, std::size_t nbytes);
/// True if `ptr` is device memory (or managed); false for host memory, pinned or not. Never throws.
bool is_device_pointer(const void* ptr) noexcept;

}  // namespace zero::cuda
