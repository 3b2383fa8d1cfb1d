// MetaTensorScope (Note [Meta tensors] in core/storage.h): tensors with a shape and no data. The factories
// allocate nothing (the CPU allocator's own count), randn draws nothing from its generator (its next draw
// against a fresh generator's), reading throws, and an nn::GPT built under the scope has the parameters,
// shapes and decay flags of the same model built for real.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/check.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "nn/gpt.h"

namespace zero {
namespace {

TEST(MetaTensors, FactoriesAllocateNothingAndReadsThrow) {
  const std::size_t before = cpu_allocator_stats().in_use;
  Generator gen(7), fresh(7);
  {
    MetaTensorScope meta;
    EXPECT_TRUE(MetaTensorScope::active());
    // 4e12 bytes each: no machine here could hold one.
    const std::vector<Tensor> made = {Tensor::empty({1000000, 1000000}), Tensor::zeros({1000000, 1000000}),
                                      Tensor::ones({1000000, 1000000}), Tensor::randn({1000000, 1000000}, gen)};
    EXPECT_EQ(cpu_allocator_stats().in_use, before);
    for (const Tensor& t : made) {
      EXPECT_TRUE(t.storage()->meta());
      EXPECT_EQ(t.storage()->nbytes(), 4000000000000ull);
      EXPECT_EQ(t.shape(), (Shape{1000000, 1000000}));
      try {
        (void)t.item_at(0);
        ADD_FAILURE() << "a meta tensor was read";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("MetaTensorScope"), std::string::npos) << e.what();
      }
    }
    {
      MetaTensorScope nested;
      EXPECT_TRUE(Tensor::zeros({4}).storage()->meta());
    }
    EXPECT_TRUE(Tensor::zeros({4}).storage()->meta()) << "the outer scope is still alive";
  }
  EXPECT_FALSE(MetaTensorScope::active());
  EXPECT_EQ(gen.normal(0.0f, 1.0f), fresh.normal(0.0f, 1.0f)) << "randn drew from the generator";
  const Tensor real = Tensor::ones({4});
  EXPECT_FALSE(real.storage()->meta());
  EXPECT_EQ(real.item_at(3), 1.0f);
}

TEST(MetaTensors, AGptBuiltShapeOnlyHasTheRealModelsParameters) {
  std::vector<nn::GPTConfig> configs(3);
  configs[1].norm = "rmsnorm";
  configs[1].bias = false;
  configs[2].n_layer = 3;
  configs[2].n_head = 3;
  configs[2].n_embd = 24;
  configs[2].vocab_size = 11;
  for (const nn::GPTConfig& cfg : configs) {
    Generator g1(1), g2(1);
    const nn::GPT real(cfg, g1);
    const std::size_t before = cpu_allocator_stats().in_use;
    MetaTensorScope meta;
    const nn::GPT shaped(cfg, g2);
    EXPECT_EQ(cpu_allocator_stats().in_use, before) << cfg.to_json().dump();
    const auto want = real.named_parameters(), got = shaped.named_parameters();
    ASSERT_EQ(got.size(), want.size()) << cfg.to_json().dump();
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].name, want[i].name);
      EXPECT_EQ(got[i].tensor.shape(), want[i].tensor.shape()) << want[i].name;
      EXPECT_EQ(got[i].decay, want[i].decay) << want[i].name;
      EXPECT_EQ(got[i].tensor.requires_grad(), want[i].tensor.requires_grad()) << want[i].name;
      EXPECT_TRUE(got[i].tensor.storage()->meta()) << want[i].name;
    }
  }
}

}  // namespace
}  // namespace zero
