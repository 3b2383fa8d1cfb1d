// The GEMM precision decisions (core/gemm_precision.h, Note [Tensor cores for 16-bit models]) as pure
// host functions, and the CPU half of the contract: the GEMM ops given 16-bit operands on cpu compute
// bit for bit what they compute on the f32 conversions (the layers' compute copies), with each
// gradient back in its input's dtype. Runs without a GPU; tests/unit/test_tensor_cores.cpp checks
// the device half.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "autograd/ops.h"
#include "core/gemm_precision.h"
#include "core/tensor.h"
#include "nn/layers.h"

namespace zero {
namespace {

TEST(GemmPrecision, CudaPlanPicksComputeTypeAndTensorCores) {
  // f32 operands: plain fp32 (CUDA cores) unless TF32 is allowed.
  const GemmPlan f32 = cuda_gemm_plan(DType::f32, DType::f32, DType::f32, false);
  EXPECT_EQ(f32.compute, GemmCompute::f32);
  EXPECT_FALSE(f32.tensor_cores);
  const GemmPlan tf32 = cuda_gemm_plan(DType::f32, DType::f32, DType::f32, true);
  EXPECT_EQ(tf32.compute, GemmCompute::tf32);
  EXPECT_TRUE(tf32.tensor_cores);
  // 16-bit operands: tensor cores with fp32 accumulation, f32 or same-dtype output; TF32 changes nothing.
  for (DType t : {DType::f16, DType::bf16}) {
    for (DType c : {DType::f32, t}) {
      for (bool allow : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " -> " << dtype_name(c) << " tf32 " << allow);
        const GemmPlan p = cuda_gemm_plan(t, t, c, allow);
        EXPECT_EQ(p.compute, GemmCompute::f32);
        EXPECT_TRUE(p.tensor_cores);
      }
    }
  }
}

TEST(GemmPrecision, CudaPlanRejectsUnsupportedCombinations) {
  EXPECT_THROW(cuda_gemm_plan(DType::f32, DType::bf16, DType::f32, false), Error);  // mixed operands
  EXPECT_THROW(cuda_gemm_plan(DType::f16, DType::bf16, DType::f32, false), Error);
  EXPECT_THROW(cuda_gemm_plan(DType::f32, DType::f32, DType::bf16, false), Error);  // f32 in, 16-bit out
  EXPECT_THROW(cuda_gemm_plan(DType::f16, DType::f16, DType::bf16, false), Error);  // other 16-bit out
  EXPECT_THROW(cuda_gemm_plan(DType::i64, DType::i64, DType::f32, false), Error);
  try {
    cuda_gemm_plan(DType::f32, DType::bf16, DType::f32, false);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("A is f32 but B is bf16"), std::string::npos) << e.what();
  }
}

TEST(GemmPrecision, OperandDtypeIs16BitOnlyOnCuda) {
  EXPECT_EQ(gemm_operand_dtype(Device::cuda, DType::bf16), DType::bf16);
  EXPECT_EQ(gemm_operand_dtype(Device::cuda, DType::f16), DType::f16);
  EXPECT_EQ(gemm_operand_dtype(Device::cuda, DType::f32), DType::f32);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) EXPECT_EQ(gemm_operand_dtype(Device::cpu, t), DType::f32);
}

TEST(GemmPrecision, SwitchedOffEveryGemmReadsF32) {
  EXPECT_TRUE(use_16bit_gemms());  // the default
  set_16bit_gemms(false);
  EXPECT_EQ(gemm_operand_dtype(Device::cuda, DType::bf16), DType::f32);
  EXPECT_EQ(gemm_operand_dtype(Device::cuda, DType::f16), DType::f32);
  EXPECT_EQ(matmul_precision(Device::cuda, DType::bf16, false), MatmulPrecision::fp32);
  EXPECT_EQ(matmul_precision(Device::cuda, DType::bf16, true), MatmulPrecision::tf32);
  set_16bit_gemms(true);
  EXPECT_EQ(gemm_operand_dtype(Device::cuda, DType::bf16), DType::bf16);
}

TEST(GemmPrecision, MatmulPrecisionIsWhatTheGemmsRun) {
  EXPECT_EQ(matmul_precision(Device::cuda, DType::bf16, false), MatmulPrecision::bf16);
  EXPECT_EQ(matmul_precision(Device::cuda, DType::bf16, true), MatmulPrecision::bf16);  // --tf32: fp32 GEMMs only
  EXPECT_EQ(matmul_precision(Device::cuda, DType::f16, false), MatmulPrecision::fp16);
  EXPECT_EQ(matmul_precision(Device::cuda, DType::f32, false), MatmulPrecision::fp32);
  EXPECT_EQ(matmul_precision(Device::cuda, DType::f32, true), MatmulPrecision::tf32);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    EXPECT_EQ(matmul_precision(Device::cpu, t, false), MatmulPrecision::fp32);
    EXPECT_EQ(matmul_precision(Device::cpu, t, true), MatmulPrecision::fp32);
  }
  EXPECT_EQ(matmul_precision_name(MatmulPrecision::bf16), "bf16");
  EXPECT_EQ(matmul_precision_name(MatmulPrecision::tf32), "tf32");
}

// ---- cpu: 16-bit operands compute exactly as their f32 conversions ----

// The raw bytes of t (cpu, contiguous): bit-for-bit comparison, NaN-safe.
std::vector<unsigned char> bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<unsigned char> out(static_cast<std::size_t>(c.numel()) * dtype_size(c.dtype()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data(), out.size());
  return out;
}

Tensor leaf(const Shape& shape, Generator& gen, DType dtype) {
  Tensor t = Tensor::randn(shape, gen).to(dtype);
  t.set_requires_grad(true);
  return t;
}

// The f32 twin of a leaf: the same values converted, a leaf itself.
Tensor f32_twin(const Tensor& t) {
  Tensor c = t.detach().to(DType::f32);
  c.set_requires_grad(true);
  return c;
}

TEST(GemmOpsOnCpu, LinearWith16BitWeightIsTheF32GemmOfItsConversion) {
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    Generator gen(7);
    Tensor x = leaf({2, 3, 8}, gen, DType::f32), w = leaf({5, 8}, gen, t), b = leaf({5}, gen, t);
    Tensor x2 = f32_twin(x), w2 = f32_twin(w), b2 = f32_twin(b);
    Tensor y = linear(x, w, b);
    // the reference: the f32 GEMM of the converted values, as a layer's compute copies gave it before
    Tensor y2 = linear(x2, w2, b2);
    EXPECT_EQ(y.dtype(), DType::f32);
    EXPECT_EQ(bytes(y), bytes(y2));
    Tensor G = Tensor::randn(y.shape(), gen);
    sum(mul(y, G)).backward();
    sum(mul(y2, G)).backward();
    EXPECT_EQ(x.grad().dtype(), DType::f32);
    EXPECT_EQ(w.grad().dtype(), t);
    EXPECT_EQ(b.grad().dtype(), t);
    EXPECT_EQ(bytes(x.grad()), bytes(x2.grad()));
    EXPECT_EQ(bytes(w.grad()), bytes(w2.grad().to(t)));  // the f32 gradient rounded once
    EXPECT_EQ(bytes(b.grad()), bytes(b2.grad().to(t)));
  }
}

TEST(GemmOpsOnCpu, MatmulWith16BitOperandsIsTheF32GemmOfTheirConversions) {
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    Generator gen(11);
    // both 16-bit (batched), and f32 @ 16-bit (shared right-hand side)
    Tensor a = leaf({2, 3, 4}, gen, t), b = leaf({2, 4, 5}, gen, t), c = leaf({2, 3, 4}, gen, DType::f32),
           d = leaf({4, 5}, gen, t);
    Tensor a2 = f32_twin(a), b2 = f32_twin(b), c2 = f32_twin(c), d2 = f32_twin(d);
    Tensor y = add(matmul(a, b), matmul(c, d));
    Tensor y2 = add(matmul(a2, b2), matmul(c2, d2));
    EXPECT_EQ(bytes(y), bytes(y2));
    sum(y).backward();
    sum(y2).backward();
    EXPECT_EQ(a.grad().dtype(), t);
    EXPECT_EQ(bytes(a.grad()), bytes(a2.grad().to(t)));
    EXPECT_EQ(bytes(b.grad()), bytes(b2.grad().to(t)));
    EXPECT_EQ(bytes(c.grad()), bytes(c2.grad()));
    EXPECT_EQ(bytes(d.grad()), bytes(d2.grad().to(t)));
  }
  Generator gen(1);
  EXPECT_THROW(matmul(Tensor::randn({2, 3}, gen).to(DType::f16), Tensor::randn({3, 2}, gen).to(DType::bf16)), Error);
}

TEST(GemmOpsOnCpu, AttentionGemmDtypeChangesNothingOnCpu) {
  Generator gen(5);
  for (DType t : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor q = leaf({2, 9, 24}, gen, DType::f32), q2 = f32_twin(q);
    Tensor y = causal_self_attention(q, 2, t), y2 = causal_self_attention(q2, 2);
    EXPECT_EQ(bytes(y), bytes(y2));
    Tensor G = Tensor::randn(y.shape(), gen);
    sum(mul(y, G)).backward();
    sum(mul(y2, G)).backward();
    EXPECT_EQ(bytes(q.grad()), bytes(q2.grad()));
  }
  EXPECT_THROW(causal_self_attention(Tensor::zeros({1, 2, 6}), 1, DType::i64), Error);
}

// A layer on cpu keeps computing with its f32 compute copy: a bf16 Linear's output is the f32 GEMM of
// the converted weight (the GEMM never sees a 16-bit operand there).
TEST(GemmOpsOnCpu, Bf16LinearLayerComputesWithItsF32Copy) {
  Generator gen(3);
  nn::Linear layer(8, 4, true, gen);
  layer.to(DType::bf16);
  Tensor x = Tensor::randn({3, 8}, gen);
  const Tensor ref = linear(x, layer.weight.detach().to(DType::f32), layer.bias.detach().to(DType::f32));
  EXPECT_EQ(bytes(layer.forward(x)), bytes(ref));
}

}  // namespace
}  // namespace zero
