// core/cuda/runtime.h and cuda tensors: availability without a device, the caching allocators' counters,
// host <-> device round trips of every dtype, strided views across devices, streams, deferred errors.
// Every test but the first is skipped when no GPU is visible.
#include <gtest/gtest.h>

#ifdef ZERO_HAS_CUDA

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/kernels.h"
#include "core/tensor.h"
#include "cuda_test_util.h"

namespace zero {
namespace {

using cuda_test::CudaTest;
using cuda_test::random_floats;
using CudaRuntime = CudaTest;

// Runs everywhere, GPU or not: the "no device" path must answer, not throw or crash.
TEST(CudaAvailability, AnswersWithoutThrowing) {
  bool available = false;
  EXPECT_NO_THROW(available = cuda::cuda_available());
  EXPECT_EQ(available, cuda::device_count() > 0);
  if (!available) {
    EXPECT_THROW(Tensor::empty({4}, DType::f32, Device::cuda), Error);
    EXPECT_THROW(cuda::device_alloc(16), Error);
    EXPECT_FALSE(cuda::is_device_pointer(&available));
  }
}

// Runs everywhere: the side-stream list is host bookkeeping (the handles below are never passed to CUDA).
// Backend::synchronize waits for exactly these streams besides the current one, so the NCCL
// communicator's stream, registered for its lifetime, is waited for (CudaNccl.SynchronizeWaitsFor...
// in tests/distributed/test_nccl.cpp checks the wait itself on a GPU).
TEST(CudaSideStreams, ListedFromRegisterUntilUnregister) {
  const auto a = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1000});
  const auto b = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x2000});
  const auto before = cuda::side_streams();
  auto listed = [](cudaStream_t s) {
    const auto v = cuda::side_streams();
    return std::count(v.begin(), v.end(), s);
  };
  cuda::register_side_stream(a);
  cuda::register_side_stream(b);
  cuda::register_side_stream(a);
  EXPECT_EQ(listed(a), 2);
  EXPECT_EQ(listed(b), 1);
  cuda::unregister_side_stream(a);
  EXPECT_EQ(listed(a), 1);
  cuda::unregister_side_stream(b);
  cuda::unregister_side_stream(b);  // not registered any more: ignored
  EXPECT_EQ(listed(b), 0);
  cuda::unregister_side_stream(a);
  EXPECT_EQ(cuda::side_streams(), before);
}

TEST_F(CudaRuntime, AllocatorReusesFreedBlocks) {
  cuda::synchronize();
  const std::size_t bytes = (std::size_t{3} << 20) + 123;  // a size class nothing else here uses
  void* first = cuda::device_alloc(bytes);
  const AllocatorStats after_first = cuda::allocator_stats();
  EXPECT_GE(after_first.in_use, bytes);
  EXPECT_GE(after_first.peak_in_use, after_first.in_use);
  cuda::device_free(first);
  const AllocatorStats after_free = cuda::allocator_stats();
  EXPECT_EQ(after_first.in_use - after_free.in_use, std::size_t{4} << 20);  // rounded up to 2 MiB pages
  EXPECT_GE(after_free.cached, bytes);

  // Same size again: the cached block comes back, no cudaMalloc.
  void* second = cuda::device_alloc(bytes);
  const AllocatorStats after_second = cuda::allocator_stats();
  EXPECT_EQ(second, first);
  EXPECT_EQ(after_second.mallocs, after_first.mallocs);
  cuda::device_free(second);

  // A training-like loop: after the first iteration, no new cudaMalloc.
  std::size_t mallocs_after_first_iteration = 0;
  for (int it = 0; it < 4; ++it) {
    {
      Tensor a = Tensor::empty({257, 129}, DType::f32, Device::cuda);
      Tensor b = Tensor::zeros({1000}, DType::f16, Device::cuda);
      Tensor c = Tensor::empty({3, 5, 7}, DType::i64, Device::cuda);
      Tensor d = a.clone();
    }
    if (it == 0) mallocs_after_first_iteration = cuda::allocator_stats().mallocs;
  }
  EXPECT_EQ(cuda::allocator_stats().mallocs, mallocs_after_first_iteration);

  cuda::reset_allocator_peak();
  EXPECT_EQ(cuda::allocator_stats().peak_in_use, cuda::allocator_stats().in_use);
}

TEST_F(CudaRuntime, PinnedBuffersAreCached) {
  void* a = cuda::pinned_alloc(10000);
  const std::size_t mallocs = cuda::pinned_allocator_stats().mallocs;
  cuda::pinned_free(a);
  void* b = cuda::pinned_alloc(10000);
  EXPECT_EQ(a, b);
  EXPECT_EQ(cuda::pinned_allocator_stats().mallocs, mallocs);
  cuda::pinned_free(b);

  cuda::PinnedBuffer buf;
  void* p = buf.reserve(100);
  EXPECT_EQ(buf.reserve(50), p);
  EXPECT_GE(buf.capacity(), 100u);
  EXPECT_FALSE(cuda::is_device_pointer(p));
}

TEST_F(CudaRuntime, RoundTripEveryDtypeIsExact) {
  const Shape shape{3, 17, 5};
  const std::vector<float> values = random_floats(3 * 17 * 5, 7, -50.0f, 50.0f);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    Tensor host = Tensor::empty(shape, t);
    host.copy_(Tensor::from_vector(values, shape));
    Tensor dev = host.to(Device::cuda);
    EXPECT_EQ(dev.device(), Device::cuda);
    EXPECT_EQ(dev.dtype(), t);
    EXPECT_TRUE(cuda::is_device_pointer(dev.raw_data()));
    Tensor back = dev.to(Device::cpu);
    EXPECT_EQ(back.device(), Device::cpu);
    ASSERT_EQ(back.nbytes(), host.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), host.raw_data(), host.nbytes()), 0) << dtype_name(t);
    EXPECT_EQ(dev.to_vector(), host.to_vector()) << dtype_name(t);
    EXPECT_EQ(dev.item_at(11), host.item_at(11));
  }
}

TEST_F(CudaRuntime, StridedViewsAndConversionsAcrossDevices) {
  const std::vector<float> values = random_floats(6 * 4, 11);
  Tensor host = Tensor::from_vector(values, {6, 4});
  // A non-contiguous CPU view uploads as its elements in row-major order.
  Tensor t_host = host.transpose(0, 1);
  EXPECT_EQ(t_host.to(Device::cuda).to_vector(), t_host.to_vector());
  // A non-contiguous cuda view downloads the same way.
  Tensor dev = host.to(Device::cuda);
  EXPECT_EQ(dev.transpose(0, 1).to_vector(), t_host.to_vector());
  EXPECT_EQ(dev.narrow(0, 2, 3).to_vector(), host.narrow(0, 2, 3).to_vector());

  // Writes through a cuda view land in the base.
  Tensor base_dev = Tensor::zeros({6, 4}, DType::f32, Device::cuda);
  Tensor base_host = Tensor::zeros({6, 4});
  const Tensor src = Tensor::from_vector(random_floats(12, 12), {2, 6});
  base_dev.transpose(0, 1).narrow(0, 1, 2).copy_(src.to(Device::cuda));
  base_host.transpose(0, 1).narrow(0, 1, 2).copy_(src);
  EXPECT_EQ(base_dev.to_vector(), base_host.to_vector());
  base_dev.narrow(1, 3, 1).fill_(2.5f);
  base_host.narrow(1, 3, 1).fill_(2.5f);
  EXPECT_EQ(base_dev.to_vector(), base_host.to_vector());

  // dtype conversion on the device rounds like the host (round to nearest even).
  for (DType t : {DType::f16, DType::bf16}) {
    Tensor on_dev = dev.to(t);
    EXPECT_EQ(on_dev.device(), Device::cuda);
    Tensor reference = host.to(t);
    Tensor down = on_dev.to(Device::cpu);
    EXPECT_EQ(std::memcmp(down.raw_data(), reference.raw_data(), reference.nbytes()), 0) << dtype_name(t);
    EXPECT_EQ(on_dev.to(DType::f32).to_vector(), reference.to(DType::f32).to_vector());
  }
  // cpu -> cuda copy_ with a dtype change and a strided destination.
  Tensor half_dev = Tensor::zeros({4, 6}, DType::f16, Device::cuda);
  half_dev.transpose(0, 1).copy_(host);
  Tensor half_host = Tensor::zeros({4, 6}, DType::f16);
  half_host.transpose(0, 1).copy_(host);
  EXPECT_EQ(half_dev.to_vector(), half_host.to_vector());
  // Overlapping views of one cuda storage.
  Tensor row = Tensor::from_vector({1, 2, 3, 4, 5}, {5}).to(Device::cuda);
  row.narrow(0, 1, 4).copy_(row.narrow(0, 0, 4));
  EXPECT_EQ(row.to_vector(), (std::vector<float>{1, 1, 2, 3, 4}));
  EXPECT_FLOAT_EQ(Tensor::from_vector({3.5f}, {}).to(Device::cuda).item(), 3.5f);
}

TEST_F(CudaRuntime, StreamGuardSwitchesAndRestores) {
  cudaStream_t base = cuda::current_stream();
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  {
    cuda::StreamGuard guard(other);
    EXPECT_EQ(cuda::current_stream(), other);
    Tensor t = Tensor::from_vector({1, 2, 3}, {3}).to(Device::cuda);  // allocated and copied on `other`
    EXPECT_EQ(t.to_vector(), (std::vector<float>{1, 2, 3}));
  }
  EXPECT_EQ(cuda::current_stream(), base);
  cuda::synchronize();
  cudaStreamSynchronize(other);
  cudaStreamDestroy(other);
}

TEST_F(CudaRuntime, BadIndicesAreReportedAtTheNextCheck) {
  cuda_test::DeviceArray<float> weight(random_floats(4 * 3, 3));
  cuda_test::DeviceArray<std::int64_t> idx(std::vector<std::int64_t>{0, 7, 2});
  cuda_test::DeviceArray<float> out(std::size_t{9});
  kernels(Device::cuda).embedding_forward(out.get(), weight.get(), idx.get(), 3, 4, 3);
  EXPECT_THROW(cuda::synchronize(), Error);
  EXPECT_NO_THROW(cuda::synchronize());  // the flag was cleared
  const std::vector<float> got = out.to_host();
  EXPECT_EQ(got[3], 0.0f);  // the bad row is zero
}

}  // namespace
}  // namespace zero

#else  // built without CUDA

TEST(CudaRuntime, NotBuilt) { GTEST_SKIP() << "built without CUDA (ZERO_CUDA=OFF or no toolkit)"; }

#endif
