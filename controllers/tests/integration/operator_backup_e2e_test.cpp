// Cluster backups end to end (issue 21) on the real stack: a real kube-apiserver and
// controller-manager, rtable-operator under the chart's RBAC, three rtable-core replica processes
// run by the test kubelet on a real ZooKeeper. ClusterBackups are applied with kubectl while
// writers insert with retries; the destination is a directory every replica can write.
//   - Completed under writes: the backup is one replica's parts at one moment (pairwise disjoint,
//     every file's size and checksum as the manifest says, each part verifies), holding every row
//     acknowledged before it began exactly once;
//   - a second and third backup once the writers stopped: the third writes exactly the data files
//     the destination did not hold (none, when no merge ran in between) and reuses the rest;
//   - a new table restored from the second backup (spec.restoreFrom): Restored, and each of its
//     three replicas holds every acknowledged row exactly once;
//   - a destination that does not exist: Failed, the condition's reason NoBucket, no manifest.
#include "operator_stack.h"
#include "rtable/backup/backup_reader.h"
#include "rtable/backup/filesystem_storage.h"
#include "rtable/controllers/cluster_backup_reconciler.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/part_name.h"

namespace rtable::controllers::testing {
namespace {

class OperatorBackup : public OperatorStack {
 protected:
  fs::path backupDir() { return plane_->workDir() / "backups"; }

  void applyBackup(const std::string& name, const std::string& path) {
    ASSERT_TRUE(plane_->apply(fmt::format(R"(apiVersion: rtable.io/v1alpha1
kind: ClusterBackup
metadata: {{name: {}, namespace: {}}}
spec:
  table: events
  destination:
    filesystem: {{path: "{}"}}
)",
                                          name, kNs, path)));
  }

  json backupObject(const std::string& name) {
    auto object = client_->get(clusterBackups(), {kNs, name});
    return object ? *object : json::object();
  }

  // The ClusterBackup once it ended (Completed or Failed).
  json waitForEnd(const std::string& name) {
    json object;
    EXPECT_TRUE(eventually(
        [&] {
          object = backupObject(name);
          std::string phase = object.value(json::json_pointer("/status/phase"), "");
          return phase == "Completed" || phase == "Failed";
        },
        180s))
        << name << ": " << object.dump();
    return object;
  }

  // A second table, `restored`, made from ClusterBackup `backup` (spec.restoreFrom); its status
  // once the restore ended (the Restored condition True, or its reason RestoreFailed).
  json applyRestoredTable(const std::string& backup) {
    EXPECT_TRUE(plane_->apply(
        tableManifest("restored", fmt::format("  restoreFrom: {{backup: {}}}\n", backup))));
    json status;
    EXPECT_TRUE(eventually(
        [&] {
          auto object = client_->get(replicatedTables(), {kNs, "restored"});
          status = object ? object->value("status", json::object()) : json::object();
          for (const auto& condition : status.value("conditions", json::array())) {
            if (condition.value("type", "") != "Restored") continue;
            return condition.value("status", "") == "True" ||
                   condition.value("reason", "") == "RestoreFailed";
          }
          return false;
        },
        240s))
        << status.dump();
    return status;
  }

  core::TableSchema schema() {
    auto spec = ReplicatedTableSpec::parse((*table())["spec"]);
    EXPECT_TRUE(spec);
    return spec->schema();
  }
};

TEST_F(OperatorBackup, BackupsUnderWritesHoldEveryAcknowledgedRowOnceAndReuseStoredFiles) {
  applyTable();
  fs::create_directories(backupDir());
  startWriters(50ms);
  std::this_thread::sleep_for(5s);
  const std::set<uint64_t> acknowledged_before = writers_->acknowledged();
  ASSERT_FALSE(acknowledged_before.empty());
  applyBackup("b1", backupDir().string());
  json b1 = waitForEnd("b1");
  ASSERT_EQ(b1["status"]["phase"], "Completed") << b1["status"].dump();
  const json& status = b1["status"];
  EXPECT_EQ(status["location"], backupDir().string());
  EXPECT_GT(status["files"].get<uint64_t>(), 0u);
  EXPECT_GT(status["bytesWritten"].get<uint64_t>(), 0u);
  EXPECT_EQ(status["hosts"].size(), 3u) << status.dump();
  for (const auto& host : status["hosts"]) EXPECT_EQ(host["stage"], "Completed") << host.dump();
  ASSERT_EQ(status["contents"].size(), 1u);

  backup::FilesystemStorage storage(backupDir());
  auto manifest = backup::readManifest(storage, std::string(kNs) + ".b1");
  ASSERT_TRUE(manifest) << manifest.error().message;
  const backup::ManifestTable& table = manifest->tables.at(0);
  EXPECT_EQ(status["contents"][0]["rows"].get<uint64_t>(), table.rows);
  EXPECT_EQ(status["contents"][0]["parts"].get<uint64_t>(), table.parts.size());
  // One replica's active parts at one moment: no part beside one that covers or overlaps it.
  std::vector<core::PartName> names;
  for (const auto& part : table.parts) names.push_back(*core::PartName::parse(part.name));
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (std::size_t j = i + 1; j < names.size(); ++j) {
      EXPECT_TRUE(names[i].isDisjoint(names[j])) << names[i].format() << " " << names[j].format();
    }
  }
  // Every part reads back from the backup and verifies; every row acknowledged before the
  // backup began is there, and no row twice.
  std::multiset<uint64_t> ids;
  uint64_t rows = 0;
  for (const auto& part : table.parts) {
    fs::path dir = plane_->workDir() / "restored-b1" / part.name;
    auto made = backup::materializePart(storage, *manifest, "events", part.name, dir);
    ASSERT_TRUE(made) << made.error();
    auto verified = core::verifyPart(dir, schema());
    ASSERT_TRUE(verified) << part.name << ": " << verified.error();
    auto block = core::readPart(dir, schema());
    ASSERT_TRUE(block) << block.error();
    for (uint64_t id : std::get<std::vector<uint64_t>>(block->columns[0].values)) ids.insert(id);
    rows += part.rows;
  }
  EXPECT_EQ(ids.size(), rows);
  EXPECT_EQ(ids.size(), table.rows);
  EXPECT_EQ(std::set<uint64_t>(ids.begin(), ids.end()).size(), ids.size()) << "a row twice";
  for (uint64_t id : acknowledged_before) {
    ASSERT_TRUE(ids.contains(id)) << "acknowledged row " << id << " is not in the backup";
  }

  // Writers stopped and the replicas settled: a second backup, then a third of the same data.
  ASSERT_TRUE(writers_->stop());
  expectReplicasHoldExactly(writers_->acknowledged(), 1);
  applyBackup("b2", backupDir().string());
  ASSERT_EQ(waitForEnd("b2")["status"]["phase"], "Completed");
  applyBackup("b3", backupDir().string());
  json b3 = waitForEnd("b3");
  ASSERT_EQ(b3["status"]["phase"], "Completed") << b3["status"].dump();
  auto m2 = backup::readManifest(storage, std::string(kNs) + ".b2");
  auto m3 = backup::readManifest(storage, std::string(kNs) + ".b3");
  ASSERT_TRUE(m2 && m3);
  // What b3 wrote is exactly what the destination did not hold: b1's and b2's data files (a
  // merge between b2 and b3 adds its part's files).
  std::set<std::string> stored;
  for (const auto& file : manifest->dataFiles()) stored.insert(file);
  for (const auto& file : m2->dataFiles()) stored.insert(file);
  uint64_t new_bytes = 0;
  std::set<std::string> counted;
  for (const auto& file : m3->files) {
    if (!file.data_file.empty() && !stored.contains(file.data_file) &&
        counted.insert(file.data_file).second) {
      new_bytes += file.size;
    }
  }
  EXPECT_EQ(b3["status"]["bytesWritten"].get<uint64_t>(), new_bytes);
  EXPECT_EQ(b3["status"]["bytesReused"].get<uint64_t>() + new_bytes, m3->data_bytes);
  EXPECT_GT(b3["status"]["bytesReused"].get<uint64_t>(), 0u);
  // And the table's backup lock is gone: nothing holds the table.
  EXPECT_FALSE(zkExists(root() + "/backup"));

  // Restored from b2 into a new table: one of its replicas restores, the others fetch; each
  // holds every acknowledged row exactly once.
  const json restored = applyRestoredTable("b2");
  json condition;
  for (const auto& item : restored.value("conditions", json::array())) {
    if (item.value("type", "") == "Restored") condition = item;
  }
  ASSERT_EQ(condition.value("status", ""), "True") << restored.dump();
  EXPECT_EQ(condition["message"],
            fmt::format("restored ClusterBackup b2 (table events): {} parts, {} rows",
                        m2->tables.at(0).parts.size(), m2->tables.at(0).rows));
  const std::set<uint64_t> acknowledged = writers_->acknowledged();  // a copy: one set's range
  const std::multiset<uint64_t> expected(acknowledged.begin(), acknowledged.end());
  for (const char* pod : {"restored-0", "restored-1", "restored-2"}) {
    std::string answer;
    ASSERT_TRUE(eventually(
        [&] {
          auto synced = httpRequest(podIp(pod), 8123, "POST", "/sync?timeout_seconds=30", "", 40s);
          answer = synced ? synced->body : synced.error();
          return synced && synced->status == 200;
        },
        180s))
        << pod << ": " << answer;
    auto holds = core::testing::checkReplicaHolds(core::testing::ReplicaEndpoint{podIp(pod), 8123},
                                                  1, expected);
    EXPECT_TRUE(holds) << pod << ": " << (holds ? "" : holds.error());
  }
}

TEST_F(OperatorBackup, ADestinationThatDoesNotExistFailsTheBackupNamingIt) {
  applyTable();
  const std::string missing = (plane_->workDir() / "no-such-mount").string();
  applyBackup("nowhere", missing);
  json object = waitForEnd("nowhere");
  const json& status = object["status"];
  ASSERT_EQ(status["phase"], "Failed") << status.dump();
  ASSERT_EQ(status["conditions"].size(), 1u);
  EXPECT_EQ(status["conditions"][0]["type"], "Failed");
  EXPECT_EQ(status["conditions"][0]["reason"], "NoBucket") << status.dump();
  EXPECT_NE(status["error"].get<std::string>().find(missing), std::string::npos) << status.dump();
  EXPECT_FALSE(fs::exists(missing));
  EXPECT_FALSE(zkExists(root() + "/backup"));
}

}  // namespace
}  // namespace rtable::controllers::testing
