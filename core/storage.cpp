#include "core/storage.h"

#include "core/backend.h"

namespace zero {

// The device's caching allocator (Backend::allocate: host free lists on cpu, core/cuda/runtime.h's
// device allocator on cuda). backend() throws for a device this build has no backend for.
Storage::Storage(std::size_t nbytes, Device device)
    : data_(backend(device).allocate(nbytes)), nbytes_(nbytes), device_(device) {}

Storage::~Storage() { backend(device_).deallocate(data_); }

}  // namespace zero
