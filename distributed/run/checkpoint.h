// Checkpoints of a ZeroOptimizer run: crash-safe, written by every rank in parallel, and loadable at
// any world size, ZeRO stage and model dtype by range arithmetic over the flat layout. The files, what
// each holds, the resharding rule with a worked example, and the guarantees are in docs/checkpoint.md.
//
//   DIR/step_00000020/model.safetensors              every trainable parameter in fp32, under its
//                                                    named_parameters() name (the exact fp32 master)
//   DIR/step_00000020/optimizer_rank00003.safetensors  rank 3's slice of the flat layout: fp32 master
//                                                    (16-bit runs), AdamW exp_avg and exp_avg_sq; with
//                                                    error feedback, rank 3's whole residual too
//   DIR/step_00000020/state.json                     version, step, counters, loss scaler, the
//                                                    caller's extra state, CRC-32 of every other file
//   DIR/latest                                       the newest complete checkpoint's name
//
// Saving never gathers anything: rank r writes the real elements of its partition of the master, m and
// v (FlatLayout::partition_begin/end of the saving run) into its own shard and into model.safetensors at
// their byte offset. Both are in logical positions [0, Ψ) (Ψ the unpadded parameter count): the
// parameters back to back in named_parameters() order, without the padding and the gaps Muon's whole
// matrices may leave at stages 1-3 (Note [Checkpoint ranges] in checkpoint.cpp), which
// is exactly the data section of a safetensors file written in that order. Loading: each rank reads,
// from every old shard, only the part overlapping the region it now steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "distributed/comm/communicator.h"
#include "distributed/zero/zero_optimizer.h"
#include "nn/module.h"

namespace zero::dist {

/// The state.json "version" this build writes and the only one it reads.
inline constexpr int kCheckpointVersion = 1;

/// "step_00000020": the directory name of the checkpoint after `step` optimizer steps.
std::string checkpoint_name(std::int64_t step);

struct SaveResult {
  std::string dir;          // the checkpoint directory written
  double seconds = 0;       // wall time of the whole save, on this rank
  std::uint64_t bytes = 0;  // bytes of every file in it (state.json included); rank 0 only
  bool cancelled = false;   // abandoned on request: nothing of it exists, the previous checkpoint is the newest
};

/// Writes DIR/step_XXXXXXXX for `opt` after `step` steps, then points DIR/latest at it, deletes step
/// directories of later steps (left by a run this one resumed from an earlier point: the directory
/// holds one trajectory) and, if keep > 0, all but the `keep` newest step directories. `extra` is merged into state.json (keys the
/// library writes win). Crash safety: everything is written under DIR/.tmp-step_XXXXXXXX, fsynced,
/// renamed into place, then `latest` is written to a temporary name, fsynced and renamed; a process
/// killed at any instant leaves every earlier checkpoint intact and loadable. An existing directory
/// of the same step is replaced. Memory: no buffer beyond a 1 Mi-element staging chunk (cuda only).
/// `cancelled` (optional) is asked on every rank once its files are written, and on rank 0 again just
/// before the commit (the rename into place): if it says true anywhere, the checkpoint is abandoned on
/// every rank (its temporary directory removed, `latest` untouched) and the result says `cancelled`.
/// Collective. Throws zero::Error naming the path and the reason on an I/O error ("cannot write
/// '.../optimizer_rank00001.safetensors': No space left on device"); the previous checkpoint then
/// stays the newest.
/// `written` (optional): the step directories ("step_00000010") this job wrote before; --keep then
/// prunes only among them and this one (Note [One writer] in checkpoint.cpp).
SaveResult save_checkpoint(const std::string& save_dir, std::int64_t step, const ZeroOptimizer& opt,
                           Communicator& comm, const nlohmann::json& extra, int keep,
                           const std::function<bool()>& cancelled = {},
                           const std::vector<std::string>* written = nullptr);

/// The one-writer lock of a save directory, DIR/.lock (Note [One writer] in checkpoint.cpp): created
/// atomically (O_CREAT | O_EXCL) with this process's host, pid, start time and `command`; removed by
/// the destructor if it is still this one's. Not collective: one rank (rank 0) takes it for the job.
class SaveDirLock {
 public:
  /// Takes the lock; a lock left by a process that is gone from this host is taken over (warning()
  /// then says so). Throws zero::Error with one line naming the lock and its owner when another job
  /// holds it (or one on another host, which cannot be checked), or when it cannot be created.
  SaveDirLock(const std::string& save_dir, const std::string& command);
  ~SaveDirLock();
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;
  const std::string& path() const { return path_; }
  /// "warning: ..." when a stale lock was taken over, else empty.
  const std::string& warning() const { return warning_; }

 private:
  std::string path_, text_, warning_;
  bool held_ = false;
};

/// A checkpoint whose files were all found and verified.
struct Checkpoint {
  std::string dir;
  nlohmann::json state;  // state.json
};

/// `path` is a checkpoint directory (it holds state.json) or a save directory: then the newest
/// complete checkpoint in it (the one DIR/latest names, or a newer step directory if a crash came
/// between that directory's rename and latest's update). Throws zero::Error if there is none.
std::string resolve_checkpoint(const std::string& path);

/// The same, resolved by rank 0 alone and shared with every rank (Note [One resolution] in checkpoint.cpp):
/// every rank returns rank 0's answer. Collective. Throws zero::Error on every rank, with rank 0's
/// message, when rank 0 finds no checkpoint.
std::string resolve_checkpoint(const std::string& path, Communicator& comm);

/// Reads DIR/state.json only (nothing is verified but its format version): for a program that needs a
/// checkpoint's settings before it can start. Throws zero::Error naming the checkpoint: state.json
/// missing, unreadable or not JSON, or an unknown format version.
nlohmann::json read_state(const std::string& dir);

/// state.json's `key` in `j` (state.json itself or an object inside it) as a T. Throws zero::Error naming
/// the checkpoint `dir`, state.json and the key when `j` lacks the key or holds it with another type.
template <typename T>
T state_value(const nlohmann::json& j, const char* key, const std::string& dir) {
  ZERO_CHECK(j.is_object() && j.contains(key), "checkpoint '{}': state.json lacks \"{}\"", dir, key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("checkpoint '{}': state.json \"{}\" has the wrong type ({})", dir, key, j.at(key).dump()));
  }
}

/// The optimizer whose state the checkpoint holds (state.json "optimizer_type"): "adamw" or "muon";
/// "adamw" when the key is absent (checkpoints written before Muon). Throws zero::Error naming `dir`,
/// state.json and the key for a value that is not a string or not an optimizer this program knows.
std::string saved_optimizer_type(const nlohmann::json& state, const std::string& dir);

/// Reads state.json and verifies every file it lists: present, of the recorded size (else
/// "truncated"), with the recorded CRC-32 (else "corrupt"); the CRC work is split over the ranks of
/// `comm` (nullptr: this process checks everything). Reads only. Collective when comm is given: the
/// ranks first compare the state.json each of them read (Note [One resolution]).
/// Throws zero::Error with one line naming the checkpoint and the culprit: a missing or unparsable
/// state.json, one that differs between ranks, an unknown format version, a missing / truncated /
/// corrupt file.
Checkpoint open_checkpoint(const std::string& dir, Communicator* comm);

/// Throws zero::Error naming the first difference between the checkpoint's parameters and the
/// trainable ones of `params` (in order): a name missing on either side, or a shape (both shapes).
void check_parameters(const Checkpoint& ckpt, const std::vector<nn::NamedParameter>& params);

/// What load_checkpoint did beyond the ranges every load restores.
struct LoadResult {
  /// Error feedback is on and this rank got its saved residual back (same world size, stage, dtype,
  /// bucket size and block size: Note [Error-feedback checkpoints] in checkpoint.cpp).
  bool residual_restored = false;
  /// One line, "warning: ...", when error feedback is on and the residual was reset to zero instead,
  /// naming the first setting that differs from the checkpoint's (the same on every rank: print it on
  /// one). Empty otherwise.
  std::string warning;
};

/// Restores `opt` from `ckpt` (after check_parameters): this rank's region of the fp32 master (from
/// the shards for 16-bit checkpoints, from model.safetensors for fp32 ones), AdamW m and v, the step
/// counters and, when both runs are fp16, the loss scaler; with error feedback, this rank's residual
/// when the layout is the same, else it stays zero (LoadResult says which); then rounds and
/// all-gathers the parameters. Any world size, stage and dtype. Collective. Throws zero::Error on an
/// I/O error, or naming the shard when its residual has the wrong type or size (before anything of
/// the residual is written).
LoadResult load_checkpoint(const Checkpoint& ckpt, ZeroOptimizer& opt, Communicator& comm);

/// Copies the F32 tensors of safetensors file `path` into the parameters of the same names (before a
/// ZeroOptimizer takes them over). Every trainable parameter must be present with its shape and F32,
/// every tensor of the file must be a parameter of the model (a file of a deeper model is refused, not
/// loaded in part), and the values finite unless `allow_non_finite`; checked for all before any is
/// written. Throws zero::Error naming the file and the culprit (the tensors either side lacks, the
/// tensor of a wrong shape or dtype, and for a NaN / inf its element).
void load_weights(const std::string& path, const std::vector<nn::NamedParameter>& params,
                  bool allow_non_finite = false);

/// A Generator's full state as text, and back (mt19937_64's standard stream format). set_ throws
/// zero::Error for a string that is not such a state.
std::string generator_state(Generator& gen);
void set_generator_state(Generator& gen, const std::string& state);

}  // namespace zero::dist
