// Helpers the ops share (autograd/ops.cpp, autograd/compute_copy.cpp): the device of an op's inputs,
// contiguous copies, broadcasting.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "autograd/autograd.h"
#include "core/tensor.h"

namespace zero {

namespace detail {
/// The device of the defined tensors of `inputs` (cpu when none is defined). Throws zero::Error naming
/// `op` and both devices when they differ.
Device op_device(const char* op, std::initializer_list<const Tensor*> inputs);
/// `t` itself (detached) when contiguous, else a contiguous copy; same device and dtype.
Tensor dense(const Tensor& t);
/// `t` broadcast to `shape` (NumPy rules, already checked by the caller) as a contiguous tensor: a
/// detached view when the shapes agree, else a copy.
Tensor materialize_broadcast(const Tensor& t, const Shape& shape);
}  // namespace detail

}  // namespace zero
