#include "core/storage.h"

#include <cstdlib>
#include <new>

#include "core/caching_allocator.h"
#include "core/check.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/runtime.h"
#endif

namespace zero {
namespace detail {

// Host blocks: exact-size free lists, sizes rounded up to 64 bytes so near-equal requests share a list.
CachingAllocator& cpu_allocator() {
  static auto* a = new CachingAllocator(CachingAllocator::Source{
      [](std::size_t n) { return n == 0 ? std::size_t{64} : (n + 63) / 64 * 64; },
      [](std::size_t size) { return std::aligned_alloc(64, size); },
      [](void* p) { std::free(p); },
      {}});
  return *a;  // never destroyed: storages may outlive main's statics
}

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
  data_ = detail::cpu_allocator().allocate(nbytes);
  if (data_ == nullptr) throw std::bad_alloc();
}

Storage::~Storage() {
#ifdef ZERO_HAS_CUDA
  if (device_ == Device::cuda) {
    cuda::device_free(data_);
    return;
  }
#endif
  detail::cpu_allocator().deallocate(data_);
}

AllocatorStats cpu_allocator_stats() { return detail::cpu_allocator().stats(); }
void reset_cpu_allocator_peak() { detail::cpu_allocator().reset_peak(); }
void empty_cpu_cache() { detail::cpu_allocator().empty_cache(); }

}  // namespace zero
