// Helpers for the CUDA suites (tests/unit/test_cuda_*.cpp): a fixture that skips without a device, device
// arrays filled from host vectors, and a tolerance check that names the worst element.
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

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

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
    return ::testing::AssertionFailure() << "element " << worst << " of " << actual.size() << ": got "
                                         << actual[worst] << ", expected " << expected[worst] << " (rtol " << rtol
                                         << ", atol " << atol << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace zero::cuda_test

#endif  // ZERO_HAS_CUDA
