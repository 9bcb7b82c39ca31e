// The stalls rtable-core's --test-stall arms (fail_points.h): parsed, applied only to their
// operation and paths, and refused with a message naming what is wrong.
#include "rtable/replication_core/fail_points.h"

#include <gtest/gtest.h>

namespace rtable::core {
namespace {

TEST(Stall, ParsesOperationPathAndMillisecondsAndStallsOnlyWhatMatches) {
  auto stall = parseStall("write@_1/:2");
  ASSERT_TRUE(stall) << stall.error();
  EXPECT_EQ(stall->op, FailPoint::kWrite);
  EXPECT_EQ(stall->path_contains, "_1/");
  EXPECT_EQ(stall->stall, std::chrono::milliseconds(2));
  EXPECT_EQ(stall->error, 0);  // it proceeds after the wait
  EXPECT_EQ(stall->times, -1);

  auto merge = parseStall("merge:1500");
  ASSERT_TRUE(merge) << merge.error();
  EXPECT_EQ(merge->op, FailPoint::kMerge);

  auto any_path = parseStall("receive_head:1500");
  ASSERT_TRUE(any_path) << any_path.error();
  EXPECT_EQ(any_path->op, FailPoint::kReceiveHead);
  EXPECT_EQ(any_path->path_contains, "");

  clearFaultsForTest();
  injectFaultForTest(*stall);
  EXPECT_EQ(faultFor(FailPoint::kWrite, "/data/tmp_202612_0_5_1/id.bin"), 0);
  EXPECT_EQ(faultFor(FailPoint::kWrite, "/data/tmp_202612_0_5_1/d.bin"), 0);
  EXPECT_EQ(faultFor(FailPoint::kWrite, "/data/tmp_202612_6_6_0/id.bin"), 0);  // not matched
  EXPECT_EQ(faultFor(FailPoint::kFsync, "/data/tmp_202612_0_5_1/id.bin"), 0);  // not matched
  EXPECT_EQ(faultHitsForTest(), 2u);
  clearFaultsForTest();
}

TEST(Stall, BadTextIsRefusedNamingWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"write", "no ':MS'"},
      {"scribble:10", "unknown operation 'scribble'"},
      {"write@x:", "is not a number of milliseconds"},
      {"write:0", "'0' is not a number of milliseconds from 1 to 600000"},
      {"write:10s", "'10s'"},
      {"write:600001", "'600001'"},
  };
  for (const auto& [text, why] : cases) {
    auto parsed = parseStall(text);
    ASSERT_FALSE(parsed) << text;
    EXPECT_NE(parsed.error().find(why), std::string::npos) << parsed.error();
  }
}

}  // namespace
}  // namespace rtable::core
