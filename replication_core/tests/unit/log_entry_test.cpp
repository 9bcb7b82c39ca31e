#include "rtable/replication_core/log_entry.h"

#include <gtest/gtest.h>

namespace rtable::core {
namespace {

constexpr int64_t kCreateTime = 1764558000;  // 2025-12-01 03:00:00 UTC

TEST(LogEntry, GetPartHasClickHousesExactText) {
  LogEntry entry;
  entry.type = LogEntry::Type::kGetPart;
  entry.create_time = kCreateTime;
  entry.source_replica = "r1";
  entry.block_id = "202612_15119613386410440397_6453052399425447744";
  entry.new_part_name = "202612_5_5_0";
  entry.quorum = 2;
  EXPECT_EQ(entry.format(),
            "format version: 4\n"
            "create_time: 2025-12-01 03:00:00\n"
            "source replica: r1\n"
            "block_id: 202612_15119613386410440397_6453052399425447744\n"
            "get\n"
            "202612_5_5_0\n"
            "quorum: 2\n");
}

TEST(LogEntry, EveryTypeRoundTrips) {
  std::vector<LogEntry> entries(5);
  entries[0].type = LogEntry::Type::kGetPart;
  entries[0].new_part_name = "all_1_1_0";
  entries[0].block_id = "all_1_2";
  entries[1].type = LogEntry::Type::kAttachPart;
  entries[1].new_part_name = "all_7_7_0";
  entries[1].part_checksum = "0123456789ABCDEF0123456789ABCDEF";
  entries[2].type = LogEntry::Type::kMergeParts;
  entries[2].source_parts = {"all_1_1_0", "all_2_2_0", "all_3_3_0"};
  entries[2].new_part_name = "all_1_3_1";
  entries[2].deduplicate = true;
  entries[3].type = LogEntry::Type::kDropRange;
  entries[3].new_part_name = "all_0_9_999999999";
  entries[4].type = LogEntry::Type::kDropRange;
  entries[4].detach = true;
  entries[4].new_part_name = "all_0_9_999999999";
  entries[4].part_type = "Compact";
  for (auto& entry : entries) {
    entry.create_time = kCreateTime;
    entry.source_replica = "replica-2";
    auto parsed = LogEntry::parse(entry.format());
    ASSERT_TRUE(parsed) << parsed.error() << "\n" << entry.format();
    EXPECT_EQ(*parsed, entry) << entry.format();
  }
}

TEST(LogEntry, ParsesWhatClickHouseWrites) {
  // A merge as ClickHouse writes it, and a get of a Compact part with an older writer's blank line.
  auto merge = LogEntry::parse(
      "format version: 4\ncreate_time: 2026-01-02 10:00:00\nsource replica: ch1\nblock_id: \n"
      "merge\n202601_0_0_0\n202601_1_1_0\ninto\n202601_0_1_1\ndeduplicate: 0\n");
  ASSERT_TRUE(merge) << merge.error();
  EXPECT_EQ(merge->type, LogEntry::Type::kMergeParts);
  EXPECT_EQ(merge->source_parts, (std::vector<std::string>{"202601_0_0_0", "202601_1_1_0"}));
  EXPECT_EQ(merge->new_part_name, "202601_0_1_1");
  EXPECT_EQ(merge->block_id, "");

  auto get = LogEntry::parse(
      "format version: 4\ncreate_time: 2026-01-02 10:00:00\nsource replica: ch1\n"
      "block_id: 202601_1_2\nget\n202601_2_2_0\n\npart_type: Compact\n");
  ASSERT_TRUE(get) << get.error();
  EXPECT_EQ(get->part_type, "Compact");
  EXPECT_EQ(get->new_part_name, "202601_2_2_0");
}

TEST(LogEntry, ErrorsNameTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "line 1: expected 'format version: '"},
      {"format version: 9\n", "format version 9 is not supported"},
      {"format version: 4\ncreate_time: yesterday\n", "line 2: create_time"},
      {"format version: 4\ncreate_time: 2026-01-02 10:00:00\nsource replica: r\nblock_id: a\\q\n",
       "block_id: unknown escape"},
      {"format version: 4\ncreate_time: 2026-01-02 10:00:00\nsource replica: r\nblock_id: "
       "\nmutate\n",
       "line 5: unknown entry type 'mutate'"},
      {"format version: 4\ncreate_time: 2026-01-02 10:00:00\nsource replica: r\nblock_id: \nget\n",
       "expected a part name"},
      {"format version: 4\ncreate_time: 2026-01-02 10:00:00\nsource replica: r\nblock_id: "
       "\nget\np\nwhat\n",
       "unexpected 'what'"},
      {"format version: 4\ncreate_time: 2026-01-02 10:00:00\nsource replica: r\nblock_id: "
       "\nmerge\na\n",
       "expected a source part or 'into'"},
  };
  for (const auto& [text, why] : cases) {
    auto parsed = LogEntry::parse(text);
    ASSERT_FALSE(parsed) << text;
    EXPECT_NE(parsed.error().find(why), std::string::npos) << parsed.error();
  }
}

// Found by fuzz_log_entry: an optional field on the last line without its newline was read from
// the error the line reader returned (an allocation of terabytes under ASan, garbage without).
TEST(LogEntry, AnOptionalFieldWithoutItsNewlineIsAnError) {
  const std::string head =
      "format version: 4\ncreate_time: 2026-01-02 10:00:00\nsource replica: r\nblock_id: \n";
  for (const std::string& text : {head + "get\np\n\npart_type: Compact", head + "get\np\nquorum: 2",
                                  head + "merge\na\ninto\nb\ndeduplicate: 1"}) {
    auto parsed = LogEntry::parse(text);
    ASSERT_FALSE(parsed) << text;
    EXPECT_NE(parsed.error().find("ending in a newline"), std::string::npos) << parsed.error();
  }
}

TEST(LogEntry, EscapingRoundTrips) {
  const std::string raw = std::string("a\\b\nc\td'e\0f", 12);
  auto back = unescapeString(escapeString(raw));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, raw);
  EXPECT_EQ(escapeString("x\ny"), "x\\ny");
}

}  // namespace
}  // namespace rtable::core
