#include "core/tensor.h"

#include <fmt/ranges.h>

#include <cstring>

#include "core/cpu/convert.h"
#include "core/strided.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#endif

namespace zero {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  std::int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

namespace {

float load_as_float(const void* base, std::int64_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return static_cast<float>(static_cast<const half*>(base)[i]);
    case DType::bf16: return static_cast<float>(static_cast<const bfloat16*>(base)[i]);
    case DType::i32: return static_cast<float>(static_cast<const std::int32_t*>(base)[i]);
    case DType::i64: return static_cast<float>(static_cast<const std::int64_t*>(base)[i]);
  }
  return 0.0f;
}

void store_from_float(void* base, std::int64_t i, DType t, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; break;
    case DType::f16: static_cast<half*>(base)[i] = half(v); break;
    case DType::bf16: static_cast<bfloat16*>(base)[i] = bfloat16(v); break;
    case DType::i32: static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v); break;
    case DType::i64: static_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(v); break;
  }
}

#ifdef ZERO_HAS_CUDA
// Note [Tensors on cuda]
// A cuda tensor's data pointer is device memory: the host loops in this file must never touch it. Each
// member below that reads or writes elements therefore branches first: cuda -> host reads download a
// contiguous copy, cuda writes go through core/cuda kernels (fill, cast, strided copy) on the current
// stream. Shapes, strides and views are the same on both devices.

// A contiguous copy of `t` (on cuda) in new cuda storage; `t` itself if already contiguous.
Tensor cuda_contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), Device::cuda);
  cuda::strided_copy(out.raw_data(), contiguous_strides(t.shape()), 0, t.storage()->data(), t.strides(), t.offset(),
                     t.shape(), dtype_size(t.dtype()));
  return out;
}

// A contiguous host copy of cuda tensor `t` (same dtype). Waits for the copy.
Tensor download(const Tensor& t) {
  const Tensor dense = cuda_contiguous(t);
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::cpu);
  cuda::copy(host.raw_data(), dense.raw_data(), host.nbytes());
  return host;
}

// dst.copy_(src) when at least one of them is on cuda (same numel, elements in row-major order).
void copy_with_cuda(Tensor dst, const Tensor& src) {
  if (dst.device() == Device::cpu) {
    dst.copy_(download(src));  // the host path converts dtype and follows dst's strides
    return;
  }
  // Make `s` a contiguous cuda tensor of dst's dtype holding src's elements.
  Tensor s = src;
  if (s.device() == Device::cpu) {
    if (s.dtype() != dst.dtype() || !s.is_contiguous()) {
      Tensor converted = Tensor::empty(s.shape(), dst.dtype(), Device::cpu);
      converted.copy_(s);
      s = converted;
    }
    // From pageable memory cudaMemcpyAsync returns once the source is staged: `s` may go away after it.
    if (dst.is_contiguous()) {
      cuda::copy_async(dst.raw_data(), s.raw_data(), s.nbytes());
      return;
    }
    Tensor up = Tensor::empty(s.shape(), s.dtype(), Device::cuda);
    cuda::copy_async(up.raw_data(), s.raw_data(), s.nbytes());
    s = up;
  } else {
    s = cuda_contiguous(s);
    if (s.dtype() != dst.dtype()) {
      Tensor converted = Tensor::empty(s.shape(), dst.dtype(), Device::cuda);
      cuda::cast(converted.raw_data(), dst.dtype(), s.raw_data(), s.dtype(), s.numel());
      s = converted;
    }
    if (s.storage() == dst.storage()) {  // views of one storage may overlap; cudaMemcpy must not
      Tensor fresh = Tensor::empty(s.shape(), s.dtype(), Device::cuda);
      cuda::copy_async(fresh.raw_data(), s.raw_data(), s.nbytes());
      s = fresh;
    }
  }
  if (dst.is_contiguous()) {
    cuda::copy_async(dst.raw_data(), s.raw_data(), dst.nbytes());
  } else {
    cuda::strided_copy(dst.storage()->data(), dst.strides(), dst.offset(), s.raw_data(), contiguous_strides(dst.shape()),
                       0, dst.shape(), dtype_size(dst.dtype()));
  }
}
#endif

}  // namespace

std::int64_t Tensor::size(int d) const {
  const int nd = dim();
  if (d < 0) d += nd;
  ZERO_CHECK(d >= 0 && d < nd, "dimension {} out of range for shape {}", d, shape_str(shape()));
  return impl_->shape[d];
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] != 1 && impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape) ZERO_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
#ifdef ZERO_HAS_CUDA
  if (device == Device::cuda) {
    cuda::memset_async(t.raw_data(), 0, t.nbytes());
    return t;
  }
#endif
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  ZERO_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "{} values for shape {}", values.size(),
             shape_str(shape));
  Tensor t = empty(shape);
  std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::from_indices(const std::vector<std::int64_t>& values, const Shape& shape) {
  ZERO_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "{} indices for shape {}", values.size(),
             shape_str(shape));
  Tensor t = empty(shape, DType::i64);
  std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, float mean, float std) {
  Tensor t = empty(shape);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = gen.normal(mean, std);
  return t;
}

float Tensor::item_at(std::int64_t i) const {
  ZERO_CHECK(i >= 0 && i < numel(), "index {} out of range for {} elements", i, numel());
#ifdef ZERO_HAS_CUDA
  if (device() == Device::cuda) return download(*this).item_at(i);
#endif
  std::int64_t off = 0, rem = i;
  for (int d = dim() - 1; d >= 0; --d) {
    off += (rem % impl_->shape[d]) * impl_->strides[d];
    rem /= impl_->shape[d];
  }
  return load_as_float(raw_data(), off, dtype());
}

float Tensor::item() const {
  ZERO_CHECK(numel() == 1, "item() on a tensor of shape {}", shape_str(shape()));
#ifdef ZERO_HAS_CUDA
  if (device() == Device::cuda) return download(*this).item();
#endif
  return load_as_float(raw_data(), 0, dtype());
}

std::vector<float> Tensor::to_vector() const {
#ifdef ZERO_HAS_CUDA
  if (device() == Device::cuda) return download(*this).to_vector();
#endif
  std::vector<float> out;
  out.reserve(numel());
  const void* base = impl_->storage->data();
  for_each_offset(shape(), strides(), offset(), [&](std::int64_t off) { out.push_back(load_as_float(base, off, dtype())); });
  return out;
}

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, std::int64_t offset) const {
  ZERO_CHECK(shape.size() == strides.size(), "as_strided: shape {} and strides {} differ in rank", shape_str(shape),
             shape_str(strides));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
#ifdef ZERO_HAS_CUDA
  if (target == Device::cpu) return download(*this);
#endif
  Tensor out = empty(shape(), dtype(), target);  // throws for cuda in a build without CUDA
  out.copy_(*this);
  return out;
}

Tensor Tensor::detach() const { return as_strided(shape(), strides(), offset()); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  ZERO_CHECK(src.numel() == numel(), "copy_: source has {} elements {}, destination {} {}", src.numel(),
             shape_str(src.shape()), numel(), shape_str(shape()));
  impl_->storage->bump_version();
#ifdef ZERO_HAS_CUDA
  if (device() == Device::cuda || src.device() == Device::cuda) {
    copy_with_cuda(*this, src);
    return;
  }
#endif
  if (src.dtype() == dtype() && src.is_contiguous() && is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  if (src.is_contiguous() && is_contiguous() && is_floating(src.dtype()) && is_floating(dtype()) &&
      src.storage() != storage()) {
    // Vectorised, same bits as the element loop below (tests/unit/test_tensor.cpp checks).
    cpu::convert(raw_data(), dtype(), src.raw_data(), src.dtype(), numel());
    return;
  }
  std::vector<std::int64_t> src_offsets;
  src_offsets.reserve(numel());
  for_each_offset(src.shape(), src.strides(), src.offset(), [&](std::int64_t off) { src_offsets.push_back(off); });
  const void* sbase = src.storage()->data();
  void* dbase = storage()->data();
  std::int64_t k = 0;
  for_each_offset(shape(), strides(), offset(), [&](std::int64_t off) {
    store_from_float(dbase, off, dtype(), load_as_float(sbase, src_offsets[k++], src.dtype()));
  });
}

void Tensor::set_data(const Tensor& src) {
  impl_->storage = src.impl_->storage;
  impl_->shape = src.impl_->shape;
  impl_->strides = src.impl_->strides;
  impl_->offset = src.impl_->offset;
  impl_->dtype = src.impl_->dtype;
}

void Tensor::fill_(float value) {
  impl_->storage->bump_version();
#ifdef ZERO_HAS_CUDA
  if (device() == Device::cuda) {
    if (is_contiguous()) {
      cuda::fill(raw_data(), dtype(), value, numel());
    } else {
      Tensor dense = empty(shape(), dtype(), Device::cuda);
      cuda::fill(dense.raw_data(), dtype(), value, numel());
      copy_(dense);
    }
    return;
  }
#endif
  void* base = storage()->data();
  if (is_contiguous() && dtype() == DType::f32) {
    std::fill_n(data<float>(), numel(), value);
    return;
  }
  if (is_contiguous() && (dtype() == DType::f16 || dtype() == DType::bf16)) {
    std::uint16_t bits;  // the value rounded once, then replicated
    store_from_float(&bits, 0, dtype(), value);
    std::fill_n(static_cast<std::uint16_t*>(raw_data()), numel(), bits);
    return;
  }
  for_each_offset(shape(), strides(), offset(), [&](std::int64_t off) { store_from_float(base, off, dtype(), value); });
}

}  // namespace zero
