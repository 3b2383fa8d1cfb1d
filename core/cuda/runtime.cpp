#include "core/cuda/runtime.h"

#include <cublas_api.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/caching_allocator.h"
#include "core/check.h"

namespace zero::cuda {

namespace detail {

void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  zero::detail::fail(file, line,
                     fmt::format("{} failed: {} ({}, CUDA error {})", call, cudaGetErrorString(code),
                                 cudaGetErrorName(code), static_cast<int>(code)));
}

void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line) {
  zero::detail::fail(file, line,
                     fmt::format("{} failed: {} (cuBLAS status {})", call, cublasGetStatusString(code),
                                 static_cast<int>(code)));
}

void throw_message(const char* message, const char* file, int line) { zero::detail::fail(file, line, message); }

}  // namespace detail

// ---- devices and streams -------------------------------------------------------------------------------

bool cuda_available() noexcept { return device_count() > 0; }

int device_count() noexcept {
  static const int count = [] {
    const char* disable = std::getenv("ZERO_DISABLE_CUDA");
    if (disable != nullptr && disable[0] != '\0' && std::strcmp(disable, "0") != 0) return 0;
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
      cudaGetLastError();  // clear the error so later calls do not report it
      return 0;
    }
    return n;
  }();
  return count;
}

void set_device(int device) {
  ZERO_CHECK(device >= 0 && device < device_count(), "set_device: device {} outside the {} visible devices", device,
             device_count());
  ZERO_CUDA_CHECK(cudaSetDevice(device));
}

int current_device() {
  int device = 0;
  ZERO_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

namespace {
thread_local cudaStream_t tl_stream = nullptr;
thread_local bool tl_has_stream = false;

cudaStream_t process_stream() {
  static std::once_flag once;
  static cudaStream_t stream = nullptr;
  std::call_once(once, [] {
    ZERO_CHECK(cuda_available(), "CUDA is not available on this machine (no device or driver)");
    // Non-blocking: the legacy default stream (used implicitly by plain cudaMemcpy) does not serialise
    // with it, and neither does the communication stream, which is what lets them overlap.
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  });
  return stream;
}
}  // namespace

cudaStream_t current_stream() { return tl_has_stream ? tl_stream : process_stream(); }

StreamGuard::StreamGuard(cudaStream_t stream) : previous_(tl_stream), had_previous_(tl_has_stream) {
  tl_stream = stream;
  tl_has_stream = true;
}

StreamGuard::~StreamGuard() {
  tl_stream = previous_;
  tl_has_stream = had_previous_;
}

void synchronize() {
  ZERO_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  check_device_errors();
}

// ---- side streams ------------------------------------------------------------------------------------

namespace {
struct SideStreams {
  std::mutex mutex;
  std::vector<cudaStream_t> streams;
};
SideStreams& side_stream_list() {
  static SideStreams* s = new SideStreams();  // never destroyed: communicators may outlive static teardown
  return *s;
}
}  // namespace

void register_side_stream(cudaStream_t stream) {
  SideStreams& s = side_stream_list();
  std::lock_guard lock(s.mutex);
  s.streams.push_back(stream);
}

void unregister_side_stream(cudaStream_t stream) noexcept {
  SideStreams& s = side_stream_list();
  std::lock_guard lock(s.mutex);
  for (auto it = s.streams.begin(); it != s.streams.end(); ++it) {
    if (*it == stream) {
      s.streams.erase(it);
      return;
    }
  }
}

std::vector<cudaStream_t> side_streams() {
  SideStreams& s = side_stream_list();
  std::lock_guard lock(s.mutex);
  return s.streams;
}

void synchronize_all() {
  {
    // Waits holding the lock, so that a communicator destroyed on another thread meanwhile cannot
    // destroy its stream under this wait (it unregisters first, and waits for the stream itself).
    SideStreams& s = side_stream_list();
    std::lock_guard lock(s.mutex);
    for (cudaStream_t stream : s.streams) ZERO_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  synchronize();
}

// ---- deferred kernel errors --------------------------------------------------------------------------

int* device_error_flag() {
  static std::once_flag once;
  static int* flag = nullptr;
  std::call_once(once, [] {
    ZERO_CHECK(cuda_available(), "CUDA is not available on this machine (no device or driver)");
    ZERO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&flag), sizeof(int)));
    ZERO_CUDA_CHECK(cudaMemset(flag, 0, sizeof(int)));
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());
  });
  return flag;
}

void check_device_errors() {
  int* flag = device_error_flag();
  int host = 0;
  cudaStream_t stream = current_stream();
  ZERO_CUDA_CHECK(cudaMemcpyAsync(&host, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  ZERO_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host == 0) return;
  ZERO_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  std::string what;
  if (host & kEmbeddingIndexOutOfRange) what += "embedding: an index was outside [0, V); ";
  if (host & kCrossEntropyTargetOutOfRange) what += "cross_entropy: a target was outside [0, V); ";
  ZERO_CHECK(false, "CUDA kernel reported bad input: {}(the offending elements were skipped)", what);
}

// ---- device caching allocator ------------------------------------------------------------------------

namespace {

// Note [Device caching allocator]
// cudaMalloc and cudaFree are slow (cudaFree synchronises the whole device), and a training step asks
// for the same sizes every time: device blocks come from a CachingAllocator (core/caching_allocator.h)
// keyed by (stream, rounded size), which is what makes reuse safe without synchronising. Sizes are
// rounded to 512 bytes below 1 MiB and to 2 MiB above, so requests that differ a little share a list
// and large blocks are whole pages. Before cached blocks are cudaFree'd the device is synchronised
// (they may still be in use by queued kernels of their stream).
CachingAllocator& device_allocator() {
  static auto* a = new CachingAllocator(CachingAllocator::Source{
      [](std::size_t n) {
        constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20, kSmallLimit = std::size_t{1} << 20;
        if (n == 0) return kSmall;
        if (n <= kSmallLimit) return (n + kSmall - 1) / kSmall * kSmall;
        return (n + kLarge - 1) / kLarge * kLarge;
      },
      [](std::size_t size) -> void* {
        void* ptr = nullptr;
        const cudaError_t rc = cudaMalloc(&ptr, size);
        if (rc == cudaErrorMemoryAllocation) {
          cudaGetLastError();
          return nullptr;
        }
        ZERO_CUDA_CHECK(rc);
        return ptr;
      },
      [](void* p) { ZERO_CUDA_CHECK(cudaFree(p)); },
      [] { ZERO_CUDA_CHECK(cudaDeviceSynchronize()); }});
  return *a;  // never destroyed: cudaFree after the runtime is gone fails
}

// Pinned host blocks: 4 KiB granularity, one list per size (key 0).
CachingAllocator& pinned_allocator() {
  static auto* a = new CachingAllocator(CachingAllocator::Source{
      [](std::size_t n) { return n == 0 ? std::size_t{4096} : (n + 4095) / 4096 * 4096; },
      [](std::size_t size) -> void* {
        void* ptr = nullptr;
        ZERO_CUDA_CHECK(cudaHostAlloc(&ptr, size, cudaHostAllocPortable));
        return ptr;
      },
      [](void* p) { ZERO_CUDA_CHECK(cudaFreeHost(p)); },
      {}});
  return *a;
}

// Frees never throw: a failure is reported on stderr.
void free_to(CachingAllocator& allocator, void* ptr, const char* who) noexcept {
  if (ptr == nullptr) return;
  try {
    if (!allocator.deallocate(ptr)) std::fprintf(stderr, "zero::cuda::%s: %p was not allocated here\n", who, ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero::cuda::%s failed: %s\n", who, e.what());
  }
}

}  // namespace

void* device_alloc(std::size_t nbytes) { return device_alloc(nbytes, current_stream()); }

void* device_alloc(std::size_t nbytes, cudaStream_t stream) {
  ZERO_CHECK(cuda_available(), "CUDA is not available on this machine (no device or driver)");
  void* ptr = device_allocator().allocate(nbytes, reinterpret_cast<std::uintptr_t>(stream));
  ZERO_CHECK(ptr != nullptr, "CUDA out of memory: cannot allocate {} bytes ({} bytes in use by tensors)", nbytes,
             device_allocator().stats().in_use);
  return ptr;
}

void device_free(void* ptr) noexcept { free_to(device_allocator(), ptr, "device_free"); }
AllocatorStats allocator_stats() { return device_allocator().stats(); }
void reset_allocator_peak() { device_allocator().reset_peak(); }
void empty_cache() { device_allocator().empty_cache(); }

void* pinned_alloc(std::size_t nbytes) {
  ZERO_CHECK(cuda_available(), "CUDA is not available on this machine (no device or driver)");
  return pinned_allocator().allocate(nbytes);
}
void pinned_free(void* ptr) noexcept { free_to(pinned_allocator(), ptr, "pinned_free"); }
AllocatorStats pinned_allocator_stats() { return pinned_allocator().stats(); }

void* PinnedBuffer::reserve(std::size_t nbytes) {
  if (nbytes <= capacity_ && ptr_ != nullptr) return ptr_;
  pinned_free(ptr_);
  ptr_ = nullptr;
  capacity_ = 0;
  ptr_ = pinned_alloc(nbytes);
  capacity_ = nbytes;
  return ptr_;
}

// ---- copies ------------------------------------------------------------------------------------------

void copy_async(void* dst, const void* src, std::size_t nbytes) {
  if (nbytes == 0) return;
  ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, current_stream()));
}

void copy(void* dst, const void* src, std::size_t nbytes) {
  if (nbytes == 0) return;
  cudaStream_t stream = current_stream();
  ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream));
  ZERO_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void memset_async(void* dst, int value, std::size_t nbytes) {
  if (nbytes == 0) return;
  ZERO_CUDA_CHECK(cudaMemsetAsync(dst, value, nbytes, current_stream()));
}

bool is_device_pointer(const void* ptr) noexcept {
  if (ptr == nullptr || !cuda_available()) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

}  // namespace zero::cuda
