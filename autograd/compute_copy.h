// The f32 compute copies of 16-bit parameters that layers compute with (Note [Compute copies]).
// Defined in autograd/compute_copy.cpp.
#pragma once

#include <cstdint>

#include "autograd/autograd.h"
#include "core/tensor.h"

namespace zero {

// Note [Compute copies]
// Layers compute in f32. For an f16/bf16 parameter nn::Module::compute() hands out a differentiable f32
// copy (gradient back in the parameter's dtype, like p.to(DType::f32)). Converting every parameter on
// every forward cost a fifth of a CPU step, so the copy is kept in the parameter's ComputeCopy
// (autograd::AutogradMeta, core/autograd_interface.h; one per parameter, shared by every layer that
// reads it) and refreshed only when the parameter changed: another storage (set_data), offset, shape
// or dtype, or a bumped Storage::version() (Tensor::copy_ and fill_ bump it; the ZeRO optimizer bumps
// its flat buffer after writing it in step()). Code that writes a 16-bit parameter through raw
// pointers must bump it too, or the next forward computes with the old values. The values are the
// same bits a fresh conversion gives, so results do not change. ZeRO stage 3 frees the copy with the
// parameter and refills it in place (free_compute_copy, refresh_compute_copy; Note [Storage that is
// freed and refilled] in core/storage.h).
/// p.to(DType::f32), reusing `cache` while p is unchanged (Note [Compute copies]). p: a float tensor.
Tensor to_f32_cached(const Tensor& p, autograd::ComputeCopy& cache);
/// Converts 16-bit parameter `p` again into the f32 copy layers compute with (its cached ComputeCopy),
/// in the copy's own storage (refilled if freed), so tensors autograd saved from it see the new values.
/// Does nothing for an f32 parameter or one without a copy yet (the next forward makes it).
void refresh_compute_copy(const Tensor& p);
/// Frees the memory of `p`'s cached f32 copy, if it has one (refresh_compute_copy refills it).
void free_compute_copy(const Tensor& p);
/// The storage of `p`'s cached f32 copy (to guard it while freed: Note [Guarded storage] in
/// core/storage.h); null when it has none.
Storage* compute_copy_storage(const Tensor& p);

}  // namespace zero
