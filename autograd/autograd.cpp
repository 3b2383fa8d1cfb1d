#include "autograd/autograd.h"

#include <atomic>
#include <mutex>
#include <queue>
#include <set>
#include <unordered_map>

#include "autograd/ops_elementwise.h"
#include "autograd/ops_reduce.h"
#include "core/autograd_interface.h"
#include "core/trace.h"

namespace zero::autograd {
namespace {

thread_local bool g_grad_mode = true;
std::atomic<std::uint64_t> g_next_sequence_nr{0};
std::atomic<int> g_next_hook_id{0};
thread_local const char* g_scope = nullptr;  // Note [Traced scopes]
thread_local std::uint32_t g_record_context = 0;  // Note [Record context]
thread_local RecordObserver* g_observer = nullptr;  // autograd/checkpoint.h
thread_local const BeforeNodeFn* g_before_node = nullptr;

// Labels live as long as the process: graph nodes keep pointers to them.
const char* intern(const std::string& label) {
  static std::mutex mutex;
  static std::set<std::string> labels;
  std::lock_guard lock(mutex);
  return labels.insert(label).first->c_str();
}

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    ZERO_CHECK(fn_ != nullptr, "backward through '{}' a second time: its saved tensors were freed "
               "(pass retain_graph=true to the first backward)", name_);
    return fn_(grad_output);
  }
  std::string name() const override { return name_; }
  void release() override { fn_ = nullptr; }

 private:
  const char* name_;
  BackwardFn fn_;
};

// Sums a leaf's gradient into leaf.grad() and then fires its post-accumulate-grad hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    Tensor param(leaf_);
    auto& m = meta_of(param);
    if (!m.grad.defined()) {
      // A fresh copy in the parameter's dtype: the incoming tensor may be shared with other gradients.
      Tensor g = Tensor::empty(param.shape(), param.dtype(), param.device());
      g.copy_(grad_output);
      m.grad = g;
    } else {
      add_(m.grad, grad_output);
    }
    // Copy the list: a hook may register or remove hooks.
    auto hooks = m.post_accumulate_grad_hooks;
    for (auto& [id, hook] : hooks) hook(param);
    return {};
  }
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

}  // namespace

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.impl()->autograd) return nullptr;
  auto& m = *t.impl()->autograd;
  if (m.grad_fn) return m.grad_fn;
  if (!m.requires_grad) return nullptr;
  auto acc = m.grad_accumulator.lock();
  if (!acc) {
    // Leaves hold their accumulator weakly; the graph holds it strongly while it exists.
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    acc->sequence_nr_ = g_next_sequence_nr++;
    m.grad_accumulator = acc;
  }
  return acc;
}

namespace {

// a + b out of place (either may be shared with another gradient). 16-bit gradients (of f16/bf16
// parameters) are summed in f32 and rounded once.
Tensor sum_gradients(const Tensor& a, const Tensor& b) {
  if (a.dtype() == DType::f32 && b.dtype() == DType::f32) return add(a.detach(), b.detach());
  return add(a.to(DType::f32), b.to(DType::f32)).to(a.dtype());
}

// One "backward <label>" trace span per run of nodes with the same label (Note [Traced scopes]); the
// last run is closed on destruction, also when a node throws.
class BackwardSpans {
 public:
  void enter(const char* scope) {
    if (!trace::active() || scope == nullptr || scope == current_) return;
    close();
    current_ = scope;
    start_us_ = trace::now_us();
  }
  ~BackwardSpans() { close(); }

 private:
  void close() {
    if (current_ == nullptr) return;
    trace::add({std::string("backward ") + current_, "backward", 'X', start_us_, trace::now_us() - start_us_,
                trace::kComputeThread, nullptr});
    current_ = nullptr;
  }
  const char* current_ = nullptr;
  double start_us_ = 0;
};

}  // namespace

bool tracing() { return trace::active(); }

ScopeGuard::ScopeGuard(std::string_view label) {
  if (!trace::active()) return;
  on_ = true;
  previous_ = g_scope;
  g_scope = intern(std::string(label));
  start_us_ = trace::now_us();
}

ScopeGuard::~ScopeGuard() {
  if (!on_) return;
  trace::add({std::string("forward ") + g_scope, "forward", 'X', start_us_, trace::now_us() - start_us_,
              trace::kComputeThread, nullptr});
  g_scope = previous_;
}

bool grad_mode_enabled() { return g_grad_mode; }
NoGradGuard::NoGradGuard() : previous_(g_grad_mode) { g_grad_mode = false; }
NoGradGuard::~NoGradGuard() { g_grad_mode = previous_; }

bool needs_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }

void record(const char* name, const std::vector<Tensor>& inputs, Tensor& output, BackwardFn backward) {
  RecordObserver* observer = g_observer;
  if (observer != nullptr) observer->on_record(name, inputs, output);
  if (!g_grad_mode) return;
  bool any = false;
  for (const auto& t : inputs) any = any || needs_grad(t);
  if (!any) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->sequence_nr_ = g_next_sequence_nr++;
  node->scope_ = g_scope;
  node->context_ = g_record_context;
  node->next_.reserve(inputs.size());
  for (const auto& t : inputs) {
    std::shared_ptr<Node> edge = gradient_edge(t);
    if (observer != nullptr && edge != nullptr) edge = observer->map_edge(edge);
    node->next_.push_back(std::move(edge));
    node->input_shapes_.push_back(t.defined() ? t.shape() : Shape{});
  }
  if (observer != nullptr) observer->on_node(node.get());
  meta_of(output).grad_fn = std::move(node);
}

void attach_node(const std::shared_ptr<Node>& node, Tensor& output) {
  node->sequence_nr_ = g_next_sequence_nr++;
  node->scope_ = g_scope;
  node->context_ = 0;
  meta_of(output).grad_fn = node;
}

RecordObserver* set_record_observer(RecordObserver* observer) {
  RecordObserver* previous = g_observer;
  g_observer = observer;
  return previous;
}
RecordObserver* record_observer() { return g_observer; }
const BeforeNodeFn* current_before_node() { return g_before_node; }

EnableGradGuard::EnableGradGuard() : previous_(g_grad_mode) { g_grad_mode = true; }
EnableGradGuard::~EnableGradGuard() { g_grad_mode = previous_; }

void set_record_context(std::uint32_t context) { g_record_context = context; }
std::uint32_t record_context() { return g_record_context; }

int register_post_accumulate_grad_hook(Tensor& param, HookFn hook) {
  ZERO_CHECK(param.is_leaf() && param.requires_grad(), "post-accumulate-grad hooks need a leaf that requires grad");
  const int id = g_next_hook_id++;
  meta_of(param).post_accumulate_grad_hooks.emplace_back(id, std::move(hook));
  return id;
}

void remove_post_accumulate_grad_hook(Tensor& param, int id) {
  auto& hooks = meta_of(param).post_accumulate_grad_hooks;
  std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
}

int register_parameter_use_hook(Tensor& param, UseHookFn hook) {
  ZERO_CHECK(param.defined(), "register_parameter_use_hook: undefined tensor");
  const int id = g_next_hook_id++;
  meta_of(param).parameter_use_hooks.emplace_back(id, std::move(hook));
  return id;
}

void remove_parameter_use_hook(Tensor& param, int id) {
  auto& hooks = meta_of(param).parameter_use_hooks;
  std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
}

void backward(const Tensor& root, const Tensor& grad_output, bool retain_graph, const BeforeNodeFn& before_node) {
  auto root_node = gradient_edge(root);
  ZERO_CHECK(root_node != nullptr, "backward() on a tensor that does not require grad");
  Tensor seed = grad_output;
  if (!seed.defined()) {
    ZERO_CHECK(root.numel() == 1, "backward() without a gradient needs a one-element tensor, got shape {}",
               shape_str(root.shape()));
    seed = Tensor::ones(root.shape(), DType::f32, root.device());
  }
  ZERO_CHECK(seed.shape() == root.shape(), "backward(): gradient shape {} differs from tensor shape {}",
             shape_str(seed.shape()), shape_str(root.shape()));

  // Count, for every reachable node, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack{root_node.get()};
  dependencies[root_node.get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& next : n->next_) {
      if (!next) continue;
      auto [it, inserted] = dependencies.try_emplace(next.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(next.get());
    }
  }

  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr_ < b->sequence_nr_;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)> ready(
      later_first);
  NoGradGuard no_grad;  // backward closures compute plain tensors; no second-order graphs
  struct BeforeNodeScope {  // a checkpointed segment's backward reuses it (autograd/checkpoint.h)
    const BeforeNodeFn* previous = g_before_node;
    explicit BeforeNodeScope(const BeforeNodeFn* f) { g_before_node = f; }
    ~BeforeNodeScope() { g_before_node = previous; }
  } before_node_scope(before_node ? &before_node : nullptr);
  std::unordered_map<Node*, Tensor> buffers;
  buffers[root_node.get()] = seed;
  ready.push(root_node);
  BackwardSpans spans;
  while (!ready.empty()) {
    auto node = ready.top();
    ready.pop();
    spans.enter(node->scope_);
    Tensor g = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    std::vector<Tensor> grads;
    if (g.defined() && node->context_ != 0 && before_node) before_node(node->context_);
    if (g.defined()) grads = node->apply(g);  // no incoming gradient: nothing to compute or accumulate
    if (!retain_graph) node->release();
    for (std::size_t i = 0; i < node->next_.size(); ++i) {
      auto& next = node->next_[i];
      if (!next) continue;
      if (i < grads.size() && grads[i].defined()) {
        ZERO_DCHECK(grads[i].shape() == node->input_shapes_[i], "backward of '{}' returned a gradient of shape {} for "
                    "input {} of shape {}", node->name(), shape_str(grads[i].shape()), i,
                    shape_str(node->input_shapes_[i]));
        Tensor& buf = buffers[next.get()];
        buf = buf.defined() ? sum_gradients(buf, grads[i]) : grads[i].detach();
      }
      if (--dependencies[next.get()] == 0) ready.push(next);
    }
  }
}

}  // namespace zero::autograd

namespace zero::autograd {

namespace {

// Tensor's autograd members, as core/ reaches them (Note [Autograd behind an interface] in
// core/autograd_interface.h).
class TensorAutograd final : public zero::detail::AutogradInterface {
 public:
  void backward(const Tensor& root) const override { autograd::backward(root); }

  void record(const char* name, const Tensor& input, Tensor& output,
              std::function<Tensor(const Tensor&)> backward) const override {
    autograd::record(name, {input}, output, [backward = std::move(backward)](const Tensor& g) -> std::vector<Tensor> {
      return {backward(g)};
    });
  }

  Tensor sum_to(const Tensor& x, const Shape& shape) const override { return zero::sum_to(x, shape); }
};

const TensorAutograd tensor_autograd;
[[maybe_unused]] const bool installed = (zero::detail::set_autograd_interface(&tensor_autograd), true);

}  // namespace

}  // namespace zero::autograd
