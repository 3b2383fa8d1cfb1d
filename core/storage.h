// Storage: one reference-counted block of device memory that tensors view.
//
// CPU blocks come from a caching allocator (core/caching_allocator.h): a freed block goes back to a free
// list keyed by its rounded size and is handed out again to the next request of that size, so a
// training loop, which asks for the same sizes every step, stops calling malloc after its first step.
// CUDA blocks come from the device caching allocator of core/cuda/runtime.h (builds with ZERO_HAS_CUDA),
// the same CachingAllocator over cudaMalloc/cudaFree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"

namespace zero {

class Storage {
 public:
  /// Allocates `nbytes` bytes (64-byte aligned; 256 on cuda) on `device`. Throws zero::Error for cuda in
  /// a build without CUDA or on a machine without a device, std::bad_alloc when host memory runs out,
  /// zero::Error when device memory does. Device memory is allocated for the current stream
  /// (cuda::current_stream(); see cuda::device_alloc for what that means for reuse).
  Storage(std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  /// The contents. A guarded storage (set_guard) first asks its guard, which makes them valid or throws
  /// (Note [Guarded storage]); a freed one without a guard throws zero::Error (Note [Storage that is freed
  /// and refilled]).
  void* data() const {
    if (guard_ != nullptr || freed_) [[unlikely]]
      guarded_access();
    return data_;
  }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  /// A counter bumped by every write that goes through Tensor (copy_, fill_) and, by hand, by code that
  /// writes parameters through raw pointers (the ZeRO optimizer's step). Caches derived from the
  /// contents (nn::Module's f32 compute copies, Note [Compute copies] in autograd/compute_copy.h) compare it.
  std::uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

  // Note [Storage that is freed and refilled]
  // ZeRO stage 3 keeps a parameter's full values only while a layer needs them: the memory of a
  // gathered parameter is returned between uses, but every tensor viewing it (the parameter itself,
  // what autograd saved of it for backward) keeps pointing at the same Storage, which is refilled before
  // the next use (PyTorch FSDP does the same with storage().resize_(0)). Reading a freed storage through
  // a Tensor throws zero::Error instead of touching freed memory.

  /// Returns the memory to the allocator; nbytes() keeps its value. A no-op when already freed.
  void free_memory();
  /// Made under a MetaTensorScope: no memory was ever allocated, and reading throws (Note [Meta tensors]).
  bool meta() const { return meta_; }
  /// Allocates nbytes() again (the contents are undefined until written). A no-op unless freed.
  void allocate_memory();
  /// No memory held: freed, or made under a MetaTensorScope (then meta() too).
  bool freed() const { return freed_; }

  // Note [Guarded storage]
  // ZeRO stage 3 also has storages whose contents are on their way (an all-gather in flight writes
  // them) or gone (freed between uses). A read through a Tensor must then wait for the gather, gather
  // the values through the agreed schedule, or fail naming the parameter: never see garbage or last
  // step's values. The owner of such a storage installs a guard while the contents are not valid;
  // data() calls guard->before_access(*this) first, which either makes them valid (and removes
  // itself) or throws. Reads of unguarded, valid storages cost one extra null check.
  class Guard {
   public:
    virtual ~Guard() = default;
    /// Makes `storage`'s contents valid (then calls storage.set_guard(nullptr)) or throws zero::Error.
    virtual void before_access(Storage& storage) = 0;
  };
  /// Installs `guard` (nullptr: none). The guard must outlive its installation.
  void set_guard(Guard* guard) { guard_ = guard; }
  Guard* guard() const { return guard_; }
  /// The contents without asking the guard: for the guard's owner, who knows their state (nullptr while
  /// freed).
  void* unguarded_data() const { return data_; }

 private:
  void guarded_access() const;
  [[noreturn]] static void throw_freed(bool meta);
  Guard* guard_ = nullptr;
  bool freed_ = false;
  bool meta_ = false;
  std::uint64_t version_ = 0;
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_ = Device::cpu;
};

// Note [Meta tensors]
// While a MetaTensorScope is alive on a thread, the storages it creates hold no memory: a tensor made
// then has its shape, dtype, device and byte size, and no data, like a tensor on PyTorch's meta device
// (torch.device("meta"); accelerate's init_empty_weights builds models that way). Tensor's factories
// skip filling them (randn draws nothing from its generator), so constructing an nn::Module of any size
// costs only its bookkeeping: zero_explain lists the parameters of a 175-billion-parameter model this
// way. Reading such a tensor's data throws zero::Error; allocate_memory() would give it memory, but
// nothing here does. Scopes nest; a thread's count is its own.

/// While alive, storages created on this thread hold no memory (Note [Meta tensors]). Not copyable.
class MetaTensorScope {
 public:
  MetaTensorScope();
  ~MetaTensorScope();
  MetaTensorScope(const MetaTensorScope&) = delete;
  MetaTensorScope& operator=(const MetaTensorScope&) = delete;
  /// Whether a scope is alive on this thread.
  static bool active();
};

/// Counters of a caching allocator, in bytes (CPU here; cuda::allocator_stats() for the device).
struct AllocatorStats {
  std::size_t in_use = 0;       // held by live storages
  std::size_t peak_in_use = 0;  // maximum of in_use since start (or the last reset_peak)
  std::size_t cached = 0;       // freed blocks kept for reuse
  std::size_t mallocs = 0;      // calls that reached the system allocator (count, not bytes)
};
AllocatorStats cpu_allocator_stats();
void reset_cpu_allocator_peak();
/// Returns every cached block to the system.
void empty_cpu_cache();

}  // namespace zero
