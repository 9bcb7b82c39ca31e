#include <gtest/gtest.h>

#include "rtable/backup/backup_storage.h"

namespace rtable::backup {
namespace {

TEST(ObjectNameTest, AcceptsRelativeNames) {
  for (const std::string name : {"a", "data/3f/3f0a-4096", "backups/b1/manifest.json", "a b/c+d",
                                 "ünïcødé/数据", ".hidden", "a/.tmp", "a/tmp-.x", "...", "a..b"}) {
    EXPECT_EQ(objectNameProblem(name), std::nullopt) << name;
  }
  EXPECT_EQ(objectNameProblem(std::string(1024, 'n')), std::nullopt);
}

TEST(ObjectNameTest, RefusesWhatCouldLeaveTheDestinationOrHideAsTemporary) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "it is empty"},
      {"/etc/passwd", "it has an empty component (a leading, doubled or final '/')"},
      {"a//b", "it has an empty component (a leading, doubled or final '/')"},
      {"a/", "it has an empty component (a leading, doubled or final '/')"},
      {"..", "it has a '..' component"},
      {"a/../../b", "it has a '..' component"},
      {"./a", "it has a '.' component"},
      {".tmp-3fa2", "a component starts with '.tmp-', which marks temporary names"},
      {"d/.tmp-3fa2/x", "a component starts with '.tmp-', which marks temporary names"},
      {"a\tb", "it holds the control character 0x09"},
      {std::string("a\0b", 3), "it holds the control character 0x00"},
      {"a\x7f", "it holds the control character 0x7f"},
      {"a\\b", "it holds a backslash, which some S3 servers (SeaweedFS) turn into '/'"},
      {std::string(1025, 'n'), "it is 1025 bytes long, over the limit of 1024"},
  };
  for (const auto& [name, problem] : cases) {
    EXPECT_EQ(objectNameProblem(name), problem) << ::testing::PrintToString(name);
  }
}

TEST(ObjectNameTest, ListPrefixesMayEndAnywhere) {
  for (const std::string prefix : {"", "data/", "data/3f", "data/.", "data/..", "a/.tmp-", "."}) {
    EXPECT_EQ(listPrefixProblem(prefix), std::nullopt) << prefix;
  }
  for (const std::string prefix : {"/", "../", "a//", "a/../", "./x", ".tmp-1/x"}) {
    EXPECT_NE(listPrefixProblem(prefix), std::nullopt) << prefix;
  }
}

}  // namespace
}  // namespace rtable::backup
