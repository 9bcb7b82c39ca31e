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
//   - a destination that does not exist: Failed, the condition's reason NoBucket, no manifest;
//   - to S3 (a real SeaweedFS): the replicas read the keys from their mount of the Secret the
//     backup names (none passes through the operator or ZooKeeper); a second backup reuses the
//     first one's objects; wrong keys fail the backup as AccessDenied; a Secret the table does not
//     mount keeps the backup Pending, saying so; a new table restored from the bucket; the first
//     backup deleted: its manifest and the data files only it used go, the second stays whole;
//   - to a PersistentVolumeClaim (ReadWriteMany, provisioned by the test kubelet): the replicas
//     write into their mount of the claim the table lists in spec.backupVolumes; a claim that does
//     not exist keeps the backup Pending, saying so; a new table restored from the claim's
//     location (restoreFrom.persistentVolumeClaim, mounted without being listed);
//   - a replica killed (SIGKILL, by rtable-core's own fail point: exactly as it starts writing its
//     data files) mid-backup: Failed with reason HostGone naming it, no manifest, the table's
//     lock gone; the next backup, with the replica restarted, Completed and whole;
//   - the operator (the initiator) killed mid-backup, while a replica is held at the same point:
//     the restarted operator rejoins the operation, which completes, and the backup holds every
//     acknowledged row once, every part verifying.
#include "operator_stack.h"
#include "rtable/backup/backup_reader.h"
#include "rtable/backup/filesystem_storage.h"
#include "rtable/backup/testing/local_seaweedfs.h"
#include "rtable/controllers/cluster_backup_reconciler.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/part_name.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::controllers::testing {
namespace {

class OperatorBackup : public OperatorStack {
 protected:
  void SetUp() override {
    OperatorStack::SetUp();
    if (HasFatalFailure()) return;
    // The filesystem destination: a shared directory at the same path on every replica. The
    // replicas run as 10001 on a read-only root, so it is a volume of theirs (a hostPath here, an
    // NFS share in a cluster) at kBackupMount, writable by them (hostPath gets no fsGroup).
    fs::create_directories(backupDir());
    fs::permissions(backupDir(), fs::perms::all);
    table_pod_template_ = fmt::format(
        "    volumes:\n"
        "      - {{name: backups, hostPath: {{path: \"{}\", type: Directory}}}}\n"
        "    volumeMounts:\n"
        "      - {{name: backups, mountPath: \"{}\"}}\n",
        backupDir().string(), kBackupMount);
  }

  // Where the replicas see the backup directory (the destination's path), and where it is here.
  static constexpr const char* kBackupMount = "/mnt/rtable-backups";
  fs::path backupDir() { return plane_->workDir() / "backups"; }

  void applyBackup(const std::string& name, const std::string& path) {
    applyBackupTo(name, fmt::format("filesystem: {{path: \"{}\"}}", path));
  }
  // `destination`: the one line under spec.destination.
  void applyBackupTo(const std::string& name, const std::string& destination) {
    ASSERT_TRUE(plane_->apply(fmt::format(R"(apiVersion: rtable.io/v1alpha1
kind: ClusterBackup
metadata: {{name: {}, namespace: {}}}
spec:
  table: events
  destination:
    {}
)",
                                          name, kNs, destination)));
  }

  // A Secret as users make one: kubectl create secret generic ... --from-literal.
  void createSecret(const std::string& name, const std::string& access_key,
                    const std::string& secret_key) {
    auto made = plane_->kubectl({"create", "secret", "generic", name, "-n", kNs,
                                 "--from-literal=accessKeyId=" + access_key,
                                 "--from-literal=secretAccessKey=" + secret_key});
    ASSERT_TRUE(made) << made.error();
    ASSERT_EQ(made->exit_code, 0) << made->out << made->err;
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

  // The ClusterBackup once its Waiting condition has `reason`.
  json waitForWaiting(const std::string& name, const std::string& reason) {
    json object;
    EXPECT_TRUE(eventually(
        [&] {
          object = backupObject(name);
          return conditionOf(object.value("status", json::object()), "Waiting")
                     .value("reason", "") == reason;
        },
        60s))
        << name << ": " << object.dump();
    return object;
  }

  // A second table, `restored`, made from ClusterBackup `backup` (spec.restoreFrom); its status
  // once the restore ended (the Restored condition True, or its reason RestoreFailed).
  json applyRestoredTable(const std::string& backup, const std::string& extra = "") {
    return applyRestoredTableWith(fmt::format("  restoreFrom: {{backup: {}}}\n{}", backup, extra));
  }
  // The same with `spec_lines` (restoreFrom and anything else) as the extra lines of its spec.
  json applyRestoredTableWith(const std::string& spec_lines) {
    EXPECT_TRUE(plane_->apply(tableManifest("restored", spec_lines)));
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

  // Each replica of the restored table holds every acknowledged row exactly once.
  void expectRestoredReplicasHold(const std::set<uint64_t>& acknowledged) {
    const std::multiset<uint64_t> expected(acknowledged.begin(), acknowledged.end());
    for (const char* pod : {"restored-0", "restored-1", "restored-2"}) {
      std::string answer;
      ASSERT_TRUE(eventually(
          [&] {
            auto synced = httpRequest(podIp(pod), 8123, "POST", "/sync?timeout_seconds=30", "", 40s,
                                      apiHeaders("restored"));
            answer = synced ? synced->body : synced.error();
            return synced && synced->status == 200;
          },
          180s))
          << pod << ": " << answer;
      auto holds = core::testing::checkReplicaHolds(endpoint(pod, "restored"), 1, expected);
      EXPECT_TRUE(holds) << pod << ": " << (holds ? "" : holds.error());
    }
  }

  static json conditionOf(const json& status, const std::string& type) {
    for (const auto& item : status.value("conditions", json::array())) {
      if (item.value("type", "") == type) return item;
    }
    return json::object();
  }

  // A table whose replicas run with RTABLE_CORE_FAILPOINT=`fail_point` (rtable-core's backup
  // fail point), and its rows: writers for 3 s, then every acknowledged row on every replica.
  std::set<uint64_t> applyTableWithFailPoint(const std::string& fail_point) {
    table_pod_template_ += fmt::format(
        "    env:\n      - {{name: RTABLE_CORE_FAILPOINT, value: \"{}\"}}\n", fail_point);
    EXPECT_TRUE(plane_->apply(tableManifest("events", "  headroom: {autoRecover: false}\n")));
    EXPECT_TRUE(eventually([&] { return readyReplicas(3); }, 240s)) << tableState();
    startWriters(50ms);
    std::this_thread::sleep_for(3s);
    EXPECT_TRUE(writers_->stop());
    const std::set<uint64_t> acknowledged = writers_->acknowledged();
    EXPECT_FALSE(acknowledged.empty());
    expectReplicasHoldExactly(acknowledged, 1);
    return acknowledged;
  }

  // Backup `name` in backupDir() holds exactly the rows `acknowledged`, each part verifying.
  void expectBackupHolds(const std::string& name, const std::set<uint64_t>& acknowledged) {
    backup::FilesystemStorage storage(backupDir());
    auto manifest = backup::readManifest(storage, std::string(kNs) + "." + name);
    ASSERT_TRUE(manifest) << name << ": " << manifest.error().message;
    std::multiset<uint64_t> ids;
    for (const auto& part : manifest->tables.at(0).parts) {
      const fs::path dir = plane_->workDir() / ("check-" + name) / part.name;
      auto made = backup::materializePart(storage, *manifest, "events", part.name, dir);
      ASSERT_TRUE(made) << made.error();
      auto verified = core::verifyPart(dir, schema());
      ASSERT_TRUE(verified) << part.name << ": " << verified.error();
      auto block = core::readPart(dir, schema());
      ASSERT_TRUE(block) << block.error();
      for (uint64_t id : std::get<std::vector<uint64_t>>(block->columns[0].values)) ids.insert(id);
    }
    EXPECT_EQ(ids, std::multiset<uint64_t>(acknowledged.begin(), acknowledged.end()))
        << name << ": not every acknowledged row exactly once";
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
  applyBackup("b1", kBackupMount);
  json b1 = waitForEnd("b1");
  ASSERT_EQ(b1["status"]["phase"], "Completed") << b1["status"].dump();
  const json& status = b1["status"];
  EXPECT_EQ(status["location"], kBackupMount);
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
  applyBackup("b2", kBackupMount);
  ASSERT_EQ(waitForEnd("b2")["status"]["phase"], "Completed");
  applyBackup("b3", kBackupMount);
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
  expectRestoredReplicasHold(writers_->acknowledged());
}

TEST_F(OperatorBackup, ADestinationThatDoesNotExistFailsTheBackupNamingIt) {
  applyTable();
  // A path the replicas can look at (a 0700 parent would say AccessDenied) that is not there.
  const std::string missing = fmt::format("/mnt/rtable-no-such-mount-{}", ::getpid());
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

TEST_F(OperatorBackup, S3BackupsReadTheKeysFromTheMountedSecretAndRestoreFromTheBucket) {
  auto weed = backup::testing::LocalSeaweedFs::start();
  ASSERT_TRUE(weed) << weed.error();
  createSecret("s3-backup", (*weed)->accessKey(), (*weed)->secretKey());
  createSecret("s3-wrong", (*weed)->accessKey(), "not-the-secret-key");
  createSecret("s3-unmounted", (*weed)->accessKey(), (*weed)->secretKey());
  ASSERT_TRUE(plane_->apply(tableManifest(
      "events", "  headroom: {autoRecover: false}\n  backupCredentials: [s3-backup, s3-wrong]\n")));
  ASSERT_TRUE(eventually([&] { return readyReplicas(3); }, 240s)) << tableState();
  startWriters(50ms);
  std::this_thread::sleep_for(3s);
  ASSERT_TRUE(writers_->stop());
  const std::set<uint64_t> acknowledged = writers_->acknowledged();
  ASSERT_FALSE(acknowledged.empty());
  expectReplicasHoldExactly(acknowledged, 1);

  auto s3 = [&](const std::string& secret) {
    return fmt::format(
        "s3: {{endpoint: \"{}\", bucket: {}, prefix: cluster-a, credentials: {{secretName: {}}}}}",
        (*weed)->endpoint(), (*weed)->bucket(), secret);
  };
  auto storage = backup::S3Storage::create((*weed)->storageOptions("cluster-a"));
  ASSERT_TRUE(storage) << storage.error().message;
  applyBackupTo("s1", s3("s3-backup"));
  json s1 = waitForEnd("s1");
  ASSERT_EQ(s1["status"]["phase"], "Completed") << s1["status"].dump();
  EXPECT_EQ(s1["status"]["location"], "s3://" + (*weed)->bucket() + "/cluster-a");
  auto m1 = backup::readManifest(**storage, std::string(kNs) + ".s1");
  ASSERT_TRUE(m1) << m1.error().message;
  EXPECT_EQ(m1->tables.at(0).rows, acknowledged.size());
  EXPECT_EQ(s1["status"]["bytesWritten"].get<uint64_t>(), m1->data_bytes);

  // A second backup of the same rows: it writes only what the bucket does not hold (a merge's
  // part since), and references the rest.
  applyBackupTo("s2", s3("s3-backup"));
  json s2 = waitForEnd("s2");
  ASSERT_EQ(s2["status"]["phase"], "Completed") << s2["status"].dump();
  auto m2 = backup::readManifest(**storage, std::string(kNs) + ".s2");
  ASSERT_TRUE(m2) << m2.error().message;
  const auto stored = m1->dataFiles();
  const std::set<std::string> in_bucket(stored.begin(), stored.end());
  uint64_t new_bytes = 0;
  std::set<std::string> counted;
  for (const auto& file : m2->files) {
    if (!file.data_file.empty() && !in_bucket.contains(file.data_file) &&
        counted.insert(file.data_file).second) {
      new_bytes += file.size;
    }
  }
  EXPECT_EQ(s2["status"]["bytesWritten"].get<uint64_t>(), new_bytes);
  EXPECT_EQ(s2["status"]["bytesReused"].get<uint64_t>() + new_bytes, m2->data_bytes);
  EXPECT_GT(s2["status"]["bytesReused"].get<uint64_t>(), 0u);

  // Keys the server refuses: Failed, AccessDenied, and no manifest.
  applyBackupTo("wrong", s3("s3-wrong"));
  json wrong = waitForEnd("wrong");
  ASSERT_EQ(wrong["status"]["phase"], "Failed") << wrong["status"].dump();
  EXPECT_EQ(conditionOf(wrong["status"], "Failed").value("reason", ""), "AccessDenied")
      << wrong["status"].dump();
  auto wrong_manifest = (*storage)->size("backups/" + std::string(kNs) + ".wrong/manifest.json");
  ASSERT_TRUE(wrong_manifest) << wrong_manifest.error().message;
  EXPECT_FALSE(*wrong_manifest);

  // A Secret the table's pods do not mount: Pending, saying what to change; nothing started.
  applyBackupTo("unmounted", s3("s3-unmounted"));
  const json waiting = waitForWaiting("unmounted", "CredentialsNotMounted");
  EXPECT_EQ(waiting["status"]["phase"], "Pending");
  EXPECT_NE(conditionOf(waiting["status"], "Waiting")["message"].get<std::string>().find(
                "add it to the table's spec.backupCredentials"),
            std::string::npos);
  auto deleted = plane_->kubectl({"delete", "clusterbackup", "unmounted", "-n", kNs});
  ASSERT_TRUE(deleted && deleted->exit_code == 0) << (deleted ? deleted->err : deleted.error());

  // Restored from the bucket into a new table that mounts the Secret.
  const json restored = applyRestoredTable("s2", "  backupCredentials: [s3-backup]\n");
  const json condition = conditionOf(restored, "Restored");
  ASSERT_EQ(condition.value("status", ""), "True") << restored.dump();
  EXPECT_EQ(condition["message"],
            fmt::format("restored ClusterBackup s2 (table events): {} parts, {} rows",
                        m2->tables.at(0).parts.size(), m2->tables.at(0).rows));
  expectRestoredReplicasHold(acknowledged);

  // s1 deleted (deletionPolicy Delete, the default): a replica of events removes its manifest and
  // the data files no other backup refers to; s2 stays whole.
  auto deleted_s1 = plane_->kubectl({"delete", "clusterbackup", "s1", "-n", kNs, "--wait=false"});
  ASSERT_TRUE(deleted_s1 && deleted_s1->exit_code == 0)
      << (deleted_s1 ? deleted_s1->err : deleted_s1.error());
  EXPECT_TRUE(eventually(
      [&] {
        auto object = client_->get(clusterBackups(), {kNs, "s1"});
        return !object && object.error().kind == op::KubeErrorKind::kNotFound;
      },
      120s))
      << backupObject("s1").dump();
  auto s1_manifest = (*storage)->size(backup::manifestName(std::string(kNs) + ".s1"));
  ASSERT_TRUE(s1_manifest) << s1_manifest.error().message;
  EXPECT_FALSE(*s1_manifest);
  auto data = (*storage)->list("data/");
  ASSERT_TRUE(data) << data.error().message;
  EXPECT_EQ(*data, m2->dataFiles()) << "only s2's data files are left";
  auto again = backup::readManifest(**storage, std::string(kNs) + ".s2");
  ASSERT_TRUE(again) << again.error().message;
}

TEST_F(OperatorBackup, VolumeBackupsWriteIntoTheMountedClaimAndRestoreFromIt) {
  ASSERT_TRUE(plane_->apply(fmt::format(R"(apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: rtable-backups, namespace: {}}}
spec:
  accessModes: [ReadWriteMany]
  resources: {{requests: {{storage: 1Gi}}}}
)",
                                        kNs)));
  ASSERT_TRUE(plane_->apply(tableManifest(
      "events", "  headroom: {autoRecover: false}\n  backupVolumes: [rtable-backups]\n")));
  ASSERT_TRUE(eventually([&] { return readyReplicas(3); }, 240s)) << tableState();
  startWriters(50ms);
  std::this_thread::sleep_for(3s);
  ASSERT_TRUE(writers_->stop());
  const std::set<uint64_t> acknowledged = writers_->acknowledged();
  ASSERT_FALSE(acknowledged.empty());
  expectReplicasHoldExactly(acknowledged, 1);

  applyBackupTo("v1", "persistentVolumeClaim: {claimName: rtable-backups, subPath: cluster-a}");
  json v1 = waitForEnd("v1");
  ASSERT_EQ(v1["status"]["phase"], "Completed") << v1["status"].dump();
  EXPECT_EQ(v1["status"]["location"], "pvc://rtable-backups/cluster-a");
  // The backup is in the claim's volume (the directory of the PersistentVolume bound to it).
  auto volume = plane_->kubectl(
      {"get", "pvc", "rtable-backups", "-n", kNs, "-o", "jsonpath={.spec.volumeName}"});
  ASSERT_TRUE(volume && volume->exit_code == 0) << (volume ? volume->err : volume.error());
  auto path = plane_->kubectl({"get", "pv", volume->out, "-o", "jsonpath={.spec.hostPath.path}"});
  ASSERT_TRUE(path && path->exit_code == 0 && !path->out.empty())
      << (path ? path->err : path.error());
  backup::FilesystemStorage storage(fs::path(path->out) / "cluster-a");
  auto manifest = backup::readManifest(storage, std::string(kNs) + ".v1");
  ASSERT_TRUE(manifest) << manifest.error().message;
  EXPECT_EQ(manifest->tables.at(0).rows, acknowledged.size());
  EXPECT_EQ(v1["status"]["bytesWritten"].get<uint64_t>(), manifest->data_bytes);

  // A claim that does not exist: Pending, naming it; nothing started.
  applyBackupTo("missing", "persistentVolumeClaim: {claimName: no-such-claim}");
  const json waiting = waitForWaiting("missing", "ClaimNotFound");
  EXPECT_EQ(waiting["status"]["phase"], "Pending");

  // Restored by location into a new table, which mounts the claim without listing it.
  const json status = applyRestoredTableWith(fmt::format(
      "  restoreFrom:\n    persistentVolumeClaim: {{claimName: rtable-backups, subPath: "
      "cluster-a}}\n    name: {}.v1\n",
      kNs));
  const json condition = conditionOf(status, "Restored");
  ASSERT_EQ(condition.value("status", ""), "True") << status.dump();
  EXPECT_NE(condition["message"].get<std::string>().find("pvc://rtable-backups/cluster-a"),
            std::string::npos)
      << condition.dump();
  expectRestoredReplicasHold(acknowledged);
}

TEST_F(OperatorBackup, AReplicaKilledMidBackupFailsItCleanlyAndTheNextOneCompletes) {
  const std::set<uint64_t> acknowledged = applyTableWithFailPoint("backup:events-1:writing files");
  fs::create_directories(backupDir());
  applyBackup("k1", kBackupMount);
  json k1 = waitForEnd("k1");
  const json& status = k1["status"];
  ASSERT_EQ(status["phase"], "Failed") << status.dump();
  EXPECT_EQ(conditionOf(status, "Failed").value("reason", ""), "HostGone") << status.dump();
  const std::string error = status.value("error", "");
  EXPECT_NE(error.find("host events-1"), std::string::npos) << error;
  EXPECT_NE(error.find("the replica is gone"), std::string::npos) << error;
  bool named = false;
  for (const auto& host : status["hosts"]) {
    if (host["name"] == "events-1") named = host.value("stage", "") == "Failed";
  }
  EXPECT_TRUE(named) << status.dump();
  // Nothing that looks complete: no manifest (other replicas' data files may be there, named by
  // no manifest); the operation and the table's backup lock are gone.
  backup::FilesystemStorage storage(backupDir());
  auto manifest = storage.size(backup::manifestName(std::string(kNs) + ".k1"));
  ASSERT_TRUE(manifest) << manifest.error().message;
  EXPECT_FALSE(*manifest);
  EXPECT_FALSE(zkExists(root() + "/backup"));

  // The kubelet restarted events-1 (the fail point fires once per data directory): the next
  // backup completes and holds every acknowledged row.
  ASSERT_TRUE(eventually([&] { return readyReplicas(3); }, 120s)) << tableState();
  applyBackup("k2", kBackupMount);
  json k2 = waitForEnd("k2");
  ASSERT_EQ(k2["status"]["phase"], "Completed") << k2["status"].dump();
  expectBackupHolds("k2", acknowledged);
}

TEST_F(OperatorBackup, TheOperatorKilledMidBackupRejoinsItAndItCompletesWhole) {
  // A quick Lease, so that the restarted operator takes over in seconds.
  const std::vector<std::string> quick_lease = {"--leader-election-lease-duration=3s",
                                                "--leader-election-renew-deadline=2s",
                                                "--leader-election-retry-period=500ms"};
  operator_.reset();
  startOperator({}, quick_lease);
  // events-0 (the first host: the one that writes the manifest) stalls 20 s as it starts writing
  // its data files, so the operator is killed while the backup is surely running.
  const std::set<uint64_t> acknowledged =
      applyTableWithFailPoint("backup:events-0:writing files:pause=20");
  fs::create_directories(backupDir());
  applyBackup("o1", kBackupMount);
  json running;
  ASSERT_TRUE(eventually(
      [&] {
        running = backupObject("o1");
        for (const auto& host : running.value(json::json_pointer("/status/hosts"), json::array())) {
          if (host.value("stage", "") == "WritingBackup") return true;  // the others wait for it
        }
        return false;
      },
      120s))
      << running.dump();
  ASSERT_EQ(running["status"]["phase"], "Running");
  // The operation's nodes: anyone may read them (a replica of another table deleting backup data
  // looks for live backups on its destination), nobody without a covered table's identity may
  // change them: neither those the operator made nor those the replicas made below them (they
  // take the operation's ACL).
  {
    const std::string operation =
        "/rtable/backups/backup-" + running["metadata"]["uid"].get<std::string>();
    auto anonymous =
        core::ZooKeeperClient::connect(core::ZooKeeperConfig{zookeeper_->connectString()});
    ASSERT_TRUE(anonymous);
    auto stage = (*anonymous)->children(operation + "/stage");
    ASSERT_TRUE(stage) << stage.error().toString();
    std::string replica_node;
    for (const auto& name : stage->names) {
      if (name.starts_with("alive|events-")) replica_node = operation + "/stage/" + name;
    }
    ASSERT_FALSE(replica_node.empty()) << fmt::format("{}", fmt::join(stage->names, ", "));
    EXPECT_TRUE((*anonymous)->get(operation));
    for (const std::string& path : {operation, operation + "/stage", replica_node}) {
      auto set = (*anonymous)->set(path, "rewritten");
      EXPECT_TRUE(!set && set.error().code == core::KeeperCode::kNoAuth) << path;
      auto planted = (*anonymous)->create(path + "/planted", "", core::CreateMode::kPersistent);
      EXPECT_TRUE(!planted && planted.error().code == core::KeeperCode::kNoAuth) << path;
    }
    auto removed = (*anonymous)->remove(replica_node);
    EXPECT_TRUE(!removed && removed.error().code == core::KeeperCode::kNoAuth);
  }
  operator_->kill();
  backup::FilesystemStorage storage(backupDir());
  auto manifest = storage.size(backup::manifestName(std::string(kNs) + ".o1"));
  ASSERT_TRUE(manifest && !*manifest) << "the backup ended before the operator was killed";
  startOperator({}, quick_lease);

  json o1 = waitForEnd("o1");
  ASSERT_EQ(o1["status"]["phase"], "Completed") << o1["status"].dump();
  expectBackupHolds("o1", acknowledged);
  EXPECT_FALSE(zkExists(root() + "/backup"));
}

}  // namespace
}  // namespace rtable::controllers::testing
