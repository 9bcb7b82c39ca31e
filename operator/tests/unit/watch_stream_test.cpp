#include "rtable/operator/watch_stream.h"

#include <gtest/gtest.h>

#include <random>

namespace rtable::op {
namespace {

std::vector<std::string> splitAll(const std::vector<std::string_view>& chunks, LineSplitter& s) {
  std::vector<std::string> lines;
  for (auto chunk : chunks) s.feed(chunk, [&](std::string_view line) { lines.emplace_back(line); });
  s.finish([&](std::string_view line) { lines.emplace_back(line); });
  return lines;
}

std::string stream(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

const std::vector<std::string> kEvents = {
    R"({"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"10"}}})",
    R"({"type":"MODIFIED","object":{"kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"11"},"data":{"k":"v\nw"}}})",
    R"({"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"12"}}})",
    R"({"type":"DELETED","object":{"kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"13"}}})",
};

TEST(LineSplitterTest, EveryTwoWaySplit) {
  const std::string all = stream(kEvents);
  for (std::size_t cut = 0; cut <= all.size(); ++cut) {
    LineSplitter s;
    const std::string_view v(all);
    EXPECT_EQ(splitAll({v.substr(0, cut), v.substr(cut)}, s), kEvents) << "cut at " << cut;
  }
}

TEST(LineSplitterTest, RandomChunkingsAndSingleBytes) {
  const std::string all = stream(kEvents) + stream(kEvents);
  std::vector<std::string> expected = kEvents;
  expected.insert(expected.end(), kEvents.begin(), kEvents.end());
  std::mt19937 rng(12345);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::string_view> chunks;
    std::size_t pos = 0;
    while (pos < all.size()) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 40)(rng);
      chunks.push_back(std::string_view(all).substr(pos, n));
      pos += n;
    }
    LineSplitter s;
    ASSERT_EQ(splitAll(chunks, s), expected) << "round " << round;
    EXPECT_EQ(s.pendingBytes(), 0u);
  }
  std::vector<std::string_view> bytes;
  for (std::size_t i = 0; i < all.size(); ++i) bytes.push_back(std::string_view(all).substr(i, 1));
  LineSplitter s;
  EXPECT_EQ(splitAll(bytes, s), expected);
}

TEST(LineSplitterTest, CrLfEmptyLinesAndUnterminatedTail) {
  LineSplitter s;
  EXPECT_EQ(splitAll({"a\r\n\n\r\nb", "c\r", "\nd"}, s),
            (std::vector<std::string>{"a", "bc", "d"}));
}

TEST(LineSplitterTest, LineLimit) {
  LineSplitter s(8);
  std::vector<std::string> lines;
  auto collect = [&](std::string_view l) { lines.emplace_back(l); };
  EXPECT_TRUE(s.feed("12345678\n1234", collect));
  EXPECT_FALSE(s.feed("56789", collect));  // 9 bytes without a newline
  EXPECT_TRUE(s.failed());
  EXPECT_FALSE(s.feed("\nok\n", collect));
  EXPECT_EQ(lines, (std::vector<std::string>{"12345678"}));

  LineSplitter whole(4);
  EXPECT_FALSE(whole.feed("12345\n", collect));  // too long inside one chunk
}

TEST(WatchEventTest, Parses) {
  auto added = parseWatchEvent(kEvents[0]);
  ASSERT_TRUE(added) << added.error().toString();
  EXPECT_EQ(added->type, WatchEventType::kAdded);
  EXPECT_EQ(added->resourceVersion(), "10");
  EXPECT_EQ(added->object["metadata"]["name"], "a");
  auto bookmark = parseWatchEvent(kEvents[2]);
  ASSERT_TRUE(bookmark);
  EXPECT_EQ(bookmark->type, WatchEventType::kBookmark);
  EXPECT_EQ(bookmark->resourceVersion(), "12");
  EXPECT_EQ(parseWatchEvent(kEvents[3])->type, WatchEventType::kDeleted);
  EXPECT_EQ(parseWatchEvent(kEvents[1])->object["data"]["k"], "v\nw");
}

TEST(WatchEventTest, Rejects) {
  for (const char* bad : {"not json", "[]", R"({"type":"ADDED"})", R"({"type":"NOPE","object":{}})",
                          R"({"type":"ADDED","object":"x"})"}) {
    auto event = parseWatchEvent(bad);
    ASSERT_FALSE(event) << bad;
    EXPECT_EQ(event.error().kind, KubeErrorKind::kDecode);
  }
}

}  // namespace
}  // namespace rtable::op
