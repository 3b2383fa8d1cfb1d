// ZeRO on cuda tensors (Note [ZeRO on cuda] in distributed/zero_optimizer.cpp): every rank's model on the
// GPU, collectives through the host-staged MPI communicator (so any number of ranks can share the one
// GPU of a test machine), against the same ZeRO run on the CPU with plain MPI. Both runs happen on every
// rank; skipped everywhere without a GPU (every rank of the node gets the same cuda_available()).
#include <gtest/gtest.h>

#ifdef ZERO_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/gemm_precision.h"
#include "distributed/job_runtime.h"
#include "distributed/nccl_communicator.h"
#include "distributed/zero_optimizer.h"
#include "nn/gpt.h"

namespace zero::dist {
namespace {

nn::GPTConfig config() {
  nn::GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.bias = false;
  return c;
}

// Rows [row0, row0 + rows) of step `step`'s global batch (the same numbers on every rank).
std::pair<Tensor, Tensor> rows_of(const nn::GPTConfig& c, int step, std::int64_t row0, std::int64_t rows) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rows * c.block_size)), tgt(idx.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < c.block_size; ++i) {
      const std::size_t k = static_cast<std::size_t>(r * c.block_size + i);
      const std::int64_t g = (row0 + r) * 31 + i * 7 + step * 13;
      idx[k] = g % c.vocab_size;
      tgt[k] = (g * 3 + 1) % c.vocab_size;
    }
  return {Tensor::from_indices(idx, {rows, c.block_size}), Tensor::from_indices(tgt, {rows, c.block_size})};
}

// Trains 3 steps of GAS 2 on `device` with `comm`; returns every parameter as host floats.
std::vector<std::vector<float>> train(Device device, std::shared_ptr<Communicator> comm, const ZeroOptions& o) {
  const nn::GPTConfig cfg = config();
  Generator gen(42);
  nn::GPT model(cfg, gen);
  model.to(device);
  ZeroOptimizer opt(model.named_parameters(), comm, o);
  const int n = comm->world_size(), rank = comm->rank();
  const std::int64_t b = 2;
  for (int s = 0; s < 3; ++s) {
    for (int g = 0; g < o.gradient_accumulation_steps; ++g) {
      auto [x, y] = rows_of(cfg, s, (static_cast<std::int64_t>(g) * n + rank) * b, b);
      opt.backward(model.loss(x.to(device), y.to(device)));
    }
    opt.step();
  }
  std::vector<std::vector<float>> out;
  for (const auto& p : model.named_parameters()) {
    EXPECT_EQ(p.tensor.device(), device) << p.name;
    out.push_back(p.tensor.to_vector());
  }
  return out;
}

TEST(ZeroCuda, HostStagedStagesMatchCpu) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  auto world = mpi_world();
  auto staged = make_host_staged(world);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int variant : {0, 1, 2, 3}) {  // stages 0, 1, 2, and stage 2 with overlap_comm
      const int stage = std::min(variant, 2);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " stage " + std::to_string(stage) +
                   (variant == 3 ? " overlap_comm" : ""));
      ZeroOptions o;
      o.stage = stage;
      o.overlap_comm = variant == 3;
      o.dtype = dtype;
      o.reduce_bucket_size = 100;
      o.allgather_bucket_size = 100;
      o.gradient_accumulation_steps = 2;
      o.adam.lr = 1e-2f;
      o.weight_decay = 0.1f;
      o.gradient_clipping = 0.5f;
      const auto want = train(Device::cpu, world, o);
      // A bf16 model's device GEMMs would also round their activation operands to bf16 (Note [Tensor
      // cores for 16-bit models]); this test is about ZeRO's data path, so the device GEMMs read f32 here,
      // as the CPU's do. tests/unit/test_tensor_cores.cpp covers the 16-bit GEMMs.
      set_16bit_gemms(false);
      struct Restore {
        ~Restore() { set_16bit_gemms(true); }
      } restore;
      const auto have = train(Device::cuda, staged, o);
      ASSERT_EQ(have.size(), want.size());
      // Different summation orders (cuBLAS, device reductions): close, not identical. An estimate, not a
      // bound (Note [CUDA test tolerances], tests/unit/cuda_test_util.h): the gradients differ by ~1e-6
      // relative (sums of at most a few hundred f32 terms), and AdamW's update lr m / sqrt(v) is
      // scale-free, so over 3 steps of lr 1e-2 the parameters move apart by ~3 lr 1e-6 relative — 1e-4
      // leaves room for gradients near zero (the model has no biases, whose true gradient can be 0).
      // bf16 rounds the model's copy to 8 bits: one ulp of a parameter near 1 is 2^-8 ≈ 4e-3, and a
      // different rounding of the master in one step can cost a few: 2e-2 ≈ 5 ulp.
      const double tol = dtype == DType::f32 ? 1e-4 : 2e-2;
      for (std::size_t i = 0; i < want.size(); ++i) {
        double diff = 0.0;
        for (std::size_t j = 0; j < want[i].size(); ++j)
          diff = std::max(diff, std::abs(static_cast<double>(have[i][j]) - want[i][j]));
        EXPECT_LE(diff, tol) << "parameter " << i;
      }
    }
  }
}

}  // namespace
}  // namespace zero::dist

#endif  // ZERO_HAS_CUDA
