#include "core/storage.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/runtime.h"
#endif

namespace zero {
namespace detail {

// Exact-size free lists. Sizes are rounded up to 64 bytes so near-equal requests share a list.
class CpuCachingAllocator {
 public:
  static CpuCachingAllocator& instance() {
    static auto* a = new CpuCachingAllocator();  // never destroyed: storages may outlive main's statics
    return *a;
  }

  void* allocate(std::size_t nbytes) {
    const std::size_t size = round_up(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& list = free_[size];
    void* ptr;
    if (!list.empty()) {
      ptr = list.back();
      list.pop_back();
      stats_.cached -= size;
    } else {
      ptr = std::aligned_alloc(64, size);
      if (ptr == nullptr) {
        release_cache_locked();
        ptr = std::aligned_alloc(64, size);
        if (ptr == nullptr) throw std::bad_alloc();
      }
      ++stats_.mallocs;
    }
    stats_.in_use += size;
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
    return ptr;
  }

  void deallocate(void* ptr, std::size_t nbytes) {
    const std::size_t size = round_up(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    free_[size].push_back(ptr);
    stats_.in_use -= size;
    stats_.cached += size;
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
  static std::size_t round_up(std::size_t n) { return n == 0 ? 64 : (n + 63) / 64 * 64; }
  void release_cache_locked() {
    for (auto& [size, list] : free_)
      for (void* p : list) std::free(p);
    free_.clear();
    stats_.cached = 0;
  }

  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace detail

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device == Device::cuda) {
#ifdef ZERO_HAS_CUDA
    data_ = cuda::device_alloc(nbytes);  // the device caching allocator, on the current stream
    return;
#else
    ZERO_CHECK(false, "device '{}' storage is not available in this build (configure with -DZERO_CUDA=ON)",
               device_name(device));
#endif
  }
  data_ = detail::CpuCachingAllocator::instance().allocate(nbytes);
}

Storage::~Storage() {
#ifdef ZERO_HAS_CUDA
  if (device_ == Device::cuda) {
    cuda::device_free(data_);
    return;
  }
#endif
  detail::CpuCachingAllocator::instance().deallocate(data_, nbytes_);
}

AllocatorStats cpu_allocator_stats() { return detail::CpuCachingAllocator::instance().stats(); }
void reset_cpu_allocator_peak() { detail::CpuCachingAllocator::instance().reset_peak(); }
void empty_cpu_cache() { detail::CpuCachingAllocator::instance().empty_cache(); }

}  // namespace zero
