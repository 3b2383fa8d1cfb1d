// The CPU kernels' thread count, and the policy that adapts it to a busy machine (core/cpu/kernels.h).
#include <omp.h>

#include <algorithm>
#include <atomic>

#include "core/check.h"
#include "core/cpu/kernels.h"

namespace zero::cpu {

// Note [Threads on a busy machine]
// A parallel kernel splits its work evenly over an OpenMP team and returns when the last thread is
// done. When another process keeps a core busy, the thread that shares that core gets about half of it
// (the scheduler alternates the two in slices of milliseconds), and every parallel region of a step
// waits for it: on 2 cores with one `yes` running, 2 threads trained at half the speed of 1 thread
// (docs/performance.md, "Threads and a shared machine"). A static team cannot hand the late thread's rows to the
// others, and a kernel must not return before every thread it started is done; so the team size adapts
// instead, from one measurement. The large GEMMs (the biggest parallel regions of a step) record when
// each thread finished; a thread's rate is its rows over its time since the region started. When the
// slowest rate stays more than kSlowLimit below the fastest (an EWMA over the GEMMs run at the current
// team size), the team halves, down to 1 thread. kProbeInterval later, kProbeGemms GEMMs run with the
// doubled team; if their threads kept pace with each other the doubled team stays. Each failed probe
// doubles the wait before the next, up to kMaxProbeInterval: a probe's GEMMs wait for the thread that
// shares the busy core, and under lasting contention probing every quarter second cost ~6% of tokens/s
// (bench/busy_core.sh: 0.90x of --threads 1, now 0.96x).
// On an idle machine the threads finish together and nothing changes; when the other job ends, the
// team is back within kMaxProbeInterval. Results never change: every kernel gives the same bits for
// any thread count.
// set_num_threads(n) turns the policy off.

namespace {

using Clock = std::chrono::steady_clock;

constexpr double kSlowLimit = 0.3;  // the slowest thread's rate below the fastest's, as a fraction
constexpr double kEwma = 0.25;      // weight of the newest GEMM in the running mean
constexpr int kMinSamples = 4;      // GEMMs at a team size before it may shrink
constexpr int kProbeGemms = 4;      // GEMMs per probe of the doubled team
constexpr auto kProbeInterval = std::chrono::milliseconds(250);      // the first probe after halving
constexpr auto kMaxProbeInterval = std::chrono::milliseconds(4000);  // between probes that keep failing

// What the program chose (any thread may read; set from the main thread).
std::atomic<int> g_max_threads{0};  // 0: not set yet (then omp_get_max_threads() at first use)
std::atomic<bool> g_adaptive{true};
std::atomic<unsigned> g_generation{0};  // bumped by every set_*: threads restart their policy

// The policy of one calling thread (each thread that runs kernels has its own team).
struct Policy {
  unsigned generation = ~0u;
  int max = 1;
  bool adaptive = true;
  int active = 1;
  double slow = 0.0;  // running mean of the GEMM teams' slowness at `active`
  int samples = 0;
  int probe_left = 0;
  double probe_slow = 0.0;
  std::chrono::milliseconds probe_interval = kProbeInterval;
  Clock::time_point next_probe{};
};

int configured_max() {
  int m = g_max_threads.load(std::memory_order_relaxed);
  if (m == 0) {
    int expected = 0;
    g_max_threads.compare_exchange_strong(expected, std::max(1, omp_get_max_threads()));
    m = g_max_threads.load(std::memory_order_relaxed);
  }
  return m;
}

Policy& policy() {
  thread_local Policy p;
  const unsigned gen = g_generation.load(std::memory_order_acquire);
  if (p.generation != gen) {
    p = Policy{};
    p.generation = gen;
    p.max = configured_max();
    p.adaptive = g_adaptive.load(std::memory_order_relaxed);
    p.active = p.max;
    p.next_probe = Clock::now() + kProbeInterval;
  }
  return p;
}

void configure(int n, bool adaptive) {
  g_max_threads.store(n, std::memory_order_relaxed);
  g_adaptive.store(adaptive, std::memory_order_relaxed);
  g_generation.fetch_add(1, std::memory_order_release);
}

}  // namespace

void set_num_threads(int n) {
  ZERO_CHECK(n >= 1, "thread count must be >= 1, got {}", n);
  configure(n, false);
}

void set_adaptive_threads(int n) {
  ZERO_CHECK(n >= 1, "thread count must be >= 1, got {}", n);
  configure(n, true);
}

int num_threads() { return configured_max(); }

int active_threads() { return policy().active; }

namespace detail {

int gemm_team() {
  Policy& p = policy();
  if (!p.adaptive || p.active >= p.max) return p.active;
  if (p.probe_left == 0 && Clock::now() >= p.next_probe) {
    p.probe_left = kProbeGemms;
    p.probe_slow = 0.0;
  }
  return p.probe_left > 0 ? std::min(p.max, 2 * p.active) : p.active;
}

void note_gemm_team(int team, Clock::time_point start, const Clock::time_point* finish, const long long* rows) {
  Policy& p = policy();
  if (!p.adaptive || team < 2) return;
  double fastest = 0.0, slowest = 0.0;
  for (int t = 0; t < team; ++t) {
    const double seconds = std::chrono::duration<double>(finish[t] - start).count();
    if (rows[t] == 0 || seconds <= 0.0) continue;
    const double rate = static_cast<double>(rows[t]) / seconds;
    fastest = std::max(fastest, rate);
    slowest = slowest == 0.0 ? rate : std::min(slowest, rate);
  }
  if (fastest == 0.0) return;
  const double slow = 1.0 - slowest / fastest;
  if (p.probe_left > 0 && team > p.active) {  // a probe of the doubled team
    p.probe_slow += slow / kProbeGemms;
    if (--p.probe_left == 0) {
      if (p.probe_slow < kSlowLimit) {
        p.active = team;
        p.slow = 0.0;
        p.samples = 0;
        p.probe_interval = kProbeInterval;
      } else {
        p.probe_interval = std::min(2 * p.probe_interval, kMaxProbeInterval);
      }
      p.next_probe = Clock::now() + p.probe_interval;
    }
    return;
  }
  if (team != p.active) return;
  p.slow = p.samples == 0 ? slow : (1.0 - kEwma) * p.slow + kEwma * slow;
  if (++p.samples >= kMinSamples && p.slow > kSlowLimit) {
    p.active = std::max(1, p.active / 2);
    p.slow = 0.0;
    p.samples = 0;
    p.probe_left = 0;
    p.probe_interval = kProbeInterval;
    p.next_probe = Clock::now() + kProbeInterval;
  }
}

}  // namespace detail

}  // namespace zero::cpu
