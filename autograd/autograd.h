// Autograd: a dynamic graph recorded during the forward pass and run backwards by one engine.
//
// Every differentiable op calls record() with its inputs, its output and a backward closure written a
// few lines below its forward (see autograd/ops.cpp). record() creates a FunctionNode whose edges point
// at the nodes that produced the inputs; leaves that require grad get an AccumulateGrad node.
//
// Note [Hook order]
// The engine runs a node once all nodes that feed it a gradient have run (dependency counting), so a
// leaf used several times (a tied embedding / LM head) has its gradient summed before its AccumulateGrad
// node runs, and its post-accumulate-grad hooks fire exactly once per backward, after the gradient of
// this backward is complete. Among ready nodes the engine runs the one created last (highest sequence
// number) first, as PyTorch does; so hooks fire roughly in reverse order of first use in the forward,
// and the order is the same on every process that built the same graph. A leaf that received no
// gradient in this backward (unused, or every path to it carried no gradient) fires no hook.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/autograd_interface.h"
#include "core/tensor.h"

namespace zero::autograd {

class Node {
 public:
  virtual ~Node() = default;
  /// Gradients for each entry of next_ (same length; undefined where an input needs none).
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  virtual std::string name() const = 0;
  /// Drops saved tensors once the node has run (unless the graph is retained).
  virtual void release() {}

  std::vector<std::shared_ptr<Node>> next_;  // one per input; null where the input needs no gradient
  std::vector<Shape> input_shapes_;          // one per input: the shape apply() must return for it
  std::uint64_t sequence_nr_ = 0;
  const char* scope_ = nullptr;  // the ScopeGuard label active when it was recorded (tracing only)
  std::uint32_t context_ = 0;    // record_context() when it was recorded (Note [Record context])
};

// HookFn, UseHookFn and AutogradMeta, the state a tensor carries, are in core/autograd_interface.h.

/// Gradient mode is on by default; NoGradGuard turns recording off in its scope (this thread only).
bool grad_mode_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Note [Traced scopes]
// A traced step shows forward and backward per block (core/trace.h). A layer opens a ScopeGuard around
// its forward; while tracing is active the guard emits a "forward <label>" span and labels every node
// recorded inside it. The engine then emits one "backward <label>" span per run of consecutive nodes
// with the same label (nodes without one, like gradient accumulation into leaves, continue the run).
// With tracing off the guard does nothing but one atomic load.

/// True while a trace is being collected (core/trace.h): build dynamic ScopeGuard labels only then.
bool tracing();

/// Labels the forward code in its scope (this thread; nests) for the trace. See Note [Traced scopes].
class ScopeGuard {
 public:
  explicit ScopeGuard(std::string_view label);
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  bool on_ = false;
  const char* previous_ = nullptr;
  double start_us_ = 0;
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

/// Records `output = op(inputs)` in the graph when grad mode is on and some input requires grad.
/// `backward` maps dL/d(output) to dL/d(input_i) for each input (undefined where not needed; each
/// returned gradient must have its input's shape). The closure must not capture `output` itself (that
/// would form a cycle): capture output.detach() instead.
void record(const char* name, const std::vector<Tensor>& inputs, Tensor& output, BackwardFn backward);

/// True if the tensor is a leaf that requires grad or the output of a recorded op.
bool needs_grad(const Tensor& t);

// ---- Parameter hooks: the two places a distributed optimizer plugs into a model ----------------------
// Both are registered per parameter (on the tensor's autograd metadata), so two models in one process
// (ranks that are threads: distributed/comm/inprocess_communicator.h) never see each other's hooks.
//   post-accumulate-grad hook  runs when the parameter's gradient of this backward is final
//                              (PyTorch's Tensor.register_post_accumulate_grad_hook): ZeRO's gradient
//                              reducer copies it into a bucket there (distributed/zero/gradient_reducer.h);
//   parameter-use hook         runs before a layer's forward reads the parameter (nn::Module::compute):
//                              ZeRO's parameter gather waits there for the all-gather that fills it
//                              (distributed/zero/parameter_gather.h). PyTorch's nearest is a module forward
//                              pre-hook; this one has the granularity of one parameter.
// A hook may throw: the exception propagates out of backward() or out of the forward.

/// Registers `hook` to run after `param`'s gradient for a backward is complete (see Note [Hook order]).
/// `param` must be a leaf that requires grad. Returns an id for remove_post_accumulate_grad_hook.
int register_post_accumulate_grad_hook(Tensor& param, HookFn hook);
void remove_post_accumulate_grad_hook(Tensor& param, int id);

/// Registers `hook` to run (on the forward's thread) each time a layer is about to read `param`.
/// Returns an id for remove_parameter_use_hook. Throws zero::Error for an undefined tensor.
int register_parameter_use_hook(Tensor& param, UseHookFn hook);
/// Removes the hook registered under `id` (an unknown id is ignored).
void remove_parameter_use_hook(Tensor& param, int id);
/// Runs `param`'s parameter-use hooks (nn::Module::compute calls it). Costs a pointer test when none.
inline void run_parameter_use_hooks(const Tensor& param) {
  const AutogradMeta* m = param.impl()->autograd.get();
  if (m == nullptr || m->parameter_use_hooks.empty()) return;
  const auto hooks = m->parameter_use_hooks;  // a hook may register or remove hooks
  for (const auto& [id, hook] : hooks) hook(param);
}

// Note [Record context]
// ~~~~~~~~~~~~~~~~~~~~~
// A backward closure reads what its op saved in the forward; when that is a parameter whose memory is
// freed between uses (ZeRO stage 3, Note [Storage that is freed and refilled] in core/storage.h), the
// memory must be refilled before the closure runs. The engine cannot see inside closures, so the code
// that frees the memory labels the graph instead: it sets a context number (this thread) while
// parameters it manages are in use, record() stores it in every node, and backward() calls
// `before_node(context)` before running a node with a non-zero context, so the owner of the memory
// can refill what was in use when the node was recorded. PyTorch's saved-tensor hooks serve the same
// purpose one tensor at a time; a number per node is enough here because a layer's parameters are
// refilled together.

/// The context number record() stores in new nodes (this thread; 0, the default, means none).
void set_record_context(std::uint32_t context);
std::uint32_t record_context();

/// Called by backward() before a node recorded under a non-zero context runs (Note [Record context]).
using BeforeNodeFn = std::function<void(std::uint32_t context)>;

/// Runs the backward pass from `root` with seed gradient `grad_output` (shape of root; default: ones
/// for a one-element root). Frees saved tensors unless retain_graph. Calls `before_node` (if set)
/// before each node with a non-zero context. Throws zero::Error if root does not require grad or the
/// seed's shape differs, and whatever before_node throws.
void backward(const Tensor& root, const Tensor& grad_output = Tensor(), bool retain_graph = false,
              const BeforeNodeFn& before_node = {});

// ---- Hooks for checkpointed segments (autograd/checkpoint.h) -----------------------------------------
// A checkpointed segment watches every op recorded on its thread while it runs (also with grad mode
// off), and in its re-run gives the new nodes substitute edges where they point outside the segment
// (Note [Checkpoint edges] in autograd/checkpoint.cpp). Nothing here costs more than a pointer test
// while no segment is running.

/// Installed on one thread by autograd::checkpoint while a segment runs.
class RecordObserver {
 public:
  virtual ~RecordObserver() = default;
  /// Called by every record() on this thread, first, whether or not grad mode is on.
  virtual void on_record(const char* name, const std::vector<Tensor>& inputs, const Tensor& output) = 0;
  /// The edge a node recorded now gets for an input whose gradient edge is `edge` (non-null).
  virtual std::shared_ptr<Node> map_edge(const std::shared_ptr<Node>& edge) = 0;
  /// Called for every node record() creates (grad mode on).
  virtual void on_node(Node* node) = 0;
  /// Called by an op before it draws from `gen` (dropout masks).
  virtual void on_random(Generator& gen) = 0;
  /// Called by an op that can skip its computation: the output, of shape `shape`, the segment kept for
  /// the op `name` about to be recorded (its re-run), or an undefined tensor (compute it). Throws
  /// zero::Error when the kept output is of another op or shape.
  virtual Tensor kept_output(const char* name, const Shape& shape) = 0;
};

/// Installs `observer` on this thread (nullptr: none); returns the previous one.
RecordObserver* set_record_observer(RecordObserver* observer);
RecordObserver* record_observer();

/// Ops call these: they forward to the observer when one is installed (Note [Save or recompute]).
inline void note_random_use(Generator& gen) {
  if (RecordObserver* o = record_observer()) o->on_random(gen);
}
inline Tensor kept_output(const char* name, const Shape& shape) {
  RecordObserver* o = record_observer();
  return o != nullptr ? o->kept_output(name, shape) : Tensor();
}

/// The node that gradients of `t` flow into: its grad_fn, its AccumulateGrad node (a leaf that
/// requires grad; made on first use), or null.
std::shared_ptr<Node> gradient_edge(const Tensor& t);
/// Makes `node` (whose next_ and input_shapes_ the caller filled) the grad_fn of `output`, numbered
/// and labelled like a node record() makes, with no record context.
void attach_node(const std::shared_ptr<Node>& node, Tensor& output);
/// The before_node of the backward() running on this thread (null outside one, or when it has none).
const BeforeNodeFn* current_before_node();

/// Turns grad mode on in its scope (this thread), e.g. to build a graph inside a backward.
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace zero::autograd
