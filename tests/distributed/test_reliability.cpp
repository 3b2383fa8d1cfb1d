// Reliability of the ZeRO optimizer: exception safety under injected faults, non-finite gradients,
// PyTorch's rule for parameters without a gradient, and error feedback's residual as optimizer state
// (skipped steps, failed backwards, checkpoints).
//
// Faults are injected consistently on every rank (the same call fails everywhere), by a Communicator
// wrapper that makes the k-th collective throw (before it starts, or after it finished), by user
// hooks that throw at the k-th firing, and by an op whose backward throws. After each failure the
// training loop does what a careful user would: calls backward() again (with a fresh forward) or
// step() again. The run must end bit-for-bit where a run without the fault ends (the reference:
// an independent clean run of the same program), and every rank must hold the same parameters.
// Models are tiny (a 70-parameter MLP) so the few hundred fault runs take seconds on 4 ranks. The tests run
// under mpirun and with the ranks as threads of one process (ZERO_DIST_TEST, tests/distributed/world.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/check.h"
#include "distributed/run/checkpoint.h"
#include "distributed/comm/inprocess_communicator.h"
#include "distributed/comm/job_runtime.h"
#include "distributed/zero/zero_optimizer.h"
#include "nn/module.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/distributed/world.h"

namespace zero::dist {
namespace {

constexpr const char* kInjected = "injected fault";

// Where a fault fires: at the `target`-th occurrence (0-based) of `site`, once.
struct Fault {
  std::string site = "none";  // collective, collective_wait, hook_before, hook_after, model_backward
  long target = -1;
  bool active = false;           // occurrences count only while active (not during construction)
  std::map<std::string, long> seen;  // occurrences per site so far

  bool select(const std::string& s) {
    if (!active) return false;
    const long n = seen[s]++;
    return s == site && n == target;
  }
  void maybe_throw(const std::string& s) {
    if (select(s)) throw Error(std::string(kInjected) + " at " + s);
  }
};

// A Work that finishes its collective, then reports failure (the "failed after it ran" fault).
class FailAfterWork final : public Work {
 public:
  explicit FailAfterWork(std::shared_ptr<Work> inner) : inner_(std::move(inner)) {}
  void wait() override {
    inner_->wait();
    throw Error(std::string(kInjected) + " at collective_wait");
  }
  bool is_completed() const override { return inner_->is_completed(); }

 private:
  std::shared_ptr<Work> inner_;
};

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() const override { return true; }
};

// Forwards every collective to `inner` (the job's MPI communicator), failing the selected one.
class FaultyCommunicator final : public Communicator {
 public:
  FaultyCommunicator(std::shared_ptr<Communicator> inner, std::shared_ptr<Fault> fault)
      : inner_(std::move(inner)), fault_(std::move(fault)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string_view backend_name() const override { return "faulty"; }
  void set_step(std::int64_t step) override {
    Communicator::set_step(step);
    inner_->set_step(step);
  }
  void set_quantized_gradients(std::size_t block) override {
    Communicator::set_quantized_gradients(block);
    inner_->set_quantized_gradients(block);
  }
  bool supports_quantized_gradients() const override { return inner_->supports_quantized_gradients(); }

 protected:
  std::shared_ptr<Work> issue_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    return run([&] { return inner_->all_reduce_async(buf, count, dtype, op); });
  }
  std::shared_ptr<Work> issue_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                                             DType dtype) override {
    return run([&] { return inner_->reduce_scatter_async(send, recv, counts, dtype); });
  }
  std::shared_ptr<Work> issue_all_gather(const void* send, void* recv, std::span<const std::size_t> counts,
                                         DType dtype) override {
    return run([&] { return inner_->all_gather_async(send, recv, counts, dtype); });
  }
  std::shared_ptr<Work> issue_reduce(void* buf, std::size_t count, DType dtype, int root) override {
    return run([&] {
      inner_->reduce(buf, count, dtype, root);
      return std::shared_ptr<Work>(std::make_shared<DoneWork>());
    });
  }
  std::shared_ptr<Work> issue_broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    return run([&] {
      inner_->broadcast(buf, count, dtype, root);
      return std::shared_ptr<Work>(std::make_shared<DoneWork>());
    });
  }
  std::shared_ptr<Work> issue_barrier() override {
    return run([&] {
      inner_->barrier();
      return std::shared_ptr<Work>(std::make_shared<DoneWork>());
    });
  }
  double control_all_reduce(double value, ReduceOp op) override {
    fault_->maybe_throw("collective");
    const bool fail_after = fault_->select("collective_wait");
    const double r = op == ReduceOp::sum ? inner_->all_reduce_sum(value) : inner_->all_reduce_max(value);
    if (fail_after) throw Error(std::string(kInjected) + " at collective_wait");
    return r;
  }
  void control_all_reduce_values(std::span<double> values, ReduceOp op) override {
    fault_->maybe_throw("collective");
    const bool fail_after = fault_->select("collective_wait");
    if (op == ReduceOp::sum)
      inner_->all_reduce_sum(values);
    else
      for (double& v : values) v = inner_->all_reduce_max(v);
    if (fail_after) throw Error(std::string(kInjected) + " at collective_wait");
  }

 private:
  std::shared_ptr<Work> run(const std::function<std::shared_ptr<Work>()>& issue) {
    fault_->maybe_throw("collective");
    const bool fail_after = fault_->select("collective_wait");
    std::shared_ptr<Work> work = issue();
    if (fail_after) return std::make_shared<FailAfterWork>(work);
    return work;
  }

  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<Fault> fault_;
};

bool injected(const Error& e) { return std::string(e.what()).find(kInjected) != std::string::npos; }

// A deterministic pseudo-random number in [0, 1) from a few integers (same on every rank).
double hash01(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t h =
      a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full ^ c * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 53);
}

// Identity whose backward runs fault->maybe_throw("model_backward"): an error inside the model's own
// backward (a shape error, say), raised after some parameters' hooks have already fired.
Tensor fragile(const Tensor& x, std::shared_ptr<Fault> fault) {
  Tensor out = x.detach().clone();
  autograd::record("fragile", {x}, out, [fault](const Tensor& g) -> std::vector<Tensor> {
    if (fault) fault->maybe_throw("model_backward");
    return {g};
  });
  return out;
}

// A two-layer MLP with a branch: Ψ = 35 + 7 + 21 + 7 = 70. `extra` is used when use_extra says so.
class Net : public nn::Module {
 public:
  static constexpr std::int64_t D = 5, H = 7, K = 3;
  Net() {
    Generator gen(11);
    w1 = register_parameter("w1", Tensor::randn({H, D}, gen, 0.0f, 0.5f), true);
    b1 = register_parameter("b1", Tensor::randn({H}, gen, 0.0f, 0.1f), false);
    w2 = register_parameter("w2", Tensor::randn({K, H}, gen, 0.0f, 0.5f), true);
    extra = register_parameter("extra", Tensor::randn({H}, gen, 0.0f, 0.1f), false);
  }
  // Rows [row0, row0 + rows) of step `step`'s global batch; row r uses `extra` when use_extra(r).
  Tensor loss(int step, std::int64_t row0, std::int64_t rows, const std::function<bool(std::int64_t)>& use_extra,
              std::shared_ptr<Fault> fault = nullptr, std::int64_t nan_row = -1) const {
    Tensor total;
    for (std::int64_t r = row0; r < row0 + rows; ++r) {
      std::vector<float> x(static_cast<std::size_t>(D));
      for (std::int64_t i = 0; i < D; ++i)
        x[static_cast<std::size_t>(i)] = static_cast<float>(2.0 * hash01(step, r, i) - 1.0);
      if (r == nan_row) x[0] = std::numeric_limits<float>::quiet_NaN();
      const std::vector<std::int64_t> y{static_cast<std::int64_t>(hash01(step, r, 99) * K)};
      Tensor h = gelu(linear(Tensor::from_vector(x, {1, D}), compute(w1), compute(b1)));
      h = fragile(h, fault);
      if (use_extra(r)) h = add(h, compute(extra));
      Tensor l = cross_entropy(linear(h, compute(w2), Tensor()), Tensor::from_indices(y, {1}));
      total = total.defined() ? add(total, l) : l;
    }
    return mul(total, 1.0f / static_cast<float>(rows));
  }
  Tensor w1, b1, w2, extra;
};

struct RunSetup {
  int stage = 1;
  int gas = 2;
  bool overlap = false;
  DType dtype = DType::f32;
  bool feedback = false;  // int8 gradients with error feedback (4-element blocks)
};

std::string describe(const RunSetup& s) {
  return fmt::format("stage {}, GAS {}, overlap {}, {}{}", s.stage, s.gas, s.overlap, dtype_name(s.dtype),
                     s.feedback ? ", error feedback" : "");
}

ZeroOptions options_for(const RunSetup& s) {
  ZeroOptions o;
  o.stage = s.stage;
  o.dtype = s.dtype;
  o.gradient_accumulation_steps = s.gas;
  o.overlap_comm = s.overlap;
  o.reduce_bucket_size = 24;
  o.allgather_bucket_size = 24;
  o.adam.lr = 3e-2f;
  o.weight_decay = 0.1f;
  o.gradient_clipping = 0.5f;
  o.fp16.initial_scale_power = 8;
  if (s.feedback) {
    o.quantized_gradients_block = 4;
    o.quantized_gradients_error_feedback = true;
  }
  return o;
}

struct Outcome {
  std::vector<float> params;  // the flat parameter buffer, as float
  std::vector<std::int64_t> param_steps;
  float loss_scale = 0;
  std::int64_t steps = 0, skipped = 0;
  std::map<std::string, long> seen;  // fault sites reached
  int faults = 0;                    // injected faults caught and retried
  std::vector<std::int8_t> residual;  // error feedback's residual and its scales
  std::vector<float> residual_scales;
};

// Trains `steps` steps of Net on every rank with faults from `fault`; each failed backward() is
// retried with a fresh forward, each failed step() is called again. `extra` is used on even steps.
// `between(net, step, g)` runs after micro-step g's backward (a user's own calls).
Outcome train(const RunSetup& s, std::shared_ptr<Fault> fault, int steps = 2,
              const std::function<void(Net&, int, int)>& between = {}) {
  auto world = test_world();
  auto comm = std::make_shared<FaultyCommunicator>(world, fault);
  const int n = comm->world_size(), rank = comm->rank();
  Net net;
  for (auto& p : net.named_parameters())
    autograd::register_post_accumulate_grad_hook(p.tensor, [fault](Tensor&) { fault->maybe_throw("hook_before"); });
  ZeroOptimizer opt(net.named_parameters(), comm, options_for(s));
  for (auto& p : net.named_parameters())
    autograd::register_post_accumulate_grad_hook(p.tensor, [fault](Tensor&) { fault->maybe_throw("hook_after"); });
  Outcome out;
  fault->active = true;
  for (int step = 0; step < steps; ++step) {
    auto use_extra = [step](std::int64_t) { return step % 2 == 0; };
    for (int g = 0; g < s.gas; ++g) {
      for (int attempt = 0;; ++attempt) {
        ZERO_CHECK(attempt < 3, "backward failed three times");
        try {
          opt.backward(net.loss(step, (std::int64_t{g} * n + rank) * 2, 2, use_extra, fault));
          if (between) between(net, step, g);
          break;
        } catch (const Error& e) {
          if (!injected(e)) throw;
          ++out.faults;
        }
      }
    }
    for (int attempt = 0;; ++attempt) {
      ZERO_CHECK(attempt < 3, "step failed three times");
      try {
        opt.step();
        break;
      } catch (const Error& e) {
        if (!injected(e)) throw;
        ++out.faults;
      }
    }
  }
  fault->active = false;
  out.params = opt.flat_params().to(DType::f32).to_vector();
  out.param_steps = opt.param_steps();
  out.loss_scale = opt.loss_scale();
  out.steps = opt.steps();
  out.skipped = opt.skipped_steps();
  out.seen = fault->seen;
  out.residual = opt.residual_values();
  out.residual_scales = opt.residual_scales();
  return out;
}

// Every rank holds rank 0's parameters, bit for bit.
void expect_replicas_identical(const std::vector<float>& params, const std::string& what) {
  std::vector<float> root = params;
  test_world()->broadcast(root.data(), root.size(), DType::f32, 0);
  EXPECT_EQ(params, root) << what << ": rank " << test_world()->rank() << " differs from rank 0";
}

// Max |a - b| over the buffer, against the clean run's scale.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-3;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return a.size() == b.size() ? diff / scale : std::numeric_limits<double>::infinity();
}

// =====================================================================================================
// Exception safety (Note [Exception safety] in distributed/zero/zero_optimizer.cpp)
// =====================================================================================================

// Trains `s` once for each occurrence of each of `sites` that its fault-free run `clean` saw, with a fault
// there alone, and hands each outcome to `check(faulted, what)`.
void for_each_single_fault(const RunSetup& s, const Outcome& clean, const std::vector<std::string>& sites,
                           const std::function<void(const Outcome&, const std::string&)>& check) {
  for (const std::string& site : sites) {
    const long total = clean.seen.count(site) ? clean.seen.at(site) : 0;
    ASSERT_GT(total, 0) << site << ", " << describe(s);
    for (long k = 0; k < total; ++k) {
      auto fault = std::make_shared<Fault>();
      fault->site = site;
      fault->target = k;
      const Outcome o = train(s, fault);
      const std::string what = fmt::format("{} #{} of {}, {}", site, k, total, describe(s));
      EXPECT_EQ(o.faults, 1) << what;
      check(o, what);
    }
  }
}

ZERO_DIST_TEST(ZeroFaults, EveryInjectedFaultLeavesTheRunAsWithoutIt) {
  const std::vector<RunSetup> setups = {{0, 2, false, DType::f32}, {0, 1, true, DType::f32},  {1, 2, true, DType::f32},
                                     {1, 1, false, DType::bf16}, {2, 2, true, DType::f32}, {2, 2, false, DType::f16}};
  const std::vector<std::string> sites = {"collective", "collective_wait", "hook_before", "hook_after",
                                          "model_backward"};
  int runs = 0, bitwise = 0;
  for (const RunSetup& s : setups) {
    const Outcome clean = train(s, std::make_shared<Fault>());
    expect_replicas_identical(clean.params, "clean, " + describe(s));
    for_each_single_fault(s, clean, sites, [&](const Outcome& o, const std::string& what) {
      EXPECT_LE(max_rel_diff(o.params, clean.params), 1e-6) << what;
      EXPECT_EQ(o.param_steps, clean.param_steps) << what;
      EXPECT_EQ(o.loss_scale, clean.loss_scale) << what;
      EXPECT_EQ(o.steps, clean.steps) << what;
      EXPECT_EQ(o.skipped, clean.skipped) << what;
      expect_replicas_identical(o.params, what);
      ++runs;
      bitwise += o.params == clean.params;
    });
  }
  if (test_world()->rank() == 0)
    std::printf("fault injection: %d faulted runs on %d rank(s), %d bitwise identical to the run without the fault\n",
                runs, test_world()->world_size(), bitwise);
}

ZERO_DIST_TEST(ZeroFaults, PlainBackwardOnTheModelChangesNothing) {
  // A user calls loss.backward() on a model ZeRO manages (between two micro-steps of an accumulation),
  // catches the error and goes on: the run must be the one without that call.
  for (int stage : {0, 1, 2}) {
    const RunSetup s{stage, 2, false, DType::f32};
    const Outcome clean = train(s, std::make_shared<Fault>());
    int refused = 0;
    const Outcome o = train(s, std::make_shared<Fault>(), 2, [&](Net& net, int step, int g) {
      if (g != 0) return;
      try {
        net.loss(step + 7, 0, 2, [](std::int64_t) { return true; }).backward();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("outside ZeroOptimizer::backward"), std::string::npos) << e.what();
        ++refused;
      }
      for (const auto& p : net.named_parameters()) EXPECT_FALSE(p.tensor.grad().defined()) << p.name;
    });
    EXPECT_EQ(refused, 2) << describe(s);
    EXPECT_EQ(o.params, clean.params) << describe(s);
    expect_replicas_identical(o.params, describe(s));
  }
}

// =====================================================================================================
// Non-finite gradients (Note [Non-finite gradients])
// =====================================================================================================

struct Plain {
  std::vector<float> params;
  std::vector<char> applied;
  std::vector<std::int64_t> param_steps;
  std::string error;
  int error_step = -1;
  std::int64_t skipped = 0, steps = 0;
};

// Trains Net for `steps` steps (2 rows per rank per micro-step); rows of step `nan_step` (and of every
// step nan_at says) on the last rank get a NaN input; step `skip` is left out entirely. Stops at the
// first error.
Plain run_plain(const ZeroOptions& o, int steps, const std::function<bool(int, std::int64_t)>& use_extra,
                int nan_step = -1, int skip = -1, const std::function<bool(int)>& nan_at = {}) {
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  Net net;
  ZeroOptimizer opt(net.named_parameters(), comm, o);
  Plain out;
  for (int step = 0; step < steps; ++step) {
    if (step == skip) continue;
    for (int g = 0; g < o.gradient_accumulation_steps; ++g) {
      const std::int64_t row0 = (std::int64_t{g} * n + rank) * 2;
      const bool nan = step == nan_step || (nan_at && nan_at(step));
      const std::int64_t nan_row = nan && rank == n - 1 && g == 0 ? row0 : -1;
      opt.backward(net.loss(step, row0, 2, [&](std::int64_t r) { return use_extra(step, r); }, nullptr, nan_row));
    }
    try {
      out.applied.push_back(opt.step());
    } catch (const Error& e) {
      out.error = e.what();
      out.error_step = step;
      break;
    }
  }
  out.params = opt.flat_params().to(DType::f32).to_vector();
  out.param_steps = opt.param_steps();
  out.skipped = opt.skipped_steps();
  out.steps = opt.steps();
  return out;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

ZERO_DIST_TEST(ZeroNonfinite, NanInOneRanksBatchStopsAtThatStep) {
  const auto always = [](int, std::int64_t) { return true; };
  for (DType dt : {DType::f32, DType::bf16})
    for (int stage : {0, 1, 2}) {
      ZeroOptions o = options_for({stage, 1, false, dt});
      const std::string what = fmt::format("stage {}, {}", stage, dtype_name(dt));
      const Plain before = run_plain(o, 2, always);  // steps 1 and 2 (1-based), clean
      const Plain r = run_plain(o, 5, always, /*nan_step=*/2);
      EXPECT_EQ(r.error_step, 2) << what;
      EXPECT_NE(r.error.find("step 3: non-finite gradient"), std::string::npos) << what << ": " << r.error;
      EXPECT_NE(r.error.find("'w1'"), std::string::npos) << what << ": " << r.error;
      EXPECT_EQ(r.applied, (std::vector<char>{1, 1})) << what;
      EXPECT_EQ(r.params, before.params) << what << ": the failed step changed the parameters";
      EXPECT_TRUE(all_finite(r.params)) << what;
      expect_replicas_identical(r.params, what);
    }
}

ZERO_DIST_TEST(ZeroNonfinite, SkipModeSkipsExactlyThatStep) {
  const auto always = [](int, std::int64_t) { return true; };
  for (DType dt : {DType::f32, DType::bf16})
    for (int stage : {0, 1, 2}) {
      ZeroOptions o = options_for({stage, 2, stage == 2, dt});
      o.nonfinite_grads = NonfiniteGrads::skip;
      o.nonfinite_skip_limit = 2;  // one skip in a row goes on
      const std::string what = fmt::format("stage {}, {}", stage, dtype_name(dt));
      const Plain r = run_plain(o, 5, always, /*nan_step=*/2);
      const Plain without = run_plain(o, 5, always, -1, /*skip=*/2);  // never sees step 3's batch
      EXPECT_TRUE(r.error.empty()) << what << ": " << r.error;
      EXPECT_EQ(r.applied, (std::vector<char>{1, 1, 0, 1, 1})) << what;
      EXPECT_EQ(r.skipped, 1) << what;
      EXPECT_EQ(r.steps, 4) << what;
      EXPECT_EQ(r.params, without.params) << what;
      EXPECT_TRUE(all_finite(r.params)) << what;
      expect_replicas_identical(r.params, what);
    }
}

// The nonfinite_skip_limit-th skipped step in a row stops training (NonfiniteSkipLimitError naming the
// step and the limit) with the step counted; an applied step in between starts the count again; 0
// never stops; the default is 1, fp16's min_scale_skip_limit default.
ZERO_DIST_TEST(ZeroNonfinite, SkipModeStopsAtTheLimitOfSkipsInARow) {
  const auto always = [](int, std::int64_t) { return true; };
  // Steps 1, 2 and 4 on (0-based) are non-finite: a run of 2 skips, then one of 5.
  const auto nan_at = [](int step) { return step == 1 || step == 2 || step >= 4; };
  EXPECT_EQ(ZeroOptions{}.nonfinite_skip_limit, optim::LossScalerConfig{}.min_scale_skip_limit);
  for (DType dt : {DType::f32, DType::bf16})
    for (int stage : {1, 2}) {
      ZeroOptions o = options_for({stage, 1, false, dt});
      o.nonfinite_grads = NonfiniteGrads::skip;
      const std::string what = fmt::format("stage {}, {}", stage, dtype_name(dt));
      for (const int limit : {1, 3}) {
        o.nonfinite_skip_limit = limit;
        const Plain r = run_plain(o, 9, always, -1, -1, nan_at);
        // limit 1 stops at the first skip (0-based step 1 = step 2); limit 3 rides out the run of two
        // and stops at the third skip of the second run (0-based step 6 = step 7).
        const int stop = limit == 1 ? 1 : 6;
        EXPECT_EQ(r.error_step, stop) << what << ", limit " << limit << ": " << r.error;
        EXPECT_NE(r.error.find(fmt::format("step {}: non-finite gradient (inf or NaN) on {} consecutive step(s), all "
                                           "skipped (nonfinite_skip_limit {})", stop + 1, limit, limit)),
                  std::string::npos)
            << what << ": " << r.error;
        EXPECT_EQ(r.skipped, limit == 1 ? 1 : 5) << what << ", limit " << limit;
        EXPECT_TRUE(all_finite(r.params)) << what;
      }
      o.nonfinite_skip_limit = 0;
      const Plain never = run_plain(o, 9, always, -1, -1, nan_at);
      EXPECT_TRUE(never.error.empty()) << what << ": " << never.error;
      EXPECT_EQ(never.skipped, 7) << what;
      EXPECT_EQ(never.steps, 2) << what;
    }
  ZeroOptions bad;
  bad.nonfinite_skip_limit = -1;
  Net net;
  try {
    ZeroOptimizer opt(net.named_parameters(), test_world(), bad);
    ADD_FAILURE() << "a negative nonfinite_skip_limit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nonfinite_skip_limit must be >= 0"), std::string::npos) << e.what();
  }
}

// =====================================================================================================
// Error feedback is optimizer state (Note [Error feedback state] in distributed/zero/gradient_reducer.cpp,
// Note [Error-feedback checkpoints] in distributed/run/checkpoint.cpp)
// =====================================================================================================

// int8 gradients with error feedback; a non-finite step is skipped however many come in a row; fp16
// with a static scale, so that a skipped step leaves the scale as it was.
ZeroOptions feedback_options(int stage, int gas, bool overlap, DType dt) {
  ZeroOptions o = options_for({stage, gas, overlap, dt, true});
  o.nonfinite_grads = NonfiniteGrads::skip;
  o.nonfinite_skip_limit = 0;
  if (dt == DType::f16) o.fp16.loss_scale = 64.0f;
  return o;
}

struct FeedbackRun {
  std::vector<float> params;  // every parameter, gathered, in layout order, as float
  std::vector<std::int8_t> residual;
  std::vector<float> residual_scales;
  std::vector<float> losses;  // this rank's loss of every micro-step trained
  std::vector<char> applied;
};

// Trains steps [from, to) of Net on `opt` (row pattern of the unused-parameter tests: `extra` on two
// rows in three); the last rank's first row of step `nan_step` is NaN; step `leave_out` is never seen.
void train_feedback(ZeroOptimizer& opt, const Net& net, int from, int to, FeedbackRun& out, int nan_step = -1,
                    int leave_out = -1) {
  auto comm = test_world();
  const int n = comm->world_size(), rank = comm->rank();
  const int gas = opt.options().gradient_accumulation_steps;
  for (int step = from; step < to; ++step) {
    if (step == leave_out) continue;
    for (int g = 0; g < gas; ++g) {
      const std::int64_t row0 = (std::int64_t{g} * n + rank) * 2;
      const std::int64_t nan_row = step == nan_step && rank == n - 1 && g == 0 ? row0 : -1;
      const Tensor loss = net.loss(step, row0, 2, [step](std::int64_t r) { return (step + r) % 3 != 0; }, nullptr,
                                   nan_row);
      if (step != nan_step) out.losses.push_back(loss.to(DType::f32).item());
      opt.backward(loss);
    }
    out.applied.push_back(opt.step());
  }
}

FeedbackRun finish(ZeroOptimizer& opt, const Net& net, FeedbackRun out) {
  opt.gather_parameters();
  out.params.clear();
  for (const auto& p : net.named_parameters()) {
    const std::vector<float> v = p.tensor.to(DType::f32).to_vector();
    out.params.insert(out.params.end(), v.begin(), v.end());
  }
  out.residual = opt.residual_values();
  out.residual_scales = opt.residual_scales();
  return out;
}

bool all_zero(const std::vector<std::int8_t>& v) {
  return std::all_of(v.begin(), v.end(), [](std::int8_t x) { return x == 0; });
}

struct FeedbackSetup {
  int gas;
  bool overlap;
  DType dtype;
};
const FeedbackSetup kFeedbackSetups[] = {{1, false, DType::f32}, {2, true, DType::bf16}, {2, false, DType::f16}};

// A run with a skipped step equals, bit for bit, the run that never saw that step's micro-batches:
// parameters, this rank's residual (values and scales) and every loss after it.
ZERO_DIST_TEST(ZeroErrorFeedback, ASkippedStepLeavesTheResidualAsIfItNeverHappened) {
  for (int stage : {1, 2, 3})
    for (const FeedbackSetup& s : kFeedbackSetups) {
      const ZeroOptions o = feedback_options(stage, s.gas, s.overlap, s.dtype);
      const std::string what = describe({stage, s.gas, s.overlap, s.dtype, true});
      FeedbackRun with, without;
      {
        Net net;
        ZeroOptimizer opt(net.named_parameters(), test_world(), o);
        train_feedback(opt, net, 0, 5, with, /*nan_step=*/2);
        with = finish(opt, net, with);
        EXPECT_EQ(opt.skipped_steps(), 1) << what;
      }
      {
        Net net;
        ZeroOptimizer opt(net.named_parameters(), test_world(), o);
        train_feedback(opt, net, 0, 5, without, -1, /*leave_out=*/2);
        without = finish(opt, net, without);
      }
      EXPECT_EQ(with.applied, (std::vector<char>{1, 1, 0, 1, 1})) << what;
      EXPECT_FALSE(all_zero(with.residual)) << what << ": error feedback kept nothing";
      EXPECT_EQ(with.residual, without.residual) << what;
      EXPECT_EQ(with.residual_scales, without.residual_scales) << what;
      EXPECT_EQ(with.params, without.params) << what;
      EXPECT_EQ(with.losses, without.losses) << what;
      EXPECT_TRUE(all_finite(with.params)) << what;
      expect_replicas_identical(with.params, what);
    }
}

// What error feedback holds, counted: the residual and its copy from the accumulation's start
// (memory().residual, twice the residual), and at stages 2/3 with GAS > 1 the per-backward copy next to
// the accumulated gradient's (memory().recovery).
ZERO_DIST_TEST(ZeroErrorFeedback, MemoryCountsTheResidualAndItsCopies) {
  for (int stage : {1, 2})
    for (int gas : {1, 2}) {
      const ZeroOptions o = feedback_options(stage, gas, false, DType::bf16);
      Net net;
      ZeroOptimizer opt(net.named_parameters(), test_world(), o);
      const double one = static_cast<double>(opt.residual_values().size()) +
                         4.0 * static_cast<double>(opt.residual_scales().size());
      EXPECT_EQ(opt.residual_values().size(), static_cast<std::size_t>(opt.layout().padded_numel()));
      EXPECT_DOUBLE_EQ(opt.memory().residual, 2 * one);
      EXPECT_DOUBLE_EQ(opt.plan().memory().residual, 2 * one);
      FeedbackRun r;
      train_feedback(opt, net, 0, 2, r);
      // bf16: the flat gradient (stage 1) or the partition gradient (stage 2)
      const double grad_copy = gas == 1 ? 0.0 : 2.0 * static_cast<double>(stage == 1 ? opt.layout().padded_numel()
                                                                                    : opt.region_size());
      const double residual_copy = gas > 1 && stage >= 2 ? one : 0.0;
      EXPECT_DOUBLE_EQ(opt.memory().recovery, grad_copy + residual_copy) << "stage " << stage << ", GAS " << gas;
      EXPECT_DOUBLE_EQ(opt.memory().residual, 2 * one);
    }
}

// A backward that fails anywhere (a collective before or after it ran, a hook, the model's backward)
// leaves the residual as it was, so the retried run ends where the run without the fault ends.
ZERO_DIST_TEST(ZeroErrorFeedback, AFailedBackwardLeavesTheResidualAsBefore) {
  const std::vector<RunSetup> setups = {{1, 2, false, DType::f32, true}, {2, 1, true, DType::bf16, true},
                                        {2, 2, false, DType::f32, true}, {2, 2, true, DType::bf16, true}};
  for (const RunSetup& s : setups) {
    const Outcome clean = train(s, std::make_shared<Fault>());
    ASSERT_FALSE(all_zero(clean.residual)) << describe(s);
    for_each_single_fault(s, clean, {"collective", "collective_wait", "hook_after", "model_backward"},
                          [&](const Outcome& o, const std::string& what) {
                            EXPECT_EQ(o.residual, clean.residual) << what;
                            EXPECT_EQ(o.residual_scales, clean.residual_scales) << what;
                            EXPECT_EQ(o.params, clean.params) << what;
                          });
  }
}

// A checkpoint directory every rank agrees on (rank 0's process id).
std::filesystem::path shared_temp_dir(const std::string& what) {
  double pid = test_world()->rank() == 0 ? static_cast<double>(::getpid()) : 0.0;
  pid = test_world()->all_reduce_sum(pid);
  return std::filesystem::temp_directory_path() /
         fmt::format("zero_ef_{}_{}_{}", static_cast<long>(pid), test_world()->world_size(), what);
}

// Saved after step 3 and resumed by a fresh optimizer at the same world size, stage and dtype, the run
// continues bit for bit as the uninterrupted one: parameters, residual, losses.
ZERO_DIST_TEST(ZeroErrorFeedback, ASameLayoutResumeIsBitwise) {
  auto comm = test_world();
  for (int stage : {1, 2, 3})
    for (const FeedbackSetup& s : kFeedbackSetups) {
      const ZeroOptions o = feedback_options(stage, s.gas, s.overlap, s.dtype);
      const std::string what = describe({stage, s.gas, s.overlap, s.dtype, true});
      const std::filesystem::path dir = shared_temp_dir(fmt::format("resume_{}_{}", stage, dtype_name(s.dtype)));
      FeedbackRun whole, first, resumed;
      {
        Net net;
        ZeroOptimizer opt(net.named_parameters(), comm, o);
        train_feedback(opt, net, 0, 5, whole, /*nan_step=*/1);
        whole = finish(opt, net, whole);
      }
      {
        Net net;
        ZeroOptimizer opt(net.named_parameters(), comm, o);
        train_feedback(opt, net, 0, 3, first, /*nan_step=*/1);
        first = finish(opt, net, first);
        save_checkpoint(dir.string(), 3, opt, *comm, nlohmann::json::object(), 0);
      }
      {
        Net net;
        ZeroOptimizer opt(net.named_parameters(), comm, o);
        const Checkpoint ckpt = open_checkpoint(resolve_checkpoint(dir.string()), comm.get());
        check_parameters(ckpt, net.named_parameters());
        const LoadResult loaded = load_checkpoint(ckpt, opt, *comm);
        EXPECT_TRUE(loaded.residual_restored) << what;
        EXPECT_EQ(loaded.warning, "") << what;
        EXPECT_EQ(opt.residual_values(), first.residual) << what;
        EXPECT_EQ(opt.residual_scales(), first.residual_scales) << what;
        resumed.losses = first.losses;
        train_feedback(opt, net, 3, 5, resumed);
        resumed = finish(opt, net, resumed);
      }
      comm->barrier();
      if (comm->rank() == 0) std::filesystem::remove_all(dir);
      EXPECT_FALSE(all_zero(whole.residual)) << what;
      EXPECT_EQ(resumed.residual, whole.residual) << what;
      EXPECT_EQ(resumed.residual_scales, whole.residual_scales) << what;
      EXPECT_EQ(resumed.params, whole.params) << what;
      EXPECT_EQ(resumed.losses, whole.losses) << what;
    }
}

// The count nonfinite_skip_limit compares against is saved too: a run saved right after a skipped step
// resumes with one skip in a row behind it, so it stops where the uninterrupted run would.
ZERO_DIST_TEST(ZeroNonfinite, TheSkipsInARowAreSavedInCheckpoints) {
  auto comm = test_world();
  const ZeroOptions o = feedback_options(2, 1, false, DType::bf16);
  const std::filesystem::path dir = shared_temp_dir("skips_in_a_row");
  {
    Net net;
    ZeroOptimizer opt(net.named_parameters(), comm, o);
    FeedbackRun r;
    train_feedback(opt, net, 0, 3, r, /*nan_step=*/2);
    ASSERT_EQ(opt.consecutive_skipped_steps(), 1);
    save_checkpoint(dir.string(), 2, opt, *comm, nlohmann::json::object(), 0);
  }
  Net net;
  ZeroOptimizer opt(net.named_parameters(), comm, o);
  load_checkpoint(open_checkpoint(resolve_checkpoint(dir.string()), comm.get()), opt, *comm);
  EXPECT_EQ(opt.consecutive_skipped_steps(), 1);
  EXPECT_EQ(opt.skipped_steps(), 1);
  EXPECT_EQ(opt.steps(), 2);
  comm->barrier();
  if (comm->rank() == 0) std::filesystem::remove_all(dir);
}

#ifdef ZERO_INPROCESS_TESTS
// Note [Error-feedback checkpoints]: at another world size, stage, dtype or bucket size the residual
// starts from zero, with one warning line naming the setting that differs; master, m and v are
// resharded as always (the parameters come back as saved). Worlds of several sizes in one test, so
// in-process only.
TEST(ZeroErrorFeedbackCheckpoint, AnotherLayoutStartsTheResidualFromZeroWithOneWarning) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("zero_ef_layout_{}", static_cast<long>(::getpid()));
  std::filesystem::remove_all(dir);
  const ZeroOptions saved = feedback_options(2, 1, false, DType::bf16);
  std::vector<float> saved_params;
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    Net net;
    ZeroOptimizer opt(net.named_parameters(), comm, saved);
    for (int step = 0; step < 2; ++step) {
      opt.backward(net.loss(step, comm->rank() * 2, 2, [](std::int64_t) { return true; }));
      opt.step();
    }
    save_checkpoint(dir.string(), 2, opt, *comm, nlohmann::json::object(), 0);
    if (comm->rank() == 0) saved_params = opt.flat_params().to(DType::f32).to_vector();
  });
  struct Case {
    int world, stage;
    std::int64_t bucket;
    DType dtype;
    std::string differs;  // "" = restored
  };
  const Case cases[] = {
      {2, 2, 24, DType::bf16, ""},
      {3, 2, 24, DType::bf16, "world size 2, this run 3"},
      {1, 2, 24, DType::bf16, "world size 2, this run 1"},
      {2, 1, 24, DType::bf16, "ZeRO stage 2, this run 1"},
      {2, 3, 24, DType::bf16, "ZeRO stage 2, this run 3"},
      {2, 2, 24, DType::f32, "dtype bf16, this run f32"},
      {2, 2, 16, DType::bf16, "reduce_bucket_size 24, this run 16"},
  };
  for (const Case& c : cases) {
    const std::string what = fmt::format("{} ranks, stage {}, bucket {}, {}", c.world, c.stage, c.bucket,
                                         dtype_name(c.dtype));
    run_ranks(c.world, [&](std::shared_ptr<Communicator> comm) {
      ZeroOptions o = feedback_options(c.stage, 1, false, c.dtype);
      o.reduce_bucket_size = c.bucket;
      Net net;
      ZeroOptimizer opt(net.named_parameters(), comm, o);
      const Checkpoint ckpt = open_checkpoint(resolve_checkpoint(dir.string()), comm.get());
      check_parameters(ckpt, net.named_parameters());
      const LoadResult loaded = load_checkpoint(ckpt, opt, *comm);
      EXPECT_EQ(loaded.residual_restored, c.differs.empty()) << what;
      if (c.differs.empty()) {
        EXPECT_EQ(loaded.warning, "") << what;
        EXPECT_FALSE(all_zero(opt.residual_values())) << what;
      } else {
        EXPECT_EQ(loaded.warning.rfind("warning: checkpoint '", 0), 0u) << what << ": " << loaded.warning;
        EXPECT_NE(loaded.warning.find("error-feedback residual starts from zero"), std::string::npos) << loaded.warning;
        EXPECT_NE(loaded.warning.find("the checkpoint has " + c.differs), std::string::npos) << what << ": "
                                                                                             << loaded.warning;
        EXPECT_EQ(loaded.warning.find('\n'), std::string::npos) << loaded.warning;
        EXPECT_TRUE(all_zero(opt.residual_values())) << what;
        EXPECT_TRUE(std::all_of(opt.residual_scales().begin(), opt.residual_scales().end(),
                                [](float x) { return x == 0.0f; }))
            << what;
      }
      opt.gather_parameters();
      if (c.dtype == DType::bf16) {
        std::vector<float> params;
        for (const auto& p : net.named_parameters()) {
          const std::vector<float> v = p.tensor.to(DType::f32).to_vector();
          params.insert(params.end(), v.begin(), v.end());
        }
        EXPECT_EQ(params, std::vector<float>(saved_params.begin(), saved_params.begin() + 70)) << what;
      }
      opt.backward(net.loss(2, comm->rank() * 2, 2, [](std::int64_t) { return true; }));
      EXPECT_TRUE(opt.step()) << what;
    });
  }
  // A run without error feedback ignores the saved residual, silently.
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    Net net;
    ZeroOptimizer opt(net.named_parameters(), comm, options_for({2, 1, false, DType::bf16}));
    const LoadResult loaded = load_checkpoint(open_checkpoint(resolve_checkpoint(dir.string()), comm.get()), opt, *comm);
    EXPECT_FALSE(loaded.residual_restored);
    EXPECT_EQ(loaded.warning, "");
  });
  // A checkpoint saved without error feedback, resumed with it: the same reset and line.
  const std::filesystem::path plain = dir / "plain";
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    Net net;
    ZeroOptimizer opt(net.named_parameters(), comm, options_for({2, 1, false, DType::bf16}));
    opt.backward(net.loss(0, comm->rank() * 2, 2, [](std::int64_t) { return true; }));
    opt.step();
    save_checkpoint(plain.string(), 1, opt, *comm, nlohmann::json::object(), 0);
  });
  run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    Net net;
    ZeroOptimizer opt(net.named_parameters(), comm, saved);
    const LoadResult loaded = load_checkpoint(open_checkpoint(resolve_checkpoint(plain.string()), comm.get()), opt, *comm);
    EXPECT_FALSE(loaded.residual_restored);
    EXPECT_NE(loaded.warning.find("the checkpoint has no residual: it was saved without "
                                  "zero_quantized_gradients_error_feedback"),
              std::string::npos)
        << loaded.warning;
  });
  std::filesystem::remove_all(dir);
}
#endif

// =====================================================================================================
// Parameters without a gradient (Note [Unused parameters])
// =====================================================================================================

// One process: plain AdamW (skips a parameter without a gradient, as PyTorch) + clip_grad_norm over
// the global batch of N·2·GAS rows.
std::vector<float> reference(const ZeroOptions& o, int steps, int n, const std::function<bool(int, std::int64_t)>& use) {
  Net net;
  std::vector<optim::ParamGroup> groups(2);
  groups[0].weight_decay = o.weight_decay;
  std::vector<Tensor> all;
  for (const auto& p : net.named_parameters()) {
    groups[p.decay ? 0 : 1].params.push_back(p.tensor);
    all.push_back(p.tensor);
  }
  optim::AdamW adamw(groups, o.adam);
  const std::int64_t rows = std::int64_t{n} * 2 * o.gradient_accumulation_steps;
  for (int step = 0; step < steps; ++step) {
    net.loss(step, 0, rows, [&](std::int64_t r) { return use(step, r); }).backward();
    optim::clip_grad_norm(all, o.gradient_clipping);
    adamw.step();
    adamw.zero_grad();
  }
  std::vector<float> flat;
  for (const Tensor& t : all) {
    const auto v = t.to_vector();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

ZERO_DIST_TEST(ZeroUnusedParameters, MatchOneProcessAdamW) {
  const int n = test_world()->world_size(), steps = 4;
  // Row r of a micro-step belongs to rank (r / 2) % n: rows [(g·N + rank)·2, +2).
  const std::vector<std::pair<std::string, std::function<bool(int, std::int64_t)>>> patterns = {
      {"used on even steps only", [](int step, std::int64_t) { return step % 2 == 0; }},
      {"used on rank 0 only", [n](int, std::int64_t r) { return (r / 2) % n == 0; }},
      {"used on the last rank's first micro-step of odd steps only",
       [n](int step, std::int64_t r) { return step % 2 == 1 && r / 2 == n - 1; }},
  };
  const std::vector<std::int64_t> extra_steps = {2, 4, 2};  // steps that update `extra`
  for (std::size_t pi = 0; pi < patterns.size(); ++pi)
    for (int stage : {0, 1, 2})
      for (int gas : {1, 2}) {
        ZeroOptions o = options_for({stage, gas, stage == 1, DType::f32});
        const std::string what = fmt::format("{}, stage {}, GAS {}", patterns[pi].first, stage, gas);
        const Plain z = run_plain(o, steps, patterns[pi].second);
        const std::vector<float> ref = reference(o, steps, n, patterns[pi].second);
        ASSERT_TRUE(z.error.empty()) << what << ": " << z.error;
        std::vector<float> real(z.params.begin(), z.params.begin() + static_cast<std::ptrdiff_t>(ref.size()));
        EXPECT_LE(max_rel_diff(real, ref), 1e-5) << what;
        EXPECT_EQ(z.param_steps, (std::vector<std::int64_t>{steps, steps, steps, extra_steps[pi]})) << what;
        expect_replicas_identical(z.params, what);
      }
}

ZERO_DIST_TEST(ZeroUnusedParameters, AStepWithoutAGradientLeavesTheParameterBitwiseAlone) {
  // Weight decay would move it (decay 0.1, lr 3e-2) and so would the moments from the first step.
  for (int stage : {0, 1, 2}) {
    ZeroOptions o = options_for({stage, 1, false, DType::f32});
    const auto even = [](int step, std::int64_t) { return step % 2 == 0; };
    const Plain one = run_plain(o, 1, even), two = run_plain(o, 2, even);
    const std::int64_t extra_begin = 35 + 7 + 21, extra_end = extra_begin + 7;
    for (std::int64_t i = extra_begin; i < extra_end; ++i)
      EXPECT_EQ(two.params[static_cast<std::size_t>(i)], one.params[static_cast<std::size_t>(i)]) << "stage " << stage;
    EXPECT_NE(two.params[0], one.params[0]) << "stage " << stage << ": w1 should have moved";
  }
}

}  // namespace
}  // namespace zero::dist
