// The GPU communicators on device buffers against closed-form references, as test_communicator.cpp does
// for MPI on host buffers: NcclCommunicator (one GPU per rank: skipped unless this node has a GPU for
// every rank) and the host-staged MPI mode (any number of ranks sharing a GPU: skipped without one).
// Every rank reaches the same skip decision, so the collectives stay matched.
#include <gtest/gtest.h>

#ifdef ZERO_HAS_CUDA

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "core/backend.h"
#include "core/cuda/runtime.h"
#include "core/kernels.h"
#include "core/tensor.h"
#include "distributed/comm/job_runtime.h"
#include "distributed/comm/nccl_communicator.h"

namespace zero::dist {
namespace {

// Small multiples of 1/2 below 64: sums over up to 4 ranks are exact in f32, f16 and bf16, so every
// comparison below is exact (Note [CUDA test tolerances], tests/unit/cuda_test_util.h).
float value(int rank, std::size_t i) { return 0.5f * float(rank + 1) + float(i % 13); }
float value_sum(int n, std::size_t i) { return 0.25f * float(n * (n + 1)) + float(n) * float(i % 13); }
float max_source(int rank, std::size_t i) { return float((i * 31 + std::size_t(rank) * 17) % 101); }

std::vector<std::size_t> offsets_of(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> offsets(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}

Tensor device_tensor(const std::vector<float>& host, DType t) {
  return Tensor::from_vector(host, {static_cast<std::int64_t>(host.size())}).to(t).to(Device::cuda);
}

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

// Runs every collective of `comm` on device buffers of dtype t and counts wrong elements. Collective:
// all ranks make the same calls whatever they find.
void check_collectives(Communicator& comm, DType t) {
  SCOPED_TRACE(::testing::Message() << comm.backend_name() << " " << dtype_name(t));
  const int n = comm.world_size(), rank = comm.rank();
  const std::size_t elem = dtype_size(t);

  // all_reduce sum / max
  {
    const std::size_t count = 1000;
    std::vector<float> v(count), m(count), want(count), want_max(count);
    for (std::size_t i = 0; i < count; ++i) {
      v[i] = value(rank, i);
      m[i] = max_source(rank, i);
      want[i] = value_sum(n, i);
      want_max[i] = 0;
      for (int r = 0; r < n; ++r) want_max[i] = std::max(want_max[i], max_source(r, i));
    }
    Tensor buf = device_tensor(v, t), mbuf = device_tensor(m, t);
    comm.all_reduce(buf.raw_data(), count, t, ReduceOp::sum);
    comm.all_reduce(mbuf.raw_data(), count, t, ReduceOp::max);
    EXPECT_EQ(buf.to_vector(), want);
    EXPECT_EQ(mbuf.to_vector(), want_max);
  }

  // reduce_scatter and all_gather, equal and uneven counts (one rank may own nothing), in place or not
  std::vector<std::vector<std::size_t>> layouts = {std::vector<std::size_t>(n, 100)};
  std::vector<std::size_t> uneven(n);
  for (int r = 0; r < n; ++r) uneven[r] = r == 1 ? 0 : 17 + 5 * std::size_t(r);
  layouts.push_back(uneven);
  // Odd element counts (16-bit slices start at odd 2-byte offsets), rank 0 owning a single element and
  // the last rank almost everything: the uneven paths (NCCL: grouped ncclReduce / ncclBroadcast;
  // host-staged: MPI's uneven reduce-scatter on the staged copy, copied back to an odd offset).
  std::vector<std::size_t> skewed(n);
  for (int r = 0; r < n; ++r) skewed[r] = r == n - 1 ? 100003 : 1 + 2 * std::size_t(r);
  layouts.push_back(skewed);
  for (const auto& counts : layouts) {
    const auto offsets = offsets_of(counts);
    const std::size_t total = offsets.back() + counts.back();
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "counts[0]=" << counts[0] << " in_place=" << in_place);
      std::vector<float> v(total), want(counts[rank]);
      for (std::size_t i = 0; i < total; ++i) v[i] = value(rank, i);
      for (std::size_t j = 0; j < counts[rank]; ++j) want[j] = value_sum(n, offsets[rank] + j);
      Tensor send = device_tensor(v, t);
      Tensor recv = Tensor::zeros({static_cast<std::int64_t>(counts[rank])}, t, Device::cuda);
      void* out = in_place ? bytes_of(send) + offsets[rank] * elem : recv.raw_data();
      comm.reduce_scatter(send.raw_data(), out, counts, t);
      const Tensor result = in_place ? send.narrow(0, static_cast<std::int64_t>(offsets[rank]),
                                                   static_cast<std::int64_t>(counts[rank]))
                                     : recv;
      EXPECT_EQ(result.to_vector(), want);

      std::vector<float> mine(counts[rank]), gathered(total);
      for (std::size_t j = 0; j < counts[rank]; ++j) mine[j] = value(rank, j);
      for (int r = 0; r < n; ++r)
        for (std::size_t j = 0; j < counts[r]; ++j) gathered[offsets[r] + j] = value(r, j);
      Tensor all = Tensor::zeros({static_cast<std::int64_t>(total)}, t, Device::cuda);
      Tensor part = device_tensor(mine, t);
      const void* in = part.raw_data();
      if (in_place) {
        all.narrow(0, static_cast<std::int64_t>(offsets[rank]), static_cast<std::int64_t>(counts[rank])).copy_(part);
        in = bytes_of(all) + offsets[rank] * elem;
      }
      auto work = comm.all_gather_async(in, all.raw_data(), counts, t);
      work->wait();
      EXPECT_TRUE(work->is_completed());
      EXPECT_EQ(all.to_vector(), gathered);
    }
  }

  // reduce to the last rank, broadcast from rank 0
  {
    const std::size_t count = 300;
    std::vector<float> v(count), want(count), source(count);
    for (std::size_t i = 0; i < count; ++i) {
      v[i] = value(rank, i);
      want[i] = rank == n - 1 ? value_sum(n, i) : value(rank, i);  // non-roots keep their buffer
      source[i] = value(0, i);
    }
    Tensor buf = device_tensor(v, t);
    comm.reduce(buf.raw_data(), count, t, n - 1);
    EXPECT_EQ(buf.to_vector(), want);
    Tensor b = rank == 0 ? device_tensor(source, t) : Tensor::zeros({static_cast<std::int64_t>(count)}, t, Device::cuda);
    comm.broadcast(b.raw_data(), count, t, 0);
    EXPECT_EQ(b.to_vector(), source);
  }

  // Stream ordering: a kernel queued on the compute stream just before the call must be seen by it.
  {
    const std::size_t count = 1 << 20;
    Tensor buf = Tensor::empty({static_cast<std::int64_t>(count)}, t, Device::cuda);
    backend(Device::cuda).fill(buf.raw_data(), t, float(rank + 1), static_cast<std::int64_t>(count));
    auto work = comm.all_reduce_async(buf.raw_data(), count, t, ReduceOp::sum);
    work->wait();
    const auto got = buf.to_vector();
    const float want = 0.5f * float(n * (n + 1));
    EXPECT_EQ(std::count(got.begin(), got.end(), want), static_cast<std::ptrdiff_t>(count));
  }
}

void check_control_and_ledger(Communicator& comm) {
  const int n = comm.world_size();
  EXPECT_EQ(comm.all_reduce_sum(comm.rank() + 1.0), 0.5 * n * (n + 1));
  EXPECT_EQ(comm.all_reduce_max(double(comm.rank())), double(n - 1));
  // The batched control vector (ZeroOptimizer's norm partial and flags): one call, every value summed.
  std::vector<double> values{comm.rank() + 1.0, 0.0, comm.rank() == 0 ? 1.0 : 0.0, -2.0 * comm.rank()};
  comm.all_reduce_sum(values);
  EXPECT_EQ(values, (std::vector<double>{0.5 * n * (n + 1), 0.0, 1.0, -1.0 * n * (n - 1)}));
  comm.barrier();
  comm.ledger().reset();
  Tensor buf = Tensor::zeros({1000}, DType::f32, Device::cuda);
  comm.all_reduce(buf.raw_data(), 1000, DType::f32);
  EXPECT_DOUBLE_EQ(comm.ledger()[Collective::all_reduce], 2.0 * (n - 1) / n * 4000.0);
  // No timers on the device backends: train_gpt then says "not measured" instead of printing their zeros.
  EXPECT_FALSE(comm.times_collectives());
  EXPECT_EQ(comm.ledger().total_seconds(), 0.0);
  EXPECT_EQ(comm.ledger().cpu_seconds, 0.0);
}

// NcclCommunicator with either wire dtype (fp32 scratch, or 16-bit sums) and the given options, through
// every collective; false when this node lacks a GPU per rank (the caller skips, on every rank).
bool check_nccl(NcclOptions options) {
  auto mpi = mpi_world();
  if (!nccl_usable(mpi->rank(), mpi->world_size())) return false;
  for (bool fp32_accumulate : {true, false}) {
    options.fp32_accumulate = fp32_accumulate;
    NcclCommunicator comm(mpi, options);
    EXPECT_EQ(comm.world_size(), mpi->world_size());
    EXPECT_EQ(comm.rank(), mpi->rank());
    for (DType t : {DType::f32, DType::f16, DType::bf16}) check_collectives(comm, t);
    check_control_and_ledger(comm);
  }
  return true;
}

TEST(CudaNccl, CollectivesMatchClosedForms) {
  if (!check_nccl({})) GTEST_SKIP() << "NCCL needs a GPU per rank (" << cuda::device_count() << " visible)";
}

// The grouped per-slice paths (ncclReduce / ncclBroadcast per rank in one NCCL group) that uneven counts
// take: forced, so that they run on one rank too, where every count list is "equal".
TEST(CudaNccl, GroupedPathsMatchClosedForms) {
  NcclOptions options;
  options.force_grouped = true;
  if (!check_nccl(options)) GTEST_SKIP() << "NCCL needs a GPU per rank (" << cuda::device_count() << " visible)";
}

// Backend::synchronize waits for every function queued on the device, the communication stream's
// collectives included (core/cuda/runtime.h, side streams): a collective issued and not waited for is
// complete once it returns. The barrier, which all-reduces a device double of the communicator's own,
// runs before and after.
TEST(CudaNccl, SynchronizeWaitsForTheCommunicationStream) {
  auto mpi = mpi_world();
  if (!nccl_usable(mpi->rank(), mpi->world_size()))
    GTEST_SKIP() << "NCCL needs a GPU per rank (" << cuda::device_count() << " visible)";
  NcclCommunicator comm(mpi);
  comm.barrier();
  const std::size_t count = std::size_t{1} << 26;  // 256 MiB of f32: still running when issue returns
  Tensor buf = Tensor::ones({static_cast<std::int64_t>(count)}, DType::f32, Device::cuda);
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 4; ++i) works.push_back(comm.all_reduce_async(buf.raw_data(), count, DType::f32, ReduceOp::sum));
  kernels(Device::cuda).synchronize();
  EXPECT_EQ(cudaStreamQuery(comm.comm_stream()), cudaSuccess);
  for (auto& w : works) EXPECT_TRUE(w->is_completed());
  for (auto& w : works) w->wait();
  comm.barrier();
  const float n = float(comm.world_size());
  EXPECT_EQ(buf.narrow(0, 0, 1).to_vector(), std::vector<float>{n * n * n * n});
}

TEST(CudaHostStaged, CollectivesMatchClosedForms) {
  auto mpi = mpi_world();
  if (!cuda::cuda_available()) {
    GTEST_SKIP() << "no CUDA device visible";
  }
  auto comm = make_host_staged(mpi);
  EXPECT_EQ(comm->world_size(), mpi->world_size());
  for (DType t : {DType::f32, DType::f16, DType::bf16}) check_collectives(*comm, t);
  check_control_and_ledger(*comm);
  // Host buffers pass straight through.
  std::vector<float> host(10, 1.0f);
  comm->all_reduce(host.data(), host.size(), DType::f32);
  EXPECT_EQ(host, std::vector<float>(10, float(comm->world_size())));
}

}  // namespace
}  // namespace zero::dist

#else  // built without CUDA

TEST(CudaNccl, NotBuilt) { GTEST_SKIP() << "built without CUDA (ZERO_CUDA=OFF or no toolkit)"; }

#endif
