// CachingAllocator: the free-list bookkeeping shared by host memory (core/storage.cpp), device memory
// and pinned host memory (core/cuda/runtime.cpp), over one (allocate, free) pair each.
//
// A training loop asks for the same sizes every step, and the system allocators are slow (cudaFree
// synchronises the whole device), so freed blocks are kept on free lists keyed by (stream, rounded size)
// and handed out again to the next request of that key. The stream key is what makes device reuse safe
// without synchronising: a block freed on stream S may still be read by kernels queued on S, but a later
// request on S is ordered after them (PyTorch's CUDACachingAllocator does the same, with block splitting
// on top; whole blocks are kept here for clarity). Host memory uses key 0. When the system allocator
// fails, the cache is released and the request retried once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/storage.h"

namespace zero {

class CachingAllocator {
 public:
  struct Source {
    /// Rounds a request up to the size of the block that serves it (bytes).
    std::function<std::size_t(std::size_t)> round;
    /// Gets `size` bytes from the system; null when out of memory (other failures throw).
    std::function<void*(std::size_t)> allocate;
    /// Returns a block to the system.
    std::function<void(void*)> free;
    /// Runs before cached blocks are returned to the system (a device synchronisation); may be empty.
    std::function<void()> before_release;
  };

  explicit CachingAllocator(Source source) : source_(std::move(source)) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// A block of at least `nbytes` for use in order on `stream` (0 for host memory); null when the system
  /// is out of memory even after the cache was released.
  void* allocate(std::size_t nbytes, std::uintptr_t stream = 0);
  /// Puts a block from allocate() back on its free list. Returns false (and does nothing) for a pointer
  /// this allocator did not hand out.
  bool deallocate(void* ptr);

  AllocatorStats stats();
  void reset_peak();
  /// Returns every cached block to the system.
  void empty_cache();

 private:
  struct Block {
    std::size_t size;
    std::uintptr_t stream;
  };
  void release_cache_locked();

  Source source_;
  std::mutex mutex_;
  std::map<std::pair<std::uintptr_t, std::size_t>, std::vector<void*>> free_;
  std::unordered_map<void*, Block> live_;
  AllocatorStats stats_;
};

}  // namespace zero
