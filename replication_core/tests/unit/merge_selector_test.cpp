#include "rtable/replication_core/merge_selector.h"

#include <gtest/gtest.h>

namespace rtable::core {
namespace {

std::vector<MergeCandidate> partsOfRows(const std::vector<uint64_t>& rows) {
  std::vector<MergeCandidate> parts;
  for (uint64_t r : rows) parts.push_back({r, true});
  return parts;
}

const auto kAny = [](const MergeRange&) { return true; };

TEST(MergeSelector, ManySmallPartsAreMergedAtOnceUpToTheMaximum) {
  const auto parts = partsOfRows(std::vector<uint64_t>(433, 1));
  EXPECT_EQ(selectMergeRange(parts, 6, 100, kAny), (MergeRange{0, 100}));
  // The old fixed width: ten at a time.
  EXPECT_EQ(selectMergeRange(parts, 6, 10, kAny), (MergeRange{0, 10}));
}

TEST(MergeSelector, ABigPartIsLeftAloneWhileSmallOnesCanBeMerged) {
  // A merged part of 1000 rows, then seven single-row parts.
  const auto parts = partsOfRows({1000, 1, 1, 1, 1, 1, 1, 1});
  EXPECT_EQ(selectMergeRange(parts, 6, 100, kAny), (MergeRange{1, 7}));
  // Only six parts: the big one is not rewritten to take in five rows (it used to be, every five
  // single-row inserts).
  EXPECT_EQ(selectMergeRange(partsOfRows({1000, 1, 1, 1, 1, 1}), 6, 100, kAny), std::nullopt);
  // Enough small rows beside it, and it is: 1000 + 4000 is five times 1000.
  EXPECT_EQ(selectMergeRange(partsOfRows({1000, 800, 800, 800, 800, 800}), 6, 100, kAny),
            (MergeRange{0, 6}));
  EXPECT_EQ(selectMergeRange(partsOfRows({1000, 800, 800, 800, 800, 799}), 6, 100, kAny),
            std::nullopt);
}

TEST(MergeSelector, ManyPartsLowerTheBarSoTheirCountStaysBounded) {
  // Big parts with four small ones between them: every run of six holds two big parts.
  auto pattern = [](std::size_t n) {
    std::vector<uint64_t> rows;
    for (std::size_t i = 0; i < n; ++i) rows.push_back(i % 5 == 0 ? 1000 : 1);
    return partsOfRows(rows);
  };
  EXPECT_EQ(selectMergeRange(pattern(10), 6, 100, kAny), std::nullopt);  // needs 5x the biggest
  // At 30 parts 3x: the cheapest run holding three big parts.
  EXPECT_EQ(selectMergeRange(pattern(30), 6, 100, kAny), (MergeRange{1, 19}));
  // At 50 and more, 1x: the cheapest run of all, two big parts and the small ones between.
  EXPECT_EQ(selectMergeRange(pattern(50), 6, 100, kAny), (MergeRange{1, 9}));
}

TEST(MergeSelector, TheBarIsNeverAboveTheNarrowestRun) {
  // Runs of three allowed: three equal parts are worth merging, a big one and two small are not.
  EXPECT_EQ(selectMergeRange(partsOfRows({1, 1, 1}), 3, 3, kAny), (MergeRange{0, 3}));
  EXPECT_EQ(selectMergeRange(partsOfRows({1000, 1, 1}), 3, 3, kAny), std::nullopt);
}

TEST(MergeSelector, TooFewPartsOrNoFreeRunGivesNothing) {
  EXPECT_EQ(selectMergeRange(partsOfRows({1}), 6, 100, kAny), std::nullopt);
  auto parts = partsOfRows({1, 1, 1, 1, 1, 1, 1});
  parts[3].mergeable = false;  // a fetch will replace it: no run of six around it
  EXPECT_EQ(selectMergeRange(parts, 6, 100, kAny), std::nullopt);
  // Runs of three on either side, when three are enough.
  EXPECT_EQ(selectMergeRange(parts, 3, 3, kAny), (MergeRange{0, 3}));
}

TEST(MergeSelector, AVetoedRunGivesTheNextBest) {
  const auto parts = partsOfRows(std::vector<uint64_t>(12, 1));
  // Any run containing part 11 (a block still being inserted) is refused.
  auto without_last = [](const MergeRange& r) { return r.start + r.width <= 11; };
  EXPECT_EQ(selectMergeRange(parts, 6, 100, without_last), (MergeRange{0, 11}));
  auto nothing = [](const MergeRange&) { return false; };
  EXPECT_EQ(selectMergeRange(parts, 6, 100, nothing), std::nullopt);
}

TEST(MergeSelector, FewerRowsPerRemovedPartWins) {
  // Runs of three that hold three times their biggest part, and what each writes per removed
  // part: {40,40,40} 60, {1,1,1} 1.5, {10,10,10} 15. ({1,1,10} would write 6, but it is not worth
  // it: the 10 would be rewritten to take in two rows.)
  const auto parts = partsOfRows({40, 40, 40, 1, 1, 1, 10, 10, 10});
  EXPECT_EQ(selectMergeRange(parts, 3, 3, kAny), (MergeRange{3, 3}));
  EXPECT_EQ(selectMergeRange(partsOfRows({40, 40, 1, 1, 10, 10, 10}), 3, 3, kAny),
            (MergeRange{4, 3}));
  // With any width from 2 (the bar is then twice the biggest part): {1,1,1} still, it writes
  // 1.5 per removed part where {1,1} writes 2.
  EXPECT_EQ(selectMergeRange(parts, 2, 9, kAny), (MergeRange{3, 3}));
}

}  // namespace
}  // namespace rtable::core
