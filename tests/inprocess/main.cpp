// GoogleTest main for the distributed suites run in one process (tests/distributed/world.h): every
// ZERO_DIST_TEST runs its body on N threads, one per rank of an in-process world, for each world size
// of the run.
//
//   zero_inprocess_tests              world sizes 1, 2, 3 and 4, one after the other
//   zero_inprocess_tests --ranks 3    world size 3 only (ctest runs one entry per size: inprocess_npN)
//
// Failures name the rank and the world size. To stop all ranks of one step in a debugger:
//   gdb --args build/bin/zero_inprocess_tests --ranks 4 --gtest_filter=ZeroEquivalence.EdgeShapes
// then `info threads` ("rank R" is a rank's training thread, "rank R comm" its communication thread)
// and `thread apply all bt`.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "distributed/comm/inprocess_communicator.h"
#include "tests/distributed/world.h"

namespace zero::dist::harness {
namespace {

std::vector<int> g_world_sizes = {1, 2, 3, 4};
thread_local std::shared_ptr<Communicator> g_rank_world;  // set on each rank's thread while it runs a body


}  // namespace

std::shared_ptr<Communicator> test_world() {
  if (!g_rank_world) throw Error("test_world(): not on a rank's thread (use it inside a ZERO_DIST_TEST)");
  return g_rank_world;
}

void run_on_every_rank(void (*body)()) {
  for (int n : g_world_sizes) {
    try {
      run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
        SCOPED_TRACE(fmt::format("rank {} of {} in-process ranks", comm->rank(), n));
        struct Bind {  // test_world() is this rank's communicator while the body runs
          explicit Bind(std::shared_ptr<Communicator> c) { g_rank_world = std::move(c); }
          ~Bind() { g_rank_world.reset(); }
        } bind(comm);
        body();
      });
    } catch (const std::exception& e) {
      ADD_FAILURE() << n << " in-process ranks: " << e.what();
    }
  }
}

}  // namespace zero::dist::harness

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    if (arg == "--ranks" && i + 1 < argc) value = argv[++i];
    else if (arg.rfind("--ranks=", 0) == 0) value = arg.substr(8);
    else {
      std::fprintf(stderr, "error: unknown argument '%s' (usage: %s [--ranks N] [gtest flags])\n", arg.c_str(), argv[0]);
      return 2;
    }
    char* end = nullptr;
    const long n = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || n < 1 || n > 64) {
      std::fprintf(stderr, "error: --ranks must be a number of ranks from 1 to 64, got '%s'\n", value.c_str());
      return 2;
    }
    zero::dist::harness::g_world_sizes = {static_cast<int>(n)};
  }
  return RUN_ALL_TESTS();
}
