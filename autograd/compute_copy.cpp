// A layer's f32 compute copy of a 16-bit parameter (Note [Compute copies] in autograd/compute_copy.h). Tensor's
// own views and conversions are in core/tensor.cpp.
#include "autograd/compute_copy.h"

namespace zero {

using autograd::record;

namespace {

// Converts p into cache.value and records what it was made from. Reuses cache.value's storage (refilled
// if freed) when its shape and device still fit, so tensors saved from it see the new values.
void convert_into(const Tensor& p, autograd::ComputeCopy& cache) {
  autograd::NoGradGuard no_grad;
  const bool reuse = cache.value.defined() && cache.value.shape() == p.shape() && cache.value.device() == p.device();
  if (reuse) {
    cache.value.storage()->allocate_memory();
    cache.value.copy_(p);
  } else {
    cache.value = p.detach().to(DType::f32);
  }
  cache.storage = p.storage();
  cache.offset = p.offset();
  cache.version = p.storage()->version();
  cache.dtype = p.dtype();
  cache.shape = p.shape();
}

}  // namespace

Tensor to_f32_cached(const Tensor& p, autograd::ComputeCopy& cache) {
  if (p.dtype() == DType::f32) return p;
  const bool fresh = cache.value.defined() && !cache.value.storage()->freed() && cache.storage.lock() == p.storage() &&
                     cache.offset == p.offset() && cache.version == p.storage()->version() &&
                     cache.dtype == p.dtype() && cache.shape == p.shape();
  if (!fresh) {
    cache.value = Tensor();  // a new copy: tensors saved from the old one keep the values they were made with
    convert_into(p, cache);
  }
  Tensor out = cache.value.detach();  // a new handle: the graph node attaches to it, not to the cache
  record("to", {p}, out, [source = p.dtype()](const Tensor& g) -> std::vector<Tensor> { return {g.to(source)}; });
  return out;
}

void refresh_compute_copy(const Tensor& p) {
  autograd::ComputeCopy& cache = autograd::meta_of(p).compute_copy;
  if (p.dtype() != DType::f32 && cache.value.defined()) convert_into(p, cache);
}

void free_compute_copy(const Tensor& p) {
  const autograd::AutogradMeta* m = p.impl()->autograd.get();
  if (m != nullptr && m->compute_copy.value.defined()) m->compute_copy.value.storage()->free_memory();
}

Storage* compute_copy_storage(const Tensor& p) {
  const autograd::AutogradMeta* m = p.impl()->autograd.get();
  return m != nullptr && m->compute_copy.value.defined() ? m->compute_copy.value.storage().get() : nullptr;
}

}  // namespace zero
