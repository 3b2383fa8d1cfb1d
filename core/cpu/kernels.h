// How many threads the CPU kernels use. The kernels themselves are CpuBackend's (core/cpu/backend.h),
// reached through kernels(Device::cpu) (core/kernels.h). Every kernel gives the same bits for any
// thread count; only the speed depends on it.
#pragma once

#include <chrono>

namespace zero::cpu {

/// Every parallel kernel uses exactly n threads (train_gpt --threads n). Throws zero::Error for n < 1.
void set_num_threads(int n);
/// Up to n threads, fewer while other work keeps this machine's cores busy (Note [Threads on a busy
/// machine] in core/cpu/threads.cpp). The default, with n = the cores OpenMP sees (OMP_NUM_THREADS).
/// Throws zero::Error for n < 1.
void set_adaptive_threads(int n);
/// The thread count set: the most a kernel uses.
int num_threads();
/// The team the next parallel kernel started on this thread uses: num_threads(), or fewer while the
/// adaptive policy has backed off.
int active_threads();

namespace detail {
/// The team size for a large GEMM about to run on this thread (active_threads(), or twice that while
/// the adaptive policy probes whether the machine is free again).
int gemm_team();
/// Reports a GEMM that ran on `team` threads starting at `start`: thread i did rows[i] rows and was
/// done at finish[i]. The adaptive policy's only measurement.
void note_gemm_team(int team, std::chrono::steady_clock::time_point start,
                    const std::chrono::steady_clock::time_point* finish, const long long* rows);
}  // namespace detail

}  // namespace zero::cpu
