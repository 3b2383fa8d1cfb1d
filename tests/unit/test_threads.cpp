// The CPU thread policy (core/cpu/kernels.h, Note [Threads on a busy machine] in core/cpu/threads.cpp)
// driven with made-up GEMM timings, so the test does not depend on how busy the machine is: a team
// whose threads fall apart halves, a probe whose threads keep pace restores it, a failed probe doubles
// the wait for the next, and set_num_threads turns the policy off. Whatever the team, the kernels'
// results are the same (the pinned runs and OpTable check that); this checks only the decisions.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/check.h"
#include "core/cpu/kernels.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

// Reports one GEMM on `team` threads: thread 0 did 100 rows in 1 ms, the others 100 rows in
// `others_ms`.
void report(int team, double others_ms) {
  const Clock::time_point start = Clock::now() - std::chrono::seconds(1);
  Clock::time_point finish[4];
  long long rows[4] = {100, 100, 100, 100};
  finish[0] = start + std::chrono::microseconds(1000);
  for (int t = 1; t < team; ++t)
    finish[t] = start + std::chrono::microseconds(static_cast<long long>(others_ms * 1000));
  cpu::detail::note_gemm_team(team, start, finish, rows);
}

class ThreadPolicy : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = cpu::num_threads(); }
  void TearDown() override { cpu::set_adaptive_threads(saved_); }
  int saved_ = 1;
};

TEST_F(ThreadPolicy, BacksOffWhenThreadsFallApartAndProbesBack) {
  cpu::set_adaptive_threads(2);
  EXPECT_EQ(cpu::active_threads(), 2);
  for (int i = 0; i < 8; ++i) report(2, 1.05);  // threads finish together: no change
  EXPECT_EQ(cpu::active_threads(), 2);
  // One thread at half the rate (slowness 0.5): the running mean passes 0.3 at the third such GEMM.
  report(2, 2.0);
  report(2, 2.0);
  EXPECT_EQ(cpu::active_threads(), 2);
  report(2, 2.0);
  EXPECT_EQ(cpu::active_threads(), 1);
  EXPECT_EQ(cpu::detail::gemm_team(), 1);  // no probe before the interval
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cpu::detail::gemm_team(), 2);      // a probe of the doubled team
  for (int i = 0; i < 4; ++i) report(2, 2.0);  // still slow: stay at 1
  EXPECT_EQ(cpu::active_threads(), 1);
  EXPECT_EQ(cpu::detail::gemm_team(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cpu::detail::gemm_team(), 1);  // a failed probe doubled the wait to 0.5 s
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cpu::detail::gemm_team(), 2);
  for (int i = 0; i < 4; ++i) report(2, 1.0);  // the machine is free again
  EXPECT_EQ(cpu::active_threads(), 2);
}

TEST_F(ThreadPolicy, FixedCountIgnoresTimings) {
  cpu::set_num_threads(2);
  for (int i = 0; i < 8; ++i) report(2, 3.0);
  EXPECT_EQ(cpu::active_threads(), 2);
  EXPECT_EQ(cpu::detail::gemm_team(), 2);
  EXPECT_EQ(cpu::num_threads(), 2);
  EXPECT_THROW(cpu::set_num_threads(0), Error);
  EXPECT_THROW(cpu::set_adaptive_threads(0), Error);
}

}  // namespace
}  // namespace zero
