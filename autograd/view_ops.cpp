// The differentiable views and conversions declared on Tensor (core/tensor.h). Views share storage;
// their backward maps the gradient back to the input's shape.
#include "autograd/ops.h"

namespace zero {

using autograd::record;

namespace {
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

Tensor Tensor::view(const Shape& shape) const {
  const Shape s = infer_shape(shape, numel(), this->shape());
  ZERO_CHECK(is_contiguous(), "view: tensor of shape {} is not contiguous (use reshape)", shape_str(this->shape()));
  Tensor out = as_strided(s, contiguous_strides(s), offset());
  record("view", {*this}, out, [in = this->shape()](const Tensor& g) -> std::vector<Tensor> {
    return {g.reshape(in)};
  });
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
  record("transpose", {*this}, out, [d0, d1](const Tensor& g) -> std::vector<Tensor> {
    return {g.transpose(d0, d1)};
  });
  return out;
}

Tensor Tensor::narrow(int d, std::int64_t start, std::int64_t length) const {
  d = wrap_dim(d, dim(), shape());
  ZERO_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d],
             "narrow: [{}, {}) outside dimension {} of size {}", start, start + length, d, shape()[d]);
  Shape s = shape();
  s[d] = length;
  Tensor out = as_strided(s, strides(), offset() + start * strides()[d]);
  record("narrow", {*this}, out, [in = shape(), d, start, length](const Tensor& g) -> std::vector<Tensor> {
    Tensor full = Tensor::zeros(in, g.dtype(), g.device());
    full.narrow(d, start, length).copy_(g);
    return {full};
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
  record("expand", {*this}, out, [in = this->shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sum_to(g, in)};
  });
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = clone();
  record("contiguous", {*this}, out, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = Tensor::empty(shape(), target, device());
  out.copy_(*this);
  if (is_floating(target) && is_floating(dtype())) {
    // The gradient flows back in the source's dtype (an f16 parameter gets an f16 gradient).
    record("to", {*this}, out, [source = dtype()](const Tensor& g) -> std::vector<Tensor> { return {g.to(source)}; });
  }
  return out;
}

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
