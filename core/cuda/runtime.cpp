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
// for the same sizes every time. So freed blocks go to free lists keyed by (stream, rounded size) and
// the next request of that size on that stream takes one. Sizes are rounded to 512 bytes below 1 MiB and
// to 2 MiB above, so requests that differ a little share a list and large blocks are whole pages.
// Keying by stream is what makes reuse safe without synchronising: a block freed on stream S may still
// be read by kernels queued on S, but a later request on S is ordered after them. (PyTorch's
// CUDACachingAllocator does the same, with block splitting on top; we keep whole blocks for clarity.)
// When cudaMalloc fails the cache is released and the call retried once.
class DeviceCachingAllocator {
 public:
  static DeviceCachingAllocator& instance() {
    static auto* a = new DeviceCachingAllocator();  // never destroyed: cudaFree after the runtime is gone fails
    return *a;
  }

  void* allocate(std::size_t nbytes, cudaStream_t stream) {
    const std::size_t size = round_up(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    void* ptr = nullptr;
    auto it = free_.find({stream, size});
    if (it != free_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      stats_.cached -= size;
    } else {
      cudaError_t rc = cudaMalloc(&ptr, size);
      if (rc == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        release_cache_locked();
        rc = cudaMalloc(&ptr, size);
      }
      if (rc == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        ZERO_CHECK(false, "CUDA out of memory: cannot allocate {} bytes ({} bytes in use by tensors)", size,
                   stats_.in_use);
      }
      ZERO_CUDA_CHECK(rc);
      ++stats_.mallocs;
    }
    live_[ptr] = Block{size, stream};
    stats_.in_use += size;
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
    return ptr;
  }

  void deallocate(void* ptr) noexcept {
    if (ptr == nullptr) return;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(ptr);
      if (it == live_.end()) {
        std::fprintf(stderr, "zero::cuda::device_free: %p was not allocated by device_alloc\n", ptr);
        return;
      }
      const Block block = it->second;
      live_.erase(it);
      free_[{block.stream, block.size}].push_back(ptr);
      stats_.in_use -= block.size;
      stats_.cached += block.size;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero::cuda::device_free failed: %s\n", e.what());
    }
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_in_use = stats_.in_use;
  }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cache_locked();
  }

 private:
  struct Block {
    std::size_t size;
    cudaStream_t stream;
  };

  static std::size_t round_up(std::size_t n) {
    constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20, kSmallLimit = std::size_t{1} << 20;
    if (n == 0) return kSmall;
    if (n <= kSmallLimit) return (n + kSmall - 1) / kSmall * kSmall;
    return (n + kLarge - 1) / kLarge * kLarge;
  }

  void release_cache_locked() {
    // Blocks may still be in use by queued kernels of their stream: wait for all of them first.
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [key, list] : free_)
      for (void* p : list) ZERO_CUDA_CHECK(cudaFree(p));
    free_.clear();
    stats_.cached = 0;
  }

  std::mutex mutex_;
  std::map<std::pair<cudaStream_t, std::size_t>, std::vector<void*>> free_;
  std::unordered_map<void*, Block> live_;
  AllocatorStats stats_;
};

// Pinned host blocks: exact-size free lists (4 KiB granularity), like the CPU allocator.
class PinnedCachingAllocator {
 public:
  static PinnedCachingAllocator& instance() {
    static auto* a = new PinnedCachingAllocator();
    return *a;
  }

  void* allocate(std::size_t nbytes) {
    const std::size_t size = nbytes == 0 ? 4096 : (nbytes + 4095) / 4096 * 4096;
    std::lock_guard<std::mutex> lock(mutex_);
    void* ptr = nullptr;
    auto& list = free_[size];
    if (!list.empty()) {
      ptr = list.back();
      list.pop_back();
      stats_.cached -= size;
    } else {
      ZERO_CUDA_CHECK(cudaHostAlloc(&ptr, size, cudaHostAllocPortable));
      ++stats_.mallocs;
    }
    live_[ptr] = size;
    stats_.in_use += size;
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
    return ptr;
  }

  void deallocate(void* ptr) noexcept {
    if (ptr == nullptr) return;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(ptr);
      if (it == live_.end()) {
        std::fprintf(stderr, "zero::cuda::pinned_free: %p was not allocated by pinned_alloc\n", ptr);
        return;
      }
      const std::size_t size = it->second;
      live_.erase(it);
      free_[size].push_back(ptr);
      stats_.in_use -= size;
      stats_.cached += size;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero::cuda::pinned_free failed: %s\n", e.what());
    }
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::unordered_map<void*, std::size_t> live_;
  AllocatorStats stats_;
};

}  // namespace

void* device_alloc(std::size_t nbytes) { return device_alloc(nbytes, current_stream()); }

void* device_alloc(std::size_t nbytes, cudaStream_t stream) {
  ZERO_CHECK(cuda_available(), "CUDA is not available on this machine (no device or driver)");
  return DeviceCachingAllocator::instance().allocate(nbytes, stream);
}

void device_free(void* ptr) noexcept { DeviceCachingAllocator::instance().deallocate(ptr); }
AllocatorStats allocator_stats() { return DeviceCachingAllocator::instance().stats(); }
void reset_allocator_peak() { DeviceCachingAllocator::instance().reset_peak(); }
void empty_cache() { DeviceCachingAllocator::instance().empty_cache(); }

void* pinned_alloc(std::size_t nbytes) {
  ZERO_CHECK(cuda_available(), "CUDA is not available on this machine (no device or driver)");
  return PinnedCachingAllocator::instance().allocate(nbytes);
}
void pinned_free(void* ptr) noexcept { PinnedCachingAllocator::instance().deallocate(ptr); }
AllocatorStats pinned_allocator_stats() { return PinnedCachingAllocator::instance().stats(); }

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
