#include "core/trace.h"

#include <chrono>
#include <mutex>

namespace zero::trace {

namespace detail {
std::atomic<bool> g_active{false};
}

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::mutex mutex;
  std::vector<Event> events;
  bool enabled = false;
  Clock::time_point origin = Clock::now();
};

State& state() {
  static State s;
  return s;
}

}  // namespace

void enable() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.events.clear();
  s.enabled = true;
  s.origin = Clock::now();
  detail::g_active = true;
}

void disable() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.enabled = false;
  s.events.clear();
  detail::g_active = false;
}

void set_active(bool on) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  detail::g_active = on && s.enabled;
}

bool enabled() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.enabled;
}

double now_us() { return std::chrono::duration<double, std::micro>(Clock::now() - state().origin).count(); }

void add(Event e) {
  if (!active()) return;
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.events.push_back(std::move(e));
}

void instant(const char* name, const char* cat, int tid, nlohmann::json args) {
  if (!active()) return;
  add(Event{name, cat, 'i', now_us(), 0.0, tid, std::move(args)});
}

std::vector<Event> take() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  std::vector<Event> out;
  out.swap(s.events);
  return out;
}

Span::Span(const char* name, const char* cat, int tid) {
  if (!active()) return;
  on_ = true;
  e_.name = name;
  e_.cat = cat;
  e_.tid = tid;
  e_.ts = now_us();
}

Span::~Span() {
  if (!on_) return;
  e_.dur = now_us() - e_.ts;
  add(std::move(e_));
}

void Span::arg(const char* key, nlohmann::json value) {
  if (on_) e_.args[key] = std::move(value);
}

}  // namespace zero::trace
