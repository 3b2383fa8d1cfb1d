// distributed/comm/scoped.h without NCCL or a GPU: the group runner against a fake NCCL group (a per-thread
// depth counter, as NCCL keeps) whose calls fail on demand, and the owning handle against a counting
// releaser inside an owner whose constructor throws half-way — the two error paths of NcclCommunicator.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "distributed/comm/scoped.h"

namespace zero::dist {
namespace {

// NCCL's group state: calls made while depth > 0 are deferred to the matching end.
struct FakeGroup {
  int depth = 0, starts = 0, ends = 0;
  int fail_call = -1;  // index of the grouped call that fails, -1 for none
  bool fail_end = false, fail_start = false;
  std::vector<int> issued;
  void start() {
    if (fail_start) throw std::runtime_error("start failed");
    ++depth;
    ++starts;
  }
  void end() {
    --depth;
    ++ends;
    if (fail_end) throw std::runtime_error("end failed");
  }
  void call(int i) {
    if (i == fail_call) throw std::runtime_error("call failed");
    issued.push_back(i);
  }
  void grouped(int calls) {
    detail::run_grouped([&] { start(); },
                        [&] {
                          for (int i = 0; i < calls; ++i) call(i);
                        },
                        [&] { end(); });
  }
};

TEST(ScopedGroup, ClosesTheGroupOnSuccess) {
  FakeGroup g;
  g.grouped(3);
  EXPECT_EQ(g.depth, 0);
  EXPECT_EQ(g.issued, (std::vector<int>{0, 1, 2}));
}

TEST(ScopedGroup, ClosesTheGroupWhenACallFails) {
  FakeGroup g;
  g.fail_call = 1;
  EXPECT_THROW(
      {
        try {
          g.grouped(3);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "call failed");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(g.depth, 0);  // not left open: the next group is a group of its own
  EXPECT_EQ(g.ends, 1);
  g.fail_call = -1;
  g.issued.clear();
  g.grouped(2);
  EXPECT_EQ(g.depth, 0);
  EXPECT_EQ(g.starts, 2);
  EXPECT_EQ(g.issued, (std::vector<int>{0, 1}));
}

TEST(ScopedGroup, TheFirstErrorWinsAndEndErrorsPropagate) {
  FakeGroup g;
  g.fail_call = 0;
  g.fail_end = true;
  try {
    g.grouped(2);
    ADD_FAILURE() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "call failed");  // the cause, not the follow-up failure of ending the group
  }
  EXPECT_EQ(g.ends, 1);
  FakeGroup h;
  h.fail_end = true;
  EXPECT_THROW(h.grouped(2), std::runtime_error);  // an error ending the group is reported
  EXPECT_EQ(h.ends, 1);
}

TEST(ScopedGroup, AFailedStartRunsNothing) {
  FakeGroup g;
  g.fail_start = true;
  EXPECT_THROW(g.grouped(2), std::runtime_error);
  EXPECT_EQ(g.ends, 0);
  EXPECT_TRUE(g.issued.empty());
}

// ---- UniqueHandle: what a throwing constructor acquired is released once ----

int g_released = 0;
struct FakeRelease {
  void operator()(int* p) const {
    ++g_released;
    delete p;
  }
};

// Acquires like NcclCommunicator: owned members filled one by one in the constructor body.
struct Owner {
  detail::UniqueHandle<int*, FakeRelease> a, b, c;
  explicit Owner(int fail_after) {
    a.reset(new int(1));
    if (fail_after == 1) throw std::runtime_error("init failed");
    b.reset(new int(2));
    if (fail_after == 2) throw std::runtime_error("init failed");
    c.reset(new int(3));
  }
};

TEST(UniqueHandle, AThrowingConstructorReleasesWhatItAcquired) {
  for (int fail_after : {1, 2}) {
    g_released = 0;
    EXPECT_THROW(Owner o(fail_after), std::runtime_error);
    EXPECT_EQ(g_released, fail_after);  // each acquired handle once; the null ones not at all
  }
  g_released = 0;
  { Owner o(0); }
  EXPECT_EQ(g_released, 3);
}

}  // namespace
}  // namespace zero::dist
