// Exception safety for the GPU communicator (distributed/comm/nccl_communicator.cpp), in plain C++ so it is
// tested without NCCL or a GPU (tests/unit/test_scoped.cpp): a group call that is closed on every path,
// and an owning handle for the streams, events and buffers the communicator acquires.
#pragma once

#include <memory>
#include <type_traits>

namespace zero::dist::detail {

/// start(); body(); end() — with end() also run when body() throws, so a group that start() opened
/// (ncclGroupStart) is closed (ncclGroupEnd) on every path. NCCL's group depth is per thread: a group
/// left open by a failed ncclReduce would swallow every later collective of the thread into it, and
/// the next wait would hang. When body() throws, its exception propagates and an error from the
/// closing end() is dropped (the first failure names the cause); when only end() throws, that
/// propagates. If start() throws nothing was opened and neither body() nor end() runs.
template <class Start, class Body, class End>
void run_grouped(Start&& start, Body&& body, End&& end) {
  start();
  try {
    body();
  } catch (...) {
    try {
      end();
    } catch (...) {
    }
    throw;
  }
  end();
}

/// Owns one handle of pointer type H (cudaStream_t, cudaEvent_t, a device or pinned pointer) and
/// releases it exactly once with Free{}(h) — in particular when the owner's constructor throws after
/// acquiring it, which raw members would leak (a destructor does not run for a half-built object, but
/// the members built so far are destroyed). Null is "nothing owned"; Free is not called for it.
template <class H, class Free>
using UniqueHandle = std::unique_ptr<std::remove_pointer_t<H>, Free>;

}  // namespace zero::dist::detail
