// The CRDs in crds/ installed in a real kube-apiserver (LocalControlPlane), and every file in
// crds/examples applied to it: valid examples are accepted and come back with the defaults the C++
// parser fills in; invalid ones, and invalid updates, are rejected with a message that names the
// field. Printer columns and the scale subresource, as kubectl shows and uses them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "../crd_examples.h"
#include "rtable/common/testing/wait.h"
#include "rtable/controllers/backup_specs.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/testing/local_control_plane.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;
using op::KubeErrorKind;
using op::ResourceType;
using testing::ExampleFile;
using testing::kindOf;

const ResourceType kReplicatedTables{"rtable.io",       "v1alpha1", "replicatedtables",
                                     "ReplicatedTable", true,       true};
const ResourceType kClusterBackups{"rtable.io",     "v1alpha1", "clusterbackups",
                                   "ClusterBackup", true,       true};
const ResourceType kBackupSchedules{"rtable.io",      "v1alpha1", "backupschedules",
                                    "BackupSchedule", true,       true};

const ResourceType& typeOf(const json& object) {
  const std::string kind = kindOf(object);
  if (kind == "ClusterBackup") return kClusterBackups;
  if (kind == "BackupSchedule") return kBackupSchedules;
  return kReplicatedTables;
}

// The spec as the C++ side reads it, every default written out.
json parsedSpec(const json& object) {
  const std::string kind = kindOf(object);
  if (kind == "ReplicatedTable") {
    auto spec = ReplicatedTableSpec::parse(object["spec"]);
    return spec ? spec->toJson() : json(spec.error().toString());
  }
  if (kind == "ClusterBackup") {
    auto spec = ClusterBackupSpec::parse(object["spec"]);
    return spec ? spec->toJson() : json(spec.error().toString());
  }
  auto spec = BackupScheduleSpec::parse(object["spec"]);
  return spec ? spec->toJson() : json(spec.error().toString());
}

std::vector<ExampleFile> load(const std::string& dir) {
  auto files = testing::loadExamples(testing::crdsDir() / dir);
  EXPECT_TRUE(files) << files.error();
  return files ? *files : std::vector<ExampleFile>{};
}

class CrdApiServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    op::testing::LocalControlPlaneOptions options;
    options.start_timeout = std::chrono::seconds(240);  // a loaded 2-core machine
    auto plane = op::testing::LocalControlPlane::start(options);
    if (!plane) {
      start_error_ = plane.error();
      return;
    }
    plane_ = std::make_unique<op::testing::LocalControlPlane>(std::move(*plane));
    auto config = op::KubeConfig::load(plane_->kubeconfigPath());
    auto cluster = config ? config->clusterConfig() : std::unexpected(config.error());
    if (!cluster) {
      start_error_ = cluster.error().toString();
      return;
    }
    auto client = op::HttpKubeClient::create(*cluster);
    if (!client) {
      start_error_ = client.error().toString();
      return;
    }
    client_ = std::move(*client);
    // As a user installs them: kubectl apply of the folder (its files, not examples/).
    auto applied = plane_->kubectl({"apply", "-f", testing::crdsDir().string()});
    if (!applied || applied->exit_code != 0) {
      start_error_ =
          "kubectl apply -f crds/: " + (applied ? applied->out + applied->err : applied.error());
    }
  }

  static void TearDownTestSuite() {
    if (plane_ && ::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      plane_->keepWorkDir();
      fmt::print(stderr, "control plane logs kept in {}\n", plane_->workDir().string());
    }
    client_.reset();
    plane_.reset();
  }

  void SetUp() override {
    ASSERT_EQ(start_error_, "");
    ASSERT_TRUE(established_ || waitEstablished()) << "the CRDs did not become Established";
  }

  static bool waitEstablished() {
    established_ = common::testing::waitFor(
        [] {
          for (const char* name : {"replicatedtables.rtable.io", "clusterbackups.rtable.io",
                                   "backupschedules.rtable.io"}) {
            auto crd = client_->get(op::resources::customResourceDefinitions(), {"", name});
            if (!crd) return false;
            bool established = false;
            for (const auto& condition : (*crd)["status"].value("conditions", json::array())) {
              established = established ||
                            (condition["type"] == "Established" && condition["status"] == "True");
            }
            if (!established) return false;
          }
          return true;
        },
        std::chrono::seconds(120));
    // Established serves the resources; kubectl also needs them in discovery, which follows a
    // moment later.
    established_ = established_ && common::testing::waitFor(
                                       [] {
                                         auto listed = plane_->kubectl({"get", "rt,cb,bs", "-A"});
                                         return listed && listed->exit_code == 0;
                                       },
                                       std::chrono::seconds(120));
    return established_;
  }

  // A namespace of the test's own, so the cases do not see each other's objects.
  std::string createNamespace(const std::string& name) {
    auto created = client_->create(
        op::resources::namespaces(),
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}});
    EXPECT_TRUE(created || created.error().kind == KubeErrorKind::kAlreadyExists)
        << created.error().toString();
    return name;
  }

  static json inNamespace(json object, const std::string& ns) {
    object["metadata"]["namespace"] = ns;
    return object;
  }

  static inline std::string start_error_;
  static inline bool established_ = false;
  static inline std::unique_ptr<op::testing::LocalControlPlane> plane_;
  static inline std::unique_ptr<op::HttpKubeClient> client_;
};

TEST_F(CrdApiServer, EveryValidExampleIsAcceptedWithTheDefaultsFilledIn) {
  const std::string ns = createNamespace("valid");
  int objects = 0;
  for (const auto& file : load("examples")) {
    SCOPED_TRACE(file.path.filename().string());
    // kubectl apply, as DESIGN.md 1 has the user do it (kubectl also checks for unknown fields).
    auto applied = plane_->kubectl({"apply", "-n", ns, "-f", file.path.string()});
    ASSERT_TRUE(applied) << applied.error();
    ASSERT_EQ(applied->exit_code, 0) << applied->out << applied->err;
    for (const auto& object : file.documents) {
      ++objects;
      auto stored = client_->get(typeOf(object), {ns, object["metadata"]["name"]});
      ASSERT_TRUE(stored) << stored.error().toString();
      // The server's defaults are the parser's defaults, and every value came through as written.
      EXPECT_EQ((*stored)["spec"], parsedSpec(object)) << "stored: " << (*stored)["spec"].dump(2);
    }
  }
  EXPECT_GE(objects, 6);

  // Spelled out for the two examples that lean on defaults most.
  auto visits = client_->get(kReplicatedTables, {ns, "visits"});
  ASSERT_TRUE(visits) << visits.error().toString();
  const json& spec = (*visits)["spec"];
  EXPECT_EQ(spec["replicas"], 3);
  EXPECT_EQ(spec["partitionBy"], "tuple()");
  EXPECT_EQ(spec["storage"]["size"], "10Gi");
  EXPECT_EQ(spec["zookeeper"]["root"], "/rtable/tables");
  EXPECT_EQ(spec["zookeeper"]["sessionTimeoutMs"], 30000);
  EXPECT_EQ(spec["deduplication"], json({{"window", 10000}, {"windowSeconds", 3600}}));
  EXPECT_EQ(spec["headroom"]["autoRecover"], true);
  EXPECT_EQ(spec["replication"]["maxLogsToKeep"], 1000);
  auto nightly = client_->get(kBackupSchedules, {ns, "nightly"});
  ASSERT_TRUE(nightly) << nightly.error().toString();
  EXPECT_EQ((*nightly)["spec"]["concurrencyPolicy"], "Forbid");
  EXPECT_EQ((*nightly)["spec"]["suspend"], false);
  EXPECT_EQ((*nightly)["spec"]["retention"]["keepLast"], 7);

  // The short names and the category resolve.
  auto listed = plane_->kubectl({"get", "rt,cb,bs", "-n", ns, "-o", "name"});
  ASSERT_TRUE(listed && listed->exit_code == 0) << (listed ? listed->err : listed.error());
  EXPECT_NE(listed->out.find("replicatedtable.rtable.io/events"), std::string::npos) << listed->out;
  EXPECT_NE(listed->out.find("clusterbackup.rtable.io/events-2026-12-01"), std::string::npos)
      << listed->out;
  EXPECT_NE(listed->out.find("backupschedule.rtable.io/nightly"), std::string::npos) << listed->out;
  auto category = plane_->kubectl({"get", "rtable", "-n", ns, "-o", "name"});
  ASSERT_TRUE(category && category->exit_code == 0)
      << (category ? category->err : category.error());
  auto lines = [](const std::string& text) {
    std::multiset<std::string> set;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) set.insert(line);
    return set;
  };
  EXPECT_EQ(lines(category->out), lines(listed->out));
  EXPECT_EQ(lines(category->out).size(), static_cast<std::size_t>(objects));
}

TEST_F(CrdApiServer, EveryInvalidExampleIsRejectedNamingTheField) {
  const std::string ns = createNamespace("invalid");
  const auto files = load("examples/invalid");
  EXPECT_GE(files.size(), 10u);
  for (const auto& file : files) {
    SCOPED_TRACE(file.path.filename().string());
    ASSERT_NE(file.expect_rejected, "") << "no '# expect-rejected: <field path>' line";
    ASSERT_EQ(file.documents.size(), 1u);
    const json& object = file.documents[0];
    auto created = client_->create(typeOf(object), inNamespace(object, ns));
    ASSERT_FALSE(created) << "accepted: " << created->dump();
    EXPECT_EQ(created.error().kind, KubeErrorKind::kInvalid) << created.error().toString();
    const std::string message = created.error().toString();
    EXPECT_NE(message.find(file.expect_rejected), std::string::npos)
        << message << "\nexpected the field " << file.expect_rejected;
    if (!file.expect_message.empty()) {
      EXPECT_NE(message.find(file.expect_message), std::string::npos) << message;
    }
    auto absent = client_->get(typeOf(object), {ns, object["metadata"]["name"]});
    EXPECT_TRUE(!absent && absent.error().kind == KubeErrorKind::kNotFound);
  }
}

TEST_F(CrdApiServer, EveryInvalidUpdateIsRejectedNamingTheField) {
  const std::string ns = createNamespace("updates");
  const auto files = load("examples/invalid-updates");
  EXPECT_GE(files.size(), 4u);
  for (const auto& file : files) {
    SCOPED_TRACE(file.path.filename().string());
    ASSERT_NE(file.expect_rejected, "") << "no '# expect-rejected: <field path>' line";
    ASSERT_EQ(file.documents.size(), 2u) << "the object, then its update";
    const ResourceType& type = typeOf(file.documents[0]);
    auto created = client_->create(type, inNamespace(file.documents[0], ns));
    ASSERT_TRUE(created) << created.error().toString();
    json update = inNamespace(file.documents[1], ns);
    update["metadata"]["resourceVersion"] = (*created)["metadata"]["resourceVersion"];
    auto updated = client_->update(type, update);
    ASSERT_FALSE(updated) << "update accepted: " << updated->dump();
    EXPECT_EQ(updated.error().kind, KubeErrorKind::kInvalid) << updated.error().toString();
    const std::string message = updated.error().toString();
    EXPECT_NE(message.find(file.expect_rejected), std::string::npos)
        << message << "\nexpected the field " << file.expect_rejected;
    if (!file.expect_message.empty()) {
      EXPECT_NE(message.find(file.expect_message), std::string::npos) << message;
    }
    auto unchanged = client_->get(type, {ns, file.documents[0]["metadata"]["name"]});
    ASSERT_TRUE(unchanged);
    EXPECT_EQ((*unchanged)["spec"], (*created)["spec"]);
  }
}

// What may change does: replicas, the ZooKeeper ensemble, the dedup window.
TEST_F(CrdApiServer, MutableFieldsCanChange) {
  const std::string ns = createNamespace("mutable");
  auto object =
      yamlDocumentsToJson(testing::readText(testing::crdsDir() / "examples/events-table.yaml"));
  ASSERT_TRUE(object);
  auto created = client_->create(kReplicatedTables, inNamespace(object->front(), ns));
  ASSERT_TRUE(created) << created.error().toString();
  json update = *created;
  update["spec"]["replicas"] = 5;
  update["spec"]["zookeeper"]["connect"] = "zk-new-0:2181,zk-new-1:2181";
  update["spec"]["deduplication"]["window"] = 500;
  update["spec"]["storage"]["size"] = "40Gi";
  auto updated = client_->update(kReplicatedTables, update);
  ASSERT_TRUE(updated) << updated.error().toString();
  EXPECT_EQ((*updated)["spec"]["replicas"], 5);
  EXPECT_EQ((*updated)["metadata"]["generation"], 2);
  auto parsed = ReplicatedTableSpec::parse((*updated)["spec"]);
  ASSERT_TRUE(parsed) << parsed.error().toString();
  EXPECT_FALSE(
      checkReplicatedTableUpdate(*ReplicatedTableSpec::parse((*created)["spec"]), *parsed));

  // A ClusterBackup's spec is fixed but for deletionPolicy: keeping a backup's data is decided
  // when it is deleted.
  auto backup =
      yamlDocumentsToJson(testing::readText(testing::crdsDir() / "examples/events-backup.yaml"));
  ASSERT_TRUE(backup);
  auto made = client_->create(kClusterBackups, inNamespace(backup->front(), ns));
  ASSERT_TRUE(made) << made.error().toString();
  EXPECT_EQ((*made)["spec"]["deletionPolicy"], "Delete");
  json retained = *made;
  retained["spec"]["deletionPolicy"] = "Retain";
  auto kept = client_->update(kClusterBackups, retained);
  ASSERT_TRUE(kept) << kept.error().toString();
  EXPECT_EQ((*kept)["spec"]["deletionPolicy"], "Retain");
  EXPECT_FALSE(checkClusterBackupUpdate(*ClusterBackupSpec::parse((*made)["spec"]),
                                        *ClusterBackupSpec::parse((*kept)["spec"])));
}

TEST_F(CrdApiServer, PrinterColumnsStatusAndScale) {
  const std::string ns = createNamespace("printer");
  auto object =
      yamlDocumentsToJson(testing::readText(testing::crdsDir() / "examples/events-table.yaml"));
  ASSERT_TRUE(object);
  auto created = client_->create(kReplicatedTables, inNamespace(object->front(), ns));
  ASSERT_TRUE(created) << created.error().toString();

  json with_status = *created;
  with_status["status"] = {{"observedGeneration", 1},
                           {"replicas", 3},
                           {"readyReplicas", 2},
                           {"ready", "2/3"},
                           {"selector", "app.kubernetes.io/instance=events"},
                           {"zookeeperPath", "/rtable/tables/printer.events"},
                           {"activeGeneration", 1},
                           {"logMaxIndex", 1204331},
                           {"logCounter", 1204332},
                           {"headroomRatio", 0.9994},
                           {"headroom", "99.94%"},
                           {"conditions",
                            {{{"type", "Ready"},
                              {"status", "False"},
                              {"reason", "ReplicasNotReady"},
                              {"message", "2 of 3 replicas are ready"},
                              {"lastTransitionTime", "2026-12-01T03:00:00Z"},
                              {"observedGeneration", 1}}}}};
  auto status = client_->updateStatus(kReplicatedTables, with_status);
  ASSERT_TRUE(status) << status.error().toString();

  auto table = plane_->kubectl({"get", "replicatedtables", "-n", ns});
  ASSERT_TRUE(table && table->exit_code == 0) << (table ? table->err : table.error());
  EXPECT_TRUE(table->out.starts_with("NAME     READY   GENERATION   LOG-INDEX   HEADROOM   AGE\n"))
      << table->out;
  EXPECT_NE(table->out.find("events   2/3     1            1204331     99.94%"), std::string::npos)
      << table->out;
  auto wide = plane_->kubectl({"get", "rt", "events", "-n", ns, "-o", "wide"});
  ASSERT_TRUE(wide && wide->exit_code == 0);
  EXPECT_NE(wide->out.find("TABLE"), std::string::npos) << wide->out;
  EXPECT_NE(wide->out.find("ReplicasNotReady"), std::string::npos) << wide->out;

  // A status outside its schema is refused too.
  json bad_status = *status;
  bad_status["status"]["conditions"][0]["status"] = "Maybe";
  auto refused = client_->updateStatus(kReplicatedTables, bad_status);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().toString().find("status.conditions[0].status"), std::string::npos)
      << refused.error().toString();

  // kubectl scale goes through the scale subresource and the same validation.
  auto scaled = plane_->kubectl({"scale", "rt/events", "-n", ns, "--replicas=5"});
  ASSERT_TRUE(scaled && scaled->exit_code == 0)
      << (scaled ? scaled->out + scaled->err : scaled.error());
  auto after = client_->get(kReplicatedTables, {ns, "events"});
  ASSERT_TRUE(after);
  EXPECT_EQ((*after)["spec"]["replicas"], 5);
  auto zero = plane_->kubectl({"scale", "rt/events", "-n", ns, "--replicas=0"});
  ASSERT_TRUE(zero);
  EXPECT_NE(zero->exit_code, 0);
  EXPECT_NE(zero->err.find("spec.replicas"), std::string::npos) << zero->err;
}

TEST_F(CrdApiServer, BackupPrinterColumnsAndStatus) {
  const std::string ns = createNamespace("backups");
  for (const char* file : {"events-backup.yaml", "nightly-backup.yaml"}) {
    auto applied = plane_->kubectl(
        {"apply", "-n", ns, "-f", (testing::crdsDir() / "examples" / file).string()});
    ASSERT_TRUE(applied && applied->exit_code == 0) << (applied ? applied->err : applied.error());
  }
  auto backup = client_->get(kClusterBackups, {ns, "events-2026-12-01"});
  ASSERT_TRUE(backup);
  json with_status = *backup;
  with_status["status"] = {
      {"phase", "Running"},
      {"tables", {"events"}},
      {"hosts",
       {{{"name", "events-0"}, {"table", "events"}, {"stage", "WritingBackup"}, {"files", 12}},
        {{"name", "events-1"}, {"table", "events"}, {"stage", "BuildingFileInfos"}}}},
      {"files", 24},
      {"bytesWritten", 1048576},
      {"bytesDeduplicated", 4096},
      {"startedAt", "2026-12-01T03:00:00Z"}};
  auto status = client_->updateStatus(kClusterBackups, with_status);
  ASSERT_TRUE(status) << status.error().toString();
  auto listed = plane_->kubectl({"get", "clusterbackups", "-n", ns});
  ASSERT_TRUE(listed && listed->exit_code == 0);
  EXPECT_TRUE(listed->out.starts_with("NAME                TABLE    PHASE     WRITTEN   STARTED"))
      << listed->out;
  EXPECT_NE(listed->out.find("events-2026-12-01   events   Running   1048576"), std::string::npos)
      << listed->out;

  json bad = *status;
  bad["status"]["hosts"][0]["stage"] = "Daydreaming";
  auto refused = client_->updateStatus(kClusterBackups, bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().toString().find("status.hosts[0].stage"), std::string::npos)
      << refused.error().toString();

  auto schedules = plane_->kubectl({"get", "bs", "-n", ns});
  ASSERT_TRUE(schedules && schedules->exit_code == 0);
  EXPECT_TRUE(schedules->out.starts_with(
      "NAME      SCHEDULE    SUSPEND   LAST-SCHEDULE   LAST-SUCCESS   AGE\n"))
      << schedules->out;
  EXPECT_NE(schedules->out.find("nightly   0 3 * * *   false"), std::string::npos)
      << schedules->out;
}

}  // namespace
}  // namespace rtable::controllers
