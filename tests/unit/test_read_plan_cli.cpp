// The resume read plan (zero_explain --read-plan, dist::read_plan in distributed/run/read_plan.h)
// against an independent count: checkpoints saved by train_gpt (2 ranks, stage 2, fp32 and bf16),
// planned for loads at other world sizes and stages. Each rank's ranges sum to its region (its
// AdamW partition [r·P, (r+1)·P) cut at Ψ, P the padded Ψ / N with Ψ padded to a multiple of 2N; stage 0: all
// of [0, Ψ)) times 4 bytes times the three f32 tensors a load restores (exp_avg, exp_avg_sq, and the
// master: from the shards for bf16, model.safetensors for fp32); and at stages 1-3 the ranks' ranges
// together cover each tensor's payload, as the test reads it from the files' own safetensors headers,
// exactly once. A Muon checkpoint of a model of odd widths, saved with uneven partitions and gaps between
// parameters (stage 2 on 4 ranks, Note [Whole-matrix partitions]), and planned for other layouts: at stages 1-3 each rank's region
// is then the logical range of the real elements in its partition (zero_explain's per-partition "real",
// counted from the slices each rank owns, summed over the partitions before it), and the payloads are
// still covered exactly once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

// Byte range [first, end) in the file of each tensor's data, from the file's header (the safetensors
// format: 8-byte little-endian header length, the JSON header, then the data section).
std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> payloads(const fs::path& file) {
  std::uint64_t start = 0;
  const nlohmann::json h = zero::testing::safetensors_header(file, &start);
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> out;
  std::uint64_t data_end = start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& t = it.value();
    if (name == "__metadata__") continue;
    const std::uint64_t b = start + t["data_offsets"][0].get<std::uint64_t>(),
                        e = start + t["data_offsets"][1].get<std::uint64_t>();
    out[name] = {b, e};
    data_end = std::max(data_end, e);
  }
  out["data section"] = {start, data_end};
  return out;
}

class ReadPlanCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = zero::testing::make_test_dir("read_plan");
    std::string text;
    for (int i = 0; i < 300; ++i) text += "to be or not to be, that is the question " + std::to_string(i % 7) + "\n";
    std::ofstream(dir_ / "text.txt") << text;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

const std::string kModel = " --n-layer 2 --n-head 2 --n-embd 16 --block 16";
// Odd widths: Muon's layout starts a matrix after an odd number of elements one element later, a gap.
const std::string kModelWithGaps = " --n-layer 2 --n-head 3 --n-embd 9 --block 9";

// Checks the plan for loading `ckpt` of `model` at `world` ranks and `stage`; `master_in_shards`: a 16-bit
// checkpoint; `muon`: planned with --optimizer muon, whose layout at stages 1-3 keeps matrices whole
// (uneven partitions, and gaps in kModelWithGaps).
void check_plan(const std::string& data, const fs::path& ckpt, int world, int stage, bool master_in_shards,
                bool muon = false, const std::string& model = kModel) {
  const std::string what = "N " + std::to_string(world) + " stage " + std::to_string(stage) + (muon ? " muon" : "");
  const auto explain = zero::testing::run_command(
      zero::testing::bin_dir() + "/zero_explain" + data + model + " --world-size " + std::to_string(world) +
      " --zero-stage " + std::to_string(stage) + (muon ? " --optimizer muon" : "") + " --format json --read-plan " +
      ckpt.string());
  ASSERT_EQ(explain.exit_code, 0) << what << "\n" << explain.output;
  const nlohmann::json explained = nlohmann::json::parse(explain.output);
  const nlohmann::json plan = explained["read_plan"];
  // Muon's layout at stages 1-3 (uneven partitions, gaps or not): regions from its partitions.
  const bool whole_matrices = muon && stage > 0;
  const fs::path step = plan["checkpoint"].get<std::string>();
  std::ifstream state_in(step / "state.json");
  const std::int64_t psi = nlohmann::json::parse(state_in)["numel"].get<std::int64_t>();
  const std::int64_t padded = (psi + 2 * world - 1) / (2 * world) * (2 * world), P = padded / world;
  ASSERT_EQ(plan["ranks"].size(), static_cast<std::size_t>(world)) << what;
  // (file, tensor) -> the byte ranges every rank reads of it
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<std::uint64_t, std::uint64_t>>> reads;
  std::int64_t real_before = 0;  // Muon: real elements of the partitions before rank r
  for (int r = 0; r < world; ++r) {
    std::int64_t b = stage == 0 ? 0 : std::min(psi, r * P), e = stage == 0 ? psi : std::min(psi, (r + 1) * P);
    if (whole_matrices) {
      b = real_before;
      e = real_before += explained["partitions"][r]["real"].get<std::int64_t>();
    }
    const nlohmann::json& rank = plan["ranks"][r];
    EXPECT_EQ(rank["region_begin"].get<std::int64_t>(), b) << what << " rank " << r;
    EXPECT_EQ(rank["region_end"].get<std::int64_t>(), e) << what << " rank " << r;
    std::uint64_t bytes = 0;
    for (const auto& x : rank["reads"]) {
      bytes += x["bytes"].get<std::uint64_t>();
      const std::string file = x["file"], tensor = x["tensor"];
      EXPECT_EQ(tensor == "data section", file == "model.safetensors") << what;
      const bool known = tensor == "exp_avg" || tensor == "exp_avg_sq" ||
                         tensor == (master_in_shards ? "master" : "data section");
      EXPECT_TRUE(known) << what << " " << file << " " << tensor;
      reads[{file, tensor}].push_back(
          {x["offset"].get<std::uint64_t>(), x["offset"].get<std::uint64_t>() + x["bytes"].get<std::uint64_t>()});
    }
    EXPECT_EQ(bytes, static_cast<std::uint64_t>(e - b) * 4 * 3) << what << " rank " << r;
  }
  // Every tensor a load restores, in every file that holds one, covered exactly once by the ranks
  // together (stages 1-3) or by each rank (stage 0).
  for (const auto& entry : fs::directory_iterator(step)) {
    const std::string file = entry.path().filename().string();
    if (entry.path().extension() != ".safetensors") continue;
    for (const auto& [tensor, range] : payloads(entry.path())) {
      const bool restored = file == "model.safetensors" ? (tensor == "data section" && !master_in_shards)
                                                        : (tensor == "exp_avg" || tensor == "exp_avg_sq" ||
                                                           (tensor == "master" && master_in_shards));
      if (!restored) continue;
      auto ranges = reads[{file, tensor}];
      std::sort(ranges.begin(), ranges.end());
      std::uint64_t expect = range.first;
      for (const auto& [lo, hi] : ranges) {
        if (stage == 0) {
          EXPECT_EQ(lo, range.first) << what << " " << file << " " << tensor;  // each rank reads all of it
          EXPECT_EQ(hi, range.second) << what << " " << file << " " << tensor;
          expect = hi;
        } else {
          EXPECT_EQ(lo, expect) << what << " " << file << " " << tensor << ": a gap or an overlap";
          expect = hi;
        }
      }
      EXPECT_EQ(expect, range.second) << what << " " << file << " " << tensor;
      if (stage == 0) {
        EXPECT_EQ(ranges.size(), static_cast<std::size_t>(world)) << what;
      }
      reads.erase({file, tensor});
    }
  }
  EXPECT_TRUE(reads.empty()) << what << ": reads outside the restored tensors";
}

TEST_F(ReadPlanCli, EachRankReadsItsPartitionAndTheRanksReadEachPayloadOnce) {
  const std::string bin = zero::testing::bin_dir(), data = " --data " + (dir_ / "text.txt").string();
  for (const char* dtype : {"fp32", "bf16"}) {
    const fs::path ckpt = dir_ / (std::string("ck_") + dtype);
    const auto train = zero::testing::run_command(
        std::string(ZERO_MPIRUN) + " -np 2 " + bin + "/train_gpt" + data + kModel + " --batch 8 --dtype " + dtype +
        " --zero-stage 2 --steps 2 --save-every 2 --save-dir " + ckpt.string() +
        " --eval-iters 1 --sample 0 --threads 1");
    ASSERT_EQ(train.exit_code, 0) << train.output;
    const bool master_in_shards = std::string(dtype) != "fp32";
    for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{3, 1}, {1, 0}, {2, 0}, {4, 3}, {2, 2}})
      check_plan(data, ckpt, world, stage, master_in_shards);
  }
}

TEST_F(ReadPlanCli, MuonCheckpointsWithGapsAreReadAsLogicalRanges) {
  const std::string bin = zero::testing::bin_dir(), data = " --data " + (dir_ / "text.txt").string();
  const fs::path ckpt = dir_ / "ck_muon";
  const auto train = zero::testing::run_command(
      std::string(ZERO_MPIRUN) + " -np 4 " + bin + "/train_gpt" + data + kModelWithGaps + " --batch 8 --dtype bf16 " +
      "--optimizer muon --zero-stage 2 --steps 2 --save-every 2 --save-dir " + ckpt.string() +
      " --eval-iters 1 --sample 0 --threads 1");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  // The saving layout and the first planned one have gaps (zero_explain --optimizer muon says how many).
  for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{4, 2}, {3, 1}}) {
    const auto explain = zero::testing::run_command(bin + "/zero_explain" + data + kModelWithGaps + " --optimizer muon " +
                                                    "--format json --world-size " + std::to_string(world) +
                                                    " --zero-stage " + std::to_string(stage));
    ASSERT_EQ(explain.exit_code, 0) << explain.output;
    ASSERT_GT(nlohmann::json::parse(explain.output)["muon"]["interior_padding"].get<std::int64_t>(), 0) << world;
  }
  for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{3, 1}, {1, 0}, {4, 3}, {2, 2}})
    check_plan(data, ckpt, world, stage, true, true, kModelWithGaps);
  // Planned without --optimizer muon: a resume keeps the checkpoint's optimizer, so that is one line.
  const auto adamw = zero::testing::run_command(bin + "/zero_explain" + data + kModelWithGaps +
                                                " --world-size 3 --zero-stage 1 --read-plan " + ckpt.string());
  EXPECT_NE(adamw.exit_code, 0) << adamw.output;
  EXPECT_EQ(zero::testing::error_lines(adamw.output), 1) << adamw.output;
  EXPECT_NE(adamw.output.find("pass --optimizer muon"), std::string::npos) << adamw.output;
}

TEST_F(ReadPlanCli, AnotherModelIsOneLine) {
  const std::string bin = zero::testing::bin_dir(), data = " --data " + (dir_ / "text.txt").string();
  const fs::path ckpt = dir_ / "ck";
  ASSERT_EQ(zero::testing::run_command(bin + "/train_gpt" + data + kModel + " --batch 2 --steps 1 --save-every 1 " +
                                       "--save-dir " + ckpt.string() + " --eval-iters 1 --sample 0 --threads 1")
                .exit_code,
            0);
  const auto r = zero::testing::run_command(bin + "/zero_explain" + data + " --n-layer 3 --n-head 2 --n-embd 16 " +
                                            "--block 16 --read-plan " + ckpt.string());
  EXPECT_EQ(r.exit_code, 1);
  // Ψ of the saved model: 22 characters, C = 16, T = 16: wte 22·16 + wpe 16·16 + 2 blocks of 12C² + 13C
  // (qkv, proj, fc, fc2 with biases, two norms) + lnf 2C = 352 + 256 + 2·3280 + 32.
  EXPECT_NE(r.output.find("holds 7200 parameter elements, the model given here"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

}  // namespace
