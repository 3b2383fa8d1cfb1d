#include "core/tensor.h"

#include <fmt/ranges.h>

#include <cstring>
#include <utility>

#include "core/autograd_interface.h"
#include "core/backend.h"
#include "core/strided.h"

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

// Note [Tensors on a device]
// A tensor's data pointer is memory of its device: host loops in this file touch only cpu tensors.
// Element reads of another device's tensor (item_at, item, to_vector) copy it to the host first; every
// write goes through the tensor's backend (Backend::copy, fill), and copies between devices move whole
// contiguous buffers with Backend::copy_bytes while the host side converts dtype and layout. No member
// here branches on which device it is.

namespace {

StridedView view_of(const Tensor& t) { return {t.storage()->data(), t.dtype(), t.shape(), t.strides(), t.offset()}; }

}  // namespace

namespace detail {

namespace {
const AutogradInterface* installed_autograd = nullptr;
}  // namespace

void set_autograd_interface(const AutogradInterface* impl) { installed_autograd = impl; }
const AutogradInterface* autograd_interface() { return installed_autograd; }

}  // namespace detail

namespace {

// The autograd implementation, for a member that cannot work without it (Note [Autograd behind an
// interface]).
const detail::AutogradInterface& need_autograd(const char* what) {
  const detail::AutogradInterface* a = detail::autograd_interface();
  ZERO_CHECK(a != nullptr,
             "{}: autograd/ is not linked into this program (a static link pulls it in with the first op of "
             "autograd/ops.h or autograd.h the program calls)",
             what);
  return *a;
}

// Records `out`, made from `in` by a view or conversion, in the graph: nothing to record for a tensor
// that needs no gradient, and no graph without autograd/ (no backward could run it).
void record_view(const char* name, const Tensor& in, Tensor& out, std::function<Tensor(const Tensor&)> backward) {
  const detail::AutogradInterface* a = detail::autograd_interface();
  if (a != nullptr && in.requires_grad()) a->record(name, in, out, std::move(backward));
}

int wrap_dim(int d, int nd, const Shape& shape) {
  const int w = d < 0 ? d + nd : d;
  ZERO_CHECK(w >= 0 && w < nd, "dimension {} out of range for shape {}", d, shape_str(shape));
  return w;
}

Shape infer_shape(Shape shape, std::int64_t numel, const Shape& from) {
  int infer = -1;
  std::int64_t known = 1;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[i] == -1) {
      ZERO_CHECK(infer < 0, "view: more than one -1 in {}", shape_str(shape));
      infer = i;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    ZERO_CHECK(known > 0 && numel % known == 0, "view: cannot view {} as {}", shape_str(from), shape_str(shape));
    shape[infer] = numel / known;
  }
  ZERO_CHECK(shape_numel(shape) == numel, "view: cannot view {} ({} elements) as {}", shape_str(from), numel,
             shape_str(shape));
  return shape;
}

}  // namespace

std::int64_t Tensor::size(int d) const {
  const int nd = dim();
  if (d < 0) d += nd;
  ZERO_CHECK(d >= 0 && d < nd, "dimension {} out of range for shape {}", d, shape_str(shape()));
  return impl_->shape[d];
}

bool is_contiguous(const Shape& shape, const Shape& strides) {
  std::int64_t expected = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

bool Tensor::is_contiguous() const { return zero::is_contiguous(impl_->shape, impl_->strides); }

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
  if (t.storage()->meta()) return t;  // shape only (Note [Meta tensors])
  backend(device).fill(t.raw_data(), dtype, 0.0f, t.numel());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (!t.storage()->meta()) t.fill_(value);
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
  if (t.storage()->meta()) return t;
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = gen.normal(mean, std);
  return t;
}

float Tensor::item_at(std::int64_t i) const {
  ZERO_CHECK(i >= 0 && i < numel(), "index {} out of range for {} elements", i, numel());
  if (device() != Device::cpu) return to(Device::cpu).item_at(i);
  std::int64_t off = 0, rem = i;
  for (int d = dim() - 1; d >= 0; --d) {
    off += (rem % impl_->shape[d]) * impl_->strides[d];
    rem /= impl_->shape[d];
  }
  return load_as_float(raw_data(), off, dtype());
}

float Tensor::item() const {
  ZERO_CHECK(numel() == 1, "item() on a tensor of shape {}", shape_str(shape()));
  if (device() != Device::cpu) return to(Device::cpu).item();
  return load_as_float(raw_data(), 0, dtype());
}

std::vector<float> Tensor::to_vector() const {
  if (device() != Device::cpu) return to(Device::cpu).to_vector();
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
  if (target == Device::cpu) {  // a contiguous copy on the device, then its bytes (the device waits)
    const Tensor dense = is_contiguous() ? *this : clone();
    Tensor host = empty(shape(), dtype(), Device::cpu);
    backend(device()).copy_bytes(host.raw_data(), dense.raw_data(), host.nbytes());
    return host;
  }
  Tensor out = empty(shape(), dtype(), target);  // throws for a device this build has no backend for
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
  if (src.device() == device()) {
    backend(device()).copy(view_of(*this), view_of(src));
    return;
  }
  // Between devices (Note [Tensors on a device]). Into the host: download, then convert on the host.
  if (device() == Device::cpu) {
    copy_(src.to(Device::cpu));
    return;
  }
  // Onto a device: src as a contiguous host tensor of this dtype, then its bytes.
  Tensor s = src.to(Device::cpu);
  if (s.dtype() != dtype() || !s.is_contiguous()) {
    Tensor converted = empty(s.shape(), dtype(), Device::cpu);
    converted.copy_(s);
    s = converted;
  }
  if (is_contiguous()) {
    backend(device()).copy_bytes(raw_data(), s.raw_data(), nbytes());
    return;
  }
  Tensor up = empty(s.shape(), s.dtype(), device());
  backend(device()).copy_bytes(up.raw_data(), s.raw_data(), s.nbytes());
  backend(device()).copy(view_of(*this), view_of(up));
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
  if (is_contiguous()) {
    backend(device()).fill(raw_data(), dtype(), value, numel());
    return;
  }
  Tensor dense = empty(shape(), dtype(), device());
  backend(device()).fill(dense.raw_data(), dtype(), value, numel());
  backend(device()).copy(view_of(*this), view_of(dense));
}

// ---- the differentiable views and conversions (recorded through Note [Autograd behind an interface]) ----

Tensor Tensor::view(const Shape& shape) const {
  const Shape s = infer_shape(shape, numel(), this->shape());
  ZERO_CHECK(is_contiguous(), "view: tensor of shape {} is not contiguous (use reshape)", shape_str(this->shape()));
  Tensor out = as_strided(s, contiguous_strides(s), offset());
  record_view("view", *this, out, [in = this->shape()](const Tensor& g) { return g.reshape(in); });
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const { return is_contiguous() ? view(shape) : contiguous().view(shape); }

Tensor Tensor::transpose(int d0, int d1) const {
  const int nd = dim();
  d0 = wrap_dim(d0, nd, shape());
  d1 = wrap_dim(d1, nd, shape());
  Shape s = shape(), st = strides();
  std::swap(s[d0], s[d1]);
  std::swap(st[d0], st[d1]);
  Tensor out = as_strided(s, st, offset());
  record_view("transpose", *this, out, [d0, d1](const Tensor& g) { return g.transpose(d0, d1); });
  return out;
}

Tensor Tensor::narrow(int d, std::int64_t start, std::int64_t length) const {
  d = wrap_dim(d, dim(), shape());
  ZERO_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d],
             "narrow: [{}, {}) outside dimension {} of size {}", start, start + length, d, shape()[d]);
  Shape s = shape();
  s[d] = length;
  Tensor out = as_strided(s, strides(), offset() + start * strides()[d]);
  record_view("narrow", *this, out, [in = shape(), d, start, length](const Tensor& g) {
    Tensor full = Tensor::zeros(in, g.dtype(), g.device());
    full.narrow(d, start, length).copy_(g);
    return full;
  });
  return out;
}

Tensor Tensor::expand(const Shape& shape) const {
  const int nd = static_cast<int>(shape.size()), td = dim();
  ZERO_CHECK(nd >= td, "expand: cannot expand {} to fewer dimensions {}", shape_str(this->shape()), shape_str(shape));
  Shape st(nd, 0);
  for (int i = 0; i < td; ++i) {
    const int o = nd - td + i;
    const std::int64_t have = this->shape()[i];
    ZERO_CHECK(have == shape[o] || have == 1, "expand: cannot expand {} to {}", shape_str(this->shape()),
               shape_str(shape));
    st[o] = have == 1 && shape[o] != 1 ? 0 : strides()[i];
  }
  Tensor out = as_strided(shape, st, offset());
  record_view("expand", *this, out,
              [in = this->shape()](const Tensor& g) { return need_autograd("expand").sum_to(g, in); });
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = clone();
  record_view("contiguous", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = Tensor::empty(shape(), target, device());
  out.copy_(*this);
  if (is_floating(target) && is_floating(dtype())) {
    // The gradient flows back in the source's dtype (an f16 parameter gets an f16 gradient).
    record_view("to", *this, out, [source = dtype()](const Tensor& g) { return g.to(source); });
  }
  return out;
}

// ---- autograd state (Note [Autograd behind an interface]) ----

autograd::AutogradMeta& autograd::meta_of(const Tensor& t) {
  auto& m = t.impl()->autograd;
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

bool Tensor::requires_grad() const {
  const autograd::AutogradMeta* m = impl_->autograd.get();
  return m != nullptr && (m->requires_grad || m->grad_fn != nullptr);
}

Tensor& Tensor::set_requires_grad(bool value) {
  ZERO_CHECK(is_leaf(), "set_requires_grad on a non-leaf tensor");
  ZERO_CHECK(!value || is_floating(dtype()), "only float tensors can require grad, got {}", dtype_name(dtype()));
  if (value || impl_->autograd) autograd::meta_of(*this).requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const { return impl_->autograd ? impl_->autograd->grad : Tensor(); }

void Tensor::set_grad(const Tensor& g) {
  ZERO_CHECK(!g.defined() || g.shape() == shape(), "set_grad: gradient shape {} differs from tensor shape {}",
             shape_str(g.shape()), shape_str(shape()));
  if (g.defined() || impl_->autograd) autograd::meta_of(*this).grad = g;
}

bool Tensor::is_leaf() const { return !impl_->autograd || !impl_->autograd->grad_fn; }

void Tensor::backward() const { need_autograd("backward").backward(*this); }

}  // namespace zero
