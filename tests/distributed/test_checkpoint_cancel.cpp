// save_checkpoint's cancellation (Note [Preemption] in examples/preemption.cpp): a cancel request on any
// one rank, once the files are written, or on rank 0 just before the commit, abandons the checkpoint on
// every rank; the previous checkpoint stays the newest and nothing of the abandoned one remains. The
// reference is what the directory holds, read independently of the library (file names and `latest`).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "distributed/run/checkpoint.h"
#include "distributed/comm/job_runtime.h"
#include "distributed/zero/zero_optimizer.h"
#include "nn/gpt.h"

namespace zero::dist {
namespace {

namespace fs = std::filesystem;

std::string read_latest(const fs::path& dir) {
  std::ifstream in(dir / "latest");
  std::string name;
  in >> name;
  return name;
}

// Every entry of `dir` except `latest` and the step directories in `keep`.
std::vector<std::string> leftovers(const fs::path& dir, const std::vector<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f != "latest" && std::find(keep.begin(), keep.end(), f) == keep.end()) out.push_back(f);
  }
  return out;
}

TEST(CheckpointCancel, ACancelOnAnyRankOrBeforeTheCommitAbandonsTheSaveEverywhere) {
  auto comm = mpi_world();
  const int rank = comm->rank(), world = comm->world_size();
  nn::GPTConfig cfg;
  cfg.vocab_size = 11;
  cfg.block_size = 8;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  Generator gen(7);
  nn::GPT model(cfg, gen);
  ZeroOptions o;
  o.stage = 2;
  ZeroOptimizer opt(model.named_parameters(), comm, o);
  // One directory for the job: rank 0's pid names it.
  const double pid = comm->all_reduce_max(rank == 0 ? static_cast<double>(::getpid()) : 0.0);
  const fs::path dir = fs::temp_directory_path() / ("zero_ckpt_cancel_" + std::to_string(static_cast<long>(pid)));
  if (rank == 0) fs::remove_all(dir);
  comm->barrier();

  const SaveResult first = save_checkpoint(dir.string(), 1, opt, *comm, {}, 0);
  EXPECT_FALSE(first.cancelled);

  // The last rank asks (as a second signal would): every rank hears the save was abandoned.
  const SaveResult on_one_rank =
      save_checkpoint(dir.string(), 2, opt, *comm, {}, 0, [&] { return rank == world - 1; });
  EXPECT_TRUE(on_one_rank.cancelled);
  comm->barrier();
  EXPECT_EQ(read_latest(dir), "step_00000001");
  EXPECT_EQ(leftovers(dir, {"step_00000001"}), std::vector<std::string>{});
  comm->barrier();  // every rank has looked before the next save starts

  // Rank 0 asks only at its second look, just before the rename.
  int asked = 0;
  const SaveResult late = save_checkpoint(dir.string(), 2, opt, *comm, {}, 0, [&] { return rank == 0 && ++asked == 2; });
  EXPECT_TRUE(late.cancelled);
  if (rank == 0) {
    EXPECT_EQ(asked, 2);
  }
  comm->barrier();
  EXPECT_EQ(read_latest(dir), "step_00000001");
  EXPECT_EQ(leftovers(dir, {"step_00000001"}), std::vector<std::string>{});
  comm->barrier();

  // Not asked: saved as usual.
  const SaveResult saved = save_checkpoint(dir.string(), 2, opt, *comm, {}, 0, [] { return false; });
  EXPECT_FALSE(saved.cancelled);
  comm->barrier();
  EXPECT_EQ(read_latest(dir), "step_00000002");
  EXPECT_TRUE(fs::exists(dir / "step_00000002" / "state.json"));
  comm->barrier();
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace zero::dist
