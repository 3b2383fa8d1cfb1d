// Tracing: a timeline of what one process does, as Chrome trace events ("Trace Event Format", the
// JSON that Perfetto and chrome://tracing open): complete events (ph "X": a name, a start and a
// duration in microseconds) and instant events (ph "i") on a thread id. zero.cpp uses two thread ids
// per process: kComputeThread (forward, backward, hooks, buckets, the optimizer step) and kCommThread
// (each collective as it runs on the communicator's own thread).
//
// Off by default; while off, a Span or instant() costs one relaxed atomic load. enable() starts
// collecting into memory, set_active() pauses and resumes (a range of steps), take() hands the events
// over. Events from several threads are appended under one mutex: a few hundred per training step.
// distributed/run/trace_file.h gathers every rank's events into one file.
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zero::trace {

inline constexpr int kComputeThread = 0;
inline constexpr int kCommThread = 1;

struct Event {
  std::string name;
  std::string cat;         // category: "forward", "backward", "hook", "bucket", "step", "comm", ...
  char ph = 'X';           // 'X' complete, 'i' instant
  double ts = 0, dur = 0;  // microseconds since the trace clock's origin
  int tid = kComputeThread;
  nlohmann::json args;  // null when none
};

namespace detail {
extern std::atomic<bool> g_active;
}

/// True while events are being collected (enabled and not paused).
inline bool active() { return detail::g_active.load(std::memory_order_relaxed); }

/// Starts collecting (clears what was collected). The clock origin is the moment of the call, so
/// ranks that call it right after a barrier share an origin to within the barrier's skew.
void enable();
/// Stops collecting for good and drops the events.
void disable();
/// Pauses (false) or resumes (true) collection; no effect unless enabled.
void set_active(bool on);
bool enabled();

/// Microseconds since the origin set by enable().
double now_us();

/// Appends an event (no-op unless active()).
void add(Event e);
/// An instant event on `tid`.
void instant(const char* name, const char* cat, int tid = kComputeThread, nlohmann::json args = nullptr);

/// The events collected so far, in the order they were added; clears them.
std::vector<Event> take();

/// A complete event from construction to destruction (nothing when inactive at construction).
class Span {
 public:
  /// `name` and `cat` are copied only when tracing is active.
  Span(const char* name, const char* cat, int tid = kComputeThread);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  /// Adds an argument shown with the event (bytes, counts, ...).
  void arg(const char* key, nlohmann::json value);

 private:
  bool on_ = false;
  Event e_;
};

}  // namespace zero::trace
