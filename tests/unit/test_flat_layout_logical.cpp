// FlatLayout's logical positions (Note [Logical positions] in distributed/zero/flat_layout.cpp):
// to_logical and logical_runs on layouts with gaps (entries marked `whole`, 2-4 ranks), against a count
// made here by walking every flat element: an element is real when some parameter's [offset, end)
// holds it, and its logical position is the number of real elements before it; a parameter's first
// logical element is the sum of the entries' sizes before it, counted from the entries, not the layout.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/check.h"
#include "distributed/zero/flat_layout.h"

namespace zero::dist {
namespace {

// Sizes that leave gaps at 2, 3 and 4 ranks (each world size is checked to have some), with a
// zero-element whole entry between two matrices and plain entries between them.
std::vector<FlatLayout::Entry> entries_with_gaps() {
  return {{"a", {7}, true, false},     {"b", {4, 6}, true, true}, {"c", {3}, false, false},
          {"z", {0, 4}, true, true},   {"d", {5, 5}, true, true}, {"e", {2}, false, false},
          {"f", {3, 7}, true, true},   {"g", {9}, true, false},   {"h", {2, 11}, true, true},
          {"i", {18}, false, false}};
}

// Per flat element: its logical position if real, -1 for padding (walked element by element).
std::vector<std::int64_t> walk(const FlatLayout& L, const std::vector<FlatLayout::Entry>& entries) {
  std::vector<std::int64_t> logical(static_cast<std::size_t>(L.padded_numel()), -1);
  std::int64_t before = 0;  // sizes of the entries before this one
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ParamRange& p = L.params()[i];
    std::int64_t n = 1;
    for (auto d : entries[i].shape) n *= d;
    for (std::int64_t k = 0; k < n; ++k) logical[static_cast<std::size_t>(p.offset + k)] = before + k;
    before += n;
  }
  return logical;
}

// The count of real elements in flat [0, x).
std::int64_t reals_before(const std::vector<std::int64_t>& logical, std::int64_t x) {
  std::int64_t n = 0;
  for (std::int64_t f = 0; f < x; ++f) n += logical[static_cast<std::size_t>(f)] >= 0 ? 1 : 0;
  return n;
}

TEST(FlatLayoutLogical, ToLogicalCountsTheRealElementsBefore) {
  const auto entries = entries_with_gaps();
  for (int world : {2, 3, 4}) {
    const FlatLayout L(entries, world);
    ASSERT_GT(L.interior_padding(), 0) << world << " ranks: the layout must have gaps for this test";
    const auto logical = walk(L, entries);
    ASSERT_EQ(reals_before(logical, L.padded_numel()), L.numel()) << world;
    for (std::int64_t f = 0; f <= L.padded_numel(); ++f) {
      EXPECT_EQ(L.to_logical(f), reals_before(logical, f)) << world << " ranks, flat " << f;
      if (f < L.padded_numel() && logical[static_cast<std::size_t>(f)] >= 0) {
        EXPECT_EQ(L.to_logical(f), logical[static_cast<std::size_t>(f)]) << world << " ranks, flat " << f;
      }
    }
    std::int64_t before = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      EXPECT_EQ(L.params()[i].logical_offset, before) << entries[i].name;
      before += L.params()[i].numel;
    }
  }
}

// Every flat range [b, e): the runs hold exactly its real elements, in order, each at its logical
// position, are maximal, and tile [to_logical(b), to_logical(e)); a partition's real elements are one
// logical range, and the partitions' ranges tile [0, Ψ) in rank order.
TEST(FlatLayoutLogical, RunsHoldExactlyTheRealElementsOfARange) {
  const auto entries = entries_with_gaps();
  for (int world : {2, 3, 4}) {
    const FlatLayout L(entries, world);
    const auto logical = walk(L, entries);
    const std::int64_t padded = L.padded_numel();
    for (std::int64_t b = 0; b <= padded; ++b)
      for (std::int64_t e = b; e <= padded; ++e) {
        std::vector<std::int64_t> want;  // the real elements of [b, e), flat positions in order
        for (std::int64_t f = b; f < e; ++f)
          if (logical[static_cast<std::size_t>(f)] >= 0) want.push_back(f);
        std::vector<std::int64_t> got;
        std::int64_t next_logical = reals_before(logical, b);
        const auto runs = L.logical_runs(b, e);
        for (std::size_t k = 0; k < runs.size(); ++k) {
          const FlatRun& r = runs[k];
          ASSERT_GT(r.length, 0);
          EXPECT_EQ(r.logical, next_logical) << "runs tile the logical range in order";
          for (std::int64_t j = 0; j < r.length; ++j) {
            got.push_back(r.flat + j);
            EXPECT_EQ(logical[static_cast<std::size_t>(r.flat + j)], r.logical + j);
          }
          next_logical = r.logical + r.length;
          if (k > 0) {
            EXPECT_NE(runs[k - 1].flat + runs[k - 1].length, r.flat) << "runs are maximal";
          }
        }
        EXPECT_EQ(got, want) << world << " ranks, [" << b << ", " << e << ")";
        EXPECT_EQ(next_logical, reals_before(logical, e));
      }
    std::int64_t covered = 0;
    for (int r = 0; r < world; ++r) {
      std::vector<std::int64_t> mine;
      for (std::int64_t f = L.partition_begin(r); f < L.partition_end(r); ++f)
        if (logical[static_cast<std::size_t>(f)] >= 0) mine.push_back(logical[static_cast<std::size_t>(f)]);
      for (std::size_t j = 0; j < mine.size(); ++j) EXPECT_EQ(mine[j], covered + static_cast<std::int64_t>(j));
      covered += static_cast<std::int64_t>(mine.size());
      EXPECT_EQ(L.to_logical(L.partition_end(r)), covered) << world << " ranks, rank " << r;
    }
    EXPECT_EQ(covered, L.numel());
  }
}

// Without gaps the logical positions are the flat ones cut at Ψ, in one run (what checkpoints wrote
// before logical positions existed).
TEST(FlatLayoutLogical, WithoutGapsItIsTheFlatRangeCutAtPsi) {
  auto entries = entries_with_gaps();
  for (auto& e : entries) e.whole = false;
  for (int world : {1, 2, 3, 4}) {
    const FlatLayout L(entries, world);
    ASSERT_EQ(L.interior_padding(), 0);
    for (std::int64_t f = 0; f <= L.padded_numel(); ++f) EXPECT_EQ(L.to_logical(f), std::min(f, L.numel()));
    const auto runs = L.logical_runs(0, L.padded_numel());
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].flat, 0);
    EXPECT_EQ(runs[0].logical, 0);
    EXPECT_EQ(runs[0].length, L.numel());
  }
  const FlatLayout L(entries, 2);
  EXPECT_THROW(L.to_logical(L.padded_numel() + 1), Error);
  EXPECT_THROW(L.logical_runs(2, 1), Error);
}

}  // namespace
}  // namespace zero::dist
