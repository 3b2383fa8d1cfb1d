// The settings a resumed train_gpt run takes from its checkpoint (Note [Settings from the checkpoint]).
//
//   train_gpt --resume out                      continues with out's model, data, schedule and config
//   train_gpt --resume out --lr 2e-3            the same, with a warning naming --lr and both values
//   train_gpt --resume out --n-embd 256         an error: the model shape is the checkpoint's
//   train_gpt --init-from out --data other.txt  fine-tuning: the weights and the model shape of out
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "distributed/distributed.h"
#include "examples/train_options.h"

namespace zero::examples {

/// What train_gpt wrote into state.json besides what the checkpoint library writes: the run's settings
/// (the resolved `config`, `model`, `data`, `seed`, `lr_schedule`, `adamw`, `evaluation`), for
/// save_checkpoint's `extra`. `data` is written as an absolute path.
nlohmann::json settings_json(const Args& a, const dist::TrainingConfig& config, const nlohmann::json& model);

/// The config a checkpoint's run used (state.json's "config"), for the merge of a resumed run. One
/// recorded before the optimizer's params were rows of the settings table ("optimizer": {..., "params":
/// null}) gets the values its run used from state.json's "lr_schedule" (lr) and "adamw" (betas, weight
/// decay), written as the params of a config without the section (Note [Section defaults] in
/// distributed/run/settings.cpp), and one without a "scheduler" its warmup from "lr_schedule" as a
/// config without the section ({"type": null, "params": {"warmup_num_steps": N}}); any other config is
/// returned as it is. Returns null when state.json has no "config".
nlohmann::json recorded_config(const nlohmann::json& state);

/// A checkpoint that --resume or --init-from names, read before any work.
struct CheckpointSettings {
  std::string dir;       // the checkpoint directory (a save directory resolved to its newest one)
  nlohmann::json state;  // its state.json
  std::vector<std::string> warnings;  // "warning: ..." lines for rank 0 to print
};

/// --resume: the settings not given on the command line are set from the checkpoint (its model shape,
/// data file, seed, schedule, AdamW and evaluation settings); a given one that differs adds a warning
/// naming the flag and both values. The ZeRO and batch settings come from the checkpoint's config
/// through make_config (config_warnings compares them afterwards). --init-from a checkpoint directory:
/// only the model shape is taken, and init_from becomes its model.safetensors. Returns nothing (an
/// empty dir) when neither flag names a checkpoint. Throws zero::Error with one line naming the
/// checkpoint and the culprit: a missing or unreadable state.json, or a given model-shape flag
/// (--n-layer, --n-head, --n-embd, --block, or a model option's: --norm, ...) that differs from the
/// checkpoint's.
/// `resolved`, when not empty, is the checkpoint directory already chosen for the flag's path (by rank
/// 0 for the whole job: Note [One resolution] in distributed/run/checkpoint.cpp).
CheckpointSettings take_checkpoint_settings(Args& a, const Given& given, const std::string& resolved = "");

/// The path --resume or --init-from gives when it names a checkpoint or save directory, else "".
std::string checkpoint_path(const Args& a);

/// Warnings for every setting of the resolved config `now` that differs from the checkpoint's
/// `saved` config ("config" of state.json), naming the flag when one was given, else the config key;
/// the micro-batch (derived from the world size) and the collective timeout are not compared.
std::vector<std::string> config_warnings(const dist::TrainingConfig& now, const nlohmann::json& saved,
                                         const Given& given, const std::string& dir);

}  // namespace zero::examples
