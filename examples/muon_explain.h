// zero_explain's Muon section: which rank owns each Muon matrix whole, and each rank's share of the
// Newton–Schulz work and of the parameters (Note [Whole-matrix partitions] in distributed/zero/flat_layout.cpp).
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "distributed/zero/zero_plan.h"
#include "optim/muon.h"

namespace zero::examples {

/// Per rank: the Newton–Schulz FLOPs of the Muon matrices it steps (optim::newton_schulz_flops) and the
/// real (non-padding) parameter elements it steps: its partition's at stages 1-3; at stage 0 every rank
/// steps every matrix whole and every element (Ψ).
struct MuonShare {
  std::vector<double> flops;
  std::vector<double> elements;
  /// max / mean of `v` (1 = balanced; 0 for an all-zero v).
  static double imbalance(const std::vector<double>& v) {
    double sum = 0, top = 0;
    for (double x : v) sum += x, top = std::max(top, x);
    return sum > 0 ? top * static_cast<double>(v.size()) / sum : 0.0;
  }
};

/// Elements per partition for a message: "P" when the partitions are equal, else "smallest to largest"
/// (Muon's layouts move the boundaries to the edges of its matrices; Note [Whole-matrix partitions]).
inline std::string partition_sizes(const dist::FlatLayout& L) {
  std::int64_t smallest = L.largest_partition_size();
  for (int r = 0; r < L.world_size(); ++r) smallest = std::min(smallest, L.partition_size(r));
  return smallest == L.largest_partition_size() ? fmt::format("{}", smallest)
                                                : fmt::format("{} to {}", smallest, L.largest_partition_size());
}

/// Long lists in the text output (ranks, buckets) show their first and last 4 items beyond 16: whether
/// item k of n is left out. At the first one left out it prints "... ranks 4 to 59: 56 more partitions
/// (--format json lists every one)", with `label` ("ranks") and `items` ("partitions").
inline bool elided(std::size_t k, std::size_t n, const char* label, const char* items) {
  const std::size_t head = n > 16 ? 4 : n;
  if (k < head || k >= n - head) return false;
  if (k == head)
    fmt::print("... {} {} to {}: {} more {} (--format json lists every one)\n", label, head, n - head - 1, n - 2 * head,
               items);
  return true;
}

/// The owner (rank) of each Muon matrix of `plan`, in layout order; -1 for one with no elements.
inline std::vector<int> muon_owners(const dist::ZeroPlan& plan) {
  std::vector<int> owners;
  for (const dist::ParamRange& p : plan.layout.params())
    if (optim::is_muon_matrix(p.name, p.shape)) owners.push_back(p.slices.empty() ? -1 : p.slices.front().rank);
  return owners;
}

inline MuonShare muon_share(const dist::ZeroPlan& plan) {
  const dist::FlatLayout& L = plan.layout;
  const int n = L.world_size();
  MuonShare s{std::vector<double>(static_cast<std::size_t>(n), 0.0), std::vector<double>(static_cast<std::size_t>(n), 0.0)};
  for (const dist::ParamRange& p : L.params()) {
    if (!optim::is_muon_matrix(p.name, p.shape) || p.slices.empty()) continue;
    const double f = optim::newton_schulz_flops(p.shape[0], p.shape[1], plan.options.muon_ns_steps);
    for (int r = 0; r < n; ++r)
      if (plan.options.stage == 0 || p.slices.front().rank == r) s.flops[static_cast<std::size_t>(r)] += f;
  }
  for (int r = 0; r < n; ++r)
    s.elements[static_cast<std::size_t>(r)] =
        static_cast<double>(plan.options.stage == 0 ? L.numel() : L.partition_real_numel(r));
  return s;
}

/// The text section; nothing unless the plan runs Muon.
inline void print_muon(const dist::ZeroPlan& plan) {
  if (!plan.options.muon) return;
  const dist::FlatLayout& L = plan.layout;
  fmt::print("\n== Muon{} ({} Newton–Schulz steps) ==\n",
             plan.options.stage == 0 ? " at stage 0: every matrix stepped whole by every rank"
                                     : ": each matrix stepped whole by one rank",
             plan.options.muon_ns_steps);
  const std::vector<int> owners = muon_owners(plan);
  std::size_t k = 0;
  for (const dist::ParamRange& p : L.params()) {
    if (!optim::is_muon_matrix(p.name, p.shape)) continue;
    const int owner = owners[k++];
    fmt::print("  {:<26} {:<11} {}  {:.1f} MFLOP\n", p.name, shape_str(p.shape),
               plan.options.stage == 0 ? std::string("every rank") : fmt::format("rank {}", owner),
               optim::newton_schulz_flops(p.shape[0], p.shape[1], plan.options.muon_ns_steps) / 1e6);
  }
  const MuonShare s = muon_share(plan);
  const int N = L.world_size();
  for (int r = 0; r < N; ++r) {
    if (elided(static_cast<std::size_t>(r), static_cast<std::size_t>(N), "ranks", "ranks")) continue;
    fmt::print("rank {}: Newton–Schulz {:.1f} MFLOP/step, {} real parameter elements\n", r,
               s.flops[static_cast<std::size_t>(r)] / 1e6, static_cast<std::int64_t>(s.elements[static_cast<std::size_t>(r)]));
  }
  fmt::print("imbalance (max / mean): Newton–Schulz {:.3f}, parameter elements {:.3f}; gaps starting matrices "
             "on even positions: {} elements ({:.2f}% of the flat buffer)\n",
             MuonShare::imbalance(s.flops), MuonShare::imbalance(s.elements), L.interior_padding(),
             100.0 * static_cast<double>(L.interior_padding()) / static_cast<double>(std::max<std::int64_t>(1, L.padded_numel())));
}

/// The JSON section ("muon"), null unless the plan runs Muon.
inline nlohmann::json json_muon(const dist::ZeroPlan& plan) {
  if (!plan.options.muon) return nullptr;
  nlohmann::json matrices = nlohmann::json::array();
  const std::vector<int> owners = muon_owners(plan);
  std::size_t k = 0;
  for (const dist::ParamRange& p : plan.layout.params())
    if (optim::is_muon_matrix(p.name, p.shape))
      matrices.push_back({{"param", p.name},
                          {"owner", plan.options.stage == 0 ? nlohmann::json("all") : nlohmann::json(owners[k++])},
                          {"newton_schulz_flops", optim::newton_schulz_flops(p.shape[0], p.shape[1],
                                                                             plan.options.muon_ns_steps)}});
  const MuonShare s = muon_share(plan);
  return {{"matrices", matrices},
          {"newton_schulz_flops_per_rank", s.flops},
          {"real_elements_per_rank", s.elements},
          {"flops_imbalance", MuonShare::imbalance(s.flops)},
          {"elements_imbalance", MuonShare::imbalance(s.elements)},
          {"interior_padding", plan.layout.interior_padding()}};
}

}  // namespace zero::examples
