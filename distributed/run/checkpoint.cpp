#include "distributed/run/checkpoint.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "core/check.h"
#include "distributed/run/read_plan.h"
#include "core/safetensors.h"

namespace zero::dist {

// Note [Checkpoint ranges]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint is a set of ranges of the logical range [0, Ψ): the parameters back to back in
// named_parameters() order, parameter i at the sum of the sizes before it, whatever the world size
// (Note [Logical positions] in distributed/zero/flat_layout.cpp). Without gaps between parameters it is
// the flat buffer cut at Ψ (only the trailing padding depends on the world size); with the gaps of Muon's
// layout at stages 1-3 (single elements that start a matrix on an even position, Note [Whole-matrix
// partitions]) the flat positions need not be the logical ones. The real elements of any partition are
// one logical range, held in the flat buffer as runs split by the gaps (FlatLayout::logical_runs). So:
//   - saving rank r of N writes the logical range of its partition [partition_begin, partition_end), its runs
//     compacted back to back — at stage 0 too, where every rank holds everything: the ranks then split
//     the writing instead of repeating it;
//   - a loading rank needs the logical range [b, e) of its region (stage 0: [0, Ψ); stages 1-3: its
//     partition) and reads, from each old shard [b_i, e_i), the overlap [max(b, b_i), min(e, e_i)) at
//     element max(b, b_i) - b_i of the shard's tensors, scattered into its runs (one read per run it
//     meets: pieces adjacent in the file).
// Padding, the gaps included, is never stored; a fresh optimizer's padding is zero and stays zero
// (nothing steps it). model.safetensors holds the parameters back to back in the same order, so its
// data section is the master's logical [0, Ψ) and every rank fills its own range of it in place.
// state.json's per-parameter "offset" is the logical one. A layout without gaps writes exactly what it
// wrote before logical positions existed.

// Note [Error-feedback checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With zero_quantized_gradients_error_feedback each rank holds a residual (Note [Error feedback] in
// gradient_reducer.cpp) that is optimizer state (Note [Error feedback state]) but, unlike master, m
// and v, is not a range of the flat buffer: rank r's residual covers every element, and holds what
// rank r lost when IT sent them, as int8 in blocks of each bucket's per-rank slices with one fp32 scale
// per block. So rank r saves its whole residual into its own shard ("error_feedback_residual": the
// int8 values in flat order, [padded_numel] bytes, stored four to an I32 element since this reader has
// no 8-bit type; "error_feedback_scales": F32), and state.json records the layout it belongs to.
// A resume at the same world size, stage, dtype, bucket size and block size gives each rank its own
// residual back, so the run continues bit for bit. Anywhere else the residual is reset to zero, with
// one warning line naming the first setting that differs. Resharding was the alternative, and it is
// not a range copy: at another N (or bucket size) the slices, hence the blocks and scales, differ, and
// there is no rank-to-rank correspondence (each old rank's residual is its own share of what was lost:
// only their sum means anything), so a reshard would have to dequantize every rank's residual, sum
// them, split the sum over the new ranks and requantize it in the new blocks, reading N residuals of
// Ψ bytes each. What a reset gives up is bounded: at most half a quantization step per element, the
// error of one reduction, which is exactly where every run with error feedback starts (the residual is
// zero at step 0); the Adam moments and master weights, which carry the training, are resharded as
// always. A checkpoint saved without error feedback (or before residuals were saved) gets the same
// reset and warning; a run without error feedback ignores a saved residual.

namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using Clock = std::chrono::steady_clock;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr std::int64_t kChunk = 1 << 20;  // elements staged at once when buffers live on cuda

std::string shard_name(int rank) { return fmt::format("optimizer_rank{:05d}.safetensors", rank); }

// A 1-D view of elements [begin, begin + n) of contiguous `t`.
Tensor range(const Tensor& t, std::int64_t begin, std::int64_t n) { return t.as_strided({n}, {1}, t.offset() + begin); }

// Calls fn(host_pointer, first, count) over elements [begin, begin + n) of fp32 buffer `t`, in chunks:
// the tensor's own memory on cpu, a host copy of each chunk on cuda.
template <typename Fn>
void for_host_chunks_read(const Tensor& t, std::int64_t begin, std::int64_t n, Fn fn) {
  if (t.device() == Device::cpu) {
    if (n > 0) fn(t.data<float>() + begin, begin, n);
    return;
  }
  for (std::int64_t done = 0; done < n; done += kChunk) {
    const std::int64_t c = std::min(kChunk, n - done);
    const Tensor host = range(t, begin + done, c).to(Device::cpu);
    fn(host.data<float>(), begin + done, c);
  }
}

// Fills elements [begin, begin + n) of fp32 buffer `t` with fn(host_pointer, first, count).
template <typename Fn>
void for_host_chunks_write(const Tensor& t, std::int64_t begin, std::int64_t n, Fn fn) {
  if (t.device() == Device::cpu) {
    if (n > 0) fn(t.data<float>() + begin, begin, n);
    return;
  }
  std::vector<float> host;
  for (std::int64_t done = 0; done < n; done += kChunk) {
    const std::int64_t c = std::min(kChunk, n - done);
    host.resize(static_cast<std::size_t>(c));
    fn(host.data(), begin + done, c);
    range(t, begin + done, c).copy_(Tensor::from_vector(host, {c}));
  }
}

bool is_step_dir(const std::string& name) {
  static const std::regex re("step_[0-9]{8}");
  return std::regex_match(name, re);
}

// step_* directories of `save_dir`, oldest first.
std::vector<std::string> step_dirs(const fs::path& save_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(save_dir, ec))
    if (e.is_directory() && is_step_dir(e.path().filename().string())) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Moves `dir` out of the way under a temporary name, then deletes it: a crash mid-deletion leaves a
// .trash- directory (cleaned at the next save), never a half-deleted step directory.
void remove_dir(const fs::path& dir) {
  const fs::path trash = dir.parent_path() / (".trash-" + dir.filename().string());
  fs::remove_all(trash);
  fs::rename(dir, trash);
  fs::remove_all(trash);
}

// One shard as state.json records it.
struct ShardRange {
  std::string file;
  std::int64_t begin = 0, end = 0;
};

std::vector<ShardRange> shard_ranges(const Checkpoint& c) {
  std::vector<ShardRange> out;
  for (const auto& s : state_value<nlohmann::json>(c.state, "shards", c.dir))
    out.push_back({state_value<std::string>(s, "file", c.dir), state_value<std::int64_t>(s, "flat_begin", c.dir),
                   state_value<std::int64_t>(s, "flat_end", c.dir)});
  return out;
}

}  // namespace

std::string checkpoint_name(std::int64_t step) { return fmt::format("step_{:08d}", step); }

std::string generator_state(Generator& gen) {
  std::ostringstream out;
  out << gen.engine();
  return out.str();
}

void set_generator_state(Generator& gen, const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 engine;
  in >> engine;
  ZERO_CHECK(!in.fail(), "not a random generator state ({} characters)", state.size());
  gen.engine() = engine;
}

// Note [Save failures agreed]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A write can fail on one rank only (its disk is full, its file-size limit is reached). If that rank
// threw at once, the others would be waiting for it in the save's next collective, and the job would
// end by the failure notice and the collective's abort path rather than by one clear line. So each
// phase's file work runs under Attempt, which keeps the first error, and the phase ends with one scalar
// all-reduce (max) of every rank's outcome: 0 fine, 1 cancelled, or (rank + 1) * 2^16 + errno for a
// failure. Then every rank acts on the same answer: on a failure all of them throw, the failing rank its
// own message and the others one naming that rank and the reason, so the job's one error line (rank 0's,
// as every rank failed) says what went wrong where; rank 0 first removes the temporary directory, giving
// back the space a full disk needs. The checkpoints already there are never touched before the commit.

namespace {

constexpr double kFailureBase = 65536.0;  // outcome codes: (rank + 1) * kFailureBase + errno

// The first error of a rank's file work in one save, with its errno.
struct Attempt {
  std::string message;
  int err = 0;

  template <typename Fn>
  void run(Fn&& fn) {
    if (!message.empty()) return;  // after a failure this rank writes nothing more
    try {
      fn();
    } catch (const fs::filesystem_error& e) {
      // "filesystem error: cannot create directories: Permission denied [/x/y]" -> without the prefix
      message = e.what();
      if (message.rfind("filesystem error: ", 0) == 0) message = message.substr(18);
      err = e.code().value();
    } catch (const std::exception& e) {
      err = errno;  // the failed system call's, still set: nothing since has failed
      message = e.what();
    }
  }
  double code(int rank) const {
    return message.empty() ? 0.0 : (rank + 1) * kFailureBase + std::clamp(err, 0, static_cast<int>(kFailureBase) - 1);
  }
};

// Note [Writing a checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// One save, in three phases, each ended by an agreement of every rank (Note [Save failures agreed]):
// its layout (rank 0 makes the temporary directory and sizes model.safetensors), its writing (every
// rank writes its shard and its range of the model: Note [Checkpoint ranges]), and its publishing
// (rank 0 writes state.json, renames the directory into place, points `latest` at it and prunes).
class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& save_dir, std::int64_t step, const ZeroOptimizer& opt, Communicator& comm)
      : opt_(opt),
        comm_(comm),
        rank_(comm.rank()),
        world_(comm.world_size()),
        layout_(opt.layout()),
        zo_(opt.options()),
        numel_(layout_.numel()),
        step_(step),
        root_(fs::absolute(save_dir)),
        name_(checkpoint_name(step)),
        tmp_(root_ / (".tmp-" + name_)),
        final_dir_(root_ / name_),
        model_path_((tmp_ / kModelFile).string()),
        model_header_(model_header(layout_)) {}

  SaveResult save(const nlohmann::json& extra, int keep, const std::function<bool()>& cancelled,
                  const std::vector<std::string>* written);

 private:
  // The model file's header (the same on every rank): parameters back to back in layout order.
  static std::string model_header(const FlatLayout& layout) {
    std::vector<st::TensorInfo> model_tensors;
    for (const ParamRange& p : layout.params()) model_tensors.push_back({p.name, DType::f32, p.shape, 0, 0});
    return st::encode_header(model_tensors, {{"format", "pt"}});
  }

  double agree(double mine, const char* doing);
  void prepare();
  std::uint32_t write_shard(std::int64_t wb, std::int64_t we, const std::vector<FlatRun>& runs);
  void write_model_range(const std::vector<FlatRun>& runs);
  nlohmann::json state_json(const nlohmann::json& extra, const std::vector<std::uint32_t>& crcs,
                            std::uint64_t& total) const;
  bool publish(const nlohmann::json& extra, const std::vector<std::uint32_t>& crcs, int keep,
               const std::function<bool()>& cancelled, const std::vector<std::string>* written);
  void prune(int keep, const std::vector<std::string>* written) const;

  const ZeroOptimizer& opt_;
  Communicator& comm_;
  const int rank_, world_;
  const FlatLayout& layout_;
  const ZeroOptions& zo_;
  const std::int64_t numel_, step_;
  const fs::path root_;
  const std::string name_;
  const fs::path tmp_, final_dir_;
  const std::string model_path_, model_header_;
  Attempt attempt_;
  SaveResult result_;
};

// The phase's end (Note [Save failures agreed]): the worst outcome over the ranks; throws on a failure.
double CheckpointWriter::agree(double mine, const char* doing) {
  const double worst = world_ > 1 ? comm_.all_reduce_max(mine) : mine;
  if (worst < kFailureBase) return worst;
  if (rank_ == 0) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
  if (!attempt_.message.empty()) throw Error(attempt_.message);
  const int failed = static_cast<int>(worst / kFailureBase) - 1;
  const int err = static_cast<int>(worst - (failed + 1) * kFailureBase);
  throw Error(fmt::format("rank {} could not {} in '{}': {}", failed, doing, tmp_.string(),
                          err > 0 ? std::strerror(err) : "an I/O error"));
}

// ---- 1. rank 0 prepares the temporary directory and sizes model.safetensors ----
void CheckpointWriter::prepare() {
  if (rank_ != 0) return;
  attempt_.run([&] {
    fs::create_directories(root_);
    for (const auto& e : fs::directory_iterator(root_)) {
      const std::string f = e.path().filename().string();
      if (f.rfind(".tmp-", 0) == 0 || f.rfind(".trash-", 0) == 0) fs::remove_all(e.path());  // crash leftovers
    }
    fs::create_directories(tmp_);
    const int fd = st::io::open_write(model_path_, true);
    try {
      st::io::pwrite_all(fd, model_header_.data(), model_header_.size(), 0, model_path_);
      const auto size = static_cast<off_t>(model_header_.size() + 4 * static_cast<std::uint64_t>(numel_));
      ZERO_CHECK(::ftruncate(fd, size) == 0, "cannot size '{}' to {} bytes: {}", model_path_, size,
                 std::strerror(errno));
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);  // flushed to disk with the ranges below: every rank's fsync covers the whole file
  });
}

// ---- 2a. this rank's shard: its optimizer state over logical [wb, we) and its error-feedback residual ----
// `runs`: where [wb, we) lies in the flat buffer. Returns the shard's CRC-32.
std::uint32_t CheckpointWriter::write_shard(std::int64_t wb, std::int64_t we, const std::vector<FlatRun>& runs) {
  const std::int64_t n = we - wb;
  std::vector<std::pair<std::string, const Tensor*>> parts;
  if (zo_.dtype != DType::f32) parts.push_back({"master", &opt_.master()});
  parts.push_back({"exp_avg", &opt_.exp_avg()});
  parts.push_back({"exp_avg_sq", &opt_.exp_avg_sq()});
  std::vector<st::TensorInfo> shard_tensors;
  for (const auto& [tname, t] : parts) shard_tensors.push_back({tname, DType::f32, {n}, 0, 0});
  // This rank's error-feedback residual, whole (Note [Error-feedback checkpoints]): int8 values packed
  // four to an I32 element (zero-padded), then the block scales.
  const bool feedback = zo_.quantized_gradients_error_feedback;
  const std::vector<std::int8_t>& residual = opt_.residual_values();
  const std::vector<float>& residual_scales = opt_.residual_scales();
  std::vector<std::int8_t> residual_packed;
  if (feedback) {
    residual_packed.assign((residual.size() + 3) / 4 * 4, 0);
    std::copy(residual.begin(), residual.end(), residual_packed.begin());
    shard_tensors.push_back(
        {"error_feedback_residual", DType::i32, {static_cast<std::int64_t>(residual_packed.size() / 4)}, 0, 0});
    shard_tensors.push_back(
        {"error_feedback_scales", DType::f32, {static_cast<std::int64_t>(residual_scales.size())}, 0, 0});
  }
  const std::string shard_header = st::encode_header(
      shard_tensors, {{"flat_begin", std::to_string(wb)}, {"flat_end", std::to_string(we)},
                      {"rank", std::to_string(rank_)}, {"world_size", std::to_string(world_)},
                      {"zero_stage", std::to_string(zo_.stage)}, {"dtype", std::string(dtype_name(zo_.dtype))}});
  const std::string shard_path = (tmp_ / shard_name(rank_)).string();
  std::uint32_t shard_crc = 0;
  attempt_.run([&] {
    const int fd = st::io::open_write(shard_path, true);
    // The bytes at `pos`, counted into the CRC.
    std::uint64_t pos = 0;
    const auto put = [&](const void* p, std::size_t bytes) {
      st::io::pwrite_all(fd, p, bytes, pos, shard_path);
      shard_crc = st::crc32(p, bytes, shard_crc);
      pos += bytes;
    };
    try {
      put(shard_header.data(), shard_header.size());
      for (const auto& part : parts)
        for (const FlatRun& run : runs)  // compacted past the gaps (Note [Checkpoint ranges])
          for_host_chunks_read(*part.second, run.flat - opt_.region_begin(), run.length,
                               [&](const float* p, std::int64_t, std::int64_t c) {
                                 put(p, static_cast<std::size_t>(c) * sizeof(float));
                               });
      if (feedback) {
        put(residual_packed.data(), residual_packed.size());
        put(residual_scales.data(), residual_scales.size() * sizeof(float));
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    st::io::sync_close(fd, shard_path);
  });
  return shard_crc;
}

// ---- 2b. this rank's range of model.safetensors: its fp32 master weights over `runs`, each at its logical place ----
void CheckpointWriter::write_model_range(const std::vector<FlatRun>& runs) {
  attempt_.run([&] {
    const int fd = st::io::open_write(model_path_, false);
    try {
      for (const FlatRun& run : runs) {
        const std::int64_t src = run.flat - opt_.region_begin();  // the run in this rank's buffers
        for_host_chunks_read(opt_.master(), src, run.length, [&](const float* p, std::int64_t first, std::int64_t c) {
          st::io::pwrite_all(fd, p, static_cast<std::size_t>(c) * sizeof(float),
                             model_header_.size() + 4 * static_cast<std::uint64_t>(first - src + run.logical),
                             model_path_);
        });
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    st::io::sync_close(fd, model_path_);
  });
}

// state.json: `extra` with the checkpoint's format, step, layout, optimizer counters, loss scaler, shards
// and every file's size and CRC-32. Adds the files' bytes to `total`.
nlohmann::json CheckpointWriter::state_json(const nlohmann::json& extra, const std::vector<std::uint32_t>& crcs,
                                            std::uint64_t& total) const {
  nlohmann::json files = nlohmann::json::object();
  const auto [model_crc, model_bytes] = st::file_crc32(model_path_);
  files[kModelFile] = {{"bytes", model_bytes}, {"crc32", model_crc}};
  nlohmann::json shards = nlohmann::json::array();
  total += model_bytes;
  for (int r = 0; r < world_; ++r) {
    const std::string f = shard_name(r);
    const auto bytes = static_cast<std::uint64_t>(fs::file_size(tmp_ / f));
    files[f] = {{"bytes", bytes}, {"crc32", crcs[static_cast<std::size_t>(r)]}};
    total += bytes;
    shards.push_back({{"file", f},  // logical ranges (Note [Checkpoint ranges])
                      {"rank", r},
                      {"flat_begin", layout_.to_logical(layout_.partition_begin(r))},
                      {"flat_end", layout_.to_logical(layout_.partition_end(r))}});
  }
  nlohmann::json params = nlohmann::json::array();
  for (const ParamRange& p : layout_.params())
    params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.logical_offset}});
  const optim::LossScaler::State ls = opt_.loss_scaler().state();
  nlohmann::json state = extra.is_object() ? extra : nlohmann::json::object();
  state["format"] = "zero.cpp checkpoint";
  state["version"] = kCheckpointVersion;
  state["step"] = step_;
  state["world_size"] = world_;
  state["zero_stage"] = zo_.stage;
  state["dtype"] = std::string(dtype_name(zo_.dtype));
  state["optimizer_type"] = zo_.muon ? "muon" : "adamw";  // what exp_avg holds: Muon's momentum or Adam's m
  state["numel"] = numel_;
  state["params"] = params;
  nlohmann::json param_steps = nlohmann::json::object();  // per parameter (Note [Unused parameters])
  for (std::size_t i = 0; i < layout_.params().size(); ++i) param_steps[layout_.params()[i].name] = opt_.param_steps()[i];
  state["optimizer"] = {{"steps", opt_.steps()},
                        {"skipped_steps", opt_.skipped_steps()},
                        {"consecutive_skipped_steps", opt_.consecutive_skipped_steps()},
                        {"param_steps", param_steps},
                        {"lr", opt_.lr()},
                        {"loss_scaler",
                         {{"scale", ls.scale},
                          {"hysteresis_left", ls.hysteresis_left},
                          {"iter", ls.iter},
                          {"last_overflow_iter", ls.last_overflow_iter},
                          {"skips_at_min", ls.skips_at_min}}}};
  if (zo_.quantized_gradients_error_feedback)  // the layout the shards' residuals belong to (Note [Error-feedback checkpoints])
    state["error_feedback"] = {{"reduce_bucket_size", zo_.reduce_bucket_size},
                               {"quantized_gradients_block", zo_.quantized_gradients_block},
                               {"padded_numel", layout_.padded_numel()}};
  state["shards"] = shards;
  state["files"] = files;
  return state;
}

// ---- 3. rank 0: state.json, rename into place, then `latest`, then pruning ----
// Returns true when cancelled before the commit (the rename).
bool CheckpointWriter::publish(const nlohmann::json& extra, const std::vector<std::uint32_t>& crcs, int keep,
                               const std::function<bool()>& cancelled, const std::vector<std::string>* written) {
  bool cancelled_late = false;
  attempt_.run([&] {
    std::uint64_t total = 0;
    const std::string text = state_json(extra, crcs, total).dump(1) + "\n";
    st::io::write_text_synced((tmp_ / kStateFile).string(), text);
    total += text.size();
    result_.bytes = total;
    st::io::sync_dir(tmp_.string());
    cancelled_late = cancelled && cancelled();
    if (cancelled_late) {
      fs::remove_all(tmp_);
      return;
    }
    if (fs::exists(final_dir_)) remove_dir(final_dir_);
    fs::rename(tmp_, final_dir_);  // the commit: from here on the checkpoint exists
    st::io::sync_dir(root_.string());
    const fs::path latest_tmp = root_ / ".tmp-latest";
    st::io::write_text_synced(latest_tmp.string(), name_ + "\n");
    fs::rename(latest_tmp, root_ / "latest");
    st::io::sync_dir(root_.string());
    prune(keep, written);
  });
  return cancelled_late;
}

// After the commit: the step directories of an abandoned future, and those beyond --keep.
void CheckpointWriter::prune(int keep, const std::vector<std::string>* written) const {
  // Step directories beyond this one belong to a future this run abandoned (it resumed from an
  // earlier checkpoint): the save directory holds one trajectory, so a later resume cannot pick them.
  for (const std::string& d : step_dirs(root_))
    if (d > name_) remove_dir(root_ / d);
  if (keep > 0) {  // among the checkpoints this job wrote, when it says which (Note [One writer])
    std::vector<std::string> dirs;
    for (const std::string& d : step_dirs(root_))
      if (d == name_ || !written || std::find(written->begin(), written->end(), d) != written->end())
        dirs.push_back(d);
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < dirs.size(); ++i)
      if (dirs[i] != name_) remove_dir(root_ / dirs[i]);
  }
}

SaveResult CheckpointWriter::save(const nlohmann::json& extra, int keep, const std::function<bool()>& cancelled,
                                  const std::vector<std::string>* written) {
  const auto t0 = Clock::now();
  result_.dir = final_dir_.string();
  prepare();
  agree(attempt_.code(rank_), "prepare the checkpoint directory");
  // ---- 2. every rank writes its range (Note [Checkpoint ranges]) ----
  const std::int64_t pb = layout_.partition_begin(rank_), pe = layout_.partition_end(rank_);
  const std::int64_t wb = layout_.to_logical(pb), we = layout_.to_logical(pe);  // logical
  const std::vector<FlatRun> runs = layout_.logical_runs(pb, pe);
  for (const FlatRun& run : runs)
    ZERO_CHECK(run.flat >= opt_.region_begin() && run.flat + run.length <= opt_.region_begin() + opt_.region_size(),
               "checkpoint: rank {} does not hold flat [{}, {})", rank_, run.flat, run.flat + run.length);
  const std::uint32_t shard_crc = write_shard(wb, we, runs);
  write_model_range(runs);
  // A failure anywhere stops every rank here; a cancellation on any rank abandons the checkpoint on all:
  // nothing was renamed yet, so the previous checkpoint stays the newest (Note [Preemption] in
  // examples/preemption.cpp).
  const bool cancel_here = attempt_.message.empty() && cancelled && cancelled();
  if (agree(std::max(attempt_.code(rank_), cancel_here ? 1.0 : 0.0), "write its part of the checkpoint") > 0.0) {
    if (rank_ == 0) fs::remove_all(tmp_);
    comm_.barrier();
    result_.cancelled = true;
    result_.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return result_;
  }
  // Every shard's CRC-32 to every rank (a 32-bit value is exact in a double).
  std::vector<std::uint32_t> crcs(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r)
    crcs[static_cast<std::size_t>(r)] =
        static_cast<std::uint32_t>(comm_.all_reduce_sum(r == rank_ ? static_cast<double>(shard_crc) : 0.0));
  const bool cancelled_late = rank_ == 0 && publish(extra, crcs, keep, cancelled, written);
  // The checkpoint is complete (or abandoned, or failed, as rank 0 says) on every rank's return. A
  // failure after the commit (pruning) leaves the new checkpoint complete and the newest.
  result_.cancelled = agree(std::max(attempt_.code(rank_), cancelled_late ? 1.0 : 0.0), "finish the checkpoint") > 0.0;
  result_.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result_;
}

SaveResult save(const std::string& save_dir, std::int64_t step, const ZeroOptimizer& opt, Communicator& comm,
                const nlohmann::json& extra, int keep, const std::function<bool()>& cancelled,
                const std::vector<std::string>* written) {
  return CheckpointWriter(save_dir, step, opt, comm).save(extra, keep, cancelled, written);
}

}  // namespace

SaveResult save_checkpoint(const std::string& save_dir, std::int64_t step, const ZeroOptimizer& opt,
                           Communicator& comm, const nlohmann::json& extra, int keep,
                           const std::function<bool()>& cancelled, const std::vector<std::string>* written) {
  return save(save_dir, step, opt, comm, extra, keep, cancelled, written);
}

// Note [One writer]
// ~~~~~~~~~~~~~~~~~
// Two jobs saving into one directory overwrite each other's `latest`, prune each other's checkpoints
// (--keep) and collide on the temporary names of a step both write. So a job that saves takes the
// directory first: rank 0 creates DIR/.lock with O_CREAT | O_EXCL (atomic: of two jobs exactly one
// creates it), holding the job's identity (host, pid of rank 0, start time, command), before any
// work; a second job then stops at start-up naming the lock and its owner. A lock whose owner is gone
// (same host, no process or a zombie with that pid: a job that was killed) is taken over with a
// warning; one from another host cannot be checked from here, and the message says to delete it if
// that job is gone. An owner still alive is watched for a few seconds first (kOwnerExitWait), so a job
// relaunched after a crash does not stop on the lock of its predecessor's last, still exiting, rank.
// (Two jobs taking over the same stale lock in the same instant can both succeed: the
// check-then-replace is not atomic. Starting two jobs on one directory at once is what the lock
// exists to stop, not a race it settles.) The lock goes at normal exit and on every error that
// unwinds (fail_job exits after the stack is unwound); a crash leaves it, stale, for the next job.
// --keep prunes only checkpoints this job wrote (the names save_checkpoint is given), so a resumed
// job never deletes the checkpoints of the run before it.

namespace {

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string slurp_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// "pid 1234 on host h (started 2025-01-01 10:00:00, command ...)", from a lock's text.
std::string describe_owner(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    return fmt::format("pid {} on host {} (started {}: {})", j.at("pid").get<long>(), j.at("host").get<std::string>(),
                       j.at("started").get<std::string>(), j.at("command").get<std::string>());
  } catch (const std::exception&) {
    return "an unknown owner (the lock file is not ours)";
  }
}

// True when the lock's owner is known to be gone: on this host, and its pid is no process or a zombie
// (a killed rank whose parent has not reaped it yet).
bool owner_gone(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.at("host").get<std::string>() != this_host()) return false;
    const auto pid = static_cast<pid_t>(j.at("pid").get<long>());
    if (pid <= 0) return false;
    if (::kill(pid, 0) != 0) return errno == ESRCH;
    // /proc/PID/stat: "pid (comm) S ...": the state letter follows the last ')'.
    const std::string stat = slurp_text(fmt::format("/proc/{}/stat", pid));
    const auto close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
  } catch (const std::exception&) {
    return false;
  }
}

// How long a lock whose owner is still alive is watched before the job gives up: a relaunch
// (scripts/launch.sh) may start while the killed job's last rank is still exiting.
constexpr auto kOwnerExitWait = std::chrono::seconds(5);

}  // namespace

SaveDirLock::SaveDirLock(const std::string& save_dir, const std::string& command)
    : path_((fs::path(save_dir) / ".lock").string()) {
  const std::time_t now = std::time(nullptr);
  char started[32];
  std::strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  text_ = nlohmann::json{{"host", this_host()}, {"pid", static_cast<long>(::getpid())}, {"started", started},
                         {"command", command}}.dump() + "\n";
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      try {
        st::io::pwrite_all(fd, text_.data(), text_.size(), 0, path_);
        st::io::sync_close(fd, path_);
      } catch (...) {
        ::unlink(path_.c_str());
        throw;
      }
      held_ = true;
      return;
    }
    ZERO_CHECK(errno == EEXIST, "--save-dir '{}': cannot create the lock '{}': {}", save_dir, path_, std::strerror(errno));
    std::string owner = slurp_text(path_);
    for (const auto until = std::chrono::steady_clock::now() + kOwnerExitWait;
         !owner_gone(owner) && std::chrono::steady_clock::now() < until;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      owner = slurp_text(path_);
      if (owner.empty() && !fs::exists(path_)) break;  // released meanwhile: create it again
    }
    if (!fs::exists(path_)) continue;
    if (attempt == 0 && owner_gone(owner)) {
      warning_ = fmt::format("warning: --save-dir '{}': taking over the lock '{}' of {}, a process that is gone", save_dir,
                             path_, describe_owner(owner));
      ::unlink(path_.c_str());
      continue;
    }
    throw Error(fmt::format("--save-dir '{}' is being written by another job: '{}' names {}; give another --save-dir, "
                            "or delete the lock if that job is gone", save_dir, path_, describe_owner(owner)));
  }
}

SaveDirLock::~SaveDirLock() {
  if (held_ && slurp_text(path_) == text_) ::unlink(path_.c_str());  // still ours
}

std::string resolve_checkpoint(const std::string& path) {
  ZERO_CHECK(fs::exists(path), "checkpoint '{}' does not exist", path);
  ZERO_CHECK(fs::is_directory(path), "checkpoint '{}' is not a directory (give a checkpoint or save directory)",
             path);
  if (fs::exists(fs::path(path) / kStateFile)) return path;
  // A save directory: the newest complete step directory. Directories get their step_ name only by
  // the rename after all their files are on disk, so every one of them is complete.
  std::string best;
  std::ifstream latest(fs::path(path) / "latest");
  std::string named;
  if (latest >> named && is_step_dir(named) && fs::exists(fs::path(path) / named / kStateFile)) best = named;
  for (const std::string& d : step_dirs(path))
    if (d > best && fs::exists(fs::path(path) / d / kStateFile)) best = d;
  ZERO_CHECK(!best.empty(), "'{}' holds no checkpoint (no state.json, no complete step_* directory)", path);
  return (fs::path(path) / best).string();
}

// Note [One resolution]
// ~~~~~~~~~~~~~~~~~~~~~
// "The newest checkpoint in DIR" is a question about a moment: a job still saving into DIR (or the
// ranks of this job starting seconds apart) gives different answers to ranks that ask at different
// moments, and ranks that load different steps train a mixed model from mixed data positions without
// any error. So one rank asks (rank 0) and every rank takes its answer; then open_checkpoint compares
// the state.json every rank actually read (its CRC-32, which covers every file's checksum), so a
// checkpoint rewritten between the ranks' reads also stops the job, with one line, before training.

std::string resolve_checkpoint(const std::string& path, Communicator& comm) {
  std::string answer, error;
  if (comm.rank() == 0) {
    try {
      answer = resolve_checkpoint(path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Rank 0's text (the directory, or its error) as doubles over the control all-reduce: the other
  // ranks add zeros. The length's sign says which of the two it is.
  const std::string& text = error.empty() ? answer : error;
  const double n = comm.all_reduce_sum(comm.rank() != 0 ? 0.0 : error.empty() ? double(text.size()) : -double(text.size()) - 1);
  std::vector<double> bytes(static_cast<std::size_t>(n >= 0 ? n : -n - 1), 0.0);
  if (comm.rank() == 0)
    for (std::size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  comm.all_reduce_sum(bytes);
  std::string shared(bytes.size(), '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) shared[i] = static_cast<char>(static_cast<unsigned char>(bytes[i]));
  if (n < 0) throw Error(shared);  // every rank fails with rank 0's message: the job prints it once
  return shared;
}

nlohmann::json read_state(const std::string& dir) {
  const fs::path state_path = fs::path(dir) / kStateFile;
  ZERO_CHECK(fs::exists(state_path), "checkpoint '{}': state.json is missing", dir);
  nlohmann::json state;
  {
    std::ifstream in(state_path);
    ZERO_CHECK(in.good(), "checkpoint '{}': cannot read state.json", dir);
    try {
      state = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception&) {
      throw Error(fmt::format("checkpoint '{}': state.json is corrupt (not valid JSON)", dir));
    }
  }
  ZERO_CHECK(state.is_object() && state.contains("version") && state["version"].is_number_integer(),
             "checkpoint '{}': state.json has no format version", dir);
  const int version = state["version"].get<int>();
  ZERO_CHECK(version == kCheckpointVersion, "checkpoint '{}' has format version {}; this build reads version {}", dir,
             version, kCheckpointVersion);
  return state;
}

std::string saved_optimizer_type(const nlohmann::json& state, const std::string& dir) {
  if (!state.contains("optimizer_type")) return "adamw";  // written before Muon
  const auto type = state_value<std::string>(state, "optimizer_type", dir);
  ZERO_CHECK(type == "adamw" || type == "muon", "checkpoint '{}': state.json \"optimizer_type\" is \"{}\", not an "
             "optimizer this program knows (adamw or muon)", dir, type);
  return type;
}

Checkpoint open_checkpoint(const std::string& dir, Communicator* comm) {
  Checkpoint c;
  c.dir = dir;
  c.state = read_state(dir);
  if (comm && comm->world_size() > 1) {  // Note [One resolution]: the same state.json on every rank
    const std::string text = c.state.dump();
    const double crc = st::crc32(text.data(), text.size());
    const double hi = comm->all_reduce_max(crc), lo = -comm->all_reduce_max(-crc);
    ZERO_CHECK(hi == lo, "checkpoint '{}': the ranks read different state.json files (CRC-32 {:08x} and {:08x}): it "
               "was rewritten while this job started; is another job saving there?", dir,
               static_cast<std::uint32_t>(lo), static_cast<std::uint32_t>(hi));
  }
  const auto files = state_value<nlohmann::json>(c.state, "files", dir);
  ZERO_CHECK(files.is_object() && files.contains(kModelFile), "checkpoint '{}': state.json lists no {}", dir,
             kModelFile);
  for (const ShardRange& s : shard_ranges(c))
    ZERO_CHECK(files.contains(s.file), "checkpoint '{}': state.json has no checksum for '{}'", dir, s.file);
  // Presence and size on every rank (cheap), CRC-32 split over the ranks.
  std::vector<std::string> names;
  for (const auto& [f, info] : files.items()) {
    names.push_back(f);
    const fs::path p = fs::path(dir) / f;
    ZERO_CHECK(fs::exists(p), "checkpoint '{}': '{}' is missing", dir, f);
    const auto want = state_value<std::uint64_t>(info, "bytes", dir);
    const auto have = static_cast<std::uint64_t>(fs::file_size(p));
    ZERO_CHECK(have == want, "checkpoint '{}': '{}' is truncated or damaged ({} bytes, state.json says {})", dir, f,
               have, want);
  }
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world_size() : 1;
  double bad = 0.0;  // 1 + index of the first corrupt file this rank found
  for (std::size_t i = 0; i < names.size() && bad == 0.0; ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(world)) != rank) continue;
    const auto want = state_value<std::uint32_t>(files[names[i]], "crc32", dir);
    if (st::file_crc32((fs::path(dir) / names[i]).string()).first != want) bad = static_cast<double>(i + 1);
  }
  if (comm) bad = comm->all_reduce_max(bad == 0.0 ? 0.0 : static_cast<double>(names.size()) + 1.0 - bad);
  if (comm && bad > 0.0) bad = static_cast<double>(names.size()) + 1.0 - bad;  // back to the lowest index
  ZERO_CHECK(bad == 0.0, "checkpoint '{}': '{}' is corrupt (its CRC-32 differs from state.json's)", dir,
             names[static_cast<std::size_t>(bad) - 1]);
  return c;
}

void check_parameters(const Checkpoint& c, const std::vector<nn::NamedParameter>& params) {
  std::vector<const nn::NamedParameter*> mine;
  for (const nn::NamedParameter& p : params)
    if (p.tensor.requires_grad()) mine.push_back(&p);
  const auto theirs = state_value<nlohmann::json>(c.state, "params", c.dir);
  ZERO_CHECK(theirs.is_array(), "checkpoint '{}': state.json \"params\" is not a list", c.dir);
  for (std::size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    ZERO_CHECK(i < theirs.size(), "checkpoint '{}' has no parameter '{}' (it holds {} parameters, this model {})",
               c.dir, mine[i]->name, theirs.size(), mine.size());
    const auto name = state_value<std::string>(theirs[i], "name", c.dir);
    ZERO_CHECK(i < mine.size(), "checkpoint '{}' has parameter '{}', which this model lacks", c.dir, name);
    ZERO_CHECK(name == mine[i]->name, "checkpoint '{}': parameter {} is '{}' there but '{}' in this model", c.dir, i,
               name, mine[i]->name);
    const auto shape = state_value<Shape>(theirs[i], "shape", c.dir);
    ZERO_CHECK(shape == mine[i]->tensor.shape(),
               "checkpoint '{}': parameter '{}' has shape {} in the checkpoint but {} in this model", c.dir, name,
               shape_str(shape), shape_str(mine[i]->tensor.shape()));
  }
  // The model file must hold exactly these, as F32, back to back (Note [Checkpoint ranges]).
  st::Reader model((fs::path(c.dir) / kModelFile).string());
  std::uint64_t offset = 0;
  ZERO_CHECK(model.tensors().size() == mine.size(), "checkpoint '{}': {} holds {} tensors, expected {}", c.dir,
             kModelFile, model.tensors().size(), mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const st::TensorInfo& t = model.tensors()[i];
    ZERO_CHECK(t.name == mine[i]->name && t.dtype == DType::f32 && t.shape == mine[i]->tensor.shape() &&
                   t.begin == offset,
               "checkpoint '{}': {} entry '{}' does not match state.json", c.dir, kModelFile, t.name);
    offset = t.end;
  }
}

namespace {

// Note [Error-feedback checkpoints]: this rank's residual from its own shard when the checkpoint's
// layout is this run's; else the reason it is not, as the warning line.
LoadResult load_residual(const Checkpoint& c, ZeroOptimizer& opt, int rank, int world) {
  LoadResult result;
  const ZeroOptions& zo = opt.options();
  if (!zo.quantized_gradients_error_feedback) return result;
  std::string differs;  // "<what> <saved>, this run <now>"
  auto compare = [&](const char* what, const auto& saved, const auto& now) {
    if (differs.empty() && saved != now) differs = fmt::format("{} {}, this run {}", what, saved, now);
  };
  if (!c.state.contains("error_feedback")) {
    differs = "no residual: it was saved without zero_quantized_gradients_error_feedback";
  } else {
    const auto& ef = state_value<nlohmann::json>(c.state, "error_feedback", c.dir);
    compare("world size", state_value<int>(c.state, "world_size", c.dir), world);
    compare("ZeRO stage", state_value<int>(c.state, "zero_stage", c.dir), zo.stage);
    compare("dtype", state_value<std::string>(c.state, "dtype", c.dir), std::string(dtype_name(zo.dtype)));
    compare("reduce_bucket_size", state_value<std::int64_t>(ef, "reduce_bucket_size", c.dir), zo.reduce_bucket_size);
    compare("zero_quantized_gradients_block_size", state_value<std::int64_t>(ef, "quantized_gradients_block", c.dir),
            zo.quantized_gradients_block);
    compare("padded size", state_value<std::int64_t>(ef, "padded_numel", c.dir), opt.layout().padded_numel());
  }
  if (!differs.empty()) {
    result.warning = fmt::format("warning: checkpoint '{}': the error-feedback residual starts from zero, as in a "
                                 "fresh run: the checkpoint has {} (docs/checkpoint.md, \"Error feedback\")",
                                 c.dir, differs);
    return result;
  }
  const std::string file = (fs::path(c.dir) / shard_name(rank)).string();
  st::Reader r(file);
  const std::size_t values = opt.residual_values().size(), scales = opt.residual_scales().size();
  const st::TensorInfo* v = r.find("error_feedback_residual");
  const st::TensorInfo* s = r.find("error_feedback_scales");
  ZERO_CHECK(v && v->dtype == DType::i32 && static_cast<std::size_t>(v->numel()) == (values + 3) / 4,
             "checkpoint '{}': shard '{}' lacks an I32 'error_feedback_residual' of {} elements ({} int8 values)", c.dir,
             shard_name(rank), (values + 3) / 4, values);
  ZERO_CHECK(s && s->dtype == DType::f32 && static_cast<std::size_t>(s->numel()) == scales,
             "checkpoint '{}': shard '{}' lacks an F32 'error_feedback_scales' of {} elements", c.dir, shard_name(rank),
             scales);
  std::vector<std::int8_t> residual(values);
  std::vector<float> residual_scales(scales);
  r.read_data(v->begin, values, residual.data());
  r.read_f32(*s, 0, static_cast<std::int64_t>(scales), residual_scales.data());
  opt.set_residual(residual, residual_scales);
  result.residual_restored = true;
  return result;
}

}  // namespace

namespace {

// The shards must tile [0, Ψ): checked before anything is written.
void check_shards_tile(const Checkpoint& c, std::vector<ShardRange> sorted, std::int64_t numel) {
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  std::int64_t expect = 0;
  for (const ShardRange& s : sorted) {
    if (s.begin == s.end) continue;
    ZERO_CHECK(s.begin == expect && s.end > s.begin, "checkpoint '{}': shard '{}' covers [{}, {}), expected it to "
               "start at {}", c.dir, s.file, s.begin, s.end, expect);
    expect = s.end;
  }
  ZERO_CHECK(expect == numel, "checkpoint '{}': the shards cover [0, {}) of {} elements", c.dir, expect, numel);
}

// An open shard and the flat range it holds.
struct ShardSource {
  std::unique_ptr<st::Reader> reader;
  const ShardRange* range;
};

// The shards that overlap this rank's region [rb, re), opened, each checked to hold its tensors
// (exp_avg, exp_avg_sq, and master for a 16-bit run) at its range's length.
std::vector<ShardSource> open_overlapping_shards(const Checkpoint& c, const std::vector<ShardRange>& shards,
                                                 DType saved, std::int64_t rb, std::int64_t re) {
  std::vector<ShardSource> sources;
  for (const ShardRange& s : shards) {
    if (std::max(rb, s.begin) >= std::min(re, s.end)) continue;  // no overlap: never opened
    auto r = std::make_unique<st::Reader>((fs::path(c.dir) / s.file).string());
    for (const char* t : {"exp_avg", "exp_avg_sq"}) {
      const st::TensorInfo* info = r->find(t);
      ZERO_CHECK(info && info->numel() == s.end - s.begin, "checkpoint '{}': shard '{}' lacks a {}-element '{}'",
                 c.dir, s.file, s.end - s.begin, t);
    }
    if (saved != DType::f32) {
      const st::TensorInfo* info = r->find("master");
      ZERO_CHECK(info && info->numel() == s.end - s.begin, "checkpoint '{}': shard '{}' lacks a {}-element 'master'",
                 c.dir, s.file, s.end - s.begin);
    }
    sources.push_back({std::move(r), &s});
  }
  return sources;
}

// The optimizer's counters from state.json: steps, skipped steps, the loss scaler (fp16), and each
// parameter's own AdamW step count.
void restore_counters(const Checkpoint& c, ZeroOptimizer& opt, DType saved) {
  const auto& o = state_value<nlohmann::json>(c.state, "optimizer", c.dir);
  const auto& ls = state_value<nlohmann::json>(o, "loss_scaler", c.dir);
  const optim::LossScaler::State scaler{
      state_value<float>(ls, "scale", c.dir), state_value<int>(ls, "hysteresis_left", c.dir), state_value<std::int64_t>(ls, "iter", c.dir),
      state_value<std::int64_t>(ls, "last_overflow_iter", c.dir),
      ls.contains("skips_at_min") ? state_value<std::int64_t>(ls, "skips_at_min", c.dir) : 0};  // absent before it existed
  opt.restore_counters(state_value<std::int64_t>(o, "steps", c.dir), state_value<std::int64_t>(o, "skipped_steps", c.dir),
                       saved == DType::f16 ? &scaler : nullptr,
                       o.contains("consecutive_skipped_steps")  // absent before it existed
                           ? state_value<std::int64_t>(o, "consecutive_skipped_steps", c.dir)
                           : 0);
  // Parameters that went without gradients for some steps have fewer AdamW steps than the optimizer.
  std::vector<std::int64_t> param_steps = opt.param_steps();
  if (o.contains("param_steps")) {
    const auto& saved_steps = state_value<nlohmann::json>(o, "param_steps", c.dir);
    for (std::size_t i = 0; i < param_steps.size(); ++i)
      if (saved_steps.contains(opt.layout().params()[i].name))
        param_steps[i] = state_value<std::int64_t>(saved_steps, opt.layout().params()[i].name.c_str(), c.dir);
  }
  opt.set_param_steps(std::move(param_steps));
}

}  // namespace

std::vector<ReadRange> read_plan(const Checkpoint& c, std::int64_t rb, std::int64_t re) {
  const std::int64_t numel = state_value<std::int64_t>(c.state, "numel", c.dir);
  ZERO_CHECK(0 <= rb && rb <= re && re <= numel, "checkpoint '{}': region [{}, {}) is not within [0, {})", c.dir, rb,
             re, numel);
  const DType saved = parse_float_dtype(state_value<std::string>(c.state, "dtype", c.dir));
  const std::vector<ShardRange> shards = shard_ranges(c);
  check_shards_tile(c, shards, numel);
  const std::vector<ShardSource> sources = open_overlapping_shards(c, shards, saved, rb, re);
  std::vector<ReadRange> plan;
  std::vector<const char*> tensors = {"exp_avg", "exp_avg_sq"};
  if (saved != DType::f32) tensors.push_back("master");
  for (const char* t : tensors)  // the order of load_checkpoint's copy_overlap calls
    for (const ShardSource& s : sources) {
      const std::int64_t lo = std::max(rb, s.range->begin), hi = std::min(re, s.range->end);
      const st::TensorInfo& info = *s.reader->find(t);
      ZERO_CHECK(info.dtype == DType::f32, "checkpoint '{}': shard '{}' tensor '{}' is not F32", c.dir, s.range->file,
                 t);
      plan.push_back({s.range->file, t,
                      s.reader->data_start() + info.begin + 4 * static_cast<std::uint64_t>(lo - s.range->begin),
                      4 * static_cast<std::uint64_t>(hi - lo), lo, hi});
    }
  if (saved == DType::f32 && re > rb) {
    const st::Reader model((fs::path(c.dir) / kModelFile).string());
    plan.push_back({kModelFile, "data section", model.data_start() + 4 * static_cast<std::uint64_t>(rb),
                    4 * static_cast<std::uint64_t>(re - rb), rb, re});
  }
  return plan;
}

LoadResult load_checkpoint(const Checkpoint& c, ZeroOptimizer& opt, Communicator& comm) {
  opt.wait_for_params();  // an overlapped all-gather of the last step must not land on the loaded values
  const FlatLayout& layout = opt.layout();
  const std::int64_t numel = layout.numel();
  ZERO_CHECK(state_value<std::int64_t>(c.state, "numel", c.dir) == numel, "checkpoint '{}' holds {} parameter elements, "
             "this model {}", c.dir, state_value<std::int64_t>(c.state, "numel", c.dir), numel);
  // exp_avg is Muon's momentum for Muon's matrices, Adam's m otherwise: the optimizer cannot change.
  const std::string saved_optimizer = saved_optimizer_type(c.state, c.dir), mine = opt.options().muon ? "muon" : "adamw";
  ZERO_CHECK(saved_optimizer == mine, "checkpoint '{}' holds {} optimizer state and this run uses {}; resume with "
             "--optimizer {} (or start a new run with --init-from)", c.dir, saved_optimizer, mine, saved_optimizer);
  const DType saved = parse_float_dtype(state_value<std::string>(c.state, "dtype", c.dir));
  const std::vector<ShardRange> shards = shard_ranges(c);
  // This rank's region: the logical range [rb, re) of its real elements, held in `runs` of its flat
  // range [fb, fb + region_size) (Note [Checkpoint ranges]).
  const std::int64_t fb = opt.region_begin();
  const std::int64_t rb = layout.to_logical(fb), re = layout.to_logical(fb + opt.region_size());
  const std::vector<FlatRun> runs = layout.logical_runs(fb, fb + opt.region_size());
  check_shards_tile(c, shards, numel);
  const std::vector<ShardSource> sources = open_overlapping_shards(c, shards, saved, rb, re);
  st::Reader model((fs::path(c.dir) / kModelFile).string());

  // Copies the logical elements of shard tensor `tname` this rank holds into `dst` (fp32, [region_size]),
  // scattered into the runs: a run's logical element l goes to element l + at - run.logical.
  auto copy_overlap = [&](const Tensor& dst, const char* tname) {
    for (const ShardSource& s : sources)
      for (const FlatRun& run : runs) {
        const std::int64_t lo = std::max(run.logical, s.range->begin);
        const std::int64_t hi = std::min(run.logical + run.length, s.range->end);
        if (hi <= lo) continue;
        const std::int64_t at = run.flat - fb + (lo - run.logical);  // where lo goes in dst
        const st::TensorInfo& info = *s.reader->find(tname);
        for_host_chunks_write(dst, at, hi - lo, [&](float* p, std::int64_t first, std::int64_t n) {
          s.reader->read_f32(info, lo - s.range->begin + (first - at), n, p);
        });
      }
  };
  copy_overlap(opt.exp_avg(), "exp_avg");
  copy_overlap(opt.exp_avg_sq(), "exp_avg_sq");
  if (saved != DType::f32) {
    copy_overlap(opt.master(), "master");
  } else {
    // An fp32 run's master is its weights: model.safetensors' data section is logical [0, Ψ) of it.
    for (const FlatRun& run : runs) {
      const std::int64_t at = run.flat - fb;
      for_host_chunks_write(opt.master(), at, run.length, [&](float* p, std::int64_t first, std::int64_t n) {
        model.read_data(4 * static_cast<std::uint64_t>(run.logical + first - at),
                        static_cast<std::size_t>(n) * sizeof(float), p);
      });
    }
  }
  restore_counters(c, opt, saved);
  const LoadResult result = load_residual(c, opt, comm.rank(), comm.world_size());
  opt.sync_params_from_master();
  return result;
}

void load_weights(const std::string& path, const std::vector<nn::NamedParameter>& params, bool allow_non_finite) {
  ZERO_CHECK(fs::exists(path), "weights file '{}' does not exist", path);
  st::Reader r(path);
  // The names on one side only, all of them in the message (a whole block is a dozen tensors).
  std::vector<std::string> missing, extra;
  std::set<std::string> names;
  for (const nn::NamedParameter& p : params) {
    names.insert(p.name);
    if (p.tensor.requires_grad() && r.find(p.name) == nullptr) missing.push_back(p.name);
  }
  for (const st::TensorInfo& t : r.tensors())
    if (names.count(t.name) == 0) extra.push_back(t.name);
  const auto listed = [](const std::vector<std::string>& v) {
    return fmt::format("{} tensor(s) ('{}')", v.size(), fmt::join(v, "', '"));
  };
  ZERO_CHECK(missing.empty(), "'{}' lacks {} of this model: its model has another shape (give the model flags it was "
             "trained with)", path, listed(missing));
  ZERO_CHECK(extra.empty(), "'{}' holds {} this model lacks: its model has another shape (give the model flags it was "
             "trained with)", path, listed(extra));
  for (const nn::NamedParameter& p : params) {
    if (!p.tensor.requires_grad()) continue;
    const st::TensorInfo* t = r.find(p.name);
    ZERO_CHECK(t->dtype == DType::f32, "'{}': tensor '{}' is {}, expected F32", path, p.name, st::dtype_code(t->dtype));
    ZERO_CHECK(t->shape == p.tensor.shape(), "'{}': tensor '{}' has shape {} in the file but {} in this model", path,
               p.name, shape_str(t->shape), shape_str(p.tensor.shape()));
  }
  // Everything is read and checked before any parameter is written.
  std::vector<std::vector<float>> values;
  for (const nn::NamedParameter& p : params) {
    if (!p.tensor.requires_grad()) continue;
    const st::TensorInfo* t = r.find(p.name);
    std::vector<float>& host = values.emplace_back(static_cast<std::size_t>(t->numel()));
    r.read_f32(*t, 0, t->numel(), host.data());
    if (allow_non_finite) continue;
    const auto bad = std::find_if(host.begin(), host.end(), [](float v) { return !std::isfinite(v); });
    ZERO_CHECK(bad == host.end(), "'{}': tensor '{}' holds a non-finite value ({} at element {} of {}); training from "
               "it cannot work (--allow-non-finite-weights loads it anyway)", path, p.name, *bad,
               bad - host.begin(), host.size());
  }
  std::size_t i = 0;
  for (const nn::NamedParameter& p : params) {
    if (!p.tensor.requires_grad()) continue;
    Tensor dst = p.tensor;
    dst.copy_(Tensor::from_vector(values[i++], p.tensor.shape()));
  }
}

}  // namespace zero::dist
