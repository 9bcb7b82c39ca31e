// Every file in crds/examples through the C++ side: valid ones parse, invalid ones are rejected
// naming the same field the apiserver names (crd_apiserver_tests checks the server's side), and
// the CRDs' enums agree with rtable-core.
#include "../crd_examples.h"

#include <gtest/gtest.h>

#include <set>

#include "rtable/controllers/backup_specs.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/replication_core/block.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;
using testing::ExampleFile;
using testing::kindOf;

// The first error the C++ side finds in one object, or nullopt.
std::optional<SpecError> check(const json& object) {
  const std::string kind = kindOf(object);
  if (kind == "ReplicatedTable") {
    if (auto error = checkReplicatedTableName(object["metadata"].value("name", ""))) return error;
    auto spec = ReplicatedTableSpec::parse(object.value("spec", json()));
    if (!spec) return spec.error();
  } else if (kind == "ClusterBackup") {
    auto spec = ClusterBackupSpec::parse(object.value("spec", json()));
    if (!spec) return spec.error();
  } else if (kind == "BackupSchedule") {
    if (auto error = checkBackupScheduleName(object["metadata"].value("name", ""))) return error;
    auto spec = BackupScheduleSpec::parse(object.value("spec", json()));
    if (!spec) return spec.error();
  } else {
    ADD_FAILURE() << "unexpected kind '" << kind << "'";
  }
  return std::nullopt;
}

std::optional<SpecError> checkUpdate(const json& old_object, const json& new_object) {
  const std::string kind = kindOf(old_object);
  if (kind == "ReplicatedTable") {
    return checkReplicatedTableUpdate(*ReplicatedTableSpec::parse(old_object["spec"]),
                                      *ReplicatedTableSpec::parse(new_object["spec"]));
  }
  if (kind == "ClusterBackup") {
    return checkClusterBackupUpdate(*ClusterBackupSpec::parse(old_object["spec"]),
                                    *ClusterBackupSpec::parse(new_object["spec"]));
  }
  return std::nullopt;  // BackupSchedule: every field may change
}

std::vector<ExampleFile> load(const std::string& dir) {
  auto files = testing::loadExamples(testing::crdsDir() / dir);
  EXPECT_TRUE(files) << files.error();
  return files ? *files : std::vector<ExampleFile>{};
}

TEST(CrdExamples, EveryValidExampleParses) {
  std::set<std::string> kinds;
  for (const auto& file : load("examples")) {
    SCOPED_TRACE(file.path.filename().string());
    EXPECT_EQ(file.expect_rejected, "") << "a valid example with an expect-rejected line";
    ASSERT_FALSE(file.documents.empty());
    for (const auto& object : file.documents) {
      kinds.insert(kindOf(object));
      auto error = check(object);
      EXPECT_FALSE(error) << error->toString();
    }
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"ReplicatedTable", "ClusterBackup", "BackupSchedule"}));
}

TEST(CrdExamples, EveryInvalidExampleIsRejectedNamingTheField) {
  const auto files = load("examples/invalid");
  EXPECT_GE(files.size(), 10u);
  for (const auto& file : files) {
    SCOPED_TRACE(file.path.filename().string());
    ASSERT_NE(file.expect_rejected, "") << "no '# expect-rejected: <field path>' line";
    ASSERT_EQ(file.documents.size(), 1u);
    auto error = check(file.documents[0]);
    ASSERT_TRUE(error) << "accepted";
    EXPECT_TRUE(error->path.starts_with(file.expect_rejected))
        << error->toString() << "\nexpected the path " << file.expect_rejected;
  }
}

TEST(CrdExamples, EveryInvalidUpdateIsRejectedNamingTheField) {
  const auto files = load("examples/invalid-updates");
  EXPECT_GE(files.size(), 4u);
  for (const auto& file : files) {
    SCOPED_TRACE(file.path.filename().string());
    ASSERT_NE(file.expect_rejected, "") << "no '# expect-rejected: <field path>' line";
    ASSERT_EQ(file.documents.size(), 2u) << "the object, then its update";
    for (const auto& object : file.documents) {
      auto error = check(object);
      ASSERT_FALSE(error) << "each document on its own is valid: " << error->toString();
    }
    auto error = checkUpdate(file.documents[0], file.documents[1]);
    ASSERT_TRUE(error) << "update accepted";
    EXPECT_EQ(error->path, file.expect_rejected) << error->toString();
    if (!file.expect_message.empty()) {
      EXPECT_NE(error->message.find(file.expect_message), std::string::npos) << error->message;
    }
  }
}

// The CRD's column type enum is exactly the types rtable-core knows, spelt as it spells them.
TEST(CrdExamples, TheColumnTypeEnumIsRtableCoresTypes) {
  auto crd = yamlToJson(testing::readText(testing::crdsDir() / "rtable.io_replicatedtables.yaml"));
  ASSERT_TRUE(crd) << crd.error();
  const json& types =
      (*crd)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["columns"]["items"]["properties"]["type"]["enum"];
  ASSERT_TRUE(types.is_array());
  std::set<std::string> names;
  for (const auto& type : types) {
    auto parsed = core::DataType::parse(type.get<std::string>());
    ASSERT_TRUE(parsed) << type;
    EXPECT_EQ(parsed->name(), type);
    names.insert(type);
  }
  // Every type id, plain and Nullable.
  for (int id = 0; id <= static_cast<int>(core::TypeId::kBool); ++id) {
    for (bool nullable : {false, true}) {
      const std::string name = core::DataType{static_cast<core::TypeId>(id), nullable}.name();
      EXPECT_TRUE(names.contains(name)) << name << " is missing from the CRD's enum";
    }
  }
  EXPECT_EQ(names.size(), types.size());
}

}  // namespace
}  // namespace rtable::controllers
