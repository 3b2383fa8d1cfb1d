// GEMM precision: which operand dtype, cuBLAS compute type and arithmetic (tensor cores or not) the
// model's GEMMs take on a device (Note [Tensor cores for 16-bit models]). Pure host functions with no
// CUDA dependency: the CUDA GEMM (core/cuda/blas.cpp), the ops (autograd/ops.cpp), the layers (nn/) and
// train_gpt's MFU denominator all ask these, and tests check the decisions without a GPU.
//
// Note [Tensor cores for 16-bit models]
// An f16/bf16 model on cuda runs its GEMMs on tensor cores: the 16-bit parameter itself is the GEMM's
// weight operand (cublasGemmEx with CUDA_R_16F / CUDA_R_16BF A and B, CUBLAS_COMPUTE_32F: products of
// 16-bit values are exact in fp32 and accumulate in fp32), so no f32 copy of a weight is made per step.
// Activations stay f32 between ops; a GEMM op rounds its activation operand to the weight's dtype once
// (x, and the incoming gradient in backward) — the operand rounding of PyTorch's autocast. Outputs that
// are activations (y, dx) come out in f32; the weight gradient comes out of the GEMM in the parameter's
// dtype (one rounding of the fp32 accumulator), the dtype the ZeRO gradient buckets hold. GEMMs that hit
// tensor cores this way: Linear (the qkv, proj, fc, fc2 projections), the tied LM head, matmul of
// 16-bit operands, and the products inside causal self-attention (q k^T and att v forward, four in
// backward), whose operands are rounded to the model's dtype while the scores and the softmax stay f32.
// LayerNorm, GELU, softmax, cross-entropy and the embedding lookup stay f32 (memory-bound); their
// parameters still use the cached f32 compute copies of Note [Compute copies] in autograd/compute_copy.h,
// refreshed once per step: norm vectors, biases, and the token/position tables for the lookup (the
// token table's GEMM use, the tied head, reads it in 16 bits).
// In fp16 an activation operand beyond 65504 becomes inf, as under PyTorch's autocast; dynamic loss
// scaling sees it in the gradients and skips the step.
// fp32 models keep plain fp32 GEMMs unless TF32 is allowed (cuda::set_allow_tf32, train_gpt --tf32),
// PyTorch's default. The CPU has no 16-bit GEMM: there every GEMM reads f32 (the compute copies), so CPU
// results are exactly those of an f32 GEMM of the converted values, as before.
#pragma once

#include <string_view>

#include "core/dtype.h"

namespace zero {

/// cuBLAS compute type: CUBLAS_COMPUTE_32F (fp32 products and accumulation; for 16-bit operands the
/// products are exact and run on tensor cores) or CUBLAS_COMPUTE_32F_FAST_TF32 (f32 operands rounded
/// to TF32's 10-bit mantissa on tensor cores, fp32 accumulation).
enum class GemmCompute { f32, tf32 };

struct GemmPlan {
  GemmCompute compute = GemmCompute::f32;
  bool tensor_cores = false;  // whether the GEMM runs on tensor cores (16-bit operands, or TF32)
};

/// The plan for a cuBLAS GEMM C = op(A) op(B) with A, B of dtype `a`, `b` and C of dtype `c`. A and B
/// must share one float dtype; C is f32, or A's 16-bit dtype for 16-bit operands. `allow_tf32` applies
/// to f32 operands only. Throws zero::Error naming the dtypes for any other combination.
GemmPlan cuda_gemm_plan(DType a, DType b, DType c, bool allow_tf32);

/// The dtype a GEMM on `device` reads an operand in when the model's dtype is `dtype`: f16/bf16 on cuda
/// (tensor cores) while 16-bit GEMMs are on, f32 otherwise (an f32 model; the CPU, which computes with
/// f32 copies).
DType gemm_operand_dtype(Device device, DType dtype);

/// Whether f16/bf16 models on cuda run their GEMMs with 16-bit operands (default true; process-wide,
/// read when an op runs). Off, every GEMM reads f32 (the compute copies) as on the cpu: a device run
/// then differs from a CPU run only by summation order, for tests that compare the two.
void set_16bit_gemms(bool on);
bool use_16bit_gemms();

/// The arithmetic the model's GEMMs run in: the precision whose peak is train_gpt's MFU denominator.
enum class MatmulPrecision { fp32, tf32, fp16, bf16 };

/// The precision of the GEMMs of a `model_dtype` model on `device`, TF32 allowed or not (cuda f32 only).
MatmulPrecision matmul_precision(Device device, DType model_dtype, bool allow_tf32);
/// "fp32", "tf32", "fp16", "bf16".
std::string_view matmul_precision_name(MatmulPrecision p);

}  // namespace zero
