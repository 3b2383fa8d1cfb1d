// What the CPU communicators (MpiCommunicator, InProcessCommunicator) share about a collective that
// their communication thread runs: CpuWork, the handle the caller waits on, and the thread CPU clock
// behind Ledger::cpu_seconds.
#pragma once

#include <time.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>

#include "core/trace.h"
#include "distributed/comm/communicator.h"

namespace zero::dist::detail {

/// Completion flag + exception of one queued collective: the communication thread calls finish(), the
/// caller wait()s.
class CpuWork final : public Work {
 public:
  void wait() override {
    std::unique_lock lock(mutex_);
    // Time the training thread spends blocked on communication: the exposed part of it in a trace.
    std::optional<trace::Span> blocked;
    if (!done_ && trace::active()) blocked.emplace("wait", "wait", trace::kComputeThread);
    done_cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() const override {
    std::lock_guard lock(mutex_);
    return done_;
  }
  void finish(std::exception_ptr error) {
    {
      std::lock_guard lock(mutex_);
      error_ = std::move(error);
      done_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

/// CPU time the calling thread has used so far (user + system), in nanoseconds.
inline std::int64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

}  // namespace zero::dist::detail
