// Helpers for the CUDA suites (tests/unit/test_cuda_*.cpp): a fixture that skips without a device, device
// arrays filled from host vectors, and tolerance checks that name the worst element.
//
// Note [CUDA test tolerances]
// Every comparison of a device result states where its tolerance comes from; u = 2^-24 (f32).
// - Against a double-precision reference: the per-element bound of the kernel's f32 evaluation
//   (tests/unit/kernel_bounds.h, Note [Kernel error bounds]).
// - Against the CPU kernel or host arithmetic in f32: both sides carry rounding error, so the bound is
//   the sum of the two sides' bounds. One correctly rounded operation per element on both sides (a copy,
//   a cast, a single add or multiply) is compared bit for bit. A sum or dot product of K terms, in any
//   order, is within (K - 1) u sum |terms| of exact (Higham, "Accuracy and Stability of Numerical
//   Algorithms", 2nd ed., eq. 3.5), so a GEMM C = alpha A B + beta C0 is, per element, within
//   (K + 2) u (|alpha| |A| |B| + |beta| |C0|) (gemm_bound below); the two within twice that.
// - Against an exact closed form (collectives on small multiples of 1/2, whose sums are exact in every
//   dtype): bit for bit.
// - Training steps: AdamW's first steps divide the gradient by its own magnitude, so a gradient that is
//   zero up to rounding moves by ±lr on one side and not on the other, and no bound covers two runs that
//   compute their gradients separately. So the optimizer comparisons give every side the same gradients
//   and hold each to exact AdamW on them (Note [AdamW trajectory bound], kernel_bounds.h):
//   test_cuda_gpt.cpp copies the device's gradients into the CPU model; tests/distributed/
//   test_zero_cuda.cpp uses a loss whose gradient is exact everywhere. A whole model's forward and
//   backward (test_cuda_gpt.cpp) are still compared within documented estimates.
#pragma once

#ifdef ZERO_HAS_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/kernels.h"
#include "core/cuda/runtime.h"
#include "tests/unit/kernel_bounds.h"

namespace zero::cuda_test {

/// Every CUDA test derives from this: without a usable device (CI, or a machine whose driver is too old)
/// the test is skipped, never failed. Each test also checks that no kernel left an error behind.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::cuda_available()) {
      GTEST_SKIP() << "no CUDA device visible";
    }
  }
  void TearDown() override {
    if (cuda::cuda_available() && !IsSkipped()) {
      EXPECT_NO_THROW(cuda::synchronize());
    }
  }
};

/// cuda::set_allow_tf32(allow) for the guard's lifetime; the previous setting comes back on every exit
/// (a failed ASSERT or an exception included), so no later test in the process runs with TF32 by mistake.
class ScopedAllowTf32 {
 public:
  explicit ScopedAllowTf32(bool allow) : previous_(cuda::allow_tf32()) { cuda::set_allow_tf32(allow); }
  ~ScopedAllowTf32() { cuda::set_allow_tf32(previous_); }
  ScopedAllowTf32(const ScopedAllowTf32&) = delete;
  ScopedAllowTf32& operator=(const ScopedAllowTf32&) = delete;

 private:
  bool previous_;
};

/// A device copy of a host vector; to_host() copies back (synchronously).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : buf_(host.size() * sizeof(T)), n_(host.size()) {
    cuda::copy(buf_.get(), host.data(), host.size() * sizeof(T));
  }
  explicit DeviceArray(std::size_t n, T poison = T(-12345)) : DeviceArray(std::vector<T>(n, poison)) {}
  T* get() const { return buf_.as<T>(); }
  std::size_t size() const { return n_; }
  std::vector<T> to_host() const {
    std::vector<T> host(n_);
    cuda::copy(host.data(), buf_.get(), n_ * sizeof(T));
    return host;
  }

 private:
  cuda::DeviceBuffer buf_;
  std::size_t n_;
};

using kernel_bounds::random_floats;  // n floats uniform in [lo, hi), reproducible from seed

inline std::vector<std::int64_t> random_indices(std::size_t n, std::int64_t high, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, high - 1);
  std::vector<std::int64_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

/// |actual - expected| <= atol + rtol * |expected| everywhere, NaN never passes; the failure names the
/// worst element.
inline ::testing::AssertionResult all_close(const std::vector<float>& actual, const std::vector<float>& expected,
                                            float rtol, float atol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << " vs " << expected.size();
  std::size_t worst = 0;
  double worst_excess = -1.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const double excess = std::isnan(a) || std::isnan(e) ? 1e30 : std::abs(a - e) - (atol + rtol * std::abs(e));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (worst_excess > 0.0)
    return ::testing::AssertionFailure() << "element " << worst << " of " << actual.size() << ": got " << actual[worst]
                                         << ", expected " << expected[worst] << " (rtol " << rtol << ", atol " << atol
                                         << ")";
  return ::testing::AssertionSuccess();
}

/// |actual[i] - expected[i]| <= bound[i] everywhere (NaN never passes); the failure names the worst
/// element by its ratio to the bound.
inline ::testing::AssertionResult within(const std::vector<float>& actual, const std::vector<float>& expected,
                                         const std::vector<double>& bound) {
  if (actual.size() != expected.size() || actual.size() != bound.size())
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << ", " << expected.size() << ", "
                                         << bound.size();
  std::size_t worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(static_cast<double>(actual[i]) - expected[i]);
    const double ratio = std::isnan(err) ? 1e30 : (err == 0.0 ? 0.0 : (bound[i] > 0.0 ? err / bound[i] : 1e30));
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (worst_ratio > 1.0)
    return ::testing::AssertionFailure() << "element " << worst << " of " << actual.size() << ": got " << actual[worst]
                                         << ", expected " << expected[worst] << ", bound " << bound[worst];
  return ::testing::AssertionSuccess();
}

/// Note [CUDA test tolerances]: the bound on |device - host| for C = alpha op(A) op(B) + beta C0 computed
/// by two f32 GEMMs (any summation order), element by element: 2 (K + 2) u (|alpha| abs_prod + |beta|
/// |C0|), abs_prod = |op(A)| |op(B)| (a host GEMM on the magnitudes, whose own rounding is second order).
inline std::vector<double> gemm_bound(std::int64_t K, float alpha, float beta, const std::vector<float>& c0,
                                      const std::vector<float>& abs_prod) {
  std::vector<double> bound(abs_prod.size());
  const double u = 1.0 / 16777216.0;
  for (std::size_t i = 0; i < bound.size(); ++i)
    bound[i] = 2.0 * (static_cast<double>(K) + 2.0) * u *
               (std::abs(alpha) * static_cast<double>(abs_prod[i]) + std::abs(static_cast<double>(beta) * c0[i]));
  return bound;
}

/// Element-wise |v|.
inline std::vector<float> abs_of(std::vector<float> v) {
  for (auto& x : v) x = std::abs(x);
  return v;
}

}  // namespace zero::cuda_test

#endif  // ZERO_HAS_CUDA
