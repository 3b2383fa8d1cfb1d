#include "core/caching_allocator.h"

namespace zero {

void* CachingAllocator::allocate(std::size_t nbytes, std::uintptr_t stream) {
  const std::size_t size = source_.round(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  auto it = free_.find({stream, size});
  if (it != free_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.cached -= size;
  } else {
    ptr = source_.allocate(size);
    if (ptr == nullptr) {
      release_cache_locked();
      ptr = source_.allocate(size);
      if (ptr == nullptr) return nullptr;
    }
    ++stats_.mallocs;
  }
  live_[ptr] = Block{size, stream};
  stats_.in_use += size;
  if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
  return ptr;
}

bool CachingAllocator::deallocate(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  const Block block = it->second;
  live_.erase(it);
  free_[{block.stream, block.size}].push_back(ptr);
  stats_.in_use -= block.size;
  stats_.cached += block.size;
  return true;
}

AllocatorStats CachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_in_use = stats_.in_use;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cache_locked();
}

void CachingAllocator::release_cache_locked() {
  if (source_.before_release) source_.before_release();
  for (auto& [key, list] : free_)
    for (void* p : list) source_.free(p);
  free_.clear();
  stats_.cached = 0;
}

}  // namespace zero
