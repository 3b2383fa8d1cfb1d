// Micro-benchmarks of the hot CPU kernels of a GPT training step (kernels(Device::cpu), core/cpu/), at the shapes
// train_gpt runs: the nanoGPT CPU recipe (B 12, T 64, C 128, H 4, V 65: N = B·T = 768 rows) and the
// GPU recipe run on the CPU (B 8, T 256, C 384, H 6: N = 2048). docs/performance.md reads these beside
// the whole-step profile.
//
//   build/bin/bench_kernels [--threads N] [--benchmark_filter=regex] [Google Benchmark flags]
//
// --threads sets the kernels' OpenMP / Eigen thread count (default 1). With one thread read the CPU
// column (this thread's CPU time: steady on a shared machine); with more, read Time (wall clock).
// Counters: GFLOP/s for GEMMs and attention (2 flops per multiply-add, full T×T as PaLM counts it),
// bytes/s for the memory-bound kernels (each buffer read or written once).
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/cpu/kernels.h"
#include "core/kernels.h"
#include "optim/adamw.h"

namespace {

using namespace zero;

// Buffers aligned like the tensors of a training step (the caching allocator hands out 64-byte
// aligned blocks; some kernels take a faster path on aligned rows).
using Buffer = std::vector<float, Eigen::aligned_allocator<float>>;

Kernels& cpu() { return kernels(Device::cpu); }

Buffer randn(std::int64_t n, std::uint64_t seed = 1) {
  Generator gen(seed);
  Buffer v(static_cast<std::size_t>(n));
  for (auto& x : v) x = gen.normal(0.0f, 1.0f);
  return v;
}

void set_bytes(benchmark::State& state, double bytes_per_iter) {
  state.counters["bytes/s"] = benchmark::Counter(bytes_per_iter, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1024);
}
void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iter * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- GEMM: C[M,N] = op(A) @ op(B), the shapes of Linear's forward, dinput and dweight ----
// Args: trans_a, trans_b, M, N, K.
void BM_gemm(benchmark::State& state) {
  const bool ta = state.range(0), tb = state.range(1);
  const std::int64_t M = state.range(2), N = state.range(3), K = state.range(4);
  auto A = randn(M * K), B = randn(K * N, 2);
  Buffer C(static_cast<std::size_t>(M * N));
  for (auto _ : state) {
    cpu().gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.0f, C.data(), N, nullptr);
    benchmark::DoNotOptimize(C.data());
  }
  set_flops(state, 2.0 * M * N * K);
}
void gemm_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ta", "tb", "M", "N", "K"});
  // Linear(in -> out) on N rows: forward y = x W^T (0,1,N,out,in); dx = g W (0,0,N,in,out);
  // dW = g^T x (1,0,out,in,N).
  for (auto [n, in, out] : std::vector<std::array<std::int64_t, 3>>{
           {768, 128, 384}, {768, 128, 128}, {768, 128, 512}, {768, 512, 128}, {768, 128, 65},
           {2048, 384, 1152}, {2048, 384, 1536}, {2048, 1536, 384}}) {
    b->Args({0, 1, n, out, in});
    b->Args({0, 0, n, in, out});
    b->Args({1, 0, out, in, n});
  }
  b->Args({0, 0, 1024, 1024, 1024});
}
BENCHMARK(BM_gemm)->Apply(gemm_shapes);
// ---- GEMM with operands out of cache ----
// In a training step a GEMM's operands are other ops' outputs, often evicted since they were written.
// This rotates through 64 copies of the operands named by `cold` (0: all three, 1: A, 2: B, 3: C; the
// others stay the same warm buffers), ~100 MB in all, so each call finds them in memory, not in cache.
// Args: trans_a, trans_b, M, N, K, cold.
void BM_gemm_cold(benchmark::State& state) {
  const bool ta = state.range(0), tb = state.range(1);
  const std::int64_t M = state.range(2), N = state.range(3), K = state.range(4);
  const int cold = static_cast<int>(state.range(5));
  constexpr int kCopies = 64;
  std::vector<Buffer> As, Bs, Cs;
  for (int i = 0; i < kCopies; ++i) {
    As.push_back(randn(M * K, i));
    Bs.push_back(randn(K * N, kCopies + i));
    Cs.emplace_back(static_cast<std::size_t>(M * N));
  }
  int i = 0;
  for (auto _ : state) {
    const int a = (cold == 0 || cold == 1) ? i : 0, b = (cold == 0 || cold == 2) ? i : 0;
    const int c = (cold == 0 || cold == 3) ? i : 0;
    cpu().gemm(ta, tb, M, N, K, 1.0f, As[a].data(), ta ? M : K, Bs[b].data(), tb ? K : N, 0.0f, Cs[c].data(), N,
               nullptr);
    benchmark::DoNotOptimize(Cs[c].data());
    i = (i + 1) % kCopies;
  }
  set_flops(state, 2.0 * M * N * K);
}
void gemm_cold_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ta", "tb", "M", "N", "K", "cold"});
  // The qkv forward (x W^T), the MLP projection's dx (g W), the qkv dW (g^T x) of the CPU recipe.
  for (auto [ta, tb, m, n, k] : std::vector<std::array<std::int64_t, 5>>{
           {0, 1, 768, 384, 128}, {0, 0, 768, 128, 384}, {1, 0, 384, 128, 768}})
    for (std::int64_t cold = 0; cold < 4; ++cold) b->Args({ta, tb, m, n, k, cold});
}
BENCHMARK(BM_gemm_cold)->Apply(gemm_cold_shapes);

// ---- LayerNorm over C channels of N rows ----
void BM_layernorm_forward(benchmark::State& state) {
  const std::int64_t N = state.range(0), C = state.range(1);
  auto x = randn(N * C), w = randn(C, 2), b = randn(C, 3);
  Buffer y(N * C), mean(N), rstd(N);
  for (auto _ : state) {
    cpu().layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, 2.0 * N * C * sizeof(float));
}
void BM_layernorm_backward(benchmark::State& state) {
  const std::int64_t N = state.range(0), C = state.range(1);
  auto x = randn(N * C), w = randn(C, 2), b = randn(C, 3), dy = randn(N * C, 4);
  Buffer y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  cpu().layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  for (auto _ : state) {
    cpu().layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                             N, C);
    benchmark::DoNotOptimize(dx.data());
  }
  set_bytes(state, 3.0 * N * C * sizeof(float));
}
BENCHMARK(BM_layernorm_forward)->ArgNames({"N", "C"})->Args({768, 128})->Args({2048, 384});
BENCHMARK(BM_layernorm_backward)->ArgNames({"N", "C"})->Args({768, 128})->Args({2048, 384});

// ---- GELU on the MLP's hidden activations [N, 4C] ----
void BM_gelu_forward(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto x = randn(n);
  Buffer y(n);
  for (auto _ : state) {
    cpu().gelu_forward(y.data(), x.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, 2.0 * n * sizeof(float));
}
void BM_gelu_backward(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto x = randn(n), dy = randn(n, 2);
  Buffer dx(n);
  for (auto _ : state) {
    cpu().gelu_backward(dx.data(), x.data(), dy.data(), n);
    benchmark::DoNotOptimize(dx.data());
  }
  set_bytes(state, 3.0 * n * sizeof(float));
}
BENCHMARK(BM_gelu_forward)->ArgName("n")->Arg(1 << 16)->Arg(768 * 512)->Arg(2048 * 1536);
BENCHMARK(BM_gelu_backward)->ArgName("n")->Arg(1 << 16)->Arg(768 * 512)->Arg(2048 * 1536);

// ---- fused causal attention: qkv[B,T,3C] -> out[B,T,C] ----
// Args: B, T, C, H.
double attention_flops(std::int64_t B, std::int64_t T, std::int64_t C) { return 2.0 * 2.0 * B * T * T * C; }
void BM_attention_forward(benchmark::State& state) {
  const std::int64_t B = state.range(0), T = state.range(1), C = state.range(2), H = state.range(3);
  auto qkv = randn(B * T * 3 * C);
  Buffer out(B * T * C), att(B * H * T * T);
  for (auto _ : state) {
    cpu().attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
    benchmark::DoNotOptimize(out.data());
  }
  set_flops(state, attention_flops(B, T, C));
}
void BM_attention_backward(benchmark::State& state) {
  const std::int64_t B = state.range(0), T = state.range(1), C = state.range(2), H = state.range(3);
  auto qkv = randn(B * T * 3 * C), dout = randn(B * T * C, 2);
  Buffer out(B * T * C), att(B * H * T * T), dqkv(B * T * 3 * C);
  cpu().attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  for (auto _ : state) {
    cpu().attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, H);
    benchmark::DoNotOptimize(dqkv.data());
  }
  set_flops(state, 2.0 * attention_flops(B, T, C));
}
BENCHMARK(BM_attention_forward)->ArgNames({"B", "T", "C", "H"})->Args({12, 64, 128, 4})->Args({8, 256, 384, 6});
BENCHMARK(BM_attention_backward)->ArgNames({"B", "T", "C", "H"})->Args({12, 64, 128, 4})->Args({8, 256, 384, 6});

// ---- softmax + cross-entropy over the vocabulary: logits[N, V] ----
void BM_cross_entropy(benchmark::State& state) {
  const std::int64_t N = state.range(0), V = state.range(1);
  auto logits = randn(N * V);
  std::vector<std::int64_t> targets(N);
  for (std::int64_t i = 0; i < N; ++i) targets[i] = (i * 7) % V;
  Buffer probs(N * V), dlogits(N * V);
  float loss = 0.0f;
  const float dloss = 1.0f;
  for (auto _ : state) {
    cpu().cross_entropy_forward(&loss, probs.data(), logits.data(), targets.data(), N, V);
    benchmark::DoNotOptimize(loss);
    cpu().cross_entropy_backward(dlogits.data(), probs.data(), targets.data(), &dloss, N, V);
    benchmark::DoNotOptimize(dlogits.data());
  }
  set_bytes(state, 4.0 * N * V * sizeof(float));
}
BENCHMARK(BM_cross_entropy)->ArgNames({"N", "V"})->Args({768, 65})->Args({2048, 65});

// ---- AdamW over all parameters (optim/adamw.h; the ZeRO optimizer calls it on its partition) ----
void BM_adamw(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto p = randn(n), g = randn(n, 2);
  Buffer m(n, 0.0f), v(n, 0.0f);
  const optim::AdamWHyper h{1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f};
  std::int64_t step = 0;
  for (auto _ : state) {
    optim::adamw_update(Device::cpu, p.data(), g.data(), DType::f32, 1.0f, m.data(), v.data(), nullptr, DType::f32, n,
                        h, ++step);
    benchmark::DoNotOptimize(p.data());
  }
  set_bytes(state, 7.0 * n * sizeof(float));  // read p, g, m, v; write p, m, v
}
BENCHMARK(BM_adamw)->ArgName("params")->Arg(809856)->Arg(10745088);

// AdamW as a 16-bit model runs it: a 16-bit gradient in, the new master rounded into the 16-bit
// model. Arg: the dtype (1 f16, 2 bf16); 0.81 M parameters.
void BM_adamw_16bit(benchmark::State& state) {
  const DType dt = state.range(0) == 1 ? DType::f16 : DType::bf16;
  const std::int64_t n = 809856;
  auto p = randn(n), g32 = randn(n, 2);
  std::vector<std::uint16_t> g(n), model(n);
  for (std::int64_t i = 0; i < n; ++i) store_from_float(g.data(), i, dt, g32[i]);
  Buffer m(n, 0.0f), v(n, 0.0f);
  const optim::AdamWHyper h{1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f};
  std::int64_t step = 0;
  for (auto _ : state) {
    optim::adamw_update(Device::cpu, p.data(), g.data(), dt, 1.0f, m.data(), v.data(), model.data(), dt, n, h, ++step);
    benchmark::DoNotOptimize(model.data());
  }
  set_bytes(state, (5.0 * sizeof(float) + 2.0 * sizeof(std::uint16_t)) * n);  // p, m, v read and written; g, model
}
BENCHMARK(BM_adamw_16bit)->ArgName("dtype")->Arg(1)->Arg(2);

// ---- a Linear layer through autograd (forward + backward): the op overhead around the GEMMs ----
// Args: N, in, out.
void BM_linear_op(benchmark::State& state) {
  const std::int64_t N = state.range(0), in = state.range(1), out = state.range(2);
  Generator gen(5);
  Tensor x = Tensor::randn({N, in}, gen).set_requires_grad(true);
  Tensor w = Tensor::randn({out, in}, gen, 0.0f, 0.02f).set_requires_grad(true);
  Tensor b = Tensor::zeros({out}).set_requires_grad(true);
  Tensor g = Tensor::randn({N, out}, gen);
  for (auto _ : state) {
    Tensor y = linear(x, w, b);
    autograd::backward(y, g);
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    b.set_grad(Tensor());
  }
  set_flops(state, 6.0 * N * in * out);
}
BENCHMARK(BM_linear_op)->ArgNames({"N", "in", "out"})->Args({768, 128, 512})->Args({768, 512, 128});

}  // namespace

int main(int argc, char** argv) {
  // Our one flag, removed before Google Benchmark parses the rest.
  int threads = 1;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      threads = std::atoi(argv[i] + 10);
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  zero::cpu::set_num_threads(threads < 1 ? 1 : threads);
  benchmark::AddCustomContext("kernel_threads", std::to_string(zero::cpu::num_threads()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
