// TrainingConfig: the DeepSpeed-style JSON file train_gpt reads with --config.
//
// Key names and defaults are DeepSpeed's (runtime/config.py, runtime/zero/config.py,
// runtime/precision_config.py), so a DeepSpeed config for a ZeRO-1/2
// run works here unchanged; docs/config.md lists every key. Where we differ it is said beside the field.
//
// Strict, as DeepSpeed's config models are (Note [Strict config keys] in config.cpp):
//   - an UNKNOWN key in a section we model, a key given twice, or a DeepSpeed key that would change the
//     training and is not implemented throws zero::Error naming the key and the file, with a "did you
//     mean" for a near miss:
//       unknown config key 'zero_optimization.stgae' in ds.json; did you mean 'zero_optimization.stage'?
//   - an INVALID value (wrong JSON type, out of range, stage 3, fp16 and bf16 both on, inconsistent
//     batch sizes, a missing or malformed file) throws zero::Error with one line naming the key (and
//     the file), before training starts:
//       invalid config key 'zero_optimization.stage' in ds.json: stage 4 is not supported (stages 0, 1, 2, 3)
//   - a DeepSpeed key that changes nothing here (logging, offloading, stage-3 tuning; the list is in
//     docs/config.md) adds one line to `warnings` for the caller to print (on rank 0 only).
//
// A JSON null counts as "not given" (the default applies; for the batch keys: derive it), as in
// DeepSpeed. Integer keys also accept whole JSON floats, so 5e8 is a valid bucket size.
//
// The merge rule (distributed/run/settings.h): defaults, then the file, then the flags, then validation
// of the result; a file is never judged alone before the flags are on it. In a training program:
//   auto cfg = TrainingConfig::parse_for_merge(read_config_file(path), path);  // types and keys only
//   for (auto& w : cfg.warnings) if (rank == 0) fmt::print(stderr, "{}\n", w);
//   cfg.apply_flag(*find_setting_by_flag("--zero-stage"), "2");  // each flag given, naming it in errors
//   cfg.resolve_batch(world_size);                    // derive the missing batch key, check the rule
//   cfg.validate();                                   // every rule, once, on the merged result
// from_file and from_json parse and validate in one go, for a config used as it is.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "distributed/run/settings.h"
#include "distributed/zero/zero_optimizer.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace zero::dist {

/// "fp16": mixed precision with f16 parameters and gradients and a loss scaler (optim/loss_scaler.h).
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;              // 0: dynamic loss scaling; > 0: this static scale
  int initial_scale_power = 16;         // dynamic: start at 2^initial_scale_power, in [0, 127]
  int loss_scale_window = 1000;         // clean steps between doublings, >= 1
  int hysteresis = 2;                   // overflows tolerated before the scale halves, >= 1
  bool consecutive_hysteresis = false;  // refill hysteresis on every clean step
  double min_loss_scale = 1.0;          // the scale never halves below this, > 0
  bool raise_error_at_min_scale = true;  // stop after min_scale_skip_limit overflows in a row at the minimum
  int min_scale_skip_limit = 1;          // (optim/loss_scaler.h), >= 1
};

/// "bf16" (old name "bfloat16", also accepted): bf16 parameters and gradients, no loss scaling.
struct Bf16Config {
  bool enabled = false;
};

/// "zero_optimization". Bucket sizes count elements, not bytes.
struct ZeroConfig {
  int stage = 0;                                     // 0 (plain data parallel), 1, 2 or 3
  // IPG bucket and all-gather chunk, elements. Unset (nullopt, or null in the file): the automatic size
  // default_bucket_size(Ψ) of distributed/zero/zero_plan.h, which keeps stage 2's gradient memory below
  // stage 1's; DeepSpeed's fixed default is 5e8 (docs/zero.md, "Bucket size"). A value given is used
  // as is: reduce_bucket_size > 0, allgather_bucket_size > 0 and even (DeepSpeed's rules).
  std::optional<std::int64_t> reduce_bucket_size;
  std::optional<std::int64_t> allgather_bucket_size;
  bool reduce_scatter = true;                        // false: all-reduce the bucket, keep your slice (1.5x traffic)
  bool contiguous_gradients = true;                  // accepted and ignored: always on (docs/zero.md)
  // DeepSpeed's default is None, which it resolves to true only for stage 3 (config.py,
  // overlap_comm_valid); stages 0-2 therefore default to false there too.
  bool overlap_comm = false;
  // Not a DeepSpeed key (Megatron-LM's --overlap-param-gather): issue the parameter all-gathers after
  // the step asynchronously and let the next forward wait per parameter (docs/zero.md).
  bool overlap_param_gather = false;
  // Megatron-LM's reduce_scatter_with_fp32_accumulation (not a DeepSpeed key): with 16-bit gradient
  // reductions, an all-to-all whose receiver adds the n contributions in fp32 and rounds once, instead
  // of the ring's rounding at every hop; the same bytes on the wire (Note [fp32-accumulating
  // reduce-scatter] in distributed/comm/communicator.cpp). Unset: off. true needs a 16-bit wire (a 16-bit
  // model without communication_data_type "fp32").
  std::optional<bool> reduce_scatter_with_fp32_accumulation;
  // Stage 3, DeepSpeed's keys and defaults, in elements (docs/zero.md, "Stage 3"): the elements of
  // the gather units fetched ahead of the one in use (0: no prefetch), and the most gathered elements
  // alive at once (at least the largest unit).
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;
  std::int64_t stage3_max_live_parameters = 1'000'000'000;
  // DeepSpeed's zero_quantized_gradients (ZeRO++ qgZ, stage 3 there), here for stages 1 to 3: the
  // gradient reduce-scatter sends int8 values with one fp32 scale per block of
  // zero_quantized_gradients_block_size elements (not a DeepSpeed key; 1 ..= 1048576, default 256) as an
  // all-to-all, and the owner adds the dequantized contributions in fp32 (Note [int8 quantized
  // reduce-scatter] in distributed/comm/quantize.cpp). Any model dtype. Refused at stage 0, with
  // reduce_scatter false, reduce_scatter_with_fp32_accumulation or communication_data_type "fp32" for a
  // 16-bit model.
  bool zero_quantized_gradients = false;
  std::int64_t zero_quantized_gradients_block_size = 256;
  // Not a DeepSpeed key: keep each step's quantization residual (int8, one fp32 scale per block) and add
  // it to the next step's gradient before quantizing (Note [Error feedback] in
  // distributed/zero/gradient_reducer.cpp). Needs zero_quantized_gradients.
  bool zero_quantized_gradients_error_feedback = false;
};

/// "optimizer": {"type": "AdamW" | "Adam" | "Muon", "params": {...}}. The type is matched
/// case-insensitively, as in DeepSpeed. "Adam" means AdamW too: DeepSpeed's Adam defaults to adam_w_mode =
/// true (decoupled weight decay); adam_w_mode = false (L2 regularisation) is rejected. "Muon" (optim/muon.h):
/// Muon for the hidden matrices with lr and weight_decay shared with AdamW for the rest (Note [Muon update
/// scale] in optim/muon.cpp), plus its own momentum and ns_steps. The type the run uses is
/// TrainingConfig::optimizer_type (the table's optimizer.type, which --optimizer sets).
///
/// The params are rows of the settings table (optimizer.params.*) with two defaults (Note [Section
/// defaults] in distributed/run/settings.cpp): the program's, written here, without the section, and
/// DeepSpeed's FusedAdam / torch defaults (beta2 0.999, weight_decay 0) when the file has the section.
/// The values are the run's after the flags (--lr, --beta1, --beta2, --weight-decay).
struct OptimizerConfig {
  std::string type = "AdamW";  // as written in the file
  double lr = 1e-3;            // >= 0
  double beta1 = 0.9;          // "betas": [beta1, beta2], each in [0, 1)
  double beta2 = 0.99;         // the section's default: 0.999
  double eps = 1e-8;           // >= 0
  double weight_decay = 0.1;   // decoupled, >= 0; the section's default: 0
  bool adam_w_mode = true;     // only true
  std::optional<double> momentum;        // Muon only: in [0, 1); unset: 0.95
  std::optional<std::int64_t> ns_steps;  // Muon only: Newton–Schulz iterations, >= 1; unset: 5
};

/// A section whose values always exist: read like a std::optional of the section, where "has a value"
/// means the file has the section (`if (c.optimizer)`), while `*` and `->` give the values the run uses
/// either way (the program's defaults without the section).
template <typename T>
class SectionValues {
 public:
  explicit operator bool() const { return present_; }
  bool has_value() const { return present_; }
  void set_present(bool present) { present_ = present; }
  T& operator*() { return value_; }
  const T& operator*() const { return value_; }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }

 private:
  T value_{};
  bool present_ = false;
};

/// "scheduler": only {"type": "WarmupCosineLR", "params": {...}}: linear warmup over warmup_num_steps,
/// then cosine decay to cos_min_ratio * lr at total_num_steps (optim/lr_schedule.h). DeepSpeed's
/// default warmup_type is "log"; we warm up linearly only, so "warmup_type" may only be "linear", and
/// "warmup_min_ratio" only 0. warmup_num_steps is a row of the settings table (--warmup) with two
/// defaults (Note [Section defaults] in distributed/run/settings.cpp): the program's 100 without the
/// section, DeepSpeed's 1000 with it; it is the run's warmup either way.
struct SchedulerConfig {
  std::string type = "WarmupCosineLR";
  std::int64_t warmup_num_steps = 100;   // >= 0; the section's default: 1000
  std::int64_t total_num_steps = 0;      // required, >= 1
  double cos_min_ratio = 1e-4;           // final lr / peak lr, in [0, 1]
};

/// DeepSpeed's "activation_checkpointing" section. Of DeepSpeed's keys only those that apply without
/// tensor parallelism are accepted (docs/config.md); the mode of recompute is Megatron's granularity.
struct ActivationCheckpointingConfig {
  // "none", "full" (each transformer block re-run in the backward) or "selective" (its GEMM outputs
  // kept, the rest re-run): autograd/checkpoint.h. Megatron-LM's --recompute-granularity, plus "none".
  std::string recompute_granularity = "none";
};

struct TrainingConfig {
  // Batch keys: train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps *
  // world_size. Unset (nullopt) ones are derived by resolve_batch; after it all three are set.
  std::optional<std::int64_t> train_batch_size;                // sequences per optimizer step, all ranks
  std::optional<std::int64_t> train_micro_batch_size_per_gpu;  // sequences per forward/backward, one rank
  std::optional<std::int64_t> gradient_accumulation_steps;     // micro-batches per optimizer step

  // Clip the global gradient L2 norm to this; 0 turns clipping off. 1.0 is DeepSpeed's default at HEAD
  // (it was 0.0, off, before v0.19.3).
  double gradient_clipping = 1.0;

  // Seconds any one collective may take before the job is ended with a message naming it (not a
  // DeepSpeed key; DeepSpeed's equivalent is torch.distributed's timeout). Unset: the communicator's
  // default, $ZERO_COLLECTIVE_TIMEOUT_S or 300 s. > 0.
  std::optional<double> collective_timeout_s;
  // fp32/bf16: what a step with a non-finite (inf/NaN) gradient does: "error" stops the run naming the
  // step, "skip" skips the step like an fp16 overflow. fp16 always skips (loss scaling). Not a
  // DeepSpeed key (DeepSpeed applies such a step).
  std::string nonfinite_grads = "error";
  // fp32/bf16 with nonfinite_grads "skip": the consecutive skipped steps that stop training (>= 0; 0 =
  // never stop). The default is fp16.min_scale_skip_limit's. Not a DeepSpeed key.
  int nonfinite_skip_limit = 1;
  // DeepSpeed's communication_data_type: the dtype gradient reductions travel in, "fp32", "fp16" or
  // "bf16". Unset: the model dtype. Supported: the model dtype, or "fp32" for a 16-bit model
  // (partial sums in fp32, rounded once; twice the reduction bytes).
  std::optional<std::string> communication_data_type;

  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  ActivationCheckpointingConfig activation_checkpointing;
  SectionValues<OptimizerConfig> optimizer;  // the file's section, or the program's defaults without it
  // optimizer.type of the settings table: "AdamW", "Adam" or "Muon" (any case), from the file's
  // optimizer section or --optimizer (adamw | muon); unset: AdamW. optimizer->type is what the file said.
  std::optional<std::string> optimizer_type;
  SectionValues<SchedulerConfig> scheduler;  // the file's section, or the program's warmup without it

  /// One line per ignored DeepSpeed key or deprecated form, "warning: " prefix included, ready to print.
  std::vector<std::string> warnings;

  /// Reads and parses a JSON file (duplicate keys are an error, as in DeepSpeed). Throws zero::Error
  /// naming the file when it does not exist, cannot be read or is not valid JSON, and naming the file
  /// and the key for any invalid value (see from_json).
  static TrainingConfig from_file(const std::string& path);

  /// Parses a JSON object and validates it (validate()). Ignored DeepSpeed keys go to `warnings`.
  /// Throws zero::Error naming the key for an unknown or unsupported key, or a value of the wrong type
  /// or out of range.
  static TrainingConfig from_json(const nlohmann::json& j);

  /// Parses a JSON object as from_json does (types, unknown and unsupported keys, warnings) without the
  /// rules validate() checks, for a merge: flags go on top (apply_flag), then validate() runs once.
  /// `source` (a file path, or "") is named by validate()'s errors for the keys no flag replaced.
  /// Throws zero::Error naming the key for an unknown key or a value of the wrong type.
  static TrainingConfig parse_for_merge(const nlohmann::json& j, const std::string& source);

  /// Sets setting `s` from its command-line flag's text (flag_json): the flag overrides the file. Later
  /// errors of validate() about that key name the flag and its value. Throws zero::Error naming the
  /// flag for a value of the wrong type or not among the allowed ones.
  void apply_flag(const Setting& s, const std::string& text);

  /// The config with DeepSpeed's key names, every default filled in and, after resolve_batch, all
  /// three batch keys (unset ones are null before). Feeding it back to from_json gives the same config.
  nlohmann::json to_json() const;

  /// DeepSpeed's batch rule (runtime/config.py, _set_batch_related_parameters and _batch_assertion),
  /// now that the world size is known:
  ///   all three given                  -> checked only;
  ///   train + micro                    -> GAS   = train / micro / world_size;
  ///   train + GAS                      -> micro = train / world_size / GAS;
  ///   micro + GAS                      -> train = micro * GAS * world_size;
  ///   train only                       -> GAS = 1, micro = train / world_size;
  ///   micro only                       -> GAS = 1, train = micro * world_size;
  ///   neither train nor micro          -> error.
  /// (integer division, as DeepSpeed.) Then train == micro * GAS * world_size must hold, with every
  /// value >= 1; otherwise throws zero::Error naming all three values, world_size and the file the
  /// config came from (parse_for_merge's `source`), and leaves the config unchanged. Throws
  /// zero::Error for world_size < 1. Apply command-line overrides of batch keys before calling it (an
  /// override that replaces a given key should reset the one it conflicts with to nullopt).
  void resolve_batch(int world_size);

  /// World size passed to resolve_batch; 0 before.
  int world_size() const { return world_size_; }

  /// Checks every value and every rule between keys (after command-line overrides); also the batch
  /// rule once resolve_batch ran. Throws zero::Error naming the first invalid key, and the file it came
  /// from or the flag that set it.
  void validate() const;

  /// f16 if fp16.enabled, bf16 if bf16.enabled, else f32.
  DType model_dtype() const;
  /// True when optimizer_type is Muon (any case).
  bool uses_muon() const;
  /// Sets fp16.enabled / bf16.enabled for `t` (f32 turns both off), for a --dtype override. Throws
  /// zero::Error for a non-floating dtype.
  void set_model_dtype(DType t);

  /// The ZeroOptimizer options this config describes: stage, model dtype, bucket sizes (automatic
  /// when unset), the wire dtype, overlap_param_gather, reduce_scatter, overlap_comm,
  /// contiguous_gradients, gradient_accumulation_steps (1 before resolve_batch when it was not given),
  /// gradient_clipping, nonfinite_grads, the loss scaler and Muon (optimizer_type, momentum, ns_steps).
  /// The AdamW hyper-parameters and weight decay are left at ZeroOptions' defaults for the training
  /// program to set.
  ZeroOptions zero_options() const;

  /// The "fp16" section as the loss scaler's config.
  optim::LossScalerConfig loss_scaler_config() const;
  /// The scheduler as an LrSchedule peaking at `lr` (optimizer.params.lr, or the program's own).
  /// Throws zero::Error when no scheduler was configured.
  optim::LrSchedule lr_schedule(double lr) const;

 private:
  int world_size_ = 0;
  std::string source_;                         // the file parsed, "" for none
  std::map<std::string, std::string> flags_;   // key -> "--flag value" that set it
};

/// The one merge rule, for every program that takes a config file and flags: `base` (a config file's
/// JSON, or a resumed checkpoint's config with the file's keys on top; `source` names the file, "" for
/// none) parsed without validation (parse_for_merge), then `flags` in order (pairs of a settings-table
/// flag and its text: {"--zero-stage", "2"}, {"--overlap-comm", "true"}; apply_flag), then
/// `program_flags` (the program's flags that are not one key of the table, such as a --dtype that
/// sets fp16.enabled and bf16.enabled; it may call resolve_batch), then validate() once on the result.
/// So a file is valid with flags exactly when the same settings written into the file are. Throws
/// zero::Error with one line naming the key, and the file or the flag it came from; a flag not in the
/// table is a programming error (zero::Error naming it).
TrainingConfig merge_config(const nlohmann::json& base, const std::string& source,
                            const std::vector<std::pair<std::string, std::string>>& flags,
                            const std::function<void(TrainingConfig&)>& program_flags = {});

/// The JSON of a config file, with DeepSpeed's duplicate-key rule (a key given twice in one object is
/// an error). Throws zero::Error naming the file when it does not exist, cannot be read, or is not
/// valid JSON.
nlohmann::json read_config_file(const std::string& path);

}  // namespace zero::dist
