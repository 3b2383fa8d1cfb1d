#include "autograd/checkpoint.h"

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/check.h"

namespace zero::autograd {

// Note [Checkpoint edges]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A checkpointed segment becomes one node of the outer graph. Its edges must lead to everything the
// segment's gradients flow into outside it, and nothing else; the segment's code does not say what that
// is (a block reads its parameters itself), so the segment finds out as it runs: every op calls
// record(), also with grad mode off, and the segment's RecordObserver sees each op's inputs. In the first
// run (grad mode off, so no op saves anything and no node is made) every input with a gradient edge
// is outside the segment (inside tensors have none), and its edge (a grad_fn, or a parameter's
// AccumulateGrad node) becomes one of the checkpoint node's edges, once.
//
// The re-run (grad mode on, inside the backward) builds the segment's graph for real. Each new node's
// edges are mapped: an edge to a node made by this re-run stays; an edge out of the segment goes to a
// sink, one per checkpoint edge, that stores the gradient reaching it. A nested backward from the
// re-run's output then runs the segment's nodes only, the engine summing what reaches each sink; the
// checkpoint node returns the sinks' gradients and the outer engine takes them on. So the nested
// backward never runs an AccumulateGrad node: a parameter's gradient is accumulated, and its
// post-accumulate-grad hooks fire, once, by the outer engine, after all its uses (Note [Hook order]).
// The nested backward reuses the outer backward's before_node (Note [Record context]): at ZeRO stage 3
// the re-run's reads of parameters and its nodes ask for their units through the backward phase's
// agreed schedule, in program order, like every other read of the backward (Note [One schedule] in
// distributed/zero/partitioned_parameters.cpp); every rank re-runs the same segments at the same points.
//
// Note [Save or recompute]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// What a segment keeps is decided per op by a policy (PyTorch's selective activation checkpoint has
// the same shape: a function of the op that says "save" or "recompute"). The first run counts the ops
// it records; for an op the policy keeps, it holds on to the op's output under that count. In the
// re-run, an op that can skip its work (linear, matmul: autograd::kept_output in autograd/ops.cpp) asks
// for the output kept under the same count and computes only what its backward needs, which for a GEMM
// is its inputs and weight, already there. Every other op runs again. So
//   - full (keep_nothing): the segment holds its inputs only; the re-run redoes the whole forward,
//     GEMMs included (one more forward: about a third more step time);
//   - selective (keep_matmul_outputs): the segment holds its inputs and the GEMMs' outputs; the re-run
//     redoes the norms, the attention's scores, softmax and weighted sum (Megatron's "core attention",
//     whose B·H·T² scores are the largest term, Korthikanti et al. 2022 section 5), GELU, the dropout
//     masks and the additions: the cheap part of the forward. The memory it saves is what those ops
//     save: the norms' outputs (read by the next GEMM), the scores, the GELU output and the masks.
// Random draws: an op that draws (dropout) tells the segment first (note_random_use); the first run
// copies each generator's state before its first draw in the segment, and the re-run sets the
// generators to those states and afterwards back to where they were, so the masks are the same bits
// and the generators' later draws are unchanged.

namespace {

class Segment;
thread_local RecomputeProbe g_probe;

// The ops that can hand back a kept output instead of computing it (autograd::kept_output in ops.cpp).
bool is_gemm(std::string_view op) { return op == "linear" || op == "matmul"; }

// Where the re-run's gradient leaving the segment through checkpoint edge `index` is stored.
class Sink final : public Node {
 public:
  Sink(Segment* segment, std::size_t index) : segment_(segment), index_(index) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  std::string name() const override { return "checkpoint edge"; }

 private:
  Segment* segment_;
  std::size_t index_;
};

class Segment final : public RecordObserver {
 public:
  Segment(RecomputePolicy policy) : policy_(std::move(policy)) {}

  void on_record(const char* name, const std::vector<Tensor>& inputs, const Tensor& output) override {
    // GEMMs are counted alone: views record only when their input needs a gradient, which inside the
    // segment holds in the re-run and not in the first run, so a count of every op would shift.
    const bool gemm = is_gemm(name);
    const std::size_t index = gemms_;
    gemms_ += gemm;
    if (replaying_) return;
    for (const Tensor& t : inputs) {
      std::shared_ptr<Node> edge = gradient_edge(t);
      if (edge == nullptr || index_.contains(edge.get())) continue;
      index_.emplace(edge.get(), edges_.size());
      edges_.push_back(std::move(edge));
      shapes_.push_back(t.shape());
    }
    if (gemm && policy_(name) == Keep::output) kept_.emplace(index, Kept{name, output.detach()});
  }

  std::shared_ptr<Node> map_edge(const std::shared_ptr<Node>& edge) override {
    if (!replaying_ || inner_.contains(edge.get())) return edge;
    auto it = index_.find(edge.get());
    ZERO_CHECK(it != index_.end(), "checkpoint: the re-run of a segment read a tensor from outside it that its "
               "first run did not read (the segment must compute the same ops on every run)");
    return sinks_[it->second];
  }

  void on_node(Node* node) override {
    if (replaying_) inner_.insert(node);
  }

  void on_random(Generator& gen) override {
    if (replaying_) return;
    for (const auto& [g, state] : rng_)
      if (g == &gen) return;
    rng_.emplace_back(&gen, gen.engine());
  }

  Tensor kept_output(const char* name, const Shape& shape) override {
    if (!replaying_) return Tensor();
    auto it = kept_.find(gemms_);  // the GEMM about to be recorded
    if (it == kept_.end()) return Tensor();
    ZERO_CHECK(std::strcmp(it->second.name, name) == 0 && it->second.output.shape() == shape,
               "checkpoint: the re-run of a segment recorded '{}' {} where its first run recorded '{}' {} (the "
               "segment must compute the same ops on every run)", name, shape_str(shape), it->second.name,
               shape_str(it->second.output.shape()));
    return it->second.output.detach();  // a new handle: the re-run's node attaches to it
  }

  // The re-run and its backward: the gradients for edges_ (undefined where none arrived).
  std::vector<Tensor> rerun(const SegmentFn& fn, const std::vector<Tensor>& inputs, const Tensor& grad_output,
                            const Shape& output_shape);

  bool has_edges() const { return !edges_.empty(); }
  const std::vector<std::shared_ptr<Node>>& edges() const { return edges_; }
  const std::vector<Shape>& shapes() const { return shapes_; }
  void store(std::size_t index, const Tensor& g) { grads_[index] = g; }

 private:
  struct Kept {
    const char* name;
    Tensor output;
  };
  RecomputePolicy policy_;
  bool replaying_ = false;
  std::size_t gemms_ = 0;  // GEMMs recorded so far in this run: the key of kept_
  std::vector<std::shared_ptr<Node>> edges_;
  std::vector<Shape> shapes_;
  std::unordered_map<Node*, std::size_t> index_;
  std::map<std::size_t, Kept> kept_;
  std::vector<std::pair<Generator*, std::mt19937_64>> rng_;
  // re-run only
  std::vector<std::shared_ptr<Node>> sinks_;
  std::unordered_set<Node*> inner_;
  std::vector<Tensor> grads_;
};

std::vector<Tensor> Sink::apply(const Tensor& grad_output) {
  segment_->store(index_, grad_output);
  return {};
}

// Installs a segment as this thread's observer for a scope; refuses to nest.
class Observing {
 public:
  explicit Observing(Segment* s) {
    ZERO_CHECK(record_observer() == nullptr, "checkpoint: a checkpointed segment cannot contain another one");
    set_record_observer(s);
  }
  ~Observing() { set_record_observer(nullptr); }
  Observing(const Observing&) = delete;
  Observing& operator=(const Observing&) = delete;
};

std::vector<Tensor> Segment::rerun(const SegmentFn& fn, const std::vector<Tensor>& inputs, const Tensor& grad_output,
                                   const Shape& output_shape) {
  if (g_probe) g_probe(false);
  replaying_ = true;
  gemms_ = 0;
  inner_.clear();
  sinks_.clear();
  for (std::size_t i = 0; i < edges_.size(); ++i) sinks_.push_back(std::make_shared<Sink>(this, i));
  grads_.assign(edges_.size(), Tensor());
  std::vector<std::mt19937_64> now;  // the generators' states, restored after the re-run
  for (auto& [gen, state] : rng_) {
    now.push_back(gen->engine());
    gen->engine() = state;
  }
  Tensor y;
  try {
    ScopeGuard scope("recompute");
    EnableGradGuard grad;
    Observing observing(this);
    y = fn(inputs);
  } catch (...) {
    for (std::size_t i = 0; i < now.size(); ++i) rng_[i].first->engine() = now[i];
    throw;
  }
  for (std::size_t i = 0; i < now.size(); ++i) rng_[i].first->engine() = now[i];
  ZERO_CHECK(y.shape() == output_shape, "checkpoint: the re-run of a segment returned shape {}, its first run {}",
             shape_str(y.shape()), shape_str(output_shape));
  if (g_probe) g_probe(true);
  if (needs_grad(y)) {
    const BeforeNodeFn* before = current_before_node();
    backward(y, grad_output, false, before != nullptr ? *before : BeforeNodeFn());
  }
  sinks_.clear();
  inner_.clear();
  std::vector<Tensor> grads = std::move(grads_);
  grads_.clear();
  return grads;
}

class CheckpointNode final : public Node {
 public:
  CheckpointNode(std::shared_ptr<Segment> segment, SegmentFn fn, std::vector<Tensor> inputs, Shape output_shape)
      : segment_(std::move(segment)), fn_(std::move(fn)), inputs_(std::move(inputs)),
        output_shape_(std::move(output_shape)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    ZERO_CHECK(segment_ != nullptr, "backward through a checkpointed segment a second time: its inputs were freed "
               "(pass retain_graph=true to the first backward)");
    return segment_->rerun(fn_, inputs_, grad_output, output_shape_);
  }
  std::string name() const override { return "checkpoint"; }
  void release() override {
    segment_.reset();
    fn_ = nullptr;
    inputs_.clear();
  }

 private:
  std::shared_ptr<Segment> segment_;
  SegmentFn fn_;
  std::vector<Tensor> inputs_;
  Shape output_shape_;
};


}  // namespace

RecomputePolicy keep_nothing() {
  return [](std::string_view) { return Keep::recompute; };
}

RecomputePolicy keep_matmul_outputs() {
  return [](std::string_view op) { return is_gemm(op) ? Keep::output : Keep::recompute; };
}

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::none: return "none";
    case Recompute::full: return "full";
    case Recompute::selective: return "selective";
  }
  return "none";
}

Recompute parse_recompute(std::string_view text) {
  for (Recompute m : {Recompute::none, Recompute::full, Recompute::selective})
    if (text == recompute_name(m)) return m;
  ZERO_CHECK(false, "recompute must be none, full or selective, got '{}'", text);
  return Recompute::none;
}

RecomputePolicy recompute_policy(Recompute mode) {
  ZERO_CHECK(mode != Recompute::none, "recompute_policy: 'none' checkpoints nothing");
  return mode == Recompute::full ? keep_nothing() : keep_matmul_outputs();
}

void set_recompute_probe(RecomputeProbe probe) { g_probe = std::move(probe); }

Tensor checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs, const RecomputePolicy& policy) {
  ZERO_CHECK(record_observer() == nullptr, "checkpoint: a checkpointed segment cannot contain another one");
  if (!grad_mode_enabled()) return fn(inputs);
  auto segment = std::make_shared<Segment>(policy ? policy : keep_nothing());
  Tensor y;
  {
    NoGradGuard no_grad;
    Observing observing(segment.get());
    y = fn(inputs);
  }
  if (!segment->has_edges()) return y;
  auto node = std::make_shared<CheckpointNode>(segment, fn, inputs, y.shape());
  node->next_ = segment->edges();
  node->input_shapes_ = segment->shapes();
  Tensor out = y.detach();  // a new handle (fn may have returned one of its inputs)
  attach_node(node, out);
  return out;
}

}  // namespace zero::autograd
