// The example configs under examples/configs/ (the README and docs/config.md point users at them):
// each one parses with no unknown key, validates, resolves its batch on the world sizes the README runs
// (1, 2, 4 ranks, train_gpt's default global batch 12 where the file gives none), and says what its name
// promises. Every *.json there must be listed here, so a new or renamed example cannot go untested.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "distributed/run/config.h"
#include "test_paths.h"

namespace zero::dist {
namespace {

struct Expected {
  int stage;
  DType dtype;
  bool reduce_scatter;
  int micro_per_rank;  // 0: the file gives no batch key (train_gpt's --batch applies)
  int gas;
};

// What each file is documented to be (README "Several ranks", docs/config.md "Example configs").
const std::map<std::string, Expected>& expected() {
  static const std::map<std::string, Expected> e = {
      {"zero1.json", {1, DType::f32, true, 0, 1}},
      {"zero1_allreduce.json", {1, DType::f32, false, 0, 1}},
      {"zero2_fp16.json", {2, DType::f16, true, 0, 1}},
      {"zero2_bf16_accum.json", {2, DType::bf16, true, 3, 2}},
  };
  return e;
}

std::filesystem::path config_dir() { return std::filesystem::path(zero::testing::example_config_dir()); }

TEST(ExampleConfigs, EveryFileIsKnown) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator(config_dir()))
    if (entry.path().extension() == ".json") found.push_back(entry.path().filename().string());
  std::sort(found.begin(), found.end());
  std::vector<std::string> known;
  for (const auto& [name, _] : expected()) known.push_back(name);
  EXPECT_EQ(found, known);
}

TEST(ExampleConfigs, LoadValidateAndMatchTheirNames) {
  for (const auto& [name, want] : expected()) {
    SCOPED_TRACE(name);
    const std::string path = (config_dir() / name).string();
    const TrainingConfig file = TrainingConfig::from_file(path);
    EXPECT_TRUE(file.warnings.empty()) << file.warnings.front();
    EXPECT_EQ(file.zero_optimization.stage, want.stage);
    EXPECT_EQ(file.model_dtype(), want.dtype);
    EXPECT_EQ(file.zero_optimization.reduce_scatter, want.reduce_scatter);
    EXPECT_DOUBLE_EQ(file.gradient_clipping, 1.0);
    if (want.dtype == DType::f16) {
      EXPECT_EQ(file.fp16.loss_scale, 0.0);  // dynamic loss scaling
      EXPECT_EQ(file.fp16.initial_scale_power, 16);
    }
    for (int world : {1, 2, 4}) {
      SCOPED_TRACE(world);
      TrainingConfig cfg = file;
      if (want.micro_per_rank == 0) {
        EXPECT_FALSE(cfg.train_batch_size || cfg.train_micro_batch_size_per_gpu);
        cfg.train_batch_size = 12;  // what train_gpt does with its default --batch
        cfg.gradient_accumulation_steps = cfg.gradient_accumulation_steps.value_or(1);
      }
      ASSERT_NO_THROW(cfg.resolve_batch(world));
      ASSERT_NO_THROW(cfg.validate());
      EXPECT_EQ(*cfg.gradient_accumulation_steps, want.gas);
      if (want.micro_per_rank > 0) {
        EXPECT_EQ(*cfg.train_micro_batch_size_per_gpu, want.micro_per_rank);
        EXPECT_EQ(*cfg.train_batch_size, want.micro_per_rank * want.gas * world);
      } else {
        EXPECT_EQ(*cfg.train_micro_batch_size_per_gpu * world, 12);
      }
    }
  }
}

}  // namespace
}  // namespace zero::dist
