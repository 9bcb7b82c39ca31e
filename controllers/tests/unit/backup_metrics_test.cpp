// BackupMetrics: the newest Completed backup of a series wins (an older one seen later, as after
// an operator restart's relist, changes nothing); failures count per table and reason.
#include "rtable/controllers/backup_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <sstream>

namespace rtable::controllers {
namespace {

std::string scrape(prometheus::Registry& registry) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry.Collect());
  return out.str();
}

TEST(BackupMetrics, TheNewestCompletedBackupWinsAndFailuresCount) {
  prometheus::Registry registry;
  BackupMetrics metrics(registry);
  metrics.observeCompleted("db", {"events", "clicks"}, "nightly", {1000, 1060, 4096, 512});
  metrics.observeCompleted("db", {"events"}, "nightly", {500, 900, 1, 1});  // older: ignored
  metrics.failed("db", {"events"}, "nightly", "NoSpace");
  metrics.failed("db", {"events"}, "nightly", "NoSpace");
  const std::string text = scrape(registry);
  EXPECT_NE(text.find("rtable_backup_last_success_timestamp_seconds{namespace=\"db\",schedule="
                      "\"nightly\",table=\"events\"} 1060"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rtable_backup_duration_seconds{namespace=\"db\",schedule=\"nightly\","
                      "table=\"clicks\"} 60"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rtable_backup_bytes_written{namespace=\"db\",schedule=\"nightly\",table="
                      "\"events\"} 4096"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rtable_backup_bytes_reused{namespace=\"db\",schedule=\"nightly\",table="
                      "\"events\"} 512"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rtable_backup_failures_total{namespace=\"db\",reason=\"NoSpace\",schedule="
                      "\"nightly\",table=\"events\"} 2"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace rtable::controllers
