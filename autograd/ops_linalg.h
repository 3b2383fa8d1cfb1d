// One family of the differentiable operations of autograd/ops.h (its rules are there): the GEMM ops
// (matmul, linear). Defined in autograd/ops.cpp.
#pragma once

#include <cstdint>

#include "autograd/autograd.h"
#include "core/tensor.h"

namespace zero {

// The GEMM ops also take f16/bf16 operands (Note [Tensor cores for 16-bit models] in
// core/gemm_precision.h): on cuda the 16-bit tensor goes into the GEMM as it is (tensor cores, fp32
// accumulation), an f32 activation operand is rounded to its dtype once, the output is f32 and each
// gradient comes back in its input's dtype; on cpu they compute exactly as with .to(DType::f32) first.
/// a[..., M, K] @ b[..., K, N] -> [..., M, N] (f32); b may also be [K, N] (shared across the batch).
/// a and b: f32, f16 or bf16; two 16-bit operands must share their dtype.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x[..., in] (f32) @ weight[out, in]^T + bias[out] -> [..., out] (f32; bias may be undefined). weight
/// and bias: f32, f16 or bf16.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

}  // namespace zero
