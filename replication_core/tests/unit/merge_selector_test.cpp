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
  // Only six parts: the big one is taken along (the part count stays bounded).
  EXPECT_EQ(selectMergeRange(partsOfRows({1000, 1, 1, 1, 1, 1}), 6, 100, kAny), (MergeRange{0, 6}));
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
  // Runs of three write per removed part: {40,40,1} 40.5, {40,1,1} 21, {1,1,10} 6, {1,10,10} 10.5,
  // {10,10,10} 15.
  const auto parts = partsOfRows({40, 40, 1, 1, 10, 10, 10});
  EXPECT_EQ(selectMergeRange(parts, 3, 3, kAny), (MergeRange{2, 3}));
  // With any width from 2: {1,1} writes 2 for one removed part.
  EXPECT_EQ(selectMergeRange(parts, 2, 7, kAny), (MergeRange{2, 2}));
}

}  // namespace
}  // namespace rtable::core
