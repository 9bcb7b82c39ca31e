// openDestination: a filesystem destination as is; a volume one inside the claim's mount under the
// volumes directory; an S3 one with the credentials of the Secret mounted under the credentials
// directory; and errors that say what to change when a mount is missing.
#include "rtable/backup/open_destination.h"

#include <gtest/gtest.h>

#include <fstream>

#include "../storage_conformance.h"

namespace rtable::backup {
namespace {

namespace fs = std::filesystem;

class OpenDestination : public ::testing::Test {
 protected:
  void SetUp() override {
    destination_.kind = DestinationRef::Kind::kS3;
    destination_.endpoint = "http://127.0.0.1:8333";
    destination_.bucket = "backups";
    destination_.prefix = "prod";
    destination_.credentials_secret = "s3-backup";
  }
  void writeKey(const std::string& key, const std::string& value) {
    fs::create_directories(dir_.path() / "s3-backup");
    std::ofstream(dir_.path() / "s3-backup" / key) << value;
  }
  ReplicaMounts mounts() const {
    return {.credentials_dir = dir_.path(), .volumes_dir = dir_.path() / "volumes"};
  }
  std::string error() {
    auto opened = openDestination(destination_, mounts());
    if (opened) return "opened " + (*opened)->location();
    return std::string(storageErrorKindName(opened.error().kind)) + ": " + opened.error().message;
  }

  testing::ScratchDir dir_;
  DestinationRef destination_;
};

TEST_F(OpenDestination, AFilesystemDestinationIsItsDirectory) {
  DestinationRef filesystem;
  filesystem.path = "/backups/events";
  auto opened = openDestination(filesystem, mounts());
  ASSERT_TRUE(opened) << opened.error().message;
  EXPECT_EQ((*opened)->location(), "/backups/events");
}

TEST_F(OpenDestination, AVolumeDestinationIsADirectoryInTheMountedClaimMadeIfMissing) {
  destination_ = DestinationRef{};
  destination_.kind = DestinationRef::Kind::kVolume;
  destination_.claim_name = "backups";
  destination_.path = "cluster-a/events";
  const fs::path root = dir_.path() / "volumes" / "backups";
  EXPECT_EQ(error(),
            "NoBucket: the PersistentVolumeClaim backups is not mounted on this replica: no "
            "directory " +
                root.string() + " (the table must list the claim in spec.backupVolumes)");
  EXPECT_FALSE(fs::exists(root / "cluster-a")) << "nothing is made outside a mounted claim";

  fs::create_directories(root);
  EXPECT_EQ(error(), "opened " + (root / "cluster-a/events").string());
  EXPECT_TRUE(fs::is_directory(root / "cluster-a/events"));
  auto opened = openDestination(destination_, mounts());
  ASSERT_TRUE(opened);
  ASSERT_TRUE((*opened)->putBytes("probe", "x"));
  EXPECT_TRUE(fs::exists(root / "cluster-a/events/probe"));

  destination_.path.clear();  // the claim's root
  EXPECT_EQ(error(), "opened " + root.string());
}

TEST_F(OpenDestination, AVolumeDestinationNeverLeavesItsClaim) {
  fs::create_directories(dir_.path() / "volumes" / "backups");
  destination_ = DestinationRef{};
  destination_.kind = DestinationRef::Kind::kVolume;
  destination_.claim_name = "..";
  EXPECT_EQ(error(), "Other: '..' is not a PersistentVolumeClaim's name");
  destination_.claim_name = "backups";
  for (const std::string path : {"../other", "a/../../b", "/abs", "a//b", "./a", "a/"}) {
    destination_.path = path;
    EXPECT_EQ(error().substr(0, 6), "Other:") << path << ": " << error();
  }
  EXPECT_FALSE(fs::exists(dir_.path() / "volumes" / "other"));
  EXPECT_FALSE(fs::exists(dir_.path() / "b"));
}

TEST_F(OpenDestination, S3TakesTheKeysOfTheMountedSecret) {
  writeKey("accessKeyId", "AKIA0001\n");  // a Secret made from `echo` output
  writeKey("secretAccessKey", "c2VjcmV0");
  EXPECT_EQ(error(), "opened s3://backups/prod");
}

TEST_F(OpenDestination, AMissingMountOrKeyIsAccessDeniedNamingTheFileAndTheFix) {
  const std::string file = (dir_.path() / "s3-backup" / "accessKeyId").string();
  EXPECT_EQ(error(), "AccessDenied: the S3 credentials are not mounted on this replica: no file " +
                         file +
                         " (the Secret s3-backup needs a key 'accessKeyId', and the table must "
                         "list the Secret in spec.backupCredentials)");
  writeKey("accessKeyId", "AKIA0001");
  writeKey("secretAccessKey", "\n");
  EXPECT_EQ(error(), "AccessDenied: Secret s3-backup: key 'secretAccessKey' is empty (" +
                         (dir_.path() / "s3-backup" / "secretAccessKey").string() + ")");
}

TEST_F(OpenDestination, NamesFromZooKeeperNeverLeaveTheCredentialsDirectory) {
  writeKey("accessKeyId", "AKIA0001");
  writeKey("secretAccessKey", "c2VjcmV0");
  destination_.credentials_secret = "..";
  EXPECT_EQ(error(), "AccessDenied: '..' is not a Secret's name");
  destination_.credentials_secret = "s3-backup";
  destination_.access_key_id_key = "../../etc/passwd";
  EXPECT_EQ(error(), "AccessDenied: Secret s3-backup: '../../etc/passwd' is not a key name");
  destination_.access_key_id_key = "accessKeyId";
  destination_.credentials_secret.clear();
  EXPECT_EQ(error(),
            "AccessDenied: s3://backups/prod: no credentials Secret is named "
            "(spec.destination.s3.credentials.secretName)");
}

TEST_F(OpenDestination, ABadS3OptionIsRefusedBeforeAnyRequest) {
  writeKey("accessKeyId", "AKIA0001");
  writeKey("secretAccessKey", "c2VjcmV0");
  destination_.bucket = "No_Such";
  EXPECT_NE(error().find("Other: "), std::string::npos) << error();
}

}  // namespace
}  // namespace rtable::backup
