// Error of a gradient reduce-scatter against an fp64 reference of the same gradients, per world size.
//
//   build/bin/bench_reduction_error [--ranks 2,4,8,16] [--elements 1048576] [--seed 1] [--block 256]
//
// Every rank of an in-process world (distributed/comm/inprocess_communicator.h: N threads, the MPI backend's
// arithmetic bit for bit) holds a synthetic gradient and contributes it pre-divided by N and rounded to
// the model dtype, as the gradient reducer does. The reference is the sum of those same contributions in
// fp64, so what is measured is the reduction's error alone, not the rounding of the inputs. Rows:
//   bf16 ring                  the default 16-bit wire: each hop adds in fp32 and rounds to bf16
//   bf16 all-to-all, fp32 acc  --reduce-scatter-with-fp32-accumulation: summed in fp32 at the owner,
//                              rounded once (Note [fp32-accumulating reduce-scatter])
//   bf16, fp32 wire            communication_data_type "fp32": widened, fp32 ring, rounded once (2x bytes)
//   fp32 ring                  an fp32 model's reduction of the same values
//   int8 bf16 / int8 fp32      --zero-quantized-gradients: int8 blocks of --block elements, one fp32 scale
//                              each, summed in fp32 at the owner (Note [int8 quantized reduce-scatter]);
//                              the reference is the fp64 sum of the unquantized contributions, so the
//                              quantization error is what is measured
// Columns per N: max and RMS of the elementwise relative error |got - ref| / |ref| (elements whose
// reference is exactly 0 left out), and the normwise error ||got - ref||_2 / ||ref||_2 (what an update
// direction sees: int8 loses small elements of a block with a large one entirely, relative error 1). The gradients: a signal shared by the ranks plus per-rank noise of
// the same size, magnitudes spread log-uniformly over 2^-24 .. 2^-4, so sums both add up and cancel.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "distributed/comm/inprocess_communicator.h"

using namespace zero;
using namespace zero::dist;

namespace {

// A uniform double in [0, 1) from (seed, a, b): splitmix64, so every thread computes the same value.
double uniform(std::uint64_t seed, std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + a * 0xBF58476D1CE4E5B9ull + b * 0x94D049BB133111EBull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

// Rank r's gradient element i, before the 1/N pre-division: signal + noise of the same magnitude.
double gradient(std::uint64_t seed, int rank, std::size_t i) {
  const double magnitude = std::exp2(-24.0 + 20.0 * uniform(seed, i, 0));
  const double signal = (uniform(seed, i, 1) - 0.5) * 2.0;
  const double noise = (uniform(seed, i, 2 + std::uint64_t(rank)) - 0.5) * 2.0;
  return magnitude * (signal + noise);
}

enum class Variant { bf16_ring, bf16_alltoall, bf16_fp32_wire, fp32_ring, int8_bf16, int8_fp32 };
const char* variant_name(Variant v) {
  switch (v) {
    case Variant::bf16_ring: return "bf16 ring (per-hop rounding)";
    case Variant::bf16_alltoall: return "bf16 all-to-all, fp32 accumulation";
    case Variant::bf16_fp32_wire: return "bf16, fp32 wire (2x bytes)";
    case Variant::fp32_ring: return "fp32 ring";
    case Variant::int8_bf16: return "int8 blocks, bf16 gradients";
    case Variant::int8_fp32: return "int8 blocks, fp32 gradients";
  }
  return "?";
}

struct RelError {
  double max = 0, rms = 0, norm = 0;
};

// Reduce-scatters every rank's contributions over `n` in-process ranks (equal slices) and compares the
// gathered result with the fp64 sum of the same contributions.
RelError measure(Variant v, int n, std::size_t elements, std::uint64_t seed, std::size_t block) {
  const std::size_t slice = elements / std::size_t(n), total = slice * std::size_t(n);
  std::vector<double> got(total), ref(total, 0.0);
  const bool wide = v == Variant::fp32_ring || v == Variant::int8_fp32;
  // The contributions as sent: g / N rounded to the dtype. Their fp64 sum is exact up to fp64's own
  // rounding (2^-53 of the largest term), far below every error measured here.
  auto contribution = [&](int rank, std::size_t i) {
    const float x = float(gradient(seed, rank, i) / n);
    return wide ? double(x) : double(float(bfloat16(x)));
  };
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < total; ++i) ref[i] += contribution(r, i);
  run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
    const int rank = comm->rank();
    comm->set_reduce_in_fp32(v == Variant::bf16_fp32_wire);
    comm->set_fp32_accumulation(v == Variant::bf16_alltoall);
    comm->set_quantized_gradients(v == Variant::int8_bf16 || v == Variant::int8_fp32 ? block : 0);
    const std::vector<std::size_t> counts(std::size_t(n), slice);
    if (wide) {
      std::vector<float> send(total), recv(slice);
      for (std::size_t i = 0; i < total; ++i) send[i] = float(contribution(rank, i));
      comm->reduce_scatter(send.data(), recv.data(), counts, DType::f32);
      for (std::size_t j = 0; j < slice; ++j) got[rank * slice + j] = recv[j];
    } else {
      std::vector<bfloat16> send(total), recv(slice);
      for (std::size_t i = 0; i < total; ++i) send[i] = bfloat16(float(contribution(rank, i)));
      comm->reduce_scatter(send.data(), recv.data(), counts, DType::bf16);
      for (std::size_t j = 0; j < slice; ++j) got[rank * slice + j] = float(recv[j]);
    }
  });
  RelError e;
  std::size_t counted = 0;
  double diff_sq = 0, ref_sq = 0;
  for (std::size_t i = 0; i < total; ++i) {
    diff_sq += (got[i] - ref[i]) * (got[i] - ref[i]);
    ref_sq += ref[i] * ref[i];
    if (ref[i] == 0.0) continue;
    const double rel = std::abs(got[i] - ref[i]) / std::abs(ref[i]);
    e.max = std::max(e.max, rel);
    e.rms += rel * rel;
    ++counted;
  }
  e.rms = counted ? std::sqrt(e.rms / double(counted)) : 0.0;
  e.norm = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : 0.0;
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {2, 4, 8, 16};
  std::size_t elements = std::size_t{1} << 20;
  std::uint64_t seed = 1;
  CLI::App app{"Relative error of gradient reduce-scatters against an fp64 reference, per world size"};
  app.add_option("--ranks", ranks, "world sizes (in-process ranks)")->delimiter(',')->capture_default_str();
  app.add_option("--elements", elements, "gradient elements (split evenly over the ranks)")->capture_default_str();
  app.add_option("--seed", seed, "seed of the synthetic gradients")->capture_default_str();
  std::size_t block = 256;
  app.add_option("--block", block, "elements per int8 block (the int8 rows)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  for (int n : ranks)
    if (n < 1 || std::size_t(n) > elements) {
      fmt::print(stderr, "error: --ranks: each world size must be in [1, --elements], got {}\n", n);
      return 1;
    }
  if (block < 1) {
    fmt::print(stderr, "error: --block must be >= 1, got {}\n", block);
    return 1;
  }

  fmt::print("relative error |got - ref| / |ref| (max, RMS) and ||got - ref|| / ||ref|| (norm) against the fp64 sum of "
             "the same contributions, {} elements, int8 blocks of {}\n\n",
             elements, block);
  std::string header = fmt::format("| {:<36} |", "reduction");
  std::string rule = "| --- |";
  for (int n : ranks) {
    header += fmt::format(" N={} max | N={} RMS | N={} norm |", n, n, n);
    rule += " --- | --- | --- |";
  }
  fmt::print("{}\n{}\n", header, rule);
  for (Variant v : {Variant::bf16_ring, Variant::bf16_alltoall, Variant::bf16_fp32_wire, Variant::fp32_ring,
                    Variant::int8_bf16, Variant::int8_fp32}) {
    std::string row = fmt::format("| {:<36} |", variant_name(v));
    for (int n : ranks) {
      const RelError e = measure(v, n, elements, seed, block);
      row += fmt::format(" {:.2e} | {:.2e} | {:.2e} |", e.max, e.rms, e.norm);
    }
    fmt::print("{}\n", row);
  }
  return 0;
}
