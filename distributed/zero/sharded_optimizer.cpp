#include "distributed/zero/sharded_optimizer.h"

#include "core/check.h"
#include "core/trace.h"
#include "optim/muon.h"

namespace zero::dist {

ShardedOptimizer::ShardedOptimizer(const ZeroPlan& plan, int rank, Tensor region_params)
    : plan_(plan),
      region_params_(std::move(region_params)),
      region_begin_(plan.region_begin(rank)),
      region_size_(plan.region_size(rank)),
      slices_(plan.region_slices(rank)),
      param_steps_(plan.layout.params().size(), 0) {
  ZERO_CHECK(region_params_.numel() == region_size_ && region_params_.is_contiguous(),
             "ShardedOptimizer: the range's parameters have {} elements, the plan's range {}", region_params_.numel(),
             region_size_);
  const Device device = region_params_.device();
  if (plan_.options.dtype == DType::f32) {
    master_ = region_params_;  // the model's own fp32 values: AdamW updates them in place
  } else {
    master_ = Tensor::empty({region_size_}, DType::f32, device);
    master_.copy_(region_params_);  // exact: every f16/bf16 value is an f32 value
  }
  exp_avg_ = Tensor::zeros({region_size_}, DType::f32, device);
  exp_avg_sq_ = Tensor::zeros({region_size_}, DType::f32, device);
  if (!plan_.options.muon) return;
  ZERO_CHECK(device == Device::cpu, "ZeRO: Muon's Newton–Schulz runs on the CPU only, the model is on {}",
             device_name(device));
  for (const ParamRange& p : plan_.layout.params()) {
    muon_.push_back(optim::is_muon_matrix(p.name, p.shape));
    // Stages 1-3: the plan kept every Muon matrix inside one partition (Note [Whole-matrix partitions]).
    ZERO_CHECK(!muon_.back() || plan_.options.stage == 0 || p.slices.size() <= 1,
               "ZeRO: Muon matrix '{}' is cut across {} partitions; the plan must keep it whole", p.name,
               p.slices.size());
  }
}

double ShardedOptimizer::bytes() const {
  const double separate_master = plan_.options.dtype == DType::f32 ? 0.0 : static_cast<double>(master_.nbytes());
  return separate_master + static_cast<double>(exp_avg_.nbytes() + exp_avg_sq_.nbytes());
}

void ShardedOptimizer::step(const Tensor& grad, float grad_factor, const std::vector<char>& stepped, float lr) {
  trace::Span span("adamw", "step");
  const ZeroOptions& o = plan_.options;
  for (std::size_t i = 0; i < stepped.size(); ++i)
    if (stepped[i]) ++param_steps_[i];
  const optim::AdamWHyper with_decay{lr, o.adam.beta1, o.adam.beta2, o.adam.eps, o.weight_decay};
  optim::AdamWHyper no_decay = with_decay;
  no_decay.weight_decay = 0.0f;
  const bool separate_master = o.dtype != DType::f32;
  for (const ParamSlice& s : slices_) {
    if (!stepped[s.param]) continue;  // Note [Unused parameters]
    const std::int64_t j = s.flat_offset - region_begin_;
    if (!muon_.empty() && muon_[s.param]) {  // the whole matrix, once, on the rank whose range holds it
      if (s.param_offset != 0) continue;
      const Shape& shape = plan_.layout.params()[s.param].shape;
      trace::Span ns("newton_schulz", "step");  // one per matrix this rank owns, once per optimizer step
      ns.arg("param", plan_.layout.params()[s.param].name);
      const optim::MuonHyper mh{lr, o.muon_momentum, s.decay ? o.weight_decay : 0.0f, true, o.muon_ns_steps};
      optim::muon_update(master_.data<float>() + j, element_ptr(grad, j), o.dtype, grad_factor,
                         exp_avg_.data<float>() + j, separate_master ? element_ptr(region_params_, j) : nullptr,
                         o.dtype, shape[0], shape[1], mh);
      continue;
    }
    optim::adamw_update(master_.device(), master_.data<float>() + j, element_ptr(grad, j), o.dtype, grad_factor,
                        exp_avg_.data<float>() + j, exp_avg_sq_.data<float>() + j,
                        separate_master ? element_ptr(region_params_, j) : nullptr, o.dtype, s.length,
                        s.decay ? with_decay : no_decay, param_steps_[s.param]);
  }
  // The parameters changed: layers must convert their 16-bit parameters again (Note [Compute copies]).
  region_params_.storage()->bump_version();
}

void ShardedOptimizer::write_master_to_params() {
  if (plan_.options.dtype != DType::f32) region_params_.copy_(master_);
  region_params_.storage()->bump_version();  // Note [Compute copies]
}

void ShardedOptimizer::reset_param_steps(std::int64_t steps) {
  std::fill(param_steps_.begin(), param_steps_.end(), steps);
}

void ShardedOptimizer::set_param_steps(std::vector<std::int64_t> steps, std::int64_t max_steps) {
  ZERO_CHECK(steps.size() == param_steps_.size(), "ZeRO: set_param_steps got {} counts for {} parameters", steps.size(),
             param_steps_.size());
  for (std::size_t i = 0; i < steps.size(); ++i)
    ZERO_CHECK(steps[i] >= 0 && steps[i] <= max_steps, "ZeRO: step count {} of parameter '{}' is outside [0, {}]",
               steps[i], plan_.layout.params()[i].name, max_steps);
  param_steps_ = std::move(steps);
}

}  // namespace zero::dist
