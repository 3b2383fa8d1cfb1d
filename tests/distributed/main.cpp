// GoogleTest main for the distributed suites, run under mpirun with 1..4 ranks.
//
// Every rank runs every test (tests are collective: all ranks issue the same calls). Rank 0 prints with
// gtest's default printer; the other ranks print only their failures, prefixed with their rank. All
// ranks then agree on the outcome (max of the failure flags) so mpirun sees one exit code, and MPI is
// finalised cleanly. An exception escaping the test runner ends the whole job (fail_job: one line)
// instead of leaving the other ranks waiting in a collective.
#include <gtest/gtest.h>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "distributed/comm/job_runtime.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  // The test's name is kept here: UnitTest::current_test_info() would deadlock inside
  // OnTestPartResult (gtest holds its own mutex while reporting).
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestEnd(const ::testing::TestInfo&) override { test_ = "(outside a test)"; }

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s failed at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
  std::string test_ = "(outside a test)";
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    auto comm = zero::dist::mpi_world();
    if (comm->rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(comm->rank()));
    }
    const int local = RUN_ALL_TESTS();
    const bool any_failed = comm->all_reduce_max(local != 0 ? 1.0 : 0.0) != 0.0;
    if (comm->rank() == 0 && any_failed && local == 0)
      std::fprintf(stderr, "rank 0 passed, but another rank failed (see its output above)\n");
    comm.reset();
    zero::dist::finalize_mpi();
    return any_failed ? 1 : 0;
  } catch (const std::exception& e) {
    zero::dist::fail_job(std::runtime_error(std::string("distributed tests: ") + e.what()));
  }
}
