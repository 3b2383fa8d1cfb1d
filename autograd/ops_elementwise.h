// One family of the differentiable operations of autograd/ops.h (its rules are there): elementwise
// arithmetic with broadcasting, and elementwise functions. Defined in autograd/ops.cpp.
#pragma once

#include <cstdint>

#include "autograd/autograd.h"
#include "core/tensor.h"

namespace zero {

/// The shape two shapes broadcast to (NumPy rules). Throws zero::Error if they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);

// ---- elementwise, with broadcasting ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, float s);
/// a + s for a scalar s (composed: s as a [] tensor on a's device).
Tensor add(const Tensor& a, float s);
/// a / b elementwise, with broadcasting (IEEE division: x/0 is +-inf or NaN).
Tensor div(const Tensor& a, const Tensor& b);
/// Elementwise sqrt(x), 1/sqrt(x), e^x, ln(x) and x^p (p a scalar); NaN or inf outside the domain.
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor pow(const Tensor& x, float p);
/// In place, not recorded: dst += src (same numel; src converted to dst's dtype). For accumulation.
void add_(Tensor& dst, const Tensor& src);

}  // namespace zero
