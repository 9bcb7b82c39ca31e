// The backup's plain data (operation, file infos, part lists, manifest, stats, the restore
// request) round trips and
// refusals, the global file plan (sort, index, (size, checksum) dedup), the choice of the source
// replica, and chunked values.
#include "rtable/backup/backup_operation.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rtable/backup/backup_host.h"
#include "rtable/backup/backup_manifest.h"
#include "rtable/backup/file_infos.h"
#include "rtable/backup/restore.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::backup {
namespace {

core::Hash128 hashOf(std::string_view text) {
  return core::hash128(text);
}

BackupOperation sampleOperation() {
  BackupOperation op;
  op.uid = "6c1f";
  op.name = "events-nightly";
  op.started_ms = 1765000000000;
  op.tables.push_back({"events", "/rtable/tables/abc", 3, {"events-1", "events-0"}});
  op.tables.push_back({"visits", "/rtable/tables/def", 1, {"visits-0"}});
  op.destination.kind = DestinationRef::Kind::kS3;
  op.destination.endpoint = "http://127.0.0.1:8333";
  op.destination.bucket = "backups";
  op.destination.prefix = "prod";
  op.destination.credentials_secret = "s3-backup";
  op.destination.access_key_id_key = "AWS_ACCESS_KEY_ID";
  return op;
}

TEST(BackupOperation, RoundTripsAndSortsItsHosts) {
  BackupOperation op = sampleOperation();
  auto parsed = BackupOperation::parse(op.format());
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, op);
  EXPECT_EQ(op.hosts(), (std::vector<std::string>{"events-0", "events-1", "visits-0"}));
  ASSERT_NE(op.tableOf("visits-0"), nullptr);
  EXPECT_EQ(op.tableOf("visits-0")->table, "visits");
  EXPECT_EQ(op.tableOf("nobody"), nullptr);
  EXPECT_EQ(op.destination.location(), "s3://backups/prod");

  op.destination = DestinationRef{};
  op.destination.path = "/backups/events";
  parsed = BackupOperation::parse(op.format());
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, op);

  op.destination = DestinationRef{};
  op.destination.kind = DestinationRef::Kind::kVolume;
  op.destination.claim_name = "backups";
  op.destination.path = "cluster-a";
  parsed = BackupOperation::parse(op.format());
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, op);
  EXPECT_EQ(op.destination.location(), "pvc://backups/cluster-a");
}

TEST(BackupOperation, RefusalsNameTheField) {
  auto with = [](auto change) {
    auto doc = nlohmann::json::parse(sampleOperation().format());
    change(doc);
    return BackupOperation::parse(doc.dump());
  };
  auto error = [](const auto& result) { return result ? std::string("accepted") : result.error(); };
  EXPECT_EQ(error(with([](auto& d) { d["name"] = "../x"; })), "name: '../x' is not a plain name");
  EXPECT_EQ(error(with([](auto& d) { d["tables"] = nlohmann::json::array(); })),
            "tables: at least one table is required");
  EXPECT_EQ(error(with([](auto& d) { d["tables"][1]["hosts"] = {"events-0"}; })),
            "tables[1].hosts: 'events-0' appears twice");
  EXPECT_EQ(error(with([](auto& d) { d["tables"][0]["generation"] = 0; })),
            "tables[0].generation: a number >= 1 is required");
  EXPECT_EQ(error(with([](auto& d) { d["destination"]["kind"] = "ftp"; })),
            "destination.kind: 'ftp' is not one of filesystem, s3 and volume");
  auto volume = [&](const std::string& claim, const std::string& path) {
    return error(with([&](auto& d) {
      d["destination"] = {{"kind", "volume"}, {"claimName", claim}, {"path", path}};
    }));
  };
  EXPECT_EQ(volume("backups", ""), "accepted");
  EXPECT_EQ(volume("backups", "../x"),
            "destination.path: '../x' must be directory names joined by '/' (no '.', '..' or "
            "empty component)");
  EXPECT_EQ(volume("backups", "/x"), "destination.path: '/x' is not a relative path");
  EXPECT_EQ(volume("a/b", "x"), "destination.claimName: 'a/b' is not a claim's name");
  EXPECT_EQ(error(with([](auto& d) { d["destination"].erase("bucket"); })),
            "destination.bucket: a string is required");
  EXPECT_EQ(error(with([](auto& d) { d["destination"]["credentials"]["secretName"] = 7; })),
            "destination.credentials.secretName: a string is required");
  // Written before S3 destinations carried credentials: still read, with no Secret named.
  auto older = with([](auto& d) { d["destination"].erase("credentials"); });
  ASSERT_TRUE(older) << older.error();
  EXPECT_EQ(older->destination.credentials_secret, "");
  EXPECT_FALSE(BackupOperation::parse("{"));
}

TEST(BackupPaths, LayOutTheOperationAsSeed001Does) {
  BackupPaths paths{BackupPaths::rootFor("/rtable/tables"), "u1"};
  EXPECT_EQ(paths.root, "/rtable/backups");
  EXPECT_EQ(paths.started("r1"), "/rtable/backups/backup-u1/stage/started|r1");
  EXPECT_EQ(paths.started(""), "/rtable/backups/backup-u1/stage/started|");
  EXPECT_EQ(paths.current("r1", "gathering metadata (0)"),
            "/rtable/backups/backup-u1/stage/current|r1|gathering metadata (0)");
  EXPECT_EQ(paths.writingFile(17), "/rtable/backups/backup-u1/writing_files/17");
  EXPECT_EQ(paths.fileInfos("r2"), "/rtable/backups/backup-u1/file_infos/r2");
  EXPECT_EQ(BackupPaths::rootFor("/tables"), "/backups");

  auto current = parseStageNodeName("current||writing backup");
  EXPECT_EQ(current.kind, StageNodeName::Kind::kCurrent);
  EXPECT_EQ(current.host, "");
  EXPECT_EQ(current.stage, "writing backup");
  EXPECT_EQ(parseStageNodeName("alive|r1").kind, StageNodeName::Kind::kAlive);
  EXPECT_EQ(parseStageNodeName("alive|r1").host, "r1");
  EXPECT_EQ(parseStageNodeName("error").kind, StageNodeName::Kind::kError);
  EXPECT_EQ(parseStageNodeName("num_hosts").kind, StageNodeName::Kind::kOther);
}

TEST(FileInfos, RoundTripAndRefuseBadLines) {
  std::vector<BackupFileInfo> infos = {{"events/202612_0_0_0/x.bin", 4096, hashOf("x")},
                                       {"events/202612_0_0_0/name with space", 0, hashOf("")}};
  auto parsed = parseFileInfos(formatFileInfos(infos));
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, infos);
  EXPECT_EQ(parseFileInfos("12 zz a\n").error(), "file infos line 1: bad checksum");
  EXPECT_EQ(parseFileInfos("1 " + hashOf("a").hex() + " a").error(),
            "file infos line 1: no newline at the end");
  EXPECT_EQ(parseFileInfos("x " + hashOf("a").hex() + " a\n").error(),
            "file infos line 1: bad size");
}

TEST(FilePlan, SortsByNameIndexesByPositionAndStoresEachContentOnce) {
  auto a = hashOf("a"), b = hashOf("b");
  std::map<std::string, std::vector<BackupFileInfo>> infos = {
      {"r2", {{"t/p2/col.bin", 10, a}, {"t/p1/col.bin", 10, a}, {"t/p1/count.txt", 3, b}}},
      {"r1", {{"t/p1/col.bin", 10, a}, {"t/p0/empty", 0, hashOf("")}}},
  };
  auto plan = planFiles(infos);
  ASSERT_TRUE(plan) << plan.error();
  ASSERT_EQ(plan->files.size(), 4u);
  EXPECT_EQ(plan->files[0].info.name, "t/p0/empty");
  EXPECT_EQ(plan->files[0].data_file, "");
  EXPECT_EQ(plan->files[1].info.name, "t/p1/col.bin");
  EXPECT_EQ(plan->files[1].data_file_index, 1u);
  EXPECT_EQ(plan->files[2].info.name, "t/p1/count.txt");
  EXPECT_EQ(plan->files[2].data_file_index, 2u);
  // Same size and checksum as t/p1/col.bin: the same data file, the first one's index.
  EXPECT_EQ(plan->files[3].info.name, "t/p2/col.bin");
  EXPECT_EQ(plan->files[3].data_file_index, 1u);
  EXPECT_EQ(plan->files[3].data_file, plan->files[1].data_file);
  EXPECT_EQ(plan->files[1].data_file, "data/" + a.hex().substr(0, 2) + "/" + a.hex() + "-10");
  EXPECT_EQ(plan->data_files, 2u);
  EXPECT_EQ(plan->data_bytes, 13u);
  EXPECT_EQ(plan->logical_bytes, 23u);
  ASSERT_NE(plan->find("t/p1/count.txt"), nullptr);
  EXPECT_EQ(plan->find("t/p9"), nullptr);

  // Every host computes the same plan: the input's order does not matter.
  std::map<std::string, std::vector<BackupFileInfo>> reversed;
  for (const auto& [host, list] : infos) reversed[host] = {list.rbegin(), list.rend()};
  auto again = planFiles(reversed);
  ASSERT_TRUE(again);
  for (std::size_t i = 0; i < plan->files.size(); ++i) {
    EXPECT_EQ(again->files[i].info, plan->files[i].info);
    EXPECT_EQ(again->files[i].data_file_index, plan->files[i].data_file_index);
  }
}

TEST(FilePlan, RefusesReplicasThatDisagreeOnAFile) {
  auto plan = planFiles(
      {{"r1", {{"t/p1/col.bin", 10, hashOf("a")}}}, {"r2", {{"t/p1/col.bin", 10, hashOf("b")}}}});
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.error().find("hosts r1 and r2 hold different files t/p1/col.bin"),
            std::string::npos)
      << plan.error();
}

TEST(FrozenPartList, RoundTripsAndTheSourceIsTheLeastBehindThenTheFullest) {
  FrozenPartList list{2, {{"202612_0_5_1", 100, hashOf("p")}, {"202612_6_6_0", 1, hashOf("q")}}};
  auto parsed = FrozenPartList::parse(list.format());
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, list);
  EXPECT_EQ(list.rows(), 101u);
  EXPECT_FALSE(FrozenPartList::parse(""));
  EXPECT_EQ(FrozenPartList::parse("lag x\n").error(), "part list line 1: expected 'lag <number>'");

  FrozenPartList behind{3, {{"a", 500, hashOf("a")}}};
  FrozenPartList caught_up_small{0, {{"a", 10, hashOf("a")}}};
  FrozenPartList caught_up_big{0, {{"a", 20, hashOf("a")}}};
  EXPECT_EQ(chooseSourceHost({{"r1", behind}, {"r2", caught_up_small}, {"r3", caught_up_big}}),
            "r3");
  EXPECT_EQ(chooseSourceHost({{"r2", caught_up_big}, {"r1", caught_up_big}}), "r1");
}

TEST(BackupManifest, RoundTripsAndListsItsDataFilesOnce) {
  BackupManifest manifest;
  manifest.name = "b1";
  manifest.uid = "u1";
  manifest.started_ms = 1;
  manifest.completed_ms = 2;
  manifest.tables.push_back(
      {"events", 2, "columns: ...\n", "events-0", 101, {{"202612_0_5_1", 101, hashOf("p")}}});
  manifest.files = {{"events/202612_0_5_1/a", 10, hashOf("a"), dataFileName(10, hashOf("a"))},
                    {"events/202612_0_5_1/b", 10, hashOf("a"), dataFileName(10, hashOf("a"))},
                    {"events/202612_0_5_1/e", 0, hashOf(""), ""}};
  manifest.data_files = 1;
  manifest.data_bytes = 10;
  manifest.bytes_written = 10;
  auto parsed = BackupManifest::parse(manifest.format());
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, manifest);
  EXPECT_EQ(manifest.dataFiles(), std::vector<std::string>{dataFileName(10, hashOf("a"))});
  ASSERT_NE(manifest.table("events"), nullptr);

  auto doc = nlohmann::json::parse(manifest.format());
  doc["version"] = 2;
  EXPECT_NE(BackupManifest::parse(doc.dump()).error().find("written by a newer rtable"),
            std::string::npos);
  doc = nlohmann::json::parse(manifest.format());
  doc["files"][0]["dataFile"] = "";
  EXPECT_EQ(BackupManifest::parse(doc.dump()).error(),
            "files[0].dataFile: required for a file of 10 bytes");
  doc = nlohmann::json::parse(manifest.format());
  doc["tables"][0]["parts"][0]["checksum"] = "nope";
  EXPECT_EQ(BackupManifest::parse(doc.dump()).error(),
            "tables[0].parts[0].checksum: 'nope' is not 32 hex digits");
}

TEST(BackupSummary, RoundTrips) {
  BackupSummary summary{{{"events", 2, 7, 1000}}, 5, 4096, 12288, "backups/b1/manifest.json"};
  EXPECT_EQ(BackupSummary::parse(summary.format()), summary);
  EXPECT_FALSE(BackupSummary::parse("{}"));
}

TEST(HostStats, RoundTrips) {
  HostStats stats{1, 2, 3, 4};
  EXPECT_EQ(HostStats::parse(stats.format()), stats);
  EXPECT_EQ(HostStats::parse("garbage"), HostStats{});
}

TEST(ChunkedValues, SplitIntoOrderedChildrenAndReadBackWhole) {
  auto server = core::testing::FakeKeeperServer::create();
  auto keeper = server->connect();
  ASSERT_TRUE(core::createAncestorsAndSelf(*keeper, "/b"));
  std::string value;
  for (int i = 0; i < 2500; ++i) value += static_cast<char>('a' + i % 26);
  ASSERT_TRUE(writeChunked(*keeper, "/b/infos", value, 1000));
  auto children = keeper->children("/b/infos");
  ASSERT_TRUE(children);
  EXPECT_EQ(children->names.size(), 3u);
  EXPECT_TRUE(keeper->exists("/b/infos/000002")->has_value());
  auto read = readChunked(*keeper, "/b/infos");
  ASSERT_TRUE(read);
  EXPECT_EQ(*read, value);
  // Again (an attempt whose answer was lost): the same value, no duplicate chunks.
  ASSERT_TRUE(writeChunked(*keeper, "/b/infos", value, 1000));
  EXPECT_EQ(*readChunked(*keeper, "/b/infos"), value);
  // Empty values are one empty chunk.
  ASSERT_TRUE(writeChunked(*keeper, "/b/empty", "", 1000));
  EXPECT_EQ(*readChunked(*keeper, "/b/empty"), "");
}

TEST(RestoreRequest, RoundTripsAndRefusalsNameTheField) {
  RestoreRequest request;
  request.backup = "prod.nightly-20261206";
  request.table = "events";
  request.destination.path = "/backups";
  request.state = RestoreRequest::State::kRunning;
  request.restorer = "events-1";
  request.parts_total = 12;
  request.parts_done = 4;
  request.rows_done = 4000;
  request.requested_ms = 1765000000000;
  auto parsed = RestoreRequest::parse(request.format());
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, request);
  request.state = RestoreRequest::State::kFailed;
  request.message = "events/202612_1_1_0/x.bin: checksum ...";
  request.destination = DestinationRef{};
  request.destination.kind = DestinationRef::Kind::kS3;
  request.destination.bucket = "b";
  EXPECT_EQ(RestoreRequest::parse(request.format()).value(), request);

  auto refused = [](nlohmann::json doc) {
    auto parsed = RestoreRequest::parse(doc.dump());
    return parsed ? std::string("accepted") : parsed.error();
  };
  nlohmann::json good = nlohmann::json::parse(request.format());
  nlohmann::json bad = good;
  bad.erase("backup");
  EXPECT_EQ(refused(bad), "backup: a non-empty string is required");
  bad = good;
  bad["backup"] = "../etc";
  EXPECT_EQ(refused(bad), "backup: '../etc' is not a plain name");
  bad = good;
  bad["state"] = "paused";
  EXPECT_EQ(refused(bad), "state: '\"paused\"' is none of pending, running, done, failed");
  bad = good;
  bad["partsDone"] = 13;
  EXPECT_EQ(refused(bad), "partsDone: 13 is more than partsTotal 12");
  bad = good;
  bad["destination"] = {{"kind", "filesystem"}, {"path", "relative"}};
  EXPECT_EQ(refused(bad), "destination.path: 'relative' is not absolute");
  EXPECT_EQ(RestoreRequest::parse("[]").error(), "not a JSON object");
}

TEST(RestoreRequest, InsertsWaitUntilItIsDoneAndAFailureSaysWhatToDo) {
  EXPECT_FALSE(restoreRefusal(std::nullopt));
  RestoreRequest request;
  request.backup = "nightly";
  request.parts_total = 6;
  request.parts_done = 2;
  request.state = RestoreRequest::State::kPending;
  EXPECT_EQ(restoreRefusal(request),
            "the table is being restored from backup 'nightly' (2 of 6 parts): inserts wait "
            "until it is done");
  request.state = RestoreRequest::State::kRunning;
  EXPECT_TRUE(restoreRefusal(request));
  request.state = RestoreRequest::State::kFailed;
  request.message = "no manifest";
  EXPECT_EQ(restoreRefusal(request),
            "the table's restore from backup 'nightly' failed (no manifest): it takes no "
            "inserts; delete the ReplicatedTable and create it again");
  request.state = RestoreRequest::State::kDone;
  EXPECT_FALSE(restoreRefusal(request));
  EXPECT_EQ(restoreRequestPath("/rtable/tables/abc"), "/rtable/tables/abc/restore");
}

}  // namespace
}  // namespace rtable::backup
