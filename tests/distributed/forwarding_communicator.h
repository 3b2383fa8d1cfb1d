// ForwardingCommunicator: a Communicator that hands every call to another one, for tests that watch or
// tamper with the collectives an optimizer issues. A subclass overrides wrap() to see (or replace) the
// Work of each data collective, and may override any issue_* hook. The outer object counts the call
// in its own ledger; the inner one counts it again in its own.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "distributed/comm/communicator.h"

namespace zero::dist::testing {

/// A Work that is already complete (what a blocking call forwarded as async returns).
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() const override { return true; }
};

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string_view backend_name() const override { return "forwarding"; }
  void set_step(std::int64_t step) override {
    Communicator::set_step(step);
    inner_->set_step(step);
  }
  void set_reduce_in_fp32(bool on) override {
    Communicator::set_reduce_in_fp32(on);
    inner_->set_reduce_in_fp32(on);
  }
  void set_fp32_accumulation(bool on) override {
    Communicator::set_fp32_accumulation(on);
    inner_->set_fp32_accumulation(on);
  }
  void set_quantized_gradients(std::size_t block) override {
    Communicator::set_quantized_gradients(block);
    inner_->set_quantized_gradients(block);
  }
  bool supports_quantized_gradients() const override { return inner_->supports_quantized_gradients(); }

 protected:
  /// Called with the Work of every reduction and all-gather; returns what the caller receives.
  virtual std::shared_ptr<Work> wrap(Collective c, std::shared_ptr<Work> work) {
    (void)c;
    return work;
  }

  std::shared_ptr<Work> issue_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    return wrap(Collective::all_reduce, inner().all_reduce_async(buf, count, dtype, op));
  }
  std::shared_ptr<Work> issue_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                                             DType dtype) override {
    return wrap(Collective::reduce_scatter, inner().reduce_scatter_async(send, recv, counts, dtype));
  }
  std::shared_ptr<Work> issue_all_gather(const void* send, void* recv, std::span<const std::size_t> counts,
                                         DType dtype) override {
    return wrap(Collective::all_gather, inner().all_gather_async(send, recv, counts, dtype));
  }
  std::shared_ptr<Work> issue_reduce(void* buf, std::size_t count, DType dtype, int root) override {
    inner().reduce(buf, count, dtype, root);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> issue_broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    inner().broadcast(buf, count, dtype, root);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> issue_barrier() override {
    inner().barrier();
    return std::make_shared<DoneWork>();
  }
  double control_all_reduce(double value, ReduceOp op) override {
    return op == ReduceOp::sum ? inner().all_reduce_sum(value) : inner().all_reduce_max(value);
  }
  void control_all_reduce_values(std::span<double> values, ReduceOp op) override {
    if (op == ReduceOp::sum)
      inner().all_reduce_sum(values);
    else
      for (double& v : values) v = inner().all_reduce_max(v);
  }

  // The inner communicator, told this collective's purpose (Note [Collective identity]).
  Communicator& inner() { return inner_->with_purpose(issuing().purpose); }
  std::shared_ptr<Communicator> make_duplicate() override { return inner_->duplicate(); }

  std::shared_ptr<Communicator> inner_;
};

}  // namespace zero::dist::testing
