// Tensor basics: views and strides, dtype conversion, broadcasting, factories, copies, the allocator.
// Expected values are written out by hand or computed here independently (bit-level rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "autograd/ops.h"
#include "core/adamw_step.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace zero {
namespace {

// 0, 1, 2, ..., n-1 as an f32 tensor of `shape`.
Tensor arange(const Shape& shape) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::from_vector(v, shape);
}

std::uint16_t bits16(const Tensor& t, std::int64_t i) {
  std::uint16_t b;
  std::memcpy(&b, static_cast<const char*>(t.raw_data()) + 2 * i, 2);
  return b;
}

// IEEE binary16 round-to-nearest-even, computed on the value (not with Eigen): scale to the grid of
// the value's binade (subnormal grid below 2^-14), round the integer, scale back.
double round_to_f16(float xf) {
  const double x = xf;
  if (x == 0.0) return x;
  const double a = std::abs(x);
  if (a >= 65520.0) return std::copysign(INFINITY, x);  // halfway between 65504 and 2^16 rounds to even: 2^16
  int e;
  std::frexp(a, &e);  // a = m * 2^e with m in [0.5, 1): the leading bit is 2^(e-1)
  const double ulp = std::ldexp(1.0, std::max(e - 1, -14) - 10);
  return std::copysign(std::nearbyint(a / ulp) * ulp, x);  // default rounding mode: ties to even
}

// bfloat16 round-to-nearest-even on the bits of the float: keep the top 16 bits, rounding on the rest.
float round_to_bf16(float x) {
  std::uint32_t b = std::bit_cast<std::uint32_t>(x);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return std::bit_cast<float>(b & 0xFFFF0000u);
}

// ---------------------------------------------------------------------------------------------
// views share storage

TEST(TensorView, WriteThroughTransposeIsVisibleInBase) {
  Tensor base = arange({2, 3});
  Tensor t = base.transpose(0, 1);  // [3, 2]
  ASSERT_EQ(t.storage(), base.storage());
  float* p = static_cast<float*>(t.storage()->data());
  // t[2][1] is base[1][2], at storage offset 1*3 + 2 = 5 (t's strides are [1, 3]).
  p[t.offset() + 2 * t.strides()[0] + 1 * t.strides()[1]] = 42.0f;
  EXPECT_EQ(base.to_vector(), (std::vector<float>{0, 1, 2, 3, 4, 42}));
}

TEST(TensorView, FillThroughNarrowIsVisibleInBase) {
  Tensor base = arange({3, 4});
  base.narrow(1, 1, 2).fill_(-1.0f);
  EXPECT_EQ(base.to_vector(), (std::vector<float>{0, -1, -1, 3, 4, -1, -1, 7, 8, -1, -1, 11}));
}

TEST(TensorView, CopyIntoTransposedViewWritesBase) {
  Tensor base = Tensor::zeros({2, 3});
  base.transpose(0, 1).copy_(arange({3, 2}));  // view element (i, j) = 2i + j lands at base (j, i)
  EXPECT_EQ(base.to_vector(), (std::vector<float>{0, 2, 4, 1, 3, 5}));
}

TEST(TensorView, ViewSharesStorageAndSeesWrites) {
  Tensor base = arange({2, 6});
  Tensor v = base.view({3, 4});
  EXPECT_EQ(v.storage(), base.storage());
  base.fill_(7.0f);
  EXPECT_EQ(v.to_vector(), std::vector<float>(12, 7.0f));
}

// ---------------------------------------------------------------------------------------------
// strides, offsets and contiguity

TEST(TensorStrides, FreshTensorIsRowMajor) {
  const Tensor t = Tensor::empty({2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.offset(), 0);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.nbytes(), 96u);
}

TEST(TensorStrides, TransposeSwapsShapeAndStrides) {
  const Tensor t = Tensor::empty({2, 3, 4}).transpose(0, 2);
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 4, 12}));
  EXPECT_EQ(t.offset(), 0);
  EXPECT_FALSE(t.is_contiguous());
}

TEST(TensorStrides, NarrowMovesOffsetKeepsStrides) {
  const Tensor base = Tensor::empty({2, 3, 4});
  const Tensor n1 = base.narrow(1, 1, 2);
  EXPECT_EQ(n1.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(n1.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(n1.offset(), 4);
  EXPECT_FALSE(n1.is_contiguous());  // rows of length 8 sit 12 apart

  const Tensor n0 = base.narrow(0, 1, 1);
  EXPECT_EQ(n0.offset(), 12);
  EXPECT_TRUE(n0.is_contiguous());  // a block of whole leading rows

  const Tensor n2 = base.narrow(-1, 3, 1);
  EXPECT_EQ(n2.offset(), 3);
  EXPECT_FALSE(n2.is_contiguous());
}

TEST(TensorStrides, NarrowOfNarrowAddsOffsets) {
  const Tensor t = Tensor::empty({10}).narrow(0, 2, 6).narrow(0, 3, 2);
  EXPECT_EQ(t.offset(), 5);
  EXPECT_EQ(t.shape(), (Shape{2}));
}

TEST(TensorStrides, NarrowOutOfRangeThrows) {
  const Tensor t = Tensor::empty({3, 4});
  EXPECT_THROW(t.narrow(1, 3, 2), Error);
  EXPECT_THROW(t.narrow(2, 0, 1), Error);
}

TEST(TensorStrides, ExpandGivesZeroStrideOnBroadcastDims) {
  const Tensor t = Tensor::empty({3, 1}).expand({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{0, 1, 0}));
  EXPECT_FALSE(t.is_contiguous());
}

TEST(TensorStrides, ExpandToIncompatibleShapeThrows) {
  EXPECT_THROW(Tensor::empty({3, 2}).expand({3, 4}), Error);
  EXPECT_THROW(Tensor::empty({2, 3}).expand({3}), Error);
}

TEST(TensorStrides, SizeOneDimsDoNotBreakContiguity) {
  // A [2, 1, 3] view whose size-1 dimension has an arbitrary stride is still laid out row-major.
  const Tensor t = Tensor::empty({6}).as_strided({2, 1, 3}, {3, 99, 1}, 0);
  EXPECT_TRUE(t.is_contiguous());
}

TEST(TensorStrides, ContiguousReturnsSameTensorWhenAlreadyContiguous) {
  const Tensor t = arange({2, 3});
  EXPECT_TRUE(t.contiguous().same(t));
}

TEST(TensorStrides, ContiguousCopiesANonContiguousView) {
  const Tensor base = arange({2, 3});
  const Tensor c = base.transpose(0, 1).contiguous();
  EXPECT_NE(c.storage(), base.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_EQ(c.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(TensorStrides, ViewOfNonContiguousThrows) {
  EXPECT_THROW(arange({2, 3}).transpose(0, 1).view({6}), Error);
  EXPECT_THROW(arange({3, 4}).narrow(1, 0, 2).view({6}), Error);
}

TEST(TensorStrides, ViewInfersOneDimensionAndChecksCount) {
  const Tensor t = arange({2, 3, 4});
  EXPECT_EQ(t.view({-1, 4}).shape(), (Shape{6, 4}));
  EXPECT_EQ(t.view({4, -1}).strides(), (Shape{6, 1}));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
  EXPECT_THROW(t.view({5, 5}), Error);
}

TEST(TensorStrides, ViewOfContiguousNarrowKeepsOffset) {
  const Tensor t = arange({4, 3}).narrow(0, 1, 2).view({6});
  EXPECT_EQ(t.offset(), 3);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{3, 4, 5, 6, 7, 8}));
}

TEST(TensorStrides, ReshapeOfNonContiguousCopiesInRowMajorOrder) {
  const Tensor base = arange({2, 3});
  const Tensor r = base.transpose(0, 1).reshape({6});
  EXPECT_EQ(r.shape(), (Shape{6}));
  EXPECT_EQ(r.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(TensorStrides, ReshapeOfContiguousIsAView) {
  const Tensor base = arange({2, 3});
  EXPECT_EQ(base.reshape({3, 2}).storage(), base.storage());
}

// ---------------------------------------------------------------------------------------------
// item / item_at / to_vector on strided views

TEST(TensorItem, ItemAtFollowsStridesOfTranspose) {
  const Tensor t = arange({2, 3}).transpose(0, 1);  // [[0, 3], [1, 4], [2, 5]]
  const std::vector<float> expected{0, 3, 1, 4, 2, 5};
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(t.item_at(i), expected[i]) << "i=" << i;
  EXPECT_EQ(t.to_vector(), expected);
}

TEST(TensorItem, ItemAtFollowsOffsetOfNarrow) {
  const Tensor t = arange({3, 4}).narrow(1, 1, 2);  // [[1, 2], [5, 6], [9, 10]]
  const std::vector<float> expected{1, 2, 5, 6, 9, 10};
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(t.item_at(i), expected[i]) << "i=" << i;
  EXPECT_EQ(t.to_vector(), expected);
}

TEST(TensorItem, ItemAtOnExpandRepeats) {
  const Tensor t = Tensor::from_vector({7, 8}, {2, 1}).expand({2, 3});
  EXPECT_EQ(t.to_vector(), (std::vector<float>{7, 7, 7, 8, 8, 8}));
  EXPECT_EQ(t.item_at(4), 8.0f);
}

TEST(TensorItem, ItemOfOneElementViewAndErrors) {
  const Tensor base = arange({2, 3});
  EXPECT_EQ(base.narrow(0, 1, 1).narrow(1, 2, 1).item(), 5.0f);
  EXPECT_THROW(base.item(), Error);
  EXPECT_THROW(base.item_at(6), Error);
  EXPECT_THROW(base.item_at(-1), Error);
}

TEST(TensorItem, ItemAtConvertsHalfAndIntegers) {
  const Tensor h = Tensor::from_vector({1.5f, -2.25f}, {2}).to(DType::f16);
  EXPECT_EQ(h.item_at(1), -2.25f);
  const Tensor i = Tensor::from_indices({3, -4, 5}, {3});
  EXPECT_EQ(i.item_at(1), -4.0f);
}

// ---------------------------------------------------------------------------------------------
// fp16 and bf16

TEST(HalfPrecision, ExactlyRepresentableValuesSurviveF16) {
  const std::vector<float> v{0.0f, 1.0f, -2.0f, 0.5f, 1.5f, 1025.0f, 2048.0f, 65504.0f, -65504.0f,
                             std::ldexp(1.0f, -14) /* min normal */, std::ldexp(1.0f, -24) /* min subnormal */,
                             std::ldexp(3.0f, -24)};
  EXPECT_EQ(Tensor::from_vector(v, {12}).to(DType::f16).to(DType::f32).to_vector(), v);
}

TEST(HalfPrecision, ExactlyRepresentableValuesSurviveBf16) {
  const std::vector<float> v{0.0f, 1.0f, -2.0f, 0.5f, 1.5f, 3.0f, 255.0f, 258.0f, -0.75f,
                             std::ldexp(1.0f, -126), std::ldexp(1.0f, 127)};
  EXPECT_EQ(Tensor::from_vector(v, {11}).to(DType::bf16).to(DType::f32).to_vector(), v);
}

TEST(HalfPrecision, OneThirdRoundsToNearestF16) {
  const Tensor h = Tensor::from_vector({1.0f / 3.0f}, {1}).to(DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.nbytes(), 2u);
  EXPECT_EQ(bits16(h, 0), 0x3555);  // 0 01101 0101010101
  EXPECT_EQ(h.item(), 0.333251953125f);
}

TEST(HalfPrecision, OneThirdRoundsToNearestBf16) {
  const Tensor b = Tensor::from_vector({1.0f / 3.0f}, {1}).to(DType::bf16);
  EXPECT_EQ(bits16(b, 0), 0x3EAB);  // f32 0x3EAAAAAB: the dropped half 0xAAAB > 0x8000 rounds up
  EXPECT_EQ(b.item(), 0.333984375f);
}

TEST(HalfPrecision, TiesRoundToEven) {
  // f16 spacing at 1 is 2^-10: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 (odd) -> 1;
  // 1 + 3*2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even) -> 1 + 2^-9.
  const Tensor h = Tensor::from_vector({1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11)}, {2});
  EXPECT_EQ(h.to(DType::f16).to_vector(), (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -9)}));
  // bf16 spacing at 1 is 2^-7.
  const Tensor b = Tensor::from_vector({1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(3.0f, -8)}, {2});
  EXPECT_EQ(b.to(DType::bf16).to_vector(), (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -6)}));
}

TEST(HalfPrecision, F16OverflowsToInfinityAbove65504) {
  const Tensor h = Tensor::from_vector({65504.0f, 65519.0f, 65520.0f, 1e5f, -1e5f}, {5}).to(DType::f16);
  const auto v = h.to_vector();
  EXPECT_EQ(v[0], 65504.0f);
  EXPECT_EQ(v[1], 65504.0f);  // below the halfway point to 2^16
  EXPECT_EQ(v[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[3], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[4], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits16(h, 0), 0x7BFF);
  EXPECT_EQ(bits16(h, 2), 0x7C00);
  EXPECT_EQ(bits16(h, 4), 0xFC00);
}

TEST(HalfPrecision, Bf16KeepsF32Range) {
  EXPECT_EQ(Tensor::from_vector({1e5f}, {1}).to(DType::bf16).item(), round_to_bf16(1e5f));
  EXPECT_TRUE(std::isfinite(Tensor::from_vector({1e38f}, {1}).to(DType::bf16).item()));
}

// A sweep over magnitudes (f16 subnormals up to overflow) against the independent references above.
std::vector<float> magnitude_sweep() {
  Generator gen(17);
  std::vector<float> v;
  for (int k = -30; k <= 17; ++k)
    for (int i = 0; i < 40; ++i) v.push_back(std::ldexp(gen.normal(0.0f, 1.0f), k));
  return v;
}

TEST(HalfPrecision, F16MatchesBitLevelReferenceAcrossMagnitudes) {
  const std::vector<float> v = magnitude_sweep();
  const auto got = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(DType::f16).to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(got[i], round_to_f16(v[i])) << "value " << v[i];
}

TEST(HalfPrecision, Bf16MatchesBitLevelReferenceAcrossMagnitudes) {
  const std::vector<float> v = magnitude_sweep();
  const auto got = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(DType::bf16).to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(got[i], round_to_bf16(v[i])) << "value " << v[i];
}

// The CPU backend's bulk 16-bit loops (scale, accumulate, the squared norm, the AdamW update) convert
// whole blocks at a time (f16: packed conversions); each element must get exactly what one
// Eigen::half / Eigen::bfloat16 conversion at a time gives (core/dtype.h's load_as_float and
// store_from_float). 1,027 elements: two 512-element blocks and a tail that is not a whole vector.
TEST(HalfPrecision, CpuBulkKernelsMatchElementLoops) {
  std::vector<float> v = magnitude_sweep();
  v.resize(1017);
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, -1e30f, 1e-40f, -1e-45f}) v.push_back(x);
  const auto n = static_cast<std::int64_t>(v.size());
  Backend& cpu = backend(Device::cpu);
  // One element rounded to dt (a 64-bit slot: store_from_float's switch also has 32/64-bit cases).
  const auto round_bits = [](float x, DType t) {
    std::uint64_t slot = 0;
    store_from_float(&slot, 0, t, x);
    return static_cast<std::uint16_t>(slot);
  };
  for (DType dt : {DType::f16, DType::bf16}) {
    std::vector<std::uint16_t> x(n), y(n), acc(n), acc16(n);
    for (std::int64_t i = 0; i < n; ++i) {
      store_from_float(x.data(), i, dt, v[i]);
      store_from_float(acc.data(), i, dt, 0.25f * static_cast<float>(i % 7) - 0.5f);
    }
    acc16 = acc;
    const std::vector<std::uint16_t> ref_acc = acc, ref_acc16 = acc;
    cpu.scale(y.data(), x.data(), dt, n, 0.375f);
    cpu.accumulate(acc.data(), dt, v.data(), DType::f32, n);
    cpu.accumulate(acc16.data(), dt, x.data(), dt, n);
    const double sq = cpu.sum_squares(x.data(), dt, n);
    double ref_sq = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float xi = load_as_float(x.data(), i, dt);
      const double d = xi;
      ref_sq += d * d;
      EXPECT_EQ(y[i], round_bits(xi * 0.375f, dt)) << dtype_name(dt) << " scale " << i;
      EXPECT_EQ(acc[i], round_bits(load_as_float(ref_acc.data(), i, dt) + v[i], dt))
          << dtype_name(dt) << " accumulate f32 " << i;
      EXPECT_EQ(acc16[i], round_bits(load_as_float(ref_acc16.data(), i, dt) + xi, dt))
          << dtype_name(dt) << " accumulate " << i;
    }
    EXPECT_TRUE((std::isnan(sq) && std::isnan(ref_sq)) || sq == ref_sq) << dtype_name(dt);

    // AdamW: a finite 16-bit gradient, the f32 master, the new master rounded into the 16-bit model.
    std::vector<std::uint16_t> g(n), model(n);
    std::vector<float> master(n), m(n, 0.01f), s2(n, 0.02f);
    for (std::int64_t i = 0; i < n; ++i) {
      store_from_float(g.data(), i, dt, std::isfinite(v[i]) ? std::clamp(v[i], -100.0f, 100.0f) : 1.0f);
      master[i] = 0.001f * static_cast<float>(i) - 0.5f;
    }
    std::vector<float> ref_master = master, ref_m = m, ref_s2 = s2;
    const AdamWScalars sc{0.9999f, 1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f};
    cpu.adamw_update(master.data(), g.data(), dt, 0.5f, m.data(), s2.data(), model.data(), dt, n, sc);
    for (std::int64_t i = 0; i < n; ++i) {
      const float p = adamw_step(ref_master[i], ref_m[i], ref_s2[i], load_as_float(g.data(), i, dt) * 0.5f, sc);
      const std::uint16_t r = round_bits(p, dt);
      EXPECT_EQ(master[i], ref_master[i]) << dtype_name(dt) << " adamw " << i;
      EXPECT_EQ(m[i], ref_m[i]);
      EXPECT_EQ(s2[i], ref_s2[i]);
      EXPECT_EQ(model[i], r) << dtype_name(dt) << " adamw model " << i;
    }
  }
}

// The squared norm's documented order (core/backend.def: fixed for a given n): chunks of 2^16
// elements, each summed in index order in double, the chunk sums added in chunk order. Nine full
// chunks and a short tenth, so the kernel's side-by-side chunks meet a group that ends short.
TEST(HalfPrecision, SumSquaresAddsChunksInOrder) {
  constexpr std::int64_t kChunk = 1 << 16;
  // One short chunk alone, and eight whole chunks side by side then a whole one beside a short one.
  for (const std::int64_t n : {std::int64_t{1234}, 9 * kChunk + 1234}) {
    Generator gen(23);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = gen.normal(0.0f, 3.0f);
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      std::vector<std::uint8_t> x(static_cast<std::size_t>(n) * dtype_size(dt));
      for (std::int64_t i = 0; i < n; ++i) store_from_float(x.data(), i, dt, v[i]);
      double ref = 0.0;
      for (std::int64_t c = 0; c * kChunk < n; ++c) {
        double s = 0.0;
        for (std::int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
          const double d = load_as_float(x.data(), i, dt);
          s += d * d;
        }
        ref += s;
      }
      EXPECT_EQ(backend(Device::cpu).sum_squares(x.data(), dt, n), ref) << dtype_name(dt) << ", n " << n;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// copy_ between dtypes and layouts

TEST(TensorCopy, F32ToF16ToBf16ToF32) {
  const Tensor src = Tensor::from_vector({1.0f / 3.0f, -2.5f, 1000.1f}, {3});
  Tensor h = Tensor::empty({3}, DType::f16);
  h.copy_(src);
  Tensor b = Tensor::empty({3}, DType::bf16);
  b.copy_(h);
  Tensor f = Tensor::empty({3});
  f.copy_(b);
  for (std::int64_t i = 0; i < 3; ++i) {
    const float via_f16 = static_cast<float>(round_to_f16(src.item_at(i)));
    EXPECT_EQ(h.item_at(i), via_f16);
    EXPECT_EQ(f.item_at(i), round_to_bf16(via_f16));
  }
}

// A contiguous copy_ between float dtypes converts in bulk (vectorised); a strided one element by
// element. Both must give the same bits for every pair of dtypes, including NaN, infinities, signed
// zeros, f32 subnormals and values that overflow f16; the length (1027) leaves a scalar tail.
TEST(TensorCopy, BulkConversionMatchesElementwiseForEveryDtypePair) {
  std::vector<float> v = magnitude_sweep();
  v.resize(1027 * 2 - 8);
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, -1e30f, 1e-40f, -1e-45f})
    v.push_back(x);
  v.resize(1027 * 2, 0.5f);
  const Tensor base = Tensor::from_vector(v, {2, 1027});
  for (DType from : {DType::f32, DType::f16, DType::bf16}) {
    // The source in `from`, contiguous, and the same values as a transposed (strided) view.
    const Tensor src = base.to(from);
    Tensor src_t = Tensor::empty({1027, 2}, from);
    src_t.copy_(src.transpose(0, 1));
    for (DType to : {DType::f32, DType::f16, DType::bf16}) {
      Tensor bulk = Tensor::empty({2, 1027}, to);
      bulk.copy_(src);
      Tensor elementwise = Tensor::empty({2, 1027}, to);
      elementwise.copy_(src_t.transpose(0, 1));
      const auto a = bulk.to_vector(), b = elementwise.to_vector();
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(b[i])) {
          EXPECT_TRUE(std::isnan(a[i])) << dtype_name(from) << " -> " << dtype_name(to) << " at " << i;
        } else {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i]))
              << dtype_name(from) << " -> " << dtype_name(to) << " value " << v[i];
        }
      }
    }
  }
}

TEST(TensorCopy, IntoStridedDestinationWithConversion) {
  Tensor dst = Tensor::zeros({2, 3}, DType::f16);
  dst.narrow(1, 1, 2).copy_(Tensor::from_vector({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(dst.to_vector(), (std::vector<float>{0, 1, 2, 0, 3, 4}));
}

TEST(TensorCopy, FromIntegerIndices) {
  Tensor dst = Tensor::empty({3});
  dst.copy_(Tensor::from_indices({-1, 0, 7}, {3}));
  EXPECT_EQ(dst.to_vector(), (std::vector<float>{-1, 0, 7}));
}

TEST(TensorCopy, DifferentElementCountThrows) {
  Tensor dst = Tensor::empty({3});
  EXPECT_THROW(dst.copy_(Tensor::empty({4})), Error);
}

TEST(TensorCopy, CloneIsContiguousAndIndependent) {
  const Tensor base = arange({2, 3});
  Tensor c = base.transpose(0, 1).clone();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), base.storage());
  c.fill_(0.0f);
  EXPECT_EQ(base.item_at(5), 5.0f);
}

TEST(TensorCopy, FillOnF16View) {
  Tensor t = Tensor::zeros({2, 2}, DType::f16);
  t.transpose(0, 1).narrow(0, 1, 1).fill_(0.1f);  // column 1 of t
  const float f = static_cast<float>(round_to_f16(0.1f));
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, f, 0, f}));
}

// ---------------------------------------------------------------------------------------------
// broadcasting rules

TEST(Broadcast, ShapesAlignFromTheRight) {
  EXPECT_EQ(broadcast_shapes({2, 3, 4}, {4}), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({4}, {2, 3, 4}), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({1}, {5}), (Shape{5}));
  EXPECT_EQ(broadcast_shapes({}, {2, 5}), (Shape{2, 5}));
  EXPECT_EQ(broadcast_shapes({}, {}), (Shape{}));
  EXPECT_EQ(broadcast_shapes({0, 1}, {1, 3}), (Shape{0, 3}));
}

TEST(Broadcast, MismatchedDimensionsThrowNamingBothShapes) {
  EXPECT_THROW(broadcast_shapes({2, 3}, {4}), Error);
  try {
    broadcast_shapes({2, 3}, {3, 2});
    FAIL() << "expected zero::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  }
}

TEST(Broadcast, OpsRejectShapesThatDoNotBroadcast) {
  EXPECT_THROW(add(Tensor::zeros({2, 3}), Tensor::zeros({2})), Error);
  EXPECT_THROW(mul(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})), Error);
}

// ---------------------------------------------------------------------------------------------
// factories

TEST(Factories, ZerosOnesFull) {
  EXPECT_EQ(Tensor::zeros({2, 2}).to_vector(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(Tensor::ones({3}).to_vector(), std::vector<float>(3, 1.0f));
  const Tensor f = Tensor::full({2}, 0.1f, DType::f16);
  EXPECT_EQ(f.dtype(), DType::f16);
  EXPECT_EQ(f.to_vector(), std::vector<float>(2, static_cast<float>(round_to_f16(0.1f))));
  const Tensor z = Tensor::zeros({3}, DType::i64);
  EXPECT_EQ(z.data<std::int64_t>()[2], 0);
}

TEST(Factories, ScalarShapeHasOneElement) {
  const Tensor s = Tensor::full({}, 3.5f);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 3.5f);
  EXPECT_TRUE(s.is_contiguous());
}

TEST(Factories, FromVectorAndFromIndices) {
  const Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2});
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.data<float>()[3], 4.0f);
  EXPECT_THROW(Tensor::from_vector({1, 2, 3}, {2, 2}), Error);
  const Tensor i = Tensor::from_indices({5, 9}, {2});
  EXPECT_EQ(i.dtype(), DType::i64);
  EXPECT_EQ(i.data<std::int64_t>()[1], 9);
  EXPECT_THROW(Tensor::from_indices({1}, {2}), Error);
}

TEST(Factories, DataOfWrongTypeThrows) {
  EXPECT_THROW(Tensor::zeros({2}).data<std::int64_t>(), Error);
  EXPECT_THROW(Tensor::zeros({2}, DType::f16).data<float>(), Error);
}

TEST(Factories, NegativeDimensionThrows) { EXPECT_THROW(Tensor::empty({2, -1}), Error); }

TEST(Factories, RandnRepeatsWithSeedAndHasRightMoments) {
  Generator a(7), b(7), c(8);
  const auto x = Tensor::randn({20000}, a, 1.0f, 2.0f).to_vector();
  EXPECT_EQ(x, Tensor::randn({20000}, b, 1.0f, 2.0f).to_vector());
  EXPECT_NE(x, Tensor::randn({20000}, c, 1.0f, 2.0f).to_vector());
  double m = 0.0, v = 0.0;
  for (float f : x) m += f / 20000.0;
  for (float f : x) v += (f - m) * (f - m) / 20000.0;
  // Standard errors: mean 2/sqrt(20000) = 0.014, std about 0.01.
  EXPECT_NEAR(m, 1.0, 0.06);
  EXPECT_NEAR(std::sqrt(v), 2.0, 0.05);
}

TEST(DTypes, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(parse_float_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_float_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_float_dtype("float32"), DType::f32);
  EXPECT_THROW(parse_float_dtype("fp8"), Error);
  EXPECT_FALSE(is_floating(DType::i64));
}

// ---------------------------------------------------------------------------------------------
// the caching allocator

TEST(Allocator, FreedBlockIsReusedForSameSize) {
  constexpr std::int64_t n = 12345;  // an unusual size, so the block is this test's own
  { Tensor warm = Tensor::empty({n}); }
  const AllocatorStats before = cpu_allocator_stats();
  {
    Tensor t = Tensor::empty({n});
    EXPECT_EQ(cpu_allocator_stats().mallocs, before.mallocs);
    EXPECT_GE(cpu_allocator_stats().in_use, before.in_use + n * sizeof(float));
  }
  const AllocatorStats after = cpu_allocator_stats();
  EXPECT_EQ(after.mallocs, before.mallocs);
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.cached, before.cached);
}

TEST(Allocator, EmptyCacheForcesANewMalloc) {
  { Tensor warm = Tensor::empty({777}); }
  empty_cpu_cache();
  EXPECT_EQ(cpu_allocator_stats().cached, 0u);
  const std::size_t mallocs = cpu_allocator_stats().mallocs;
  Tensor t = Tensor::empty({777});
  EXPECT_EQ(cpu_allocator_stats().mallocs, mallocs + 1);
}

TEST(Allocator, ViewsDoNotAllocate) {
  const Tensor base = arange({4, 4});
  const std::size_t mallocs = cpu_allocator_stats().mallocs;
  const std::size_t in_use = cpu_allocator_stats().in_use;
  const Tensor v = base.transpose(0, 1).narrow(0, 1, 2).expand({3, 2, 4});
  EXPECT_EQ(cpu_allocator_stats().mallocs, mallocs);
  EXPECT_EQ(cpu_allocator_stats().in_use, in_use);
}

}  // namespace
}  // namespace zero
