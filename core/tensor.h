// Tensor: a view (shape + strides + offset) into shared Storage, with a dtype and a device.
//
// Copying a Tensor copies a handle: both refer to the same TensorImpl. View operations (view/reshape,
// transpose, narrow, expand) make a new TensorImpl over the same Storage and never copy elements.
// Autograd state (requires_grad, grad, grad_fn, hooks) hangs off the TensorImpl as autograd/'s
// AutogradMeta; the members that use it reach autograd through an interface, so core/ links without
// autograd/ (Note [Autograd behind an interface] in core/autograd_interface.h).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/storage.h"

namespace zero {

using Shape = std::vector<std::int64_t>;
std::string shape_str(const Shape& s);
std::int64_t shape_numel(const Shape& s);
/// Row-major (C-contiguous) strides of `s`, in elements.
Shape contiguous_strides(const Shape& s);
/// True if a view of `shape` with `strides` (elements) is row-major contiguous (size-1 dimensions may
/// have any stride).
bool is_contiguous(const Shape& shape, const Shape& strides);

namespace autograd {
struct AutogradMeta;
class Node;
}  // namespace autograd

class Tensor;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;            // in elements
  std::int64_t offset = 0;  // in elements, from storage->data()
  DType dtype = DType::f32;
  std::shared_ptr<autograd::AutogradMeta> autograd;  // null until autograd touches this tensor
};

/// Random number source for initialisation and dropout (mt19937_64; seeded, so runs repeat).
class Generator {
 public:
  explicit Generator(std::uint64_t seed = 1337) : engine_(seed) {}
  float normal(float mean, float std) { return std::normal_distribution<float>(mean, std)(engine_); }
  float uniform() { return std::uniform_real_distribution<float>(0.0f, 1.0f)(engine_); }
  std::int64_t randint(std::int64_t high) { return std::uniform_int_distribution<std::int64_t>(0, high - 1)(engine_); }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (like an empty optional)
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (new contiguous storage; under a MetaTensorScope shape only, never filled: Note [Meta
  // tensors] in core/storage.h) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor full(const Shape& shape, float value, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu) {
    return full(shape, 1.0f, dtype, device);
  }
  /// f32 tensor of `shape` holding `values` (row-major). Throws if the counts differ.
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  /// i64 tensor of `shape` holding `values` (row-major).
  static Tensor from_indices(const std::vector<std::int64_t>& values, const Shape& shape);
  /// f32 tensor with elements drawn from N(mean, std²).
  static Tensor randn(const Shape& shape, Generator& gen, float mean = 0.0f, float std = 1.0f);

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  std::int64_t offset() const { return impl_->offset; }
  /// Size of dimension `d`; negative d counts from the end.
  std::int64_t size(int d) const;
  int dim() const { return static_cast<int>(impl_->shape.size()); }
  std::int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// True if both tensors are handles to the same TensorImpl.
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

  /// Pointer to the first element (storage + offset); a device pointer for a cuda tensor. Throws if T
  /// does not match dtype().
  template <typename T> T* data() const {
    ZERO_CHECK(dtype_of<T>() == dtype(), "data<{}>() on a {} tensor", dtype_name(dtype_of<T>()), dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }
  /// Throws zero::Error when the storage was freed (Note [Storage that is freed and refilled]).
  void* raw_data() const {
    return static_cast<char*>(impl_->storage->data()) + impl_->offset * static_cast<std::int64_t>(dtype_size(dtype()));
  }
  /// Element at flat row-major position `i` of the (possibly strided) view, converted to float.
  /// (item_at, item and to_vector copy a cuda tensor to the host first, synchronously.)
  float item_at(std::int64_t i) const;
  /// The single element of a one-element tensor, as float.
  float item() const;
  /// All elements in row-major order, converted to float.
  std::vector<float> to_vector() const;

  // ---- views: share storage; differentiable (recorded through autograd when it is linked) ----
  /// Same elements, new shape (one dimension may be -1). Needs a contiguous tensor; throws otherwise.
  Tensor view(const Shape& shape) const;
  /// view() if contiguous, else a contiguous copy reshaped.
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int d0, int d1) const;
  /// Elements [start, start + length) of dimension `d`.
  Tensor narrow(int d, std::int64_t start, std::int64_t length) const;
  /// Broadcast size-1 dimensions (and new leading ones) to `shape` with stride 0.
  Tensor expand(const Shape& shape) const;
  /// This tensor if already contiguous, else a contiguous copy (differentiable).
  Tensor contiguous() const;
  /// Converts to `dtype` (f32 <-> f16/bf16, round to nearest even); differentiable for float types.
  Tensor to(DType dtype) const;
  /// This tensor on `device`: itself if already there, else a contiguous copy in new storage there (same
  /// dtype). cuda -> cpu waits for the copy; cpu -> cuda is queued on the current stream. Not recorded
  /// by autograd (yet). Throws zero::Error for cuda in a build or on a machine without CUDA.
  Tensor to(Device device) const;

  /// A raw view without autograd: the building block of the views above.
  Tensor as_strided(const Shape& shape, const Shape& strides, std::int64_t offset) const;
  /// A handle to the same data that autograd does not track (like PyTorch's detach()).
  Tensor detach() const;
  /// A contiguous copy in new storage (not differentiable).
  Tensor clone() const;
  /// Copies `src` (same numel; any float dtype, converted) into this tensor's elements, in place.
  /// Either may be on cuda: copies between devices are queued on the current stream (and waited for
  /// when the destination is on the host). Note [Tensors on a device] in core/tensor.cpp.
  void copy_(const Tensor& src);
  void fill_(float value);
  /// Re-points this tensor (every handle to it) at `src`'s storage, shape, strides, offset and dtype,
  /// keeping its autograd identity (requires_grad, hooks). How flat buffers adopt module parameters.
  void set_data(const Tensor& src);
  void zero_() { fill_(0.0f); }

  // ---- autograd (through autograd/ when it is linked: Note [Autograd behind an interface]) ----
  bool requires_grad() const;
  /// Marks a leaf tensor as a parameter whose gradient accumulates in grad(). Returns *this.
  Tensor& set_requires_grad(bool value);
  /// Accumulated gradient of a leaf (undefined until a backward reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& g);
  bool is_leaf() const;
  /// Runs the backward pass from this one-element tensor (seed gradient 1). See autograd/engine.h.
  void backward() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace zero
