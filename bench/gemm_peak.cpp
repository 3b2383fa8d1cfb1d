// The machine's fp32 GEMM peak, measured on a large square product C = A B (n×n, default 1024) by
// three implementations: Eigen 3.4's GEMM, zero.cpp's own (the CPU backend's gemm, what train_gpt runs),
// and the system BLAS's cblas_sgemm, loaded at run time (libopenblas.so.0, else libblas.so.3) so the
// build needs no BLAS. bench/compare_torch.sh divides train_gpt's achieved FLOP rate by the largest.
//
//   build/bin/gemm_peak [--n 1024] [--threads 1] [--seconds 1.0] [--reps 5] [--copy-mib 0]
//
// Prints one line per backend, `backend=<name> threads=<t> n=<n> gflops=<best rate>`, then
// `peak_gflops=<max>`. --backends picks a subset (comma-separated: eigen, zero, blas; none for only
// the bandwidth). With --copy-mib M > 0 it first prints the memory bandwidth of memcpy on a buffer of
// M MiB split over the threads, `memcpy threads=<t> mib=<M> gbytes_per_s=<best rate>`, counting the
// bytes read plus the bytes written (bench/step_roofline.py's bandwidth peak). Each rate is the best
// of --reps timed rounds (wall clock, each about --seconds / reps long): on a shared machine the best
// round is the closest to what the cores can do.
// The system BLAS reads its own settings from the environment (OPENBLAS_NUM_THREADS is overridden by
// --threads; OPENBLAS_CORETYPE picks the kernel when OpenBLAS does not recognise the CPU).
#include <CLI/CLI.hpp>
#include <dlfcn.h>
#include <fmt/format.h>

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/kernels.h"
#include "core/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best GFLOP/s of `reps` rounds of `fn` (one n×n×n product per call).
double best_gflops(const std::function<void()>& fn, std::int64_t n, double seconds, int reps) {
  const double flops = 2.0 * n * n * n;
  fn();  // warm up: page in the buffers, start the threads
  const auto t0 = Clock::now();
  fn();
  const double one = std::max(1e-6, std::chrono::duration<double>(Clock::now() - t0).count());
  const int calls = std::max(1, static_cast<int>(seconds / reps / one));
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    const auto s = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    const double dt = std::chrono::duration<double>(Clock::now() - s).count();
    best = std::max(best, flops * calls / dt * 1e-9);
  }
  return best;
}

// The subset of CBLAS (and OpenBLAS's extensions) this program calls, resolved with dlsym.
enum CblasOrder { kRowMajor = 101 };
enum CblasTranspose { kNoTrans = 111 };
using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                         int);
struct SystemBlas {
  void* handle = nullptr;
  SgemmFn sgemm = nullptr;
  std::string name;
};

SystemBlas load_system_blas(int threads) {
  SystemBlas b;
  for (const char* lib : {"libopenblas.so.0", "libblas.so.3"}) {
    b.handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (b.handle == nullptr) continue;
    b.sgemm = reinterpret_cast<SgemmFn>(dlsym(b.handle, "cblas_sgemm"));
    if (b.sgemm == nullptr) continue;
    b.name = lib;
    break;
  }
  if (b.sgemm == nullptr) return b;
  if (auto set = reinterpret_cast<void (*)(int)>(dlsym(b.handle, "openblas_set_num_threads"))) set(threads);
  if (auto core = reinterpret_cast<char* (*)()>(dlsym(b.handle, "openblas_get_corename")))
    b.name = fmt::format("openblas-{}", core());
  return b;
}

// Best bytes/s (read + written) of memcpy over `bytes`, split into one contiguous slice per thread;
// each thread copies its slice `calls` times, and a round is timed from the first start to the last end.
double best_copy_bandwidth(std::size_t bytes, int threads, double seconds, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const auto round = [&](int calls) {
    std::vector<std::thread> team;
    const auto s = Clock::now();
    for (int t = 0; t < threads; ++t)
      team.emplace_back([&, t] {
        const std::size_t b = bytes * t / threads, e = bytes * (t + 1) / threads;
        for (int i = 0; i < calls; ++i) std::memcpy(dst.data() + b, src.data() + b, e - b);
      });
    for (auto& th : team) th.join();
    return std::chrono::duration<double>(Clock::now() - s).count();
  };
  round(2);  // warm up: page in both buffers
  const int calls = std::max(1, static_cast<int>(seconds / reps / std::max(1e-6, round(1))));
  double best = 0.0;
  for (int r = 0; r < reps; ++r) best = std::max(best, 2.0 * bytes * calls / round(calls));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t n = 1024;
  int threads = 1, reps = 5;
  double seconds = 1.0;
  std::string backends = "eigen,zero,blas";
  CLI::App app{"fp32 GEMM peak of this machine: Eigen (as zero.cpp calls it) and the system BLAS"};
  app.add_option("--n", n, "matrix size")->capture_default_str()->check(CLI::Range(16, 8192));
  app.add_option("--threads", threads, "threads for both backends")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--seconds", seconds, "time per backend")->capture_default_str()->check(CLI::Range(0.05, 60.0));
  app.add_option("--reps", reps, "timed rounds per backend (best counts)")->capture_default_str()->check(
      CLI::Range(1, 100));
  app.add_option("--backends", backends, "which to measure: eigen, zero, blas (comma-separated)")->capture_default_str();
  double copy_mib = 0.0;
  app.add_option("--copy-mib", copy_mib, "also measure memcpy bandwidth on a buffer of this many MiB (0: no)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 65536.0));
  CLI11_PARSE(app, argc, argv);
  if (copy_mib > 0.0) {
    const auto bytes = static_cast<std::size_t>(copy_mib * 1024 * 1024) / 64 * 64;
    fmt::print("memcpy threads={} mib={} gbytes_per_s={:.1f}\n", threads, copy_mib,
               best_copy_bandwidth(bytes, threads, seconds, reps) * 1e-9);
  }

  zero::Generator gen(7);
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (auto& x : a) x = gen.normal(0.0f, 1.0f);
  for (auto& x : b) x = gen.normal(0.0f, 1.0f);

  zero::cpu::set_num_threads(threads);
  const auto wanted = [&](const char* name) { return backends.find(name) != std::string::npos; };
  double peak = 0.0;
  if (wanted("eigen")) {
    using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const Matrix> ma(a.data(), n, n), mb(b.data(), n, n);
    Eigen::Map<Matrix> mc(c.data(), n, n);
    Eigen::setNbThreads(threads);
    const double g = best_gflops([&] { mc.noalias() = ma * mb; }, n, seconds, reps);
    fmt::print("backend=eigen threads={} n={} gflops={:.1f}\n", threads, n, g);
    peak = std::max(peak, g);
  }
  if (wanted("zero")) {
    zero::Kernels& cpu = zero::kernels(zero::Device::cpu);
    const double g = best_gflops(
        [&] { cpu.gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n, nullptr); }, n,
        seconds, reps);
    fmt::print("backend=zero threads={} n={} gflops={:.1f}\n", threads, n, g);
    peak = std::max(peak, g);
  }
  if (!wanted("blas")) {
    fmt::print("peak_gflops={:.1f}\n", peak);
    return 0;
  }

  const SystemBlas blas = load_system_blas(threads);
  if (blas.sgemm != nullptr) {
    const int ni = static_cast<int>(n);
    const double sys = best_gflops(
        [&] {
          blas.sgemm(kRowMajor, kNoTrans, kNoTrans, ni, ni, ni, 1.0f, a.data(), ni, b.data(), ni, 0.0f, c.data(), ni);
        },
        n, seconds, reps);
    fmt::print("backend={} threads={} n={} gflops={:.1f}\n", blas.name, threads, n, sys);
    peak = std::max(peak, sys);
  } else {
    fmt::print("backend=system-blas threads={} n={} gflops=n/a (no libopenblas.so.0 or libblas.so.3 with cblas)\n",
               threads, n);
  }
  fmt::print("peak_gflops={:.1f}\n", peak);
  return 0;
}
