// ZeRO's data path on cuda tensors (Note [ZeRO on cuda] in distributed/zero/zero_optimizer.cpp): every rank's
// parameters on the GPU, collectives through the host-staged MPI communicator (so any number of ranks can
// share the one GPU of a test machine), and the same ZeRO run on the CPU with plain MPI, both against
// exact AdamW in double with the bound of Note [AdamW trajectory bound] (tests/unit/kernel_bounds.h).
//
// The loss is linear in the parameters, sum_p sum(p * C), so its gradient is the constant C (times the
// backward's 1/GAS) with no rounding on any device: C's entries are k/4 (k = 1..4) with a sign fixed per
// element, so the sums over micro-steps and ranks are exact as well (a world whose size is not a power of
// two rounds its 1/N, once per rank, without cancellation). What the comparison then sees is ZeRO itself:
// buckets, partitions, reduce-scatter / all-reduce, gradient accumulation, clipping, AdamW, the 16-bit
// copy and the all-gather. The CPU half runs without a GPU too (ZeroAdamWReference), so CI checks the
// reference and its bound. Every rank runs both halves; the GPU half skips everywhere without a GPU
// (every rank of the node gets the same cuda_available()).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "distributed/comm/job_runtime.h"
#include "distributed/zero/zero_optimizer.h"
#include "tests/unit/kernel_bounds.h"
#ifdef ZERO_HAS_CUDA
#include "core/cuda/runtime.h"
#include "distributed/comm/nccl_communicator.h"
#endif

namespace zero::dist {
namespace {

namespace kb = kernel_bounds;

// Sizes that make buckets of 100 elements straddle parameters and partitions cut them; "bias" is not
// decayed (AdamW's no-decay slices).
struct ParamSpec {
  const char* name;
  Shape shape;
  bool decay;
};
const std::vector<ParamSpec> kParams = {{"a", {37}, true}, {"w", {8, 16}, true}, {"bias", {5}, false},
                                        {"proj", {64, 3}, true}};
constexpr int kSteps = 3;
constexpr float kMaxNorm = 0.5f;

std::int64_t total_numel() {
  std::int64_t n = 0;
  for (const auto& s : kParams) n += shape_numel(s.shape);
  return n;
}

// C for flat element e at step `step`, rank `rank`, micro-step `micro`: k/4, k = 1..4, sign fixed per e.
float coefficient(std::int64_t e, int step, int rank, int micro) {
  const float sign = (e * 7 + 3) % 5 < 2 ? -1.0f : 1.0f;
  return sign * static_cast<float>(1 + (e * 3 + step * 5 + rank * 7 + micro * 11) % 4) / 4.0f;
}

// The starting parameters (the same on every rank), exactly representable in bf16.
std::vector<float> initial_params() {
  auto v = kb::random_floats(static_cast<std::size_t>(total_numel()), 42);
  return Tensor::from_vector(v, {total_numel()}).to(DType::bf16).to(DType::f32).to_vector();
}

ZeroOptions options(DType dtype, int variant) {  // variants: stages 0, 1, 2, and 2 with overlap_comm
  ZeroOptions o;
  o.stage = std::min(variant, 2);
  o.overlap_comm = variant == 3;
  o.dtype = dtype;
  o.reduce_bucket_size = 100;
  o.allgather_bucket_size = 100;
  o.gradient_accumulation_steps = 2;
  o.adam.lr = 1e-2f;
  o.weight_decay = 0.1f;
  o.gradient_clipping = kMaxNorm;
  return o;
}

// kSteps steps of ZeRO on `device` with `comm`; every parameter, concatenated, as host floats.
std::vector<float> train(Device device, std::shared_ptr<Communicator> comm, const ZeroOptions& o) {
  const auto p0 = initial_params();
  std::vector<nn::NamedParameter> params;
  std::int64_t offset = 0;
  for (const auto& s : kParams) {
    const std::int64_t n = shape_numel(s.shape);
    std::vector<float> v(p0.begin() + offset, p0.begin() + offset + n);
    Tensor t = Tensor::from_vector(v, s.shape).to(device);
    t.set_requires_grad(true);
    params.push_back({s.name, t, s.decay});
    offset += n;
  }
  ZeroOptimizer opt(params, comm, o);
  const int rank = comm->rank();
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < o.gradient_accumulation_steps; ++micro) {
      Tensor loss;
      std::int64_t e0 = 0;
      for (const auto& p : params) {
        const std::int64_t n = p.tensor.numel();
        std::vector<float> c(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) c[i] = coefficient(e0 + i, step, rank, micro);
        const Tensor term = sum(mul(p.tensor.to(DType::f32), Tensor::from_vector(c, p.tensor.shape()).to(device)));
        loss = loss.defined() ? add(loss, term) : term;
        e0 += n;
      }
      opt.backward(loss);
    }
    opt.step();
  }
  std::vector<float> out;
  for (const auto& p : params) {
    EXPECT_EQ(p.tensor.device(), device) << p.name;
    const auto v = p.tensor.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Exact AdamW on the exact averaged, clipped gradients, with the bound of an f32 implementation that
// sees them with relative error rel_g: the 1/N pre-division (one rounding in the model dtype) and the
// wire sum of N one-signed terms (N - 1 roundings), one more accumulation at stage 2 (N + 2 roundings
// of u_dtype in all, counting generously; none at all when N is a power of two), then the clip
// coefficient rounded to f32 and its product (2u; 3u with margin). The model copy of a 16-bit run is
// the master rounded once more: u_dtype |p|.
struct Reference {
  std::vector<double> param, bound;
};
Reference reference(const ZeroOptions& o, int world) {
  const std::int64_t n = total_numel();
  const auto p0 = initial_params();
  kb::AdamWTrajectory exact(std::vector<double>(p0.begin(), p0.end()), o.adam.lr, o.adam.beta1, o.adam.beta2,
                            o.adam.eps);
  std::vector<float> decay;
  for (const auto& s : kParams)
    decay.insert(decay.end(), static_cast<std::size_t>(shape_numel(s.shape)), s.decay ? o.weight_decay : 0.0f);
  const double u_dtype = o.dtype == DType::f32 ? kb::kU : 1.0 / 256;
  const double rel_g = (world + 2) * u_dtype + 3 * kb::kU;
  const int gas = o.gradient_accumulation_steps;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<double> g(static_cast<std::size_t>(n), 0.0);
    double sq = 0.0;
    for (std::int64_t e = 0; e < n; ++e) {
      for (int r = 0; r < world; ++r)
        for (int micro = 0; micro < gas; ++micro) g[e] += coefficient(e, step, r, micro);
      g[e] /= static_cast<double>(world) * gas;
      sq += g[e] * g[e];
    }
    const double coef = std::min(1.0, static_cast<double>(kMaxNorm) / (std::sqrt(sq) + 1e-6));
    for (double& v : g) v *= coef;
    exact.apply(g, decay, rel_g);
  }
  Reference ref{exact.param, exact.bound};
  if (o.dtype != DType::f32)
    for (std::int64_t e = 0; e < n; ++e) ref.bound[e] += u_dtype * (std::abs(ref.param[e]) + ref.bound[e]);
  return ref;
}

std::string label(DType dtype, int variant) {
  return std::string(dtype_name(dtype)) + " stage " + std::to_string(std::min(variant, 2)) +
         (variant == 3 ? " overlap_comm" : "");
}

// The CPU half, without a GPU: ZeRO on MPI against the reference, which also shows the bound holds for a
// correct implementation.
TEST(ZeroAdamWReference, CpuStagesWithinBound) {
  auto world = mpi_world();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int variant : {0, 1, 2, 3}) {
      SCOPED_TRACE(label(dtype, variant));
      const ZeroOptions o = options(dtype, variant);
      const auto have = train(Device::cpu, world, o);
      const Reference want = reference(o, world->world_size());
      EXPECT_TRUE(kb::within_bounds(have, want.param, want.bound));
    }
  }
}

#ifdef ZERO_HAS_CUDA
TEST(ZeroCuda, HostStagedStagesMatchCpu) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  auto world = mpi_world();
  auto staged = make_host_staged(world);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int variant : {0, 1, 2, 3}) {
      SCOPED_TRACE(label(dtype, variant));
      const ZeroOptions o = options(dtype, variant);
      const auto cpu = train(Device::cpu, world, o);
      const auto gpu = train(Device::cuda, staged, o);
      const Reference want = reference(o, world->world_size());
      EXPECT_TRUE(kb::within_bounds(cpu, want.param, want.bound)) << "cpu";
      EXPECT_TRUE(kb::within_bounds(gpu, want.param, want.bound)) << "cuda";
    }
  }
}
#endif  // ZERO_HAS_CUDA

}  // namespace
}  // namespace zero::dist
