// ZeroPlan: what a ZeroOptimizer configuration allocates and sends, worked out from the flat layout
// alone: no tensors, no ranks talking, no training. zero_explain prints it; tests hold it against what
// a real ZeroOptimizer measures (its memory() and its communicator's ledger) for the same parameters.
//
// Everything here is range arithmetic over FlatLayout (distributed/flat_layout.h) and mirrors the
// rules of distributed/zero_optimizer.cpp:
//   - memory per rank: the flat parameter buffer (padded elements × b bytes), the gradient storage
//     (the whole flat gradient for stages 0/1, the partition for stage 2), fp32 master (16-bit
//     models only) + Adam m + v for the region the rank steps (everything at stage 0, its partition
//     at stages 1/2), and the stage-2 bucket pool (Note [ZeRO-2 gradient ownership]);
//   - traffic per optimizer step: the collectives of Note [Bucket order] (one per bucket per
//     reduction; stage 2 reduces every micro-step, stages 0/1 at the accumulation boundary) and the
//     all-gather chunks after the step, counted the ledger's way (nccl-tests bus bytes:
//     all_reduce 2(n-1)/n·S, reduce_scatter and all_gather (n-1)/n·S).
// Equal partitions make memory the same on every rank; padding only changes how much of a partition
// is real.
#pragma once

#include <cstdint>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/flat_layout.h"
#include "distributed/zero_optimizer.h"

namespace zero::dist {

/// Bytes one rank sends per optimizer step, per collective, and the number of calls behind them.
struct StepTraffic {
  double bytes[kNumCollectives] = {};
  std::int64_t calls[kNumCollectives] = {};
  double operator[](Collective c) const { return bytes[static_cast<int>(c)]; }
  /// Sum over the collectives (bytes).
  double total() const;
};

struct ZeroPlan {
  FlatLayout layout;
  ZeroOptions options;
  std::vector<Bucket> buckets;  // in issue order (bucket 0 holds the end of the flat buffer)
  /// Stage 2: buffers the bucket pool grows to. A bucket holds one from its issue until its collective
  /// finishes (Note [ZeRO-2 gradient ownership]), so with blocking collectives (overlap_comm off) the
  /// pool is one buffer. With overlap_comm on it holds one per bucket in flight, which depends on
  /// timing: pool_buffers is then the blocking count, a lower bound, and max_pool_buffers (every
  /// bucket in flight at once) the upper one. 0 for stages 0/1.
  int pool_buffers = 0;
  int max_pool_buffers = 0;
  /// Elements of one pool buffer: min(reduce_bucket_size, padded_numel).
  std::int64_t pool_buffer_numel = 0;

  /// Persistent bytes of one rank (the same on every rank), as ZeroOptimizer::memory() reports them
  /// after the first backward.
  MemoryBreakdown memory() const;
  /// Bytes per optimizer step of one rank, as its communicator's ledger counts them (control
  /// scalars excluded), for a step that is not skipped (an fp16 overflow skips the all-gather).
  StepTraffic traffic() const;
};

/// Plans `options` for parameters `entries` (named_parameters() order) on `world_size` ranks. Bucket
/// sizes left at kAutoBucketSize resolve to default_bucket_size(Ψ), as in the optimizer; `options` in
/// the result holds the resolved sizes. Throws zero::Error for invalid options (the constructor's
/// checks that concern the plan: stage, dtype, bucket sizes, GAS >= 1) or world_size < 1.
ZeroPlan plan_zero(const std::vector<FlatLayout::Entry>& entries, int world_size, const ZeroOptions& options);

/// α-β ring model of one collective's time (Hockney's model, as in Thakur, Rabenseifner & Gropp,
/// "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005): a ring
/// reduce-scatter or all-gather takes n-1 steps, each paying the latency α once, and moves its bus
/// bytes through each rank's link at β = 1/bandwidth; an all-reduce is the two in a row.
///   t = steps·α + bus_bytes / bandwidth,  steps = n-1 (reduce_scatter, all_gather), 2(n-1) (all_reduce).
/// bus_bytes as in Ledger::bus_bytes; bandwidth in bytes/s (> 0), latency in seconds (>= 0). 0 for
/// n = 1. Throws zero::Error for a non-positive bandwidth or negative latency.
double ring_time_s(Collective c, double bus_bytes, int world_size, double bandwidth, double latency);

/// Modelled communication seconds per optimizer step of `plan` (every call of traffic() through
/// ring_time_s).
double step_comm_time_s(const ZeroPlan& plan, double bandwidth, double latency);

}  // namespace zero::dist
