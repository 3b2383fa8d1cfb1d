#include "core/storage.h"

#include "core/backend.h"
#include "core/check.h"

namespace zero {

// The device's caching allocator (Backend::allocate: host free lists on cpu, core/cuda/runtime.h's
// device allocator on cuda). backend() throws for a device this build has no backend for.
Storage::Storage(std::size_t nbytes, Device device)
    : data_(backend(device).allocate(nbytes)), nbytes_(nbytes), device_(device) {}

Storage::~Storage() {
  if (!freed_) backend(device_).deallocate(data_);
}

void Storage::throw_freed() {
  throw Error(
      "tensor read while its storage is freed: a ZeRO stage-3 parameter outside its gather (read parameters "
      "in a layer's forward, through nn::Module::compute; Note [Storage that is freed and refilled])");
}

void Storage::guarded_access() const {
  // The guard may refill or wait for the contents: logically const for the reader.
  if (guard_ != nullptr) guard_->before_access(const_cast<Storage&>(*this));
  if (freed_) throw_freed();
}

void Storage::free_memory() {
  if (freed_) return;
  backend(device_).deallocate(data_);
  data_ = nullptr;
  freed_ = true;
}

void Storage::allocate_memory() {
  if (!freed_) return;
  data_ = backend(device_).allocate(nbytes_);
  freed_ = false;
}

}  // namespace zero
