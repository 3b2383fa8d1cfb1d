#include "core/storage.h"

#include "core/backend.h"
#include "core/check.h"

namespace zero {

namespace {
thread_local int meta_scopes = 0;  // MetaTensorScopes alive on this thread
}  // namespace

MetaTensorScope::MetaTensorScope() { ++meta_scopes; }
MetaTensorScope::~MetaTensorScope() { --meta_scopes; }
bool MetaTensorScope::active() { return meta_scopes > 0; }

// The device's caching allocator (Backend::allocate: host free lists on cpu, core/cuda/runtime.h's
// device allocator on cuda), unless a MetaTensorScope is alive (Note [Meta tensors]). backend() throws
// for a device this build has no backend for.
Storage::Storage(std::size_t nbytes, Device device)
    : freed_(MetaTensorScope::active()),
      meta_(freed_),
      data_(meta_ ? nullptr : backend(device).allocate(nbytes)),
      nbytes_(nbytes),
      device_(device) {}

Storage::~Storage() {
  if (!freed_) backend(device_).deallocate(data_);
}

void Storage::throw_freed(bool meta) {
  if (meta)
    throw Error("tensor read that has no data: it was made under a MetaTensorScope, shape only (Note [Meta tensors])");
  throw Error(
      "tensor read while its storage is freed: a ZeRO stage-3 parameter outside its gather (read parameters "
      "in a layer's forward, through nn::Module::compute; Note [Storage that is freed and refilled])");
}

void Storage::guarded_access() const {
  // The guard may refill or wait for the contents: logically const for the reader.
  if (guard_ != nullptr) guard_->before_access(const_cast<Storage&>(*this));
  if (freed_) throw_freed(meta_);
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
  meta_ = false;
}

}  // namespace zero
