#include "rtable/operator/testing/fake_kube_client.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

namespace rtable::op::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

const ResourceType kTables{"rtable.io",       "v1alpha1", "replicatedtables",
                           "ReplicatedTable", true,       true};
const ResourceType kConfigMaps = resources::configMaps();

json table(const std::string& name, int replicas = 1, json labels = json::object()) {
  return {{"apiVersion", "rtable.io/v1alpha1"},
          {"kind", "ReplicatedTable"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"labels", labels}}},
          {"spec", {{"replicas", replicas}}}};
}

json configMap(const std::string& name, const std::string& ns = "default") {
  return {{"metadata", {{"name", name}, {"namespace", ns}}}, {"data", {{"k", "v"}}}};
}

WatchOptions at(const std::string& resource_version) {
  WatchOptions o;
  o.resource_version = resource_version;
  return o;
}

std::string rv(const json& o) {
  return o["metadata"]["resourceVersion"].get<std::string>();
}
int64_t rvNumber(const json& o) {
  return std::stoll(rv(o));
}

// Collects watch events from the watch's reader thread.
class Recorder {
 public:
  WatchEventHandler onEvent() {
    return [this](const WatchEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(e);
      cv_.notify_all();
    };
  }
  WatchEndHandler onEnd() {
    return [this](const WatchEnd& e) {
      std::lock_guard lock(mu_);
      end_ = e;
      cv_.notify_all();
    };
  }
  // Waits (5 s at most) for at least n events.
  std::vector<WatchEvent> waitFor(std::size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, 5s, [&] { return events_.size() >= n; });
    return events_;
  }
  std::optional<WatchEnd> waitEnd() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, 5s, [&] { return end_.has_value(); });
    return end_;
  }
  std::vector<WatchEvent> events() {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<WatchEvent> events_;
  std::optional<WatchEnd> end_;
};

std::vector<std::string> describe(const std::vector<WatchEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    std::string name = e.object.contains("metadata") && e.object["metadata"].contains("name")
                           ? e.object["metadata"]["name"].get<std::string>()
                           : "";
    out.push_back(std::string(watchEventTypeName(e.type)) + " " + name);
  }
  return out;
}

TEST(FakeKubeClientTest, CreateStampsLikeTheApiserver) {
  FakeKubeClient fake;
  json input = table("t1");
  input["status"] = {{"phase", "Ready"}};
  auto created = fake.create(kTables, input);
  ASSERT_TRUE(created) << created.error().toString();
  const json& meta = (*created)["metadata"];
  EXPECT_EQ(meta["uid"].get<std::string>().size(), 36u);
  EXPECT_TRUE(meta.contains("creationTimestamp"));
  EXPECT_EQ(meta["generation"], 1);
  EXPECT_FALSE(rv(*created).empty());
  EXPECT_FALSE(created->contains("status"));  // create cannot set status (subresource)

  auto again = fake.create(kTables, table("t1"));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().kind, KubeErrorKind::kAlreadyExists);
  EXPECT_EQ(again.error().message, "replicatedtables.rtable.io \"t1\" already exists");

  // kind and apiVersion are filled in for objects without them.
  auto cm = fake.create(kConfigMaps, configMap("c"));
  ASSERT_TRUE(cm);
  EXPECT_EQ((*cm)["kind"], "ConfigMap");
  EXPECT_EQ((*cm)["apiVersion"], "v1");

  auto wrong_kind = fake.create(
      kConfigMaps,
      json{{"kind", "Secret"}, {"metadata", {{"name", "s"}, {"namespace", "default"}}}});
  ASSERT_FALSE(wrong_kind);
  EXPECT_EQ(wrong_kind.error().kind, KubeErrorKind::kBadRequest);
}

TEST(FakeKubeClientTest, CreateChecks) {
  FakeKubeClient fake;
  auto no_ns = fake.create(kConfigMaps, configMap("c", "missing"));
  ASSERT_FALSE(no_ns);
  EXPECT_EQ(no_ns.error().kind, KubeErrorKind::kNotFound);
  EXPECT_EQ(no_ns.error().message, "namespaces \"missing\" not found");

  auto unnamed = fake.create(kConfigMaps, json{{"metadata", {{"namespace", "default"}}}});
  ASSERT_FALSE(unnamed);
  EXPECT_EQ(unnamed.error().kind, KubeErrorKind::kInvalid);
  ASSERT_EQ(unnamed.error().causes.size(), 1u);
  EXPECT_EQ(unnamed.error().causes[0].field, "metadata.name");

  auto generated = fake.create(
      kConfigMaps, json{{"metadata", {{"namespace", "default"}, {"generateName", "backup-"}}}});
  ASSERT_TRUE(generated);
  const std::string name = (*generated)["metadata"]["name"];
  EXPECT_TRUE(name.starts_with("backup-"));
  EXPECT_EQ(name.size(), 12u);

  json with_rv = configMap("r");
  with_rv["metadata"]["resourceVersion"] = "5";
  EXPECT_EQ(fake.create(kConfigMaps, with_rv).error().kind, KubeErrorKind::kBadRequest);

  // A namespace that exists after being created.
  ASSERT_TRUE(fake.create(resources::namespaces(), json{{"metadata", {{"name", "tables"}}}}));
  EXPECT_TRUE(fake.create(kConfigMaps, configMap("c", "tables")));

  // Dry run: validated, not stored.
  WriteOptions dry;
  dry.dry_run = true;
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("dry"), dry));
  EXPECT_EQ(fake.get(kConfigMaps, {"default", "dry"}).error().kind, KubeErrorKind::kNotFound);
}

TEST(FakeKubeClientTest, OneGlobalResourceVersion) {
  FakeKubeClient fake;
  auto a = fake.create(kConfigMaps, configMap("a"));
  auto b = fake.create(kTables, table("b"));
  auto c = fake.create(kConfigMaps, configMap("c"));
  ASSERT_TRUE(a && b && c);
  EXPECT_LT(rvNumber(*a), rvNumber(*b));
  EXPECT_LT(rvNumber(*b), rvNumber(*c));
  EXPECT_EQ(fake.currentResourceVersionForTest(), rvNumber(*c));
}

TEST(FakeKubeClientTest, UpdateConflictsOnStaleVersion) {
  FakeKubeClient fake;
  auto v1 = fake.create(kTables, table("t"));
  ASSERT_TRUE(v1);
  json edit = *v1;
  edit["spec"]["replicas"] = 3;
  auto v2 = fake.update(kTables, edit);
  ASSERT_TRUE(v2) << v2.error().toString();
  EXPECT_NE(rv(*v2), rv(*v1));

  // The same edit again carries the old resourceVersion.
  edit["spec"]["replicas"] = 4;
  auto stale = fake.update(kTables, edit);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().kind, KubeErrorKind::kConflict);
  EXPECT_NE(stale.error().message.find("the object has been modified"), std::string::npos);
  EXPECT_EQ(fake.get(kTables, {"default", "t"})->at("spec")["replicas"], 3);

  // A custom resource refuses a PUT without resourceVersion...
  edit["metadata"].erase("resourceVersion");
  auto unversioned = fake.update(kTables, edit);
  ASSERT_FALSE(unversioned);
  EXPECT_EQ(unversioned.error().kind, KubeErrorKind::kInvalid);
  EXPECT_EQ(unversioned.error().causes.at(0).field, "metadata.resourceVersion");
  // ...a ConfigMap takes it as an unconditional update.
  auto cm = fake.create(kConfigMaps, configMap("c"));
  ASSERT_TRUE(cm);
  json cm_edit = *cm;
  cm_edit["metadata"].erase("resourceVersion");
  cm_edit["data"]["k"] = "unconditional";
  ASSERT_TRUE(fake.update(kConfigMaps, cm_edit));

  // A different uid is a failed precondition.
  edit = *fake.get(kTables, {"default", "t"});
  edit["metadata"]["uid"] = "someone-else";
  EXPECT_EQ(fake.update(kTables, edit).error().kind, KubeErrorKind::kConflict);

  EXPECT_EQ(fake.update(kTables, table("missing")).error().kind, KubeErrorKind::kNotFound);
}

TEST(FakeKubeClientTest, NoOpUpdateWritesNothing) {
  FakeKubeClient fake;
  auto v1 = fake.create(kTables, table("t"));
  ASSERT_TRUE(v1);
  const int64_t before = fake.currentResourceVersionForTest();
  auto same = fake.update(kTables, *v1);
  ASSERT_TRUE(same);
  EXPECT_EQ(rv(*same), rv(*v1));
  EXPECT_EQ(fake.currentResourceVersionForTest(), before);
}

TEST(FakeKubeClientTest, GenerationTracksSpecOnly) {
  FakeKubeClient fake;
  auto v = fake.create(kTables, table("t"));
  ASSERT_TRUE(v);
  json edit = *v;
  edit["metadata"]["labels"]["team"] = "data";
  v = fake.update(kTables, edit);
  ASSERT_TRUE(v);
  EXPECT_EQ((*v)["metadata"]["generation"], 1);  // metadata only

  edit = *v;
  edit["status"] = {{"readyReplicas", 1}};
  v = fake.updateStatus(kTables, edit);
  ASSERT_TRUE(v);
  EXPECT_EQ((*v)["metadata"]["generation"], 1);  // status only

  edit = *v;
  edit["spec"]["replicas"] = 2;
  v = fake.update(kTables, edit);
  ASSERT_TRUE(v);
  EXPECT_EQ((*v)["metadata"]["generation"], 2);

  // System fields cannot be changed by an update.
  edit = *v;
  edit["metadata"]["generation"] = 99;
  edit["metadata"]["uid"] = (*v)["metadata"]["uid"];
  edit["metadata"]["creationTimestamp"] = "1999-01-01T00:00:00Z";
  v = fake.update(kTables, edit);
  ASSERT_TRUE(v);
  EXPECT_EQ((*v)["metadata"]["generation"], 2);
  EXPECT_NE((*v)["metadata"]["creationTimestamp"], "1999-01-01T00:00:00Z");
}

TEST(FakeKubeClientTest, StatusSubresource) {
  FakeKubeClient fake;
  auto v = fake.create(kTables, table("t"));
  ASSERT_TRUE(v);

  // update ignores status...
  json edit = *v;
  edit["status"] = {{"phase", "Ready"}};
  edit["spec"]["replicas"] = 5;
  v = fake.update(kTables, edit);
  ASSERT_TRUE(v);
  EXPECT_FALSE(v->contains("status"));
  EXPECT_EQ((*v)["spec"]["replicas"], 5);

  // ...and updateStatus ignores everything else.
  edit = *v;
  edit["status"] = {{"phase", "Ready"}};
  edit["spec"]["replicas"] = 7;
  edit["metadata"]["labels"] = {{"x", "y"}};
  v = fake.updateStatus(kTables, edit);
  ASSERT_TRUE(v) << v.error().toString();
  EXPECT_EQ((*v)["status"]["phase"], "Ready");
  EXPECT_EQ((*v)["spec"]["replicas"], 5);
  EXPECT_FALSE((*v)["metadata"]["labels"].contains("x"));

  // Stale status writes conflict too.
  EXPECT_EQ(fake.updateStatus(kTables, edit).error().kind, KubeErrorKind::kConflict);

  // No status subresource: update writes everything, updateStatus does not exist.
  auto cm = fake.create(kConfigMaps, configMap("c"));
  ASSERT_TRUE(cm);
  EXPECT_EQ(fake.updateStatus(kConfigMaps, *cm).error().kind, KubeErrorKind::kNotFound);
}

TEST(FakeKubeClientTest, Patches) {
  FakeKubeClient fake;
  json input = table("t", 1, {{"a", "1"}, {"b", "2"}});
  auto v = fake.create(kTables, input);
  ASSERT_TRUE(v);

  // RFC 7386: null removes, objects merge, arrays replace.
  auto merged = fake.patch(
      kTables, {"default", "t"}, PatchType::kMerge,
      json::parse(R"({"metadata":{"labels":{"a":null,"c":"3"}},"spec":{"replicas":2}})"));
  ASSERT_TRUE(merged) << merged.error().toString();
  EXPECT_EQ((*merged)["metadata"]["labels"], json({{"b", "2"}, {"c", "3"}}));
  EXPECT_EQ((*merged)["spec"]["replicas"], 2);
  EXPECT_EQ((*merged)["metadata"]["generation"], 2);

  // RFC 6902, including a failing test op (422).
  auto patched = fake.patch(kTables, {"default", "t"}, PatchType::kJson,
                            json::parse(R"([{"op":"replace","path":"/spec/replicas","value":4}])"));
  ASSERT_TRUE(patched);
  EXPECT_EQ((*patched)["spec"]["replicas"], 4);
  auto failed_test =
      fake.patch(kTables, {"default", "t"}, PatchType::kJson,
                 json::parse(R"([{"op":"test","path":"/spec/replicas","value":9}])"));
  ASSERT_FALSE(failed_test);
  EXPECT_EQ(failed_test.error().kind, KubeErrorKind::kInvalid);

  // A resourceVersion in the patch is a precondition.
  json stale = {{"metadata", {{"resourceVersion", rv(*v)}}}, {"spec", {{"replicas", 8}}}};
  EXPECT_EQ(fake.patch(kTables, {"default", "t"}, PatchType::kMerge, stale).error().kind,
            KubeErrorKind::kConflict);

  // Status through the subresource, the main resource ignores it.
  PatchOptions status;
  status.subresource = "status";
  auto with_status =
      fake.patch(kTables, {"default", "t"}, PatchType::kMerge,
                 json{{"status", {{"phase", "Ready"}}}, {"spec", {{"replicas", 1}}}}, status);
  ASSERT_TRUE(with_status);
  EXPECT_EQ((*with_status)["status"]["phase"], "Ready");
  EXPECT_EQ((*with_status)["spec"]["replicas"], 4);
  auto ignored = fake.patch(kTables, {"default", "t"}, PatchType::kMerge,
                            json{{"status", {{"phase", "Broken"}}}});
  ASSERT_TRUE(ignored);
  EXPECT_EQ((*ignored)["status"]["phase"], "Ready");

  EXPECT_EQ(
      fake.patch(kTables, {"default", "nope"}, PatchType::kMerge, json::object()).error().kind,
      KubeErrorKind::kNotFound);
  EXPECT_FALSE(fake.patch(kTables, {"default", "t"}, PatchType::kStrategicMerge, json::object()));
}

TEST(FakeKubeClientTest, ApplyCreatesAndNeedsAFieldManager) {
  FakeKubeClient fake;
  const json desired = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"data", {{"k", "v"}}}};
  EXPECT_EQ(fake.patch(kConfigMaps, {"default", "c"}, PatchType::kApply, desired).error().kind,
            KubeErrorKind::kBadRequest);
  PatchOptions apply;
  apply.field_manager = "rtable-operator";
  apply.force = true;
  auto created = fake.patch(kConfigMaps, {"default", "c"}, PatchType::kApply, desired, apply);
  ASSERT_TRUE(created) << created.error().toString();
  EXPECT_EQ((*created)["metadata"]["name"], "c");
  json changed = desired;
  changed["data"]["k"] = "w";
  auto updated = fake.patch(kConfigMaps, {"default", "c"}, PatchType::kApply, changed, apply);
  ASSERT_TRUE(updated);
  EXPECT_EQ((*updated)["data"]["k"], "w");
}

TEST(FakeKubeClientTest, DeleteWithPreconditions) {
  FakeKubeClient fake;
  auto v = fake.create(kConfigMaps, configMap("c"));
  ASSERT_TRUE(v);
  DeleteOptions wrong_uid;
  wrong_uid.precondition_uid = "other";
  EXPECT_EQ(fake.remove(kConfigMaps, {"default", "c"}, wrong_uid).error().kind,
            KubeErrorKind::kConflict);
  DeleteOptions wrong_rv;
  wrong_rv.precondition_resource_version = "1";
  EXPECT_EQ(fake.remove(kConfigMaps, {"default", "c"}, wrong_rv).error().kind,
            KubeErrorKind::kConflict);

  DeleteOptions right;
  right.precondition_uid = (*v)["metadata"]["uid"];
  right.precondition_resource_version = rv(*v);
  auto deleted = fake.remove(kConfigMaps, {"default", "c"}, right);
  ASSERT_TRUE(deleted) << deleted.error().toString();
  EXPECT_TRUE(deleted->deleted);
  EXPECT_EQ(deleted->object["kind"], "Status");
  EXPECT_EQ(deleted->object["status"], "Success");
  EXPECT_EQ(fake.get(kConfigMaps, {"default", "c"}).error().kind, KubeErrorKind::kNotFound);
  EXPECT_EQ(fake.remove(kConfigMaps, {"default", "c"}).error().kind, KubeErrorKind::kNotFound);
}

TEST(FakeKubeClientTest, Finalizers) {
  FakeKubeClient fake;
  Recorder recorder;
  auto watch =
      fake.watch(kTables, "default", at(std::to_string(fake.currentResourceVersionForTest())),
                 recorder.onEvent(), recorder.onEnd());
  ASSERT_TRUE(watch);

  json input = table("t");
  input["metadata"]["finalizers"] = {"rtable.io/zookeeper"};
  auto v = fake.create(kTables, input);
  ASSERT_TRUE(v);

  auto pending = fake.remove(kTables, {"default", "t"});
  ASSERT_TRUE(pending) << pending.error().toString();
  EXPECT_FALSE(pending->deleted);
  EXPECT_TRUE(pending->object["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(pending->object["metadata"]["generation"], 2);  // deletion bumps generation
  auto still = fake.get(kTables, {"default", "t"});
  ASSERT_TRUE(still);

  // Deleting again changes nothing.
  const int64_t before = fake.currentResourceVersionForTest();
  ASSERT_TRUE(fake.remove(kTables, {"default", "t"}));
  EXPECT_EQ(fake.currentResourceVersionForTest(), before);

  // No new finalizers once deleting.
  json add = *still;
  add["metadata"]["finalizers"].push_back("other/finalizer");
  auto refused = fake.update(kTables, add);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, KubeErrorKind::kInvalid);
  EXPECT_EQ(refused.error().causes.at(0).field, "metadata.finalizers");

  // Removing the last finalizer deletes the object.
  auto last = fake.patch(kTables, {"default", "t"}, PatchType::kMerge,
                         json{{"metadata", {{"finalizers", nullptr}}}});
  ASSERT_TRUE(last) << last.error().toString();
  EXPECT_EQ(fake.get(kTables, {"default", "t"}).error().kind, KubeErrorKind::kNotFound);

  EXPECT_EQ(describe(recorder.waitFor(3)),
            (std::vector<std::string>{"ADDED t", "MODIFIED t", "DELETED t"}));
}

TEST(FakeKubeClientTest, ForegroundDeletionAddsTheGcFinalizer) {
  FakeKubeClient fake;
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("c")));
  DeleteOptions foreground;
  foreground.propagation_policy = PropagationPolicy::kForeground;
  auto pending = fake.remove(kConfigMaps, {"default", "c"}, foreground);
  ASSERT_TRUE(pending);
  EXPECT_FALSE(pending->deleted);
  EXPECT_EQ(pending->object["metadata"]["finalizers"], json::array({"foregroundDeletion"}));
}

TEST(FakeKubeClientTest, ListSelectorsNamespacesAndOrder) {
  FakeKubeClient fake;
  ASSERT_TRUE(fake.create(resources::namespaces(), json{{"metadata", {{"name", "other"}}}}));
  ASSERT_TRUE(fake.create(kTables, table("b", 1, {{"app", "rtable"}, {"tier", "core"}})));
  ASSERT_TRUE(fake.create(kTables, table("a", 1, {{"app", "rtable"}, {"tier", "edge"}})));
  ASSERT_TRUE(fake.create(kTables, table("c", 1, {{"app", "other"}})));
  json elsewhere = table("z", 1, {{"app", "rtable"}});
  elsewhere["metadata"]["namespace"] = "other";
  ASSERT_TRUE(fake.create(kTables, elsewhere));

  auto names = [&](std::string_view ns, const std::string& selector) {
    ListOptions o;
    o.label_selector = selector;
    auto l = fake.list(kTables, ns, o);
    EXPECT_TRUE(l) << (l ? "" : l.error().toString());
    std::vector<std::string> out;
    if (l) {
      for (const auto& item : l->items) out.push_back(item["metadata"]["name"]);
    }
    return out;
  };
  EXPECT_EQ(names("default", ""), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(names("", "app=rtable"), (std::vector<std::string>{"a", "b", "z"}));
  EXPECT_EQ(names("default", "app=rtable,tier in (core)"), (std::vector<std::string>{"b"}));
  EXPECT_EQ(names("default", "tier!=core"), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(names("default", "tier"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(names("default", "!tier"), (std::vector<std::string>{"c"}));
  ListOptions bad;
  bad.label_selector = "a in (";
  EXPECT_EQ(fake.list(kTables, "default", bad).error().kind, KubeErrorKind::kBadRequest);
  ListOptions fields;
  fields.field_selector = "metadata.name=b";
  EXPECT_EQ(fake.list(kTables, "default", fields)->items.size(), 1u);
  EXPECT_EQ(fake.list(kTables, "default")->resource_version,
            std::to_string(fake.currentResourceVersionForTest()));
}

TEST(FakeKubeClientTest, PaginationIsAConsistentSnapshot) {
  FakeKubeClient fake;
  for (const char* name : {"a", "b", "c", "d", "e"})
    ASSERT_TRUE(fake.create(kConfigMaps, configMap(name)));
  ListOptions o;
  o.limit = 2;
  auto page1 = fake.list(kConfigMaps, "default", o);
  ASSERT_TRUE(page1);
  EXPECT_EQ(page1->items.size(), 2u);
  EXPECT_EQ(page1->remaining_item_count, 3);
  ASSERT_FALSE(page1->continue_token.empty());

  // Writes after the first page do not show in the next pages.
  ASSERT_TRUE(fake.remove(kConfigMaps, {"default", "d"}));
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("f")));

  o.continue_token = page1->continue_token;
  auto page2 = fake.list(kConfigMaps, "default", o);
  ASSERT_TRUE(page2);
  EXPECT_EQ(page2->resource_version, page1->resource_version);
  ASSERT_EQ(page2->items.size(), 2u);
  EXPECT_EQ(page2->items[0]["metadata"]["name"], "c");
  EXPECT_EQ(page2->items[1]["metadata"]["name"], "d");
  o.continue_token = page2->continue_token;
  auto page3 = fake.list(kConfigMaps, "default", o);
  ASSERT_TRUE(page3);
  ASSERT_EQ(page3->items.size(), 1u);
  EXPECT_EQ(page3->items[0]["metadata"]["name"], "e");
  EXPECT_TRUE(page3->continue_token.empty());

  ListOptions all;
  all.limit = 2;
  auto everything = fake.listAll(kConfigMaps, "default", all);
  ASSERT_TRUE(everything);
  EXPECT_EQ(everything->items.size(), 5u);  // a b c e f
  EXPECT_EQ(everything->resource_version, std::to_string(fake.currentResourceVersionForTest()));
}

// Delegates to a FakeKubeClient; before the first page with a continue token it writes and
// compacts, as an etcd compaction between two pages does.
class CompactingBetweenPages final : public KubeClient {
 public:
  explicit CompactingBetweenPages(FakeKubeClient& fake) : fake_(fake) {}
  int compactions = 0;

  KubeResult<ObjectList> list(const ResourceType& type, std::string_view ns,
                              const ListOptions& options) override {
    if (!options.continue_token.empty() && compactions == 0) {
      ++compactions;
      EXPECT_TRUE(fake_.create(kConfigMaps, configMap("late")));
      fake_.compactForTest();
    }
    return fake_.list(type, ns, options);
  }
  KubeResult<json> get(const ResourceType& t, const ObjectKey& k) override {
    return fake_.get(t, k);
  }
  KubeResult<json> create(const ResourceType& t, const json& o, const WriteOptions& w) override {
    return fake_.create(t, o, w);
  }
  KubeResult<json> update(const ResourceType& t, const json& o, const WriteOptions& w) override {
    return fake_.update(t, o, w);
  }
  KubeResult<json> updateStatus(const ResourceType& t, const json& o,
                                const WriteOptions& w) override {
    return fake_.updateStatus(t, o, w);
  }
  KubeResult<json> patch(const ResourceType& t, const ObjectKey& k, PatchType p, const json& j,
                         const PatchOptions& o) override {
    return fake_.patch(t, k, p, j, o);
  }
  KubeResult<DeleteResult> remove(const ResourceType& t, const ObjectKey& k,
                                  const DeleteOptions& o) override {
    return fake_.remove(t, k, o);
  }
  KubeResult<std::unique_ptr<Watch>> watch(const ResourceType& t, std::string_view ns,
                                           const WatchOptions& o, WatchEventHandler e,
                                           WatchEndHandler end) override {
    return fake_.watch(t, ns, o, std::move(e), std::move(end));
  }

 private:
  FakeKubeClient& fake_;
};

TEST(FakeKubeClientTest, CompactedContinueTokenIsGoneAndListAllRestarts) {
  FakeKubeClient fake;
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(fake.create(kConfigMaps, configMap(name)));
  ListOptions o;
  o.limit = 1;
  auto page1 = fake.list(kConfigMaps, "default", o);
  ASSERT_TRUE(page1);
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("d")));
  fake.compactForTest();
  o.continue_token = page1->continue_token;
  auto expired = fake.list(kConfigMaps, "default", o);
  ASSERT_FALSE(expired);
  EXPECT_EQ(expired.error().kind, KubeErrorKind::kGone);
  EXPECT_EQ(expired.error().http_code, 410);

  // listAll starts over from the first page, and returns the new snapshot whole.
  CompactingBetweenPages client(fake);
  ListOptions paged;
  paged.limit = 2;
  auto all = client.listAll(kConfigMaps, "default", paged);
  ASSERT_TRUE(all) << all.error().toString();
  EXPECT_EQ(client.compactions, 1);
  std::vector<std::string> names;
  for (const auto& item : all->items) names.push_back(item["metadata"]["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d", "late"}));
  EXPECT_EQ(all->resource_version, std::to_string(fake.currentResourceVersionForTest()));

  // A Gone on the first page is not a continue problem: returned as is.
  fake.failNextForTest(Verb::kList, expired.error());
  EXPECT_EQ(fake.listAll(kConfigMaps, "default", paged).error().kind, KubeErrorKind::kGone);
}

TEST(FakeKubeClientTest, ExactListAtAnOlderVersion) {
  FakeKubeClient fake;
  auto a = fake.create(kConfigMaps, configMap("a"));
  ASSERT_TRUE(a);
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("b")));
  json edit = *a;
  edit["data"]["k"] = "changed";
  ASSERT_TRUE(fake.update(kConfigMaps, edit));
  ListOptions exact;
  exact.resource_version = rv(*a);
  exact.resource_version_match = ResourceVersionMatch::kExact;
  auto old = fake.list(kConfigMaps, "default", exact);
  ASSERT_TRUE(old) << old.error().toString();
  ASSERT_EQ(old->items.size(), 1u);
  EXPECT_EQ(old->items[0]["data"]["k"], "v");
  EXPECT_EQ(old->resource_version, rv(*a));
  fake.compactForTest();
  EXPECT_EQ(fake.list(kConfigMaps, "default", exact).error().kind, KubeErrorKind::kGone);
}

TEST(FakeKubeClientTest, WatchReplaysFromAResourceVersion) {
  FakeKubeClient fake;
  auto a = fake.create(kConfigMaps, configMap("a"));
  ASSERT_TRUE(a);
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("b")));
  json edit = *a;
  edit["data"]["k"] = "w";
  ASSERT_TRUE(fake.update(kConfigMaps, edit));

  Recorder from_a;
  auto w1 = fake.watch(kConfigMaps, "default", at(rv(*a)), from_a.onEvent(), from_a.onEnd());
  ASSERT_TRUE(w1);
  EXPECT_EQ(describe(from_a.waitFor(2)), (std::vector<std::string>{"ADDED b", "MODIFIED a"}));

  // "" and "0": synthetic ADDED for what exists, then live events.
  Recorder from_now;
  auto w2 = fake.watch(kConfigMaps, "default", {}, from_now.onEvent(), from_now.onEnd());
  ASSERT_TRUE(w2);
  ASSERT_TRUE(fake.remove(kConfigMaps, {"default", "b"}));
  EXPECT_EQ(describe(from_now.waitFor(3)),
            (std::vector<std::string>{"ADDED a", "ADDED b", "DELETED b"}));
  const auto events = from_now.events();
  // The DELETED object carries the resourceVersion of the deletion.
  EXPECT_EQ(events[2].resourceVersion(), std::to_string(fake.currentResourceVersionForTest()));

  (*w1)->stop();
  EXPECT_EQ(from_a.waitEnd()->reason, WatchEndReason::kStopped);
  EXPECT_EQ(fake.activeWatchesForTest(), 1u);
}

TEST(FakeKubeClientTest, WatchSelectorTransitions) {
  FakeKubeClient fake;
  Recorder r;
  WatchOptions o;
  o.label_selector = "app=rtable";
  o.resource_version = "0";
  auto w = fake.watch(kTables, "default", o, r.onEvent(), r.onEnd());
  ASSERT_TRUE(w);
  auto v = fake.create(kTables, table("t", 1, {{"app", "other"}}));  // not selected
  ASSERT_TRUE(v);
  v = fake.patch(kTables, {"default", "t"}, PatchType::kMerge,
                 json{{"metadata", {{"labels", {{"app", "rtable"}}}}}});  // enters: ADDED
  ASSERT_TRUE(v);
  v = fake.patch(kTables, {"default", "t"}, PatchType::kMerge, json{{"spec", {{"replicas", 2}}}});
  ASSERT_TRUE(v);
  v = fake.patch(kTables, {"default", "t"}, PatchType::kMerge,
                 json{{"metadata", {{"labels", {{"app", "gone"}}}}}});  // leaves: DELETED
  ASSERT_TRUE(v);
  EXPECT_EQ(describe(r.waitFor(3)),
            (std::vector<std::string>{"ADDED t", "MODIFIED t", "DELETED t"}));
}

TEST(FakeKubeClientTest, CompactedWatchGetsGoneThenEnds) {
  FakeKubeClient fake;
  auto a = fake.create(kConfigMaps, configMap("a"));
  ASSERT_TRUE(a);
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("b")));
  fake.compactForTest();
  Recorder r;
  auto w = fake.watch(kConfigMaps, "default", at(rv(*a)), r.onEvent(), r.onEnd());
  ASSERT_TRUE(w);
  auto events = r.waitFor(1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, WatchEventType::kError);
  EXPECT_EQ(events[0].error.kind, KubeErrorKind::kGone);
  EXPECT_EQ(events[0].error.http_code, 410);
  EXPECT_EQ(events[0].error.reason, "Expired");
  auto end = r.waitEnd();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->reason, WatchEndReason::kServerClosed);
  EXPECT_TRUE((*w)->waitEnded(1s));

  // The current version is still watchable.
  Recorder fresh;
  auto ok =
      fake.watch(kConfigMaps, "default", at(std::to_string(fake.currentResourceVersionForTest())),
                 fresh.onEvent(), fresh.onEnd());
  ASSERT_TRUE(ok);
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("c")));
  EXPECT_EQ(describe(fresh.waitFor(1)), (std::vector<std::string>{"ADDED c"}));
}

TEST(FakeKubeClientTest, BookmarksAndServerClose) {
  FakeKubeClient fake;
  Recorder with, without;
  auto w1 = fake.watch(kConfigMaps, "", at("0"), with.onEvent(), with.onEnd());
  WatchOptions no_bookmarks;
  no_bookmarks.allow_watch_bookmarks = false;
  auto w2 = fake.watch(kConfigMaps, "", no_bookmarks, without.onEvent(), without.onEnd());
  ASSERT_TRUE(w1 && w2);
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("a")));
  fake.bookmarkForTest();
  auto events = with.waitFor(2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].type, WatchEventType::kBookmark);
  EXPECT_EQ(events[1].resourceVersion(), std::to_string(fake.currentResourceVersionForTest()));
  EXPECT_EQ(events[1].object["kind"], "ConfigMap");
  fake.closeWatchesForTest();
  EXPECT_EQ(with.waitEnd()->reason, WatchEndReason::kServerClosed);
  EXPECT_EQ(without.waitEnd()->reason, WatchEndReason::kServerClosed);
  EXPECT_EQ(without.events().size(), 1u);
  EXPECT_EQ(fake.activeWatchesForTest(), 0u);
}

TEST(FakeKubeClientTest, HandlersMayCallTheClientAndStopTheirWatch) {
  FakeKubeClient fake;
  std::unique_ptr<Watch> watch;
  std::mutex mu;
  std::condition_variable cv;
  bool ended = false;
  int seen = 0;
  auto started = fake.watch(
      kConfigMaps, "default", at("0"),
      [&](const WatchEvent& e) {
        // Read back through the client from the handler (an informer's cache miss).
        EXPECT_TRUE(fake.get(kConfigMaps, objectKeyOf(e.object)));
        std::lock_guard lock(mu);
        if (++seen == 2) watch->stop();  // stop from inside: must not deadlock
      },
      [&](const WatchEnd& end) {
        EXPECT_EQ(end.reason, WatchEndReason::kStopped);
        std::lock_guard lock(mu);
        ended = true;
        cv.notify_all();
      });
  ASSERT_TRUE(started);
  {
    std::lock_guard lock(mu);
    watch = std::move(*started);
  }
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("a")));
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("b")));
  ASSERT_TRUE(fake.create(kConfigMaps, configMap("c")));
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return ended; }));
  EXPECT_EQ(seen, 2);
}

TEST(FakeKubeClientTest, FaultInjection) {
  FakeKubeClient fake;
  fake.failNextForTest(Verb::kCreate, KubeError::connection("refused"));
  auto refused = fake.create(kConfigMaps, configMap("a"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, KubeErrorKind::kConnection);
  EXPECT_EQ(fake.get(kConfigMaps, {"default", "a"}).error().kind, KubeErrorKind::kNotFound);

  // A lost answer: applied, but the caller sees the error; a retry then sees AlreadyExists.
  fake.failNextForTest(Verb::kCreate, KubeError::timeout("lost"), 1,
                       FakeKubeClient::FaultTiming::kAfterApply);
  EXPECT_EQ(fake.create(kConfigMaps, configMap("a")).error().kind, KubeErrorKind::kTimeout);
  EXPECT_TRUE(fake.get(kConfigMaps, {"default", "a"}));
  EXPECT_EQ(fake.create(kConfigMaps, configMap("a")).error().kind, KubeErrorKind::kAlreadyExists);

  fake.failNextForTest(Verb::kWatch, KubeError::of(KubeErrorKind::kForbidden, "rbac"), 2);
  Recorder r;
  EXPECT_EQ(fake.watch(kConfigMaps, "", {}, r.onEvent(), r.onEnd()).error().kind,
            KubeErrorKind::kForbidden);
  EXPECT_FALSE(fake.watch(kConfigMaps, "", {}, r.onEvent(), r.onEnd()));
  EXPECT_TRUE(fake.watch(kConfigMaps, "", {}, r.onEvent(), r.onEnd()));

  const auto actions = fake.actionsForTest();
  ASSERT_GE(actions.size(), 4u);
  EXPECT_EQ(actions[0].verb, Verb::kCreate);
  EXPECT_EQ(actions[0].resource, "configmaps");
  EXPECT_EQ(actions[0].key.name, "a");
}

}  // namespace
}  // namespace rtable::op::testing
