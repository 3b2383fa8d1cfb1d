// The resume read plan: which byte ranges of which checkpoint files a rank reads when it loads a
// checkpoint (load_checkpoint in checkpoint.h), at any world size and stage. zero_explain --read-plan
// prints it (docs/checkpoint.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/run/checkpoint.h"

namespace zero::dist {

/// One contiguous read of a load: `bytes` bytes at byte `offset` of `file` (a file of the checkpoint
/// directory), inside its tensor `tensor` ("data section" for model.safetensors' parameters read as
/// one range), holding the f32 elements [flat_begin, flat_end) of the logical range [0, Ψ): the
/// parameters back to back (Note [Checkpoint ranges] in checkpoint.cpp).
struct ReadRange {
  std::string file, tensor;
  std::uint64_t offset = 0, bytes = 0;
  std::int64_t flat_begin = 0, flat_end = 0;
};

/// The reads load_checkpoint makes for a rank whose region holds the logical range [region_begin,
/// region_end) of [0, Ψ) (stage 0: [0, Ψ); stages 1-3: its partition's real elements,
/// FlatLayout::to_logical of its ends; Note [Checkpoint ranges] in checkpoint.cpp): from each shard
/// overlapping it, the overlap of exp_avg, exp_avg_sq and (16-bit checkpoints) master; for an fp32
/// checkpoint the master from model.safetensors' data section. In load order. Not listed:
/// state.json, the headers, and the error-feedback residual (read whole from the rank's own shard when
/// the layout is the same). Reads only the files' headers. Throws zero::Error naming the checkpoint and
/// file: a region outside [0, Ψ), shards that do not tile [0, Ψ), a shard lacking a tensor of its
/// range's length, or an unreadable header.
std::vector<ReadRange> read_plan(const Checkpoint& ckpt, std::int64_t region_begin, std::int64_t region_end);

}  // namespace zero::dist
