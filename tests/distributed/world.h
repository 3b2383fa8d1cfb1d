// One source, two ways to run it: the distributed tests under mpirun, and the same tests with every rank
// a thread of one process.
//
//   zero_dist_tests       (tests/distributed/*.cpp, run under mpirun with 1..4 processes)
//                         test_world() is mpi_world(); ZERO_DIST_TEST(Suite, Name) is TEST(Suite, Name),
//                         whose body every process runs.
//   zero_inprocess_tests  (the ZeRO suites compiled once more with ZERO_INPROCESS_TESTS defined, plus
//                         tests/inprocess/main.cpp; plain ctest, no MPI)
//                         ZERO_DIST_TEST(Suite, Name) is a test that runs its body on every rank of an
//                         in-process world (run_ranks, distributed/comm/inprocess_communicator.h), for each
//                         world size given by --ranks N (default: 1, 2, 3 and 4 in turn); test_world() is
//                         the communicator of the rank whose thread calls it.
// A test written with ZERO_DIST_TEST and test_world() therefore runs both ways. Tests of MPI itself (the
// wire-byte count of the PMPI interposer, MpiCommunicator's own options) stay plain TESTs in files or
// blocks the in-process binary leaves out. An ASSERT_* that fails returns from one rank's body: that rank
// leaves its world, and ranks still waiting for it in a collective fail with PeerGone instead of hanging.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "distributed/comm/communicator.h"

#ifdef ZERO_INPROCESS_TESTS

namespace zero::dist::harness {
/// The calling rank's communicator (the thread's rank of the in-process world running the test).
std::shared_ptr<Communicator> test_world();
/// Runs body() on every rank of an in-process world, for each world size of the run (--ranks).
void run_on_every_rank(void (*body)());
}  // namespace zero::dist::harness

#define ZERO_DIST_TEST(suite, name)                                                             \
  void zero_dist_test_body_##suite##_##name();                                                  \
  TEST(suite, name) { ::zero::dist::harness::run_on_every_rank(&zero_dist_test_body_##suite##_##name); } \
  void zero_dist_test_body_##suite##_##name()

#else

#include "distributed/comm/job_runtime.h"

namespace zero::dist::harness {
/// This process's communicator: the job's MPI world.
inline std::shared_ptr<Communicator> test_world() { return mpi_world(); }
}  // namespace zero::dist::harness

#define ZERO_DIST_TEST(suite, name) TEST(suite, name)

#endif

namespace zero::dist {
using harness::test_world;
}  // namespace zero::dist
