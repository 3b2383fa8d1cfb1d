// TrainingConfig: DeepSpeed-style JSON parsing, defaults, validation messages, unknown-key warnings and
// DeepSpeed's batch-size rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/check.h"
#include "distributed/run/config.h"

namespace zero::dist {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// The message of the zero::Error that fn throws; fails the test when it throws nothing.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected zero::Error";
  return "";
}

std::string parse_error(const json& j) {
  return error_of([&] { TrainingConfig::from_json(j); });
}

// A scratch folder under the system temp directory, removed afterwards.
class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("zero_config_test_") + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  std::filesystem::path dir_;
};

TEST(ConfigStage3, DeepSpeedKeysReachTheOptimizerAndRoundTrip) {
  // DeepSpeed configs write these as floats (5e7, 1e9): whole numbers are accepted.
  auto c = TrainingConfig::from_json(json::parse(
      R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e4, "stage3_max_live_parameters": 1e6}})"));
  EXPECT_TRUE(c.warnings.empty());
  const dist::ZeroOptions zo = c.zero_options();
  EXPECT_EQ(zo.stage, 3);
  EXPECT_EQ(zo.stage3_prefetch_bucket_size, 50'000);
  EXPECT_EQ(zo.stage3_max_live_parameters, 1'000'000);
  EXPECT_EQ(TrainingConfig::from_json(c.to_json()).zero_options().stage3_max_live_parameters, 1'000'000);
  // Unset: DeepSpeed's defaults.
  const dist::ZeroOptions d = TrainingConfig::from_json(json::object()).zero_options();
  EXPECT_EQ(d.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(d.stage3_max_live_parameters, 1'000'000'000);
}

TEST(ConfigWire, CommunicationDataTypeAndOverlapParamGather) {
  auto c = TrainingConfig::from_json(json::parse(
      R"({"fp16": {"enabled": true}, "communication_data_type": "fp32",
          "zero_optimization": {"stage": 2, "overlap_param_gather": true}})"));
  EXPECT_EQ(c.communication_data_type, std::optional<std::string>("fp32"));
  EXPECT_TRUE(c.zero_optimization.overlap_param_gather);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(TrainingConfig::from_json(c.to_json()).communication_data_type, std::optional<std::string>("fp32"));
  EXPECT_EQ(TrainingConfig::from_json(json::parse(R"({"bf16": {"enabled": true}, "communication_data_type": "bf16"})"))
                .communication_data_type,
            std::optional<std::string>("bf16"));
  EXPECT_THAT(parse_error(json::parse(R"({"communication_data_type": "fp8"})")),
              AllOf(HasSubstr("'communication_data_type'"), HasSubstr("fp8")));
  EXPECT_THAT(parse_error(json::parse(R"({"bf16": {"enabled": true}, "communication_data_type": "fp16"})")),
              AllOf(HasSubstr("'communication_data_type'"), HasSubstr("bf16 model")));
  EXPECT_THAT(parse_error(json::parse(R"({"zero_optimization": {"overlap_param_gather": 1}})")),
              HasSubstr("'zero_optimization.overlap_param_gather'"));
}

TEST(ConfigWire, QuantizedGradientsKeys) {
  // Any model dtype (int8 quantizes fp32 gradients too); the block size defaults to 256.
  for (const char* dtype : {"", R"("bf16": {"enabled": true},)"}) {
    const auto c = TrainingConfig::from_json(json::parse(
        std::string("{") + dtype +
        R"("zero_optimization": {"stage": 2, "zero_quantized_gradients": true,
            "zero_quantized_gradients_error_feedback": true}})"));
    const ZeroOptions zo = c.zero_options();
    EXPECT_EQ(zo.quantized_gradients_block, 256);
    EXPECT_TRUE(zo.quantized_gradients_error_feedback);
    EXPECT_EQ(TrainingConfig::from_json(c.to_json()).zero_options().quantized_gradients_block, 256);
  }
  const auto off = TrainingConfig::from_json(json::parse(
      R"({"zero_optimization": {"stage": 1, "zero_quantized_gradients_block_size": 64}})"));
  EXPECT_EQ(off.zero_options().quantized_gradients_block, 0) << "the block size alone does not turn it on";
  const auto on = TrainingConfig::from_json(json::parse(
      R"({"zero_optimization": {"stage": 1, "zero_quantized_gradients": true, "zero_quantized_gradients_block_size": 64}})"));
  EXPECT_EQ(on.zero_options().quantized_gradients_block, 64);
}

TEST(ConfigDefaults, EmptyObjectGivesDeepSpeedDefaults) {
  const TrainingConfig c = TrainingConfig::from_json(json::object());
  EXPECT_FALSE(c.train_batch_size);
  EXPECT_FALSE(c.train_micro_batch_size_per_gpu);
  EXPECT_FALSE(c.gradient_accumulation_steps);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.zero_optimization.stage, 0);
  // Unset: the automatic size (dist::default_bucket_size), chosen once Ψ is known.
  EXPECT_FALSE(c.zero_optimization.reduce_bucket_size.has_value());
  EXPECT_FALSE(c.zero_optimization.allgather_bucket_size.has_value());
  EXPECT_TRUE(c.zero_optimization.reduce_scatter);
  EXPECT_TRUE(c.zero_optimization.contiguous_gradients);
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  EXPECT_FALSE(c.zero_optimization.overlap_param_gather);
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_FALSE(c.optimizer);
  EXPECT_FALSE(c.scheduler);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(c.model_dtype(), DType::f32);
  EXPECT_EQ(c.world_size(), 0);
}

TEST(ConfigParse, EveryKey) {
  const json j = json::parse(R"({
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4,
    "gradient_clipping": 0.5,
    "fp16": {"enabled": true, "loss_scale": 128, "initial_scale_power": 12, "loss_scale_window": 500,
             "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.25},
    "bf16": {"enabled": false},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 1000, "allgather_bucket_size": 2000,
                          "reduce_scatter": false, "contiguous_gradients": false, "overlap_comm": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                                              "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10, "total_num_steps": 100,
                                                      "cos_min_ratio": 0.1, "warmup_type": "linear"}}
  })");
  const TrainingConfig c = TrainingConfig::from_json(j);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 128.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_TRUE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 0.25);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.model_dtype(), DType::f16);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 1000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 2000);
  EXPECT_FALSE(c.zero_optimization.reduce_scatter);
  EXPECT_FALSE(c.zero_optimization.contiguous_gradients);
  EXPECT_TRUE(c.zero_optimization.overlap_comm);
  ASSERT_TRUE(c.optimizer);
  EXPECT_EQ(c.optimizer->type, "AdamW");
  EXPECT_EQ(c.optimizer->lr, 6e-4);
  EXPECT_EQ(c.optimizer->beta1, 0.8);
  EXPECT_EQ(c.optimizer->beta2, 0.95);
  EXPECT_EQ(c.optimizer->eps, 1e-6);
  EXPECT_EQ(c.optimizer->weight_decay, 0.1);
  ASSERT_TRUE(c.scheduler);
  EXPECT_EQ(c.scheduler->warmup_num_steps, 10);
  EXPECT_EQ(c.scheduler->total_num_steps, 100);
  EXPECT_EQ(c.scheduler->cos_min_ratio, 0.1);

  const optim::LossScalerConfig ls = c.loss_scaler_config();
  EXPECT_EQ(ls.loss_scale, 128.0f);
  EXPECT_EQ(ls.initial_scale_power, 12);
  EXPECT_EQ(ls.loss_scale_window, 500);
  EXPECT_EQ(ls.hysteresis, 3);
  EXPECT_TRUE(ls.consecutive_hysteresis);
  EXPECT_EQ(ls.min_loss_scale, 0.25f);
  const optim::LrSchedule sched = c.lr_schedule(6e-4);
  EXPECT_FLOAT_EQ(sched.lr, 6e-4f);
  EXPECT_FLOAT_EQ(sched.min_lr, 6e-5f);
  EXPECT_EQ(sched.warmup, 10);
  EXPECT_EQ(sched.total_steps, 100);
}

TEST(ConfigParse, Bf16AndItsOldName) {
  EXPECT_EQ(TrainingConfig::from_json({{"bf16", {{"enabled", true}}}}).model_dtype(), DType::bf16);
  const TrainingConfig old = TrainingConfig::from_json({{"bfloat16", {{"enabled", true}}}});
  EXPECT_EQ(old.model_dtype(), DType::bf16);
  EXPECT_TRUE(old.warnings.empty());
  EXPECT_THAT(parse_error({{"bf16", {{"enabled", true}}}, {"bfloat16", {{"enabled", true}}}}), HasSubstr("'bfloat16'"));
}

TEST(ConfigParse, AdamIsAcceptedCaseInsensitively) {
  for (const char* type : {"AdamW", "adamw", "Adam", "adam"}) {
    const TrainingConfig c = TrainingConfig::from_json({{"optimizer", {{"type", type}}}});
    ASSERT_TRUE(c.optimizer) << type;
    EXPECT_EQ(c.optimizer->type, type);
    EXPECT_EQ(c.optimizer->lr, 1e-3);  // FusedAdam / torch defaults when "params" is absent
    EXPECT_EQ(c.optimizer->beta1, 0.9);
    EXPECT_EQ(c.optimizer->beta2, 0.999);
    EXPECT_EQ(c.optimizer->eps, 1e-8);
    EXPECT_EQ(c.optimizer->weight_decay, 0.0);
  }
}

TEST(ConfigParse, NullMeansNotGiven) {
  const TrainingConfig c = TrainingConfig::from_json({{"train_batch_size", nullptr},
                                                      {"gradient_clipping", nullptr},
                                                      {"zero_optimization", {{"overlap_comm", nullptr}}}});
  EXPECT_FALSE(c.train_batch_size);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ConfigParse, FloatBucketSizesAcceptedWhenWhole) {
  // 5e8 is a JSON float; integer keys take whole floats.
  const TrainingConfig c = TrainingConfig::from_json(json::parse(
      R"({"zero_optimization": {"stage": 1.0, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8},
          "train_batch_size": 3.2e1})"));
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200'000'000);
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_THAT(parse_error(json::parse(R"({"zero_optimization": {"reduce_bucket_size": 1.5e0}})")),
              AllOf(HasSubstr("'zero_optimization.reduce_bucket_size'"), HasSubstr("whole number")));
  EXPECT_THAT(parse_error(json::parse(R"({"zero_optimization": {"reduce_bucket_size": 1e300}})")),
              AllOf(HasSubstr("'zero_optimization.reduce_bucket_size'"), HasSubstr("out of range")));
}

TEST(ConfigParse, DeprecatedBooleanZeroOptimization) {
  const TrainingConfig c = TrainingConfig::from_json({{"zero_optimization", true}});
  EXPECT_EQ(c.zero_optimization.stage, 1);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_THAT(c.warnings[0], HasSubstr("deprecated"));
  EXPECT_EQ(TrainingConfig::from_json({{"zero_optimization", false}}).zero_optimization.stage, 0);
}

// Every invalid value throws a zero::Error whose message names the key with its path.
TEST(ConfigInvalid, EachInvalidValueNamesItsKey) {
  struct Case {
    const char* json_text;
    const char* key;
    const char* says;  // a further piece of the message
  };
  const Case cases[] = {
      {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage",
       "stage 4 is not supported (stages 0, 1, 2, 3)"},
      {R"({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 0}})",
       "zero_optimization.stage3_max_live_parameters", ">= 1 element"},
      {R"({"zero_optimization": {"stage3_prefetch_bucket_size": -1}})", "zero_optimization.stage3_prefetch_bucket_size",
       ">= 0 elements"},
      {R"({"collective_timeout_s": 0})", "collective_timeout_s", "seconds > 0"},
      {R"({"collective_timeout_s": -1.5})", "collective_timeout_s", "seconds > 0"},
      {R"({"collective_timeout_s": "300"})", "collective_timeout_s", "expected a number"},
      {R"({"nonfinite_grads": "warn"})", "nonfinite_grads", "\"error\" or \"skip\""},
      {R"({"nonfinite_grads": true})", "nonfinite_grads", "expected a string"},
      {R"({"nonfinite_skip_limit": -1})", "nonfinite_skip_limit", ">= 0 (0 = never stop)"},
      {R"({"nonfinite_skip_limit": 1.5})", "nonfinite_skip_limit", "whole number"},
      {R"({"zero_optimization": {"stage": -1}})", "zero_optimization.stage", "not supported"},
      {R"({"zero_optimization": {"stage": "2"}})", "zero_optimization.stage", "expected an integer"},
      {R"({"zero_optimization": {"stage": 2.5}})", "zero_optimization.stage", "whole number"},
      {R"({"zero_optimization": {"reduce_bucket_size": 0}})", "zero_optimization.reduce_bucket_size", "> 0"},
      {R"({"zero_optimization": {"reduce_bucket_size": -5}})", "zero_optimization.reduce_bucket_size", "> 0"},
      {R"({"zero_optimization": {"allgather_bucket_size": 0}})", "zero_optimization.allgather_bucket_size", "even"},
      {R"({"zero_optimization": {"allgather_bucket_size": 1001}})", "zero_optimization.allgather_bucket_size", "even"},
      {R"({"zero_optimization": {"allgather_bucket_size": -2}})", "zero_optimization.allgather_bucket_size", "> 0"},
      {R"({"zero_optimization": {"reduce_scatter": 1}})", "zero_optimization.reduce_scatter", "true or false"},
      {R"({"zero_optimization": {"contiguous_gradients": "yes"}})", "zero_optimization.contiguous_gradients",
       "true or false"},
      {R"({"zero_optimization": {"overlap_comm": "auto"}})", "zero_optimization.overlap_comm", "true or false"},
      {R"({"zero_optimization": [2]})", "zero_optimization", "expected an object"},
      {R"({"zero_optimization": {"zero_quantized_gradients_block_size": 0}})",
       "zero_optimization.zero_quantized_gradients_block_size", "[1, 1048576]"},
      {R"({"zero_optimization": {"zero_quantized_gradients_block_size": 1048577}})",
       "zero_optimization.zero_quantized_gradients_block_size", "[1, 1048576]"},
      {R"({"zero_optimization": {"zero_quantized_gradients": "yes"}})", "zero_optimization.zero_quantized_gradients",
       "true or false"},
      {R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients_error_feedback": true}})",
       "zero_optimization.zero_quantized_gradients_error_feedback", "needs zero_optimization.zero_quantized_gradients"},
      {R"({"zero_optimization": {"zero_quantized_gradients": true}})", "zero_optimization.zero_quantized_gradients",
       "needs stage 1, 2 or 3"},
      {R"({"zero_optimization": {"stage": 1, "reduce_scatter": false, "zero_quantized_gradients": true}})",
       "zero_optimization.zero_quantized_gradients", "needs reduce_scatter = true"},
      {R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "zero_quantized_gradients": true,
          "reduce_scatter_with_fp32_accumulation": true}})",
       "zero_optimization.zero_quantized_gradients", "choose one"},
      {R"({"bf16": {"enabled": true}, "communication_data_type": "fp32",
          "zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})",
       "zero_optimization.zero_quantized_gradients", "communication_data_type"},
      {R"({"train_batch_size": 0})", "train_batch_size", ">= 1"},
      {R"({"train_batch_size": -8})", "train_batch_size", ">= 1"},
      {R"({"train_batch_size": "auto"})", "train_batch_size", "expected an integer"},
      {R"({"train_micro_batch_size_per_gpu": -1})", "train_micro_batch_size_per_gpu", ">= 1"},
      {R"({"gradient_accumulation_steps": 0})", "gradient_accumulation_steps", ">= 1"},
      {R"({"gradient_clipping": -1.0})", "gradient_clipping", ">= 0"},
      {R"({"gradient_clipping": true})", "gradient_clipping", "expected a number"},
      {R"({"fp16": {"enabled": "true"}})", "fp16.enabled", "true or false"},
      {R"({"fp16": {"loss_scale": -1}})", "fp16.loss_scale", ">= 0"},
      {R"({"fp16": {"initial_scale_power": 200}})", "fp16.initial_scale_power", "[0, 127]"},
      {R"({"fp16": {"loss_scale_window": 0}})", "fp16.loss_scale_window", ">= 1"},
      {R"({"fp16": {"hysteresis": 0}})", "fp16.hysteresis", ">= 1"},
      {R"({"fp16": {"min_loss_scale": 0}})", "fp16.min_loss_scale", "> 0"},
      {R"({"fp16": true})", "fp16", "expected an object"},
      {R"({"bf16": {"enabled": 1}})", "bf16.enabled", "true or false"},
      {R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "bf16.enabled", "fp16.enabled"},
      {R"({"optimizer": {"type": "SGD"}})", "optimizer.type", "\"SGD\" is not supported"},
      {R"({"optimizer": {"params": {"lr": 0.1}}})", "optimizer.type", "required"},
      {R"({"optimizer": {"type": "AdamW", "params": {"lr": -0.1}}})", "optimizer.params.lr", ">= 0"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})", "optimizer.params.betas", "[beta1, beta2]"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}}})", "optimizer.params.betas", "[0, 1)"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, "x"]}}})", "optimizer.params.betas",
       "expected a number"},
      {R"({"optimizer": {"type": "AdamW", "params": {"eps": -1e-8}}})", "optimizer.params.eps", ">= 0"},
      {R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": -0.1}}})", "optimizer.params.weight_decay",
       ">= 0"},
      {R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})", "optimizer.params.adam_w_mode", "AdamW"},
      {R"({"scheduler": {"type": "OneCycle", "params": {"total_num_steps": 10}}})", "scheduler.type",
       "\"OneCycle\" is not supported"},
      {R"({"scheduler": {"type": "WarmupCosineLR"}})", "scheduler.params.total_num_steps", "required"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 0}}})",
       "scheduler.params.total_num_steps", ">= 1"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_num_steps": -1}}})",
       "scheduler.params.warmup_num_steps", ">= 0"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "cos_min_ratio": 2}}})",
       "scheduler.params.cos_min_ratio", "[0, 1]"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_type": "log"}}})",
       "scheduler.params.warmup_type", "linear"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_min_ratio": 0.1}}})",
       "scheduler.params.warmup_min_ratio", "only 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json_text);
    const std::string msg = parse_error(json::parse(c.json_text));
    EXPECT_THAT(msg, HasSubstr(std::string("invalid config key '") + c.key + "'"));
    EXPECT_THAT(msg, HasSubstr(c.says));
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line";
  }
  EXPECT_THAT(parse_error(json::array()), HasSubstr("top level"));
}

TEST(ConfigKeys, IgnoredDeepSpeedKeysWarnOnceWithTheirPath) {
  const TrainingConfig c = TrainingConfig::from_json(json::parse(R"({
    "steps_per_print": 10,
    "tensorboard": {"enabled": true, "anything": "goes"},
    "fp16": {"enabled": false, "auto_cast": false},
    "bf16": {"enabled": false, "immediate_grad_update": true},
    "zero_optimization": {"stage": 2, "stage3_param_persistence_threshold": 1e5, "offload_optimizer": {"device": "cpu"}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5, "last_batch_iteration": -1}}
  })"));
  EXPECT_EQ(c.zero_optimization.stage, 2);
  const auto ignored = [](const std::string& key) {
    return "warning: config key '" + key + "' is a DeepSpeed key zero.cpp ignores (docs/config.md, \"Ignored DeepSpeed keys\")";
  };
  EXPECT_THAT(c.warnings, ::testing::UnorderedElementsAre(
                              ignored("steps_per_print"), ignored("tensorboard"), ignored("fp16.auto_cast"),
                              ignored("bf16.immediate_grad_update"), ignored("zero_optimization.stage3_param_persistence_threshold"),
                              ignored("zero_optimization.offload_optimizer"), ignored("scheduler.params.last_batch_iteration")));
}

TEST(ConfigKeys, UnknownKeysAreErrorsWithASuggestion) {
  struct Case {
    const char* json_text;
    std::string says;
  };
  const std::vector<Case> cases = {
      // a swap, a missing letter, a wrong case: the nearest key of the same section
      {R"({"zero_optimization": {"stgae": 2}})",
       "unknown config key 'zero_optimization.stgae'; did you mean 'zero_optimization.stage'?"},
      {R"({"fp16": {"enabled": true, "loss_scale_windw": 10}})",
       "unknown config key 'fp16.loss_scale_windw'; did you mean 'fp16.loss_scale_window'?"},
      {R"({"Gradient_Clipping": 1.0})", "unknown config key 'Gradient_Clipping'; did you mean 'gradient_clipping'?"},
      {R"({"optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}}})",
       "unknown config key 'optimizer.params.weight_decy'; did you mean 'optimizer.params.weight_decay'?"},
      // a key of another section
      {R"({"stage": 2})", "unknown config key 'stage'; did you mean 'zero_optimization.stage'?"},
      {R"({"zero_optimization": {"gradient_clipping": 1.0}})",
       "unknown config key 'zero_optimization.gradient_clipping'; did you mean 'gradient_clipping'?"},
      // nothing near
      {R"({"zero_optimization": {"frobnicate": true}})", "unknown config key 'zero_optimization.frobnicate'"},
      // DeepSpeed keys that would change the numbers
      {R"({"prescale_gradients": true})",
       "config key 'prescale_gradients' is a DeepSpeed key zero.cpp does not implement; remove it"},
      {R"({"zero_optimization": {"stage": 2, "zero_quantized_weights": true}})",
       "config key 'zero_optimization.zero_quantized_weights' is a DeepSpeed key zero.cpp does not implement"},
  };
  for (const Case& c : cases) {
    const std::string msg = parse_error(json::parse(c.json_text));
    EXPECT_THAT(msg, HasSubstr(c.says)) << c.json_text;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line";
  }
  EXPECT_THAT(parse_error(json::parse(R"({"zero_optimization": {"frobnicate": true}})")),
              ::testing::Not(HasSubstr("did you mean")));
}

TEST(ConfigBatch, DerivesEachMissingOne) {
  const auto resolved = [](json j, int world) {
    TrainingConfig c = TrainingConfig::from_json(j);
    c.resolve_batch(world);
    c.validate();
    EXPECT_EQ(c.world_size(), world);
    return std::array<std::int64_t, 3>{*c.train_batch_size, *c.train_micro_batch_size_per_gpu,
                                       *c.gradient_accumulation_steps};
  };
  using A = std::array<std::int64_t, 3>;
  // all three given, consistent
  EXPECT_EQ(
      resolved({{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 2}},
               2),
      (A{16, 4, 2}));
  // train + micro -> GAS
  EXPECT_EQ(resolved({{"train_batch_size", 48}, {"train_micro_batch_size_per_gpu", 4}}, 3), (A{48, 4, 4}));
  // train + GAS -> micro
  EXPECT_EQ(resolved({{"train_batch_size", 48}, {"gradient_accumulation_steps", 2}}, 4), (A{48, 6, 2}));
  // micro + GAS -> train
  EXPECT_EQ(resolved({{"train_micro_batch_size_per_gpu", 3}, {"gradient_accumulation_steps", 5}}, 2), (A{30, 3, 5}));
  // train only -> GAS 1, micro = train / world
  EXPECT_EQ(resolved({{"train_batch_size", 12}}, 4), (A{12, 3, 1}));
  // micro only -> GAS 1, train = micro * world
  EXPECT_EQ(resolved({{"train_micro_batch_size_per_gpu", 12}}, 2), (A{24, 12, 1}));
}

TEST(ConfigBatch, RejectsInconsistentOnes) {
  TrainingConfig c = TrainingConfig::from_json(
      {{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 2}});
  const std::string msg = error_of([&] { c.resolve_batch(2); });
  EXPECT_THAT(msg, HasSubstr("'train_batch_size'"));
  EXPECT_THAT(msg, HasSubstr("train_batch_size (32)"));
  EXPECT_THAT(msg, HasSubstr("train_micro_batch_size_per_gpu (4)"));
  EXPECT_THAT(msg, HasSubstr("gradient_accumulation_steps (2)"));
  EXPECT_THAT(msg, HasSubstr("world_size (2) = 16"));
  EXPECT_EQ(c.world_size(), 0);  // unchanged on failure
  EXPECT_EQ(c.train_batch_size, 32);

  // Not divisible: GAS derives to 12 / 5 / 1 = 2, and 5 * 2 * 1 != 12.
  TrainingConfig d = TrainingConfig::from_json({{"train_batch_size", 12}, {"train_micro_batch_size_per_gpu", 5}});
  EXPECT_THAT(error_of([&] { d.resolve_batch(1); }), HasSubstr("gradient_accumulation_steps (2, derived)"));
  EXPECT_FALSE(d.gradient_accumulation_steps);
  // A key below 1 is refused naming it, before it divides the others (it used to divide by zero).
  for (const char* key : {"gradient_accumulation_steps", "train_micro_batch_size_per_gpu"}) {
    TrainingConfig z = TrainingConfig::parse_for_merge({{"train_batch_size", 12}, {key, 0}}, "q.json");
    EXPECT_THAT(error_of([&] { z.resolve_batch(1); }),
                HasSubstr(std::string("invalid config key '") + key + "' in q.json: must be >= 1, got 0"));
  }
  // train smaller than the world: micro derives to 0.
  TrainingConfig e = TrainingConfig::from_json({{"train_batch_size", 2}});
  EXPECT_THAT(error_of([&] { e.resolve_batch(4); }), HasSubstr("train_micro_batch_size_per_gpu (0, derived)"));
}

TEST(ConfigBatch, NeedsTrainOrMicro) {
  TrainingConfig none = TrainingConfig::from_json(json::object());
  EXPECT_THAT(error_of([&] { none.resolve_batch(1); }),
              AllOf(HasSubstr("'train_batch_size'"), HasSubstr("train_micro_batch_size_per_gpu")));
  TrainingConfig gas_only = TrainingConfig::from_json({{"gradient_accumulation_steps", 4}});
  EXPECT_THROW(gas_only.resolve_batch(1), Error);
  TrainingConfig ok = TrainingConfig::from_json({{"train_batch_size", 4}});
  EXPECT_THROW(ok.resolve_batch(0), Error);
}

TEST(ConfigValidate, RechecksAfterOverrides) {
  TrainingConfig c =
      TrainingConfig::from_json({{"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 2}});
  c.resolve_batch(2);
  c.validate();
  EXPECT_EQ(c.train_batch_size, 16);

  TrainingConfig stage = c;
  stage.zero_optimization.stage = 4;  // --zero-stage 4
  EXPECT_THAT(error_of([&] { stage.validate(); }), HasSubstr("stage 4 is not supported (stages 0, 1, 2, 3)"));

  TrainingConfig gas = c;
  gas.gradient_accumulation_steps = 4;  // --grad-accum 4 after resolution: train_batch_size no longer fits
  EXPECT_THAT(error_of([&] { gas.validate(); }), HasSubstr("train_batch_size (16)"));

  TrainingConfig bucket = c;
  bucket.zero_optimization.reduce_bucket_size = 0;  // --reduce-bucket-size 0
  EXPECT_THAT(error_of([&] { bucket.validate(); }), HasSubstr("'zero_optimization.reduce_bucket_size'"));

  TrainingConfig dtype = c;  // --dtype
  dtype.set_model_dtype(DType::bf16);
  EXPECT_EQ(dtype.model_dtype(), DType::bf16);
  dtype.validate();
  dtype.set_model_dtype(DType::f16);
  EXPECT_EQ(dtype.model_dtype(), DType::f16);
  EXPECT_FALSE(dtype.bf16.enabled);
  dtype.set_model_dtype(DType::f32);
  EXPECT_EQ(dtype.model_dtype(), DType::f32);
  EXPECT_THROW(dtype.set_model_dtype(DType::i32), Error);
  dtype.bf16.enabled = dtype.fp16.enabled = true;
  EXPECT_THAT(error_of([&] { dtype.validate(); }), HasSubstr("'bf16.enabled'"));
}

TEST(ConfigJson, ToJsonRoundTrips) {
  TrainingConfig c = TrainingConfig::from_json(json::parse(R"({
    "train_batch_size": 24, "gradient_clipping": 0.0,
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8, "overlap_comm": true},
    "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5, "total_num_steps": 50}}
  })"));
  const json before = c.to_json();
  EXPECT_TRUE(before["train_micro_batch_size_per_gpu"].is_null());  // not resolved yet
  c.resolve_batch(3);
  const json j = c.to_json();
  EXPECT_EQ(j["train_batch_size"], 24);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(j["gradient_accumulation_steps"], 1);
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 500'000'000);
  EXPECT_EQ(j["zero_optimization"]["stage"], 1);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_EQ(j["fp16"]["initial_scale_power"], 16);
  EXPECT_EQ(j["optimizer"]["params"]["betas"], json::array({0.9, 0.999}));
  EXPECT_EQ(j["scheduler"]["params"]["cos_min_ratio"], 1e-4);

  const TrainingConfig back = TrainingConfig::from_json(j);
  EXPECT_TRUE(back.warnings.empty());
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(TrainingConfig::from_json(before).to_json(), before);
}

TEST_F(ConfigFileTest, ReadsAFile) {
  const std::string path = write("ds.json", R"({
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "round_robin_gradients": true}
  })");
  const TrainingConfig c = TrainingConfig::from_file(path);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500'000'000);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_THAT(c.warnings[0], AllOf(HasSubstr("'zero_optimization.round_robin_gradients' in " + path), HasSubstr("ignores")));
}

TEST_F(ConfigFileTest, UnknownKeyNamesKeyAndFile) {
  const std::string path = write("typo.json", R"({"zero_optimization": {"stgae": 2}})");
  EXPECT_EQ(error_of([&] { TrainingConfig::from_file(path); }),
            "unknown config key 'zero_optimization.stgae' in " + path + "; did you mean 'zero_optimization.stage'?");
}

TEST_F(ConfigFileTest, MissingFile) {
  const std::string path = (dir_ / "nope.json").string();
  const std::string msg = error_of([&] { TrainingConfig::from_file(path); });
  EXPECT_THAT(msg, AllOf(HasSubstr(path), HasSubstr("does not exist")));
  EXPECT_THAT(error_of([&] { TrainingConfig::from_file(dir_.string()); }), HasSubstr("directory"));
}

TEST_F(ConfigFileTest, MalformedFile) {
  const std::string path = write("bad.json", "{\n  \"zero_optimization\": {\"stage\": 2,}\n}\n");
  const std::string msg = error_of([&] { TrainingConfig::from_file(path); });
  EXPECT_THAT(msg, AllOf(HasSubstr(path), HasSubstr("not valid JSON"), HasSubstr("line 2")));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_THAT(error_of([&] { TrainingConfig::from_file(write("empty.json", "")); }), HasSubstr("not valid JSON"));
}

TEST_F(ConfigFileTest, InvalidValueNamesKeyAndFile) {
  const std::string path = write("stage4.json", R"({"zero_optimization": {"stage": 4}})");
  const std::string msg = error_of([&] { TrainingConfig::from_file(path); });
  EXPECT_EQ(msg,
            "invalid config key 'zero_optimization.stage' in " + path + ": stage 4 is not supported (stages 0, 1, 2, 3)");
}

TEST_F(ConfigFileTest, DuplicateKeyIsAnError) {
  const std::string path = write("dup.json", R"({"zero_optimization": {"stage": 1, "stage": 2}})");
  EXPECT_THAT(error_of([&] { TrainingConfig::from_file(path); }),
              AllOf(HasSubstr("'zero_optimization.stage'"), HasSubstr("given twice"), HasSubstr(path)));
  // The same key in different objects is fine.
  const std::string ok = write("ok.json", R"({"fp16": {"enabled": false}, "bf16": {"enabled": false}})");
  EXPECT_NO_THROW(TrainingConfig::from_file(ok));
}

TEST(ConfigParse, ReliabilityKeys) {
  const TrainingConfig none = TrainingConfig::from_json(json::object());
  EXPECT_FALSE(none.collective_timeout_s.has_value());  // the communicator's default applies
  EXPECT_EQ(none.nonfinite_grads, "error");
  EXPECT_EQ(none.nonfinite_skip_limit, none.fp16.min_scale_skip_limit);  // fp16's default
  EXPECT_EQ(none.zero_options().nonfinite_skip_limit, 1);
  const TrainingConfig c = TrainingConfig::from_json(json::parse(R"({"collective_timeout_s": 12.5,
                                                                    "nonfinite_grads": "skip",
                                                                    "nonfinite_skip_limit": 7})"));
  ASSERT_TRUE(c.collective_timeout_s.has_value());
  EXPECT_EQ(*c.collective_timeout_s, 12.5);
  EXPECT_EQ(c.nonfinite_grads, "skip");
  EXPECT_EQ(c.nonfinite_skip_limit, 7);
  EXPECT_EQ(c.zero_options().nonfinite_skip_limit, 7);
  EXPECT_TRUE(c.warnings.empty());
  const TrainingConfig back = TrainingConfig::from_json(c.to_json());
  EXPECT_EQ(back.collective_timeout_s, c.collective_timeout_s);
  EXPECT_EQ(back.nonfinite_grads, "skip");
  EXPECT_EQ(back.nonfinite_skip_limit, 7);
  EXPECT_TRUE(TrainingConfig::from_json(json::parse(R"({"collective_timeout_s": null})")).warnings.empty());
}

}  // namespace
}  // namespace zero::dist
