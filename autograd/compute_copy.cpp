// A layer's f32 compute copy of a 16-bit parameter (Note [Compute copies] in autograd/ops.h). Tensor's
// own views and conversions are in core/tensor.cpp.
#include "autograd/ops.h"

namespace zero {

using autograd::record;

Tensor to_f32_cached(const Tensor& p, ComputeCopy& cache) {
  if (p.dtype() == DType::f32) return p;
  const bool fresh = cache.value.defined() && cache.storage.lock() == p.storage() && cache.offset == p.offset() &&
                     cache.version == p.storage()->version() && cache.dtype == p.dtype() && cache.shape == p.shape();
  if (!fresh) {
    autograd::NoGradGuard no_grad;
    cache.value = p.detach().to(DType::f32);
    cache.storage = p.storage();
    cache.offset = p.offset();
    cache.version = p.storage()->version();
    cache.dtype = p.dtype();
    cache.shape = p.shape();
  }
  Tensor out = cache.value.detach();  // a new handle: the graph node attaches to it, not to the cache
  record("to", {p}, out, [source = p.dtype()](const Tensor& g) -> std::vector<Tensor> { return {g.to(source)}; });
  return out;
}

}  // namespace zero
