// ShardedOptimizer: AdamW (and, with Muon, optim::muon_update for the hidden matrices whole) with fp32
// master weights over one contiguous range of the flat parameter
// buffer: the whole buffer at stage 0, this rank's partition (FlatLayout::partition_begin/end) at stages 1-3 (the ZeRO
// paper's P_os: each rank keeps optimizer state for 1/N of the parameters). It knows nothing of ranks
// or communication: it is handed this rank's averaged gradient of the range and updates the range.
//
//   master      fp32 [region_size]: the range of the flat buffer itself for an f32 model (AdamW updates
//               the model in place), a separate fp32 copy for f16/bf16 (mixed precision);
//   exp_avg     fp32 [region_size]  (Adam's m)
//   exp_avg_sq  fp32 [region_size]  (Adam's v)
//
// The update is optim::adamw_update (the one AdamW of optim/, on the buffers' device) per
// parameter slice of the range, with that parameter's weight-decay flag and its own step count
// (Note [Unused parameters] in zero_optimizer.cpp); for a 16-bit model it also rounds the updated
// master back into the model-dtype parameters of the range (a range of the flat buffer at stages 0-2,
// the rank's parameter shard at stage 3), so after step() this rank's range of the model is current
// and the other ranks' ranges wait for the all-gather (distributed/zero/parameter_gather.h) or, at stage 3,
// for the next gather of each unit (distributed/zero/partitioned_parameters.h).
#pragma once

#include <cstdint>
#include <vector>

#include "distributed/zero/zero_plan.h"

namespace zero::dist {

class ShardedOptimizer {
 public:
  /// The state for what rank `rank` steps under `plan`: master initialised from `region_params`
  /// ([region_size] model dtype, contiguous, on the device every buffer is allocated on: the model's
  /// values of the range, which step() updates), m and v zero.
  /// With options.muon, the hidden matrices (optim::is_muon_matrix) are stepped by optim::muon_update,
  /// whole by the rank whose range holds them (at stages 1-3 the plan keeps each inside one partition),
  /// their momentum buffer held in exp_avg (exp_avg_sq unused there). Throws zero::Error for Muon on a
  /// device other than the CPU or a Muon matrix the layout cut.
  ShardedOptimizer(const ZeroPlan& plan, int rank, Tensor region_params);

  /// One optimizer step of the range (AdamW; Muon for its matrices). grad: [region_size] model dtype, this rank's averaged gradient, still
  /// multiplied by the loss scale; grad_factor: what to multiply it by first (1/loss scale times the clip
  /// coefficient); stepped[i]: whether layout parameter i is updated at all (parameters no rank produced
  /// a gradient for are not: no decay, no moment decay, no step count). lr: this step's learning rate.
  void step(const Tensor& grad, float grad_factor, const std::vector<char>& stepped, float lr);
  /// Rounds the master into the range's model-dtype parameters (f16/bf16; for f32 they are the same
  /// memory), as step() does: after a checkpoint load wrote the master.
  void write_master_to_params();

  std::int64_t region_begin() const { return region_begin_; }
  std::int64_t region_size() const { return region_size_; }
  const Tensor& master() const { return master_; }
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  /// Bytes of master (none for f32: the model's parameters are the master) + m + v, over the whole range:
  /// with Muon, v is allocated for its matrices too, where it stays zero (4 bytes an element).
  double bytes() const;

  /// Per layout parameter: the AdamW steps that updated it (its bias-correction count).
  const std::vector<std::int64_t>& param_steps() const { return param_steps_; }
  /// Sets every count to `steps` (a checkpoint without per-parameter counts).
  void reset_param_steps(std::int64_t steps);
  /// Restores per-parameter counts. Throws zero::Error unless there is one per parameter, each in
  /// [0, max_steps].
  void set_param_steps(std::vector<std::int64_t> steps, std::int64_t max_steps);

 private:
  const ZeroPlan& plan_;
  Tensor region_params_;  // [region_size] model dtype: the model's values of the range
  std::int64_t region_begin_ = 0;
  std::int64_t region_size_ = 0;
  std::vector<ParamSlice> slices_;  // the parameter pieces inside the range, in flat order
  Tensor master_, exp_avg_, exp_avg_sq_;
  std::vector<std::int64_t> param_steps_;
  std::vector<char> muon_;  // per layout parameter: stepped by Muon (options.muon and a hidden matrix)
};

}  // namespace zero::dist
