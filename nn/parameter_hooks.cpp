#include "nn/parameter_hooks.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace zero::nn {

namespace {
struct Registry {
  std::mutex mutex;
  std::vector<std::pair<int, ParameterUseHook>> hooks;
  int next_id = 0;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

namespace detail {
std::atomic<int> g_parameter_use_hooks{0};

void run_parameter_use_hooks(const Tensor& parameter) {
  std::vector<ParameterUseHook> hooks;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    for (const auto& [id, hook] : r.hooks) hooks.push_back(hook);
  }
  for (const auto& hook : hooks) hook(parameter);
}
}  // namespace detail

int add_parameter_use_hook(ParameterUseHook hook) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const int id = r.next_id++;
  r.hooks.emplace_back(id, std::move(hook));
  detail::g_parameter_use_hooks = static_cast<int>(r.hooks.size());
  return id;
}

void remove_parameter_use_hook(int id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.hooks.erase(std::remove_if(r.hooks.begin(), r.hooks.end(), [&](const auto& h) { return h.first == id; }),
                r.hooks.end());
  detail::g_parameter_use_hooks = static_cast<int>(r.hooks.size());
}

}  // namespace zero::nn
