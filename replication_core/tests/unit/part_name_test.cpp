#include "rtable/replication_core/part_name.h"

#include <gtest/gtest.h>

#include "rtable/replication_core/active_part_set.h"

namespace rtable::core {
namespace {

PartName part(std::string_view name) {
  auto parsed = PartName::parse(name);
  EXPECT_TRUE(parsed) << parsed.error();
  return parsed ? *parsed : PartName{};
}

TEST(PartName, RoundTripsWithAndWithoutMutation) {
  for (const char* name : {"202612_1_1_0", "all_0_56_999999999_999999999", "2026-12-01_3_9_2",
                           "x_0_2147483647_1", "all_5_5_0_7"}) {
    EXPECT_EQ(part(name).format(), name);
  }
  auto p = part("202612_3_9_2_11");
  EXPECT_EQ(p.partition_id, "202612");
  EXPECT_EQ(p.min_block, 3);
  EXPECT_EQ(p.max_block, 9);
  EXPECT_EQ(p.level, 2u);
  EXPECT_EQ(p.mutation, 11);
  EXPECT_EQ(p.blocksCount(), 7);
}

TEST(PartName, RejectsMalformedNamesAndSaysWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"202612_1_1", "expected <partition>_<min>_<max>_<level>"},
      {"202612_1_1_0_0_0", "expected"},
      {"2026.12_1_1_0", "partition id '2026.12'"},
      {"_1_1_0", "partition id ''"},
      {"all_x_1_0", "min block 'x'"},
      {"all_1_-2_0", "max block '-2'"},
      {"all_1_1_", "level ''"},
      {"all_1_1_0_z", "mutation 'z'"},
      {"all_5_4_0", "min block 5 is above max block 4"},
      {"all_01_1_0", "not canonical (it would be 'all_1_1_0')"},
      {"all_1_1_0_0", "not canonical"},
  };
  for (const auto& [name, why] : cases) {
    auto parsed = PartName::parse(name);
    ASSERT_FALSE(parsed) << name;
    EXPECT_NE(parsed.error().find(why), std::string::npos) << name << ": " << parsed.error();
    EXPECT_NE(parsed.error().find(name), std::string::npos) << parsed.error();
  }
}

TEST(PartName, ContainsFollowsClickHouse) {
  EXPECT_TRUE(part("all_0_5_1").contains(part("all_0_2_0")));
  EXPECT_TRUE(part("all_0_5_1").contains(part("all_3_5_0")));
  EXPECT_TRUE(part("all_0_5_1").contains(part("all_0_5_1")));   // itself
  EXPECT_FALSE(part("all_0_5_2").contains(part("all_0_4_2")));  // equal level, other range
  EXPECT_TRUE(part("all_0_5_3").contains(part("all_0_4_2")));
  EXPECT_TRUE(part("all_0_4_2_9").contains(part("all_0_4_2")));  // its mutation
  EXPECT_FALSE(part("all_0_4_2").contains(part("all_0_4_2_9")));
  EXPECT_FALSE(part("all_0_5_1").contains(part("other_1_1_0")));
  EXPECT_FALSE(part("all_2_5_1").contains(part("all_0_2_0")));
  // A drop range covers every part of its blocks, whatever their level.
  EXPECT_TRUE(part("all_0_56_999999999").contains(part("all_0_56_5")));
  EXPECT_TRUE(part("all_0_56_999999999").isFakeDropRange());

  EXPECT_TRUE(part("all_0_2_1").isDisjoint(part("all_3_4_0")));
  EXPECT_FALSE(part("all_0_2_1").isDisjoint(part("all_2_4_1")));
  EXPECT_TRUE(part("a_0_2_1").isDisjoint(part("b_0_2_1")));
}

TEST(PartName, OrdersByPartitionThenBlocksThenLevel) {
  EXPECT_LT(part("a_5_5_0"), part("b_0_0_0"));
  EXPECT_LT(part("a_1_1_0"), part("a_1_2_1"));
  EXPECT_LT(part("a_1_2_0"), part("a_1_2_1"));
  EXPECT_LT(part("a_1_2_1"), part("a_2_2_0"));
}

TEST(ActiveDataPartSet, AMergedPartReplacesItsSources) {
  ActiveDataPartSet set;
  for (const char* name : {"all_1_1_0", "all_2_2_0", "all_3_3_0", "other_1_1_0"}) {
    EXPECT_EQ(set.add(part(name)), ActiveDataPartSet::AddResult::kAdded);
  }
  EXPECT_EQ(set.add(part("all_1_2_1")), ActiveDataPartSet::AddResult::kAdded);
  EXPECT_EQ(set.parts(),
            (std::vector<PartName>{part("all_1_2_1"), part("all_3_3_0"), part("other_1_1_0")}));
  // A part already covered changes nothing.
  EXPECT_EQ(set.add(part("all_2_2_0")), ActiveDataPartSet::AddResult::kAlreadyCovered);
  EXPECT_EQ(set.add(part("all_1_2_1")), ActiveDataPartSet::AddResult::kAlreadyCovered);
  EXPECT_EQ(set.containingPart(part("all_1_1_0")), part("all_1_2_1"));
  EXPECT_EQ(set.containingPart(part("all_4_4_0")), std::nullopt);
  EXPECT_EQ(set.size(), 3u);
}

TEST(ActiveDataPartSet, AnIntersectingPartIsRefusedAndChangesNothing) {
  ActiveDataPartSet set;
  ASSERT_TRUE(set.add(part("all_1_3_1")));
  ASSERT_TRUE(set.add(part("all_4_4_0")));
  auto next = set.add(part("all_0_2_1"));
  ASSERT_FALSE(next);
  EXPECT_NE(next.error().find("intersects next part all_1_3_1"), std::string::npos) << next.error();
  auto previous = set.add(part("all_3_4_1"));
  ASSERT_FALSE(previous);
  EXPECT_NE(previous.error().find("intersects previous part all_1_3_1"), std::string::npos)
      << previous.error();
  EXPECT_EQ(set.parts(), (std::vector<PartName>{part("all_1_3_1"), part("all_4_4_0")}));
}

TEST(ActiveDataPartSet, ADropRangeCoversAWholePartitionAndNothingElse) {
  ActiveDataPartSet set;
  for (const char* name : {"202611_0_9_2", "202612_0_3_1", "202612_4_4_0", "202612_5_5_0"}) {
    ASSERT_TRUE(set.add(part(name)));
  }
  const PartName drop = part("202612_0_5_999999999");
  EXPECT_EQ(
      set.partsCoveredBy(drop),
      (std::vector<PartName>{part("202612_0_3_1"), part("202612_4_4_0"), part("202612_5_5_0")}));
  EXPECT_EQ(set.add(drop), ActiveDataPartSet::AddResult::kAdded);
  EXPECT_EQ(set.parts(), (std::vector<PartName>{part("202611_0_9_2"), drop}));
  EXPECT_TRUE(set.remove(drop));
  EXPECT_FALSE(set.remove(drop));
}

}  // namespace
}  // namespace rtable::core
