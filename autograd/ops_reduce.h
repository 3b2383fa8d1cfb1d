// One family of the differentiable operations of autograd/ops.h (its rules are there): reductions
// (sum, mean, max over all or one dimension). Defined in autograd/ops.cpp.
#pragma once

#include <cstdint>

#include "autograd/autograd.h"
#include "core/tensor.h"

namespace zero {

/// Sum of all elements: a one-element tensor of shape [].
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
/// Sum / mean / max over dimension `dim` (negative counts from the end): x[..., n, ...] -> the shape
/// without that dimension, or with it as 1 when keepdim (torch.sum / torch.mean / torch.amax with one
/// dim). Sums accumulate in f32 in index order. max's gradient flows to the first maximal element (as
/// the indices of torch.max(x, dim)); a NaN counts as the maximum. max throws for an empty dimension.
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
Tensor max(const Tensor& x, int dim, bool keepdim = false);
/// Sums `x` down to `shape` (the inverse of broadcasting `shape` to x.shape()).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace zero
