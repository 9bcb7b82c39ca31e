// One suite, two backends: FakeKubeClient and HttpKubeClient against a real kube-apiserver
// (LocalControlPlane). Every case states an apiserver behaviour the operator relies on; a case
// that passes on the fake and fails on the real server is a bug in the fake.
//
// The real side also covers what only it can: TLS with the kubeconfig's CA and client
// certificate from memory, chunked watch streams, server-side timeouts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>

#include "rtable/common/testing/wait.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/testing/fake_kube_client.h"
#include "rtable/operator/testing/local_control_plane.h"

namespace rtable::op {
namespace {

using common::testing::waitFor;
using nlohmann::json;
using namespace std::chrono_literals;

const ResourceType kConfigMaps = resources::configMaps();
// A custom resource with a status subresource, like the operator's own CRDs.
const ResourceType kWidgets{"conformance.rtable.io", "v1", "widgets", "Widget", true, true};

json widgetCrd() {
  return json::parse(R"({
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.conformance.rtable.io"},
    "spec": {
      "group": "conformance.rtable.io", "scope": "Namespaced",
      "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
      "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object",
                                                   "x-kubernetes-preserve-unknown-fields": true}}}]}})");
}

std::string rv(const json& o) {
  return o["metadata"].value("resourceVersion", "");
}

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
  std::vector<WatchEvent> waitFor(std::size_t n, std::chrono::seconds timeout = 30s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return events_.size() >= n; });
    return events_;
  }
  // Waits until some event satisfies `matches`; returns every event so far.
  template <class Matches>
  std::vector<WatchEvent> waitUntil(Matches matches, std::chrono::seconds timeout = 30s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout,
                 [&] { return std::any_of(events_.begin(), events_.end(), matches); });
    return events_;
  }
  std::optional<WatchEnd> waitEnd(std::chrono::seconds timeout = 30s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return end_.has_value(); });
    return end_;
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
    if (e.type == WatchEventType::kBookmark) continue;  // timing is the server's
    out.push_back(
        fmt::format("{} {}", watchEventTypeName(e.type), e.object["metadata"].value("name", "")));
  }
  return out;
}

class KubeClientConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    fake_ = std::make_unique<testing::FakeKubeClient>();
    testing::LocalControlPlaneOptions options;
    // Leases bypass the watch cache: their watches read etcd, so an etcd compaction really
    // expires old resourceVersions (the cache would keep serving its own window).
    options.extra_apiserver_flags.push_back("--watch-cache-sizes=leases.coordination.k8s.io#0");
    auto plane = testing::LocalControlPlane::start(options);
    if (!plane) {
      start_error_ = plane.error();
      return;
    }
    plane_ = std::make_unique<testing::LocalControlPlane>(std::move(*plane));
    // The admin kubeconfig carries CA, client certificate and key inline: the TLS path.
    auto kubeconfig = KubeConfig::load(plane_->kubeconfigPath());
    if (!kubeconfig) {
      start_error_ = kubeconfig.error().toString();
      return;
    }
    auto cluster = kubeconfig->clusterConfig();
    if (!cluster) {
      start_error_ = cluster.error().toString();
      return;
    }
    auto client = HttpKubeClient::create(*cluster);
    if (!client) {
      start_error_ = client.error().toString();
      return;
    }
    http_ = std::move(*client);
    auto crd = http_->create(resources::customResourceDefinitions(), widgetCrd());
    if (!crd) {
      start_error_ = "creating the CRD: " + crd.error().toString();
      return;
    }
    // Established, and its REST endpoint served.
    const bool served = waitFor([] { return http_->list(kWidgets, "default").has_value(); }, 60s);
    if (!served) start_error_ = "the widgets CRD was not served within 60 s";
  }

  static void TearDownTestSuite() {
    if (plane_ && ::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      plane_->keepWorkDir();
      fmt::print(stderr, "control plane logs kept in {}\n", plane_->workDir().string());
    }
    http_.reset();
    plane_.reset();
    fake_.reset();
  }

  void SetUp() override {
    if (real()) {
      ASSERT_TRUE(http_) << "no control plane: " << start_error_;
      client_ = http_.get();
    } else {
      client_ = fake_.get();
    }
    // A namespace per case: cases share one apiserver.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    name = name.substr(0, name.find('/'));
    ns_ = "conf";
    for (char c : name) {
      if (std::isupper(static_cast<unsigned char>(c))) ns_ += '-';
      ns_ += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    auto created = client_->create(resources::namespaces(), json{{"metadata", {{"name", ns_}}}});
    ASSERT_TRUE(created) << created.error().toString();
  }

  bool real() const { return GetParam() == "apiserver"; }

  json configMap(const std::string& name, json labels = json::object()) const {
    return {{"apiVersion", "v1"},
            {"kind", "ConfigMap"},
            {"metadata", {{"name", name}, {"namespace", ns_}, {"labels", labels}}},
            {"data", {{"k", "v"}}}};
  }
  json widget(const std::string& name) const {
    return {{"apiVersion", "conformance.rtable.io/v1"},
            {"kind", "Widget"},
            {"metadata", {{"name", name}, {"namespace", ns_}}},
            {"spec", {{"size", 1}}}};
  }
  json createOk(const ResourceType& type, const json& object) {
    auto created = client_->create(type, object);
    EXPECT_TRUE(created) << created.error().toString();
    return created ? *created : json();
  }

  static inline std::unique_ptr<testing::FakeKubeClient> fake_;
  static inline std::unique_ptr<testing::LocalControlPlane> plane_;
  static inline std::unique_ptr<HttpKubeClient> http_;
  static inline std::string start_error_;

  KubeClient* client_ = nullptr;
  std::string ns_;
};

TEST_P(KubeClientConformanceTest, CreateGetAndTheirErrors) {
  const json created = createOk(kConfigMaps, configMap("c"));
  EXPECT_EQ(created["metadata"]["uid"].get<std::string>().size(), 36u);
  EXPECT_FALSE(rv(created).empty());
  EXPECT_TRUE(created["metadata"].contains("creationTimestamp"));
  auto got = client_->get(kConfigMaps, {ns_, "c"});
  ASSERT_TRUE(got) << got.error().toString();
  EXPECT_EQ(rv(*got), rv(created));
  EXPECT_EQ((*got)["data"]["k"], "v");

  auto again = client_->create(kConfigMaps, configMap("c"));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().kind, KubeErrorKind::kAlreadyExists);
  EXPECT_EQ(again.error().http_code, 409);
  EXPECT_EQ(again.error().message, "configmaps \"c\" already exists");

  auto missing = client_->get(kConfigMaps, {ns_, "missing"});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().kind, KubeErrorKind::kNotFound);
  EXPECT_EQ(missing.error().message, "configmaps \"missing\" not found");

  json elsewhere = configMap("c");
  elsewhere["metadata"]["namespace"] = "no-such-namespace";
  auto no_ns = client_->create(kConfigMaps, elsewhere);
  ASSERT_FALSE(no_ns);
  EXPECT_EQ(no_ns.error().kind, KubeErrorKind::kNotFound);
  EXPECT_EQ(no_ns.error().message, "namespaces \"no-such-namespace\" not found");

  json unnamed = configMap("");
  unnamed["metadata"].erase("name");
  auto invalid = client_->create(kConfigMaps, unnamed);
  ASSERT_FALSE(invalid);
  EXPECT_EQ(invalid.error().kind, KubeErrorKind::kInvalid);
  ASSERT_FALSE(invalid.error().causes.empty());
  EXPECT_EQ(invalid.error().causes[0].field, "metadata.name");

  json generated = configMap("");
  generated["metadata"].erase("name");
  generated["metadata"]["generateName"] = "gen-";
  const json with_name = createOk(kConfigMaps, generated);
  EXPECT_TRUE(with_name["metadata"].value("name", "").starts_with("gen-"));
}

TEST_P(KubeClientConformanceTest, UpdatesConflictOnStaleVersions) {
  const json v1 = createOk(kConfigMaps, configMap("c"));
  json edit = v1;
  edit["data"]["k"] = "w";
  auto v2 = client_->update(kConfigMaps, edit);
  ASSERT_TRUE(v2) << v2.error().toString();
  EXPECT_NE(rv(*v2), rv(v1));

  edit["data"]["k"] = "x";  // still carries v1's resourceVersion
  auto stale = client_->update(kConfigMaps, edit);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().kind, KubeErrorKind::kConflict);
  EXPECT_NE(stale.error().message.find("the object has been modified"), std::string::npos);

  // An update that changes nothing writes nothing.
  auto same = client_->update(kConfigMaps, *v2);
  ASSERT_TRUE(same);
  EXPECT_EQ(rv(*same), rv(*v2));

  // A ConfigMap may be updated without a resourceVersion (unconditionally).
  edit["metadata"].erase("resourceVersion");
  auto unconditional = client_->update(kConfigMaps, edit);
  ASSERT_TRUE(unconditional) << unconditional.error().toString();
  EXPECT_EQ((*unconditional)["data"]["k"], "x");
}

TEST_P(KubeClientConformanceTest, GenerationAndTheStatusSubresource) {
  json input = widget("w");
  input["status"] = {{"phase", "Set at create"}};
  json v = createOk(kWidgets, input);
  EXPECT_EQ(v["metadata"]["generation"], 1);
  EXPECT_FALSE(v.contains("status"));  // create cannot set status

  json edit = v;
  edit["metadata"]["labels"] = {{"team", "data"}};
  edit["status"] = {{"phase", "Ignored by update"}};
  auto labelled = client_->update(kWidgets, edit);
  ASSERT_TRUE(labelled) << labelled.error().toString();
  EXPECT_EQ((*labelled)["metadata"]["generation"], 1);
  EXPECT_FALSE(labelled->contains("status"));

  edit = *labelled;
  edit["status"] = {{"phase", "Ready"}};
  edit["spec"]["size"] = 9;  // ignored by updateStatus
  auto with_status = client_->updateStatus(kWidgets, edit);
  ASSERT_TRUE(with_status) << with_status.error().toString();
  EXPECT_EQ((*with_status)["status"]["phase"], "Ready");
  EXPECT_EQ((*with_status)["spec"]["size"], 1);
  EXPECT_EQ((*with_status)["metadata"]["generation"], 1);

  // A custom resource needs a resourceVersion for a PUT (a ConfigMap does not).
  json unversioned = *labelled;
  unversioned["metadata"].erase("resourceVersion");
  auto refused = client_->update(kWidgets, unversioned);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, KubeErrorKind::kInvalid) << refused.error().toString();

  // The stale status write conflicts.
  EXPECT_EQ(client_->updateStatus(kWidgets, edit).error().kind, KubeErrorKind::kConflict);

  edit = *with_status;
  edit["spec"]["size"] = 2;
  auto resized = client_->update(kWidgets, edit);
  ASSERT_TRUE(resized);
  EXPECT_EQ((*resized)["metadata"]["generation"], 2);
  EXPECT_EQ((*resized)["status"]["phase"], "Ready");
}

TEST_P(KubeClientConformanceTest, Patches) {
  json input = configMap("c", {{"a", "1"}, {"b", "2"}});
  const json v1 = createOk(kConfigMaps, input);
  auto merged = client_->patch(kConfigMaps, {ns_, "c"}, PatchType::kMerge,
                               json::parse(R"({"metadata":{"labels":{"a":null,"c":"3"}}})"));
  ASSERT_TRUE(merged) << merged.error().toString();
  EXPECT_EQ((*merged)["metadata"]["labels"], json({{"b", "2"}, {"c", "3"}}));

  auto replaced = client_->patch(kConfigMaps, {ns_, "c"}, PatchType::kJson,
                                 json::parse(R"([{"op":"replace","path":"/data/k","value":"j"}])"));
  ASSERT_TRUE(replaced) << replaced.error().toString();
  EXPECT_EQ((*replaced)["data"]["k"], "j");

  auto failed_test =
      client_->patch(kConfigMaps, {ns_, "c"}, PatchType::kJson,
                     json::parse(R"([{"op":"test","path":"/data/k","value":"no"}])"));
  ASSERT_FALSE(failed_test);
  EXPECT_EQ(failed_test.error().http_code, 422);

  const json stale = {{"metadata", {{"resourceVersion", rv(v1)}}}, {"data", {{"k", "s"}}}};
  auto conflict = client_->patch(kConfigMaps, {ns_, "c"}, PatchType::kMerge, stale);
  ASSERT_FALSE(conflict);
  EXPECT_EQ(conflict.error().kind, KubeErrorKind::kConflict);

  auto missing = client_->patch(kConfigMaps, {ns_, "nope"}, PatchType::kMerge, json::object());
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().kind, KubeErrorKind::kNotFound);

  // Status of a custom resource through the subresource; the main resource ignores status.
  createOk(kWidgets, widget("w"));
  PatchOptions status;
  status.subresource = "status";
  auto with_status = client_->patch(kWidgets, {ns_, "w"}, PatchType::kMerge,
                                    json{{"status", {{"phase", "Ready"}}}}, status);
  ASSERT_TRUE(with_status) << with_status.error().toString();
  EXPECT_EQ((*with_status)["status"]["phase"], "Ready");
  auto ignored = client_->patch(kWidgets, {ns_, "w"}, PatchType::kMerge,
                                json{{"status", {{"phase", "Broken"}}}});
  ASSERT_TRUE(ignored);
  EXPECT_EQ((*ignored)["status"]["phase"], "Ready");
}

TEST_P(KubeClientConformanceTest, ServerSideApplyCreatesAndUpdates) {
  PatchOptions apply;
  apply.field_manager = "rtable-conformance";
  apply.force = true;
  json desired = {{"apiVersion", "v1"},
                  {"kind", "ConfigMap"},
                  {"metadata", {{"name", "applied"}, {"namespace", ns_}}},
                  {"data", {{"k", "v"}}}};
  auto created = client_->patch(kConfigMaps, {ns_, "applied"}, PatchType::kApply, desired, apply);
  ASSERT_TRUE(created) << created.error().toString();
  EXPECT_EQ((*created)["data"]["k"], "v");
  desired["data"]["k"] = "w";
  auto updated = client_->patch(kConfigMaps, {ns_, "applied"}, PatchType::kApply, desired, apply);
  ASSERT_TRUE(updated) << updated.error().toString();
  EXPECT_EQ((*updated)["data"]["k"], "w");
}

TEST_P(KubeClientConformanceTest, DeletePreconditions) {
  const json v = createOk(kConfigMaps, configMap("c"));
  DeleteOptions wrong_uid;
  wrong_uid.precondition_uid = "00000000-0000-0000-0000-000000000000";
  EXPECT_EQ(client_->remove(kConfigMaps, {ns_, "c"}, wrong_uid).error().kind,
            KubeErrorKind::kConflict);
  DeleteOptions wrong_rv;
  wrong_rv.precondition_resource_version = "1";
  EXPECT_EQ(client_->remove(kConfigMaps, {ns_, "c"}, wrong_rv).error().kind,
            KubeErrorKind::kConflict);
  DeleteOptions right;
  right.precondition_uid = v["metadata"]["uid"];
  right.precondition_resource_version = rv(v);
  auto deleted = client_->remove(kConfigMaps, {ns_, "c"}, right);
  ASSERT_TRUE(deleted) << deleted.error().toString();
  EXPECT_TRUE(deleted->deleted);
  EXPECT_EQ(client_->get(kConfigMaps, {ns_, "c"}).error().kind, KubeErrorKind::kNotFound);
  EXPECT_EQ(client_->remove(kConfigMaps, {ns_, "c"}).error().kind, KubeErrorKind::kNotFound);
}

TEST_P(KubeClientConformanceTest, FinalizersHoldDeletion) {
  json input = widget("w");
  input["metadata"]["finalizers"] = {"conformance.rtable.io/cleanup"};
  createOk(kWidgets, input);

  auto pending = client_->remove(kWidgets, {ns_, "w"});
  ASSERT_TRUE(pending) << pending.error().toString();
  EXPECT_FALSE(pending->deleted);
  EXPECT_TRUE(pending->object["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(pending->object["metadata"]["generation"], 2);

  auto again = client_->remove(kWidgets, {ns_, "w"});
  ASSERT_TRUE(again) << again.error().toString();
  EXPECT_FALSE(again->deleted);

  auto current = client_->get(kWidgets, {ns_, "w"});
  ASSERT_TRUE(current);
  json add = *current;
  add["metadata"]["finalizers"].push_back("conformance.rtable.io/late");
  auto refused = client_->update(kWidgets, add);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, KubeErrorKind::kInvalid) << refused.error().toString();

  auto released = client_->patch(kWidgets, {ns_, "w"}, PatchType::kMerge,
                                 json{{"metadata", {{"finalizers", nullptr}}}});
  ASSERT_TRUE(released) << released.error().toString();
  EXPECT_EQ(client_->get(kWidgets, {ns_, "w"}).error().kind, KubeErrorKind::kNotFound);
}

TEST_P(KubeClientConformanceTest, ListPagesAndSelectors) {
  for (const auto& [name, tier] : std::vector<std::pair<std::string, std::string>>{
           {"a", "core"}, {"b", "edge"}, {"c", "core"}, {"d", ""}, {"e", "edge"}}) {
    json labels = {{"app", "rtable"}};
    if (!tier.empty()) labels["tier"] = tier;
    createOk(kConfigMaps, configMap(name, labels));
  }
  ListOptions paged;
  paged.limit = 2;
  auto page1 = client_->list(kConfigMaps, ns_, paged);
  ASSERT_TRUE(page1) << page1.error().toString();
  ASSERT_EQ(page1->items.size(), 2u);
  ASSERT_FALSE(page1->continue_token.empty());
  EXPECT_EQ(page1->remaining_item_count, 3);
  // Written between pages: not part of the snapshot.
  createOk(kConfigMaps, configMap("f"));
  paged.continue_token = page1->continue_token;
  auto page2 = client_->list(kConfigMaps, ns_, paged);
  ASSERT_TRUE(page2) << page2.error().toString();
  EXPECT_EQ(page2->resource_version, page1->resource_version);
  paged.continue_token = page2->continue_token;
  auto page3 = client_->list(kConfigMaps, ns_, paged);
  ASSERT_TRUE(page3) << page3.error().toString();
  EXPECT_TRUE(page3->continue_token.empty());
  std::vector<std::string> names;
  for (const auto* page : {&*page1, &*page2, &*page3}) {
    for (const auto& item : page->items) names.push_back(item["metadata"]["name"]);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d", "e"}));

  ListOptions all;
  all.limit = 4;
  auto everything = client_->listAll(kConfigMaps, ns_, all);
  ASSERT_TRUE(everything);
  EXPECT_GE(everything->items.size(), 6u);  // the real namespace also has kube-root-ca.crt

  auto select = [&](const std::string& selector) {
    ListOptions o;
    o.label_selector = selector;
    auto l = client_->list(kConfigMaps, ns_, o);
    EXPECT_TRUE(l) << selector;
    std::vector<std::string> out;
    if (l) {
      for (const auto& item : l->items) out.push_back(item["metadata"]["name"]);
    }
    return out;
  };
  EXPECT_EQ(select("tier=core"), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(select("app=rtable,tier!=core"), (std::vector<std::string>{"b", "d", "e"}));
  EXPECT_EQ(select("tier in (edge),app"), (std::vector<std::string>{"b", "e"}));
  EXPECT_EQ(select("app,!tier"), (std::vector<std::string>{"d"}));
  ListOptions bad;
  bad.label_selector = "tier in (";
  EXPECT_EQ(client_->list(kConfigMaps, ns_, bad).error().kind, KubeErrorKind::kBadRequest);
}

TEST_P(KubeClientConformanceTest, WatchFromAResourceVersion) {
  const json a = createOk(kConfigMaps, configMap("a"));
  createOk(kConfigMaps, configMap("b"));
  json edit = a;
  edit["data"]["k"] = "w";
  ASSERT_TRUE(client_->update(kConfigMaps, edit));
  ASSERT_TRUE(client_->remove(kConfigMaps, {ns_, "b"}));

  Recorder r;
  WatchOptions o;
  o.resource_version = rv(a);
  auto watch = client_->watch(kConfigMaps, ns_, o, r.onEvent(), r.onEnd());
  ASSERT_TRUE(watch) << watch.error().toString();
  EXPECT_EQ(describe(r.waitFor(3)),
            (std::vector<std::string>{"ADDED b", "MODIFIED a", "DELETED b"}));
  createOk(kConfigMaps, configMap("c"));
  EXPECT_EQ(describe(r.waitFor(4)).back(), "ADDED c");
  (*watch)->stop();
  EXPECT_EQ(r.waitEnd()->reason, WatchEndReason::kStopped);
}

TEST_P(KubeClientConformanceTest, WatchWithoutVersionStartsWithTheCurrentState) {
  createOk(kConfigMaps, configMap("a", {{"w", "1"}}));
  createOk(kConfigMaps, configMap("b", {{"w", "1"}}));
  Recorder r;
  WatchOptions o;
  o.label_selector = "w=1";  // leaves out the real namespace's kube-root-ca.crt
  auto watch = client_->watch(kConfigMaps, ns_, o, r.onEvent(), r.onEnd());
  ASSERT_TRUE(watch) << watch.error().toString();
  auto initial = describe(r.waitFor(2));
  EXPECT_EQ(std::set<std::string>(initial.begin(), initial.end()),
            (std::set<std::string>{"ADDED a", "ADDED b"}));
  createOk(kConfigMaps, configMap("c", {{"w", "1"}}));
  // The new object follows the initial state. (Under ASan the real apiserver was once seen to
  // send the initial ADDED of b a second time when the watch started while its cache caught up;
  // "start at most recent" is a snapshot plus what follows, which is what is checked here.)
  auto all = describe(r.waitUntil([](const WatchEvent& e) {
    return e.type == WatchEventType::kAdded && e.object["metadata"]["name"] == "c";
  }));
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back(), "ADDED c");
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()),
            (std::set<std::string>{"ADDED a", "ADDED b", "ADDED c"}));
}

TEST_P(KubeClientConformanceTest, WatchSelectorTransitions) {
  Recorder r;
  WatchOptions o;
  o.label_selector = "app=rtable";
  o.resource_version = rv(createOk(kConfigMaps, configMap("marker")));
  auto watch = client_->watch(kConfigMaps, ns_, o, r.onEvent(), r.onEnd());
  ASSERT_TRUE(watch);
  createOk(kConfigMaps, configMap("t", {{"app", "other"}}));
  ASSERT_TRUE(client_->patch(kConfigMaps, {ns_, "t"}, PatchType::kMerge,
                             json{{"metadata", {{"labels", {{"app", "rtable"}}}}}}));
  ASSERT_TRUE(
      client_->patch(kConfigMaps, {ns_, "t"}, PatchType::kMerge, json{{"data", {{"k", "2"}}}}));
  ASSERT_TRUE(client_->patch(kConfigMaps, {ns_, "t"}, PatchType::kMerge,
                             json{{"metadata", {{"labels", {{"app", "gone"}}}}}}));
  EXPECT_EQ(describe(r.waitFor(3)),
            (std::vector<std::string>{"ADDED t", "MODIFIED t", "DELETED t"}));
}

TEST_P(KubeClientConformanceTest, WatchFromCompactedHistoryIsGone) {
  const ResourceType leases = resources::leases();
  auto lease = [&](const std::string& name) {
    return json{{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", {{"name", name}, {"namespace", ns_}}},
                {"spec", {{"holderIdentity", "x"}}}};
  };
  const json a = createOk(leases, lease("a"));
  createOk(leases, lease("b"));
  // etcd keeps the revision it compacts at: compact past the first event after `a`.
  createOk(leases, lease("c"));
  if (real()) {
    auto compacted = plane_->compactEtcd();
    ASSERT_TRUE(compacted) << compacted.error();
  } else {
    fake_->compactForTest();
  }
  Recorder r;
  WatchOptions o;
  o.resource_version = rv(a);
  auto watch = client_->watch(leases, ns_, o, r.onEvent(), r.onEnd());
  ASSERT_TRUE(watch) << watch.error().toString();
  auto events = r.waitFor(1);
  ASSERT_EQ(events.size(), 1u) << (events.empty() ? "none" : events[0].object.dump());
  EXPECT_EQ(events[0].type, WatchEventType::kError) << events[0].object.dump();
  EXPECT_EQ(events[0].error.kind, KubeErrorKind::kGone) << events[0].error.toString();
  EXPECT_EQ(events[0].error.http_code, 410);
  auto end = r.waitEnd();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->reason, WatchEndReason::kServerClosed);
}

// Delegates to another client; before the first page with a continue token it runs `between`
// (a write and a compaction), as happens when a slow reader pages through a big list.
class ActBetweenPages final : public KubeClient {
 public:
  ActBetweenPages(KubeClient& inner, std::function<void()> between)
      : inner_(inner), between_(std::move(between)) {}
  int acted = 0;

  KubeResult<ObjectList> list(const ResourceType& t, std::string_view ns,
                              const ListOptions& o) override {
    if (!o.continue_token.empty() && acted++ == 0) between_();
    return inner_.list(t, ns, o);
  }
  KubeResult<json> get(const ResourceType& t, const ObjectKey& k) override {
    return inner_.get(t, k);
  }
  KubeResult<json> create(const ResourceType& t, const json& o, const WriteOptions& w) override {
    return inner_.create(t, o, w);
  }
  KubeResult<json> update(const ResourceType& t, const json& o, const WriteOptions& w) override {
    return inner_.update(t, o, w);
  }
  KubeResult<json> updateStatus(const ResourceType& t, const json& o,
                                const WriteOptions& w) override {
    return inner_.updateStatus(t, o, w);
  }
  KubeResult<json> patch(const ResourceType& t, const ObjectKey& k, PatchType p, const json& j,
                         const PatchOptions& o) override {
    return inner_.patch(t, k, p, j, o);
  }
  KubeResult<DeleteResult> remove(const ResourceType& t, const ObjectKey& k,
                                  const DeleteOptions& o) override {
    return inner_.remove(t, k, o);
  }
  KubeResult<std::unique_ptr<Watch>> watch(const ResourceType& t, std::string_view ns,
                                           const WatchOptions& o, WatchEventHandler e,
                                           WatchEndHandler end) override {
    return inner_.watch(t, ns, o, std::move(e), std::move(end));
  }

 private:
  KubeClient& inner_;
  std::function<void()> between_;
};

TEST_P(KubeClientConformanceTest, CompactedContinueTokenIsGoneAndListAllStartsOver) {
  const ResourceType leases = resources::leases();  // uncached: lists read etcd
  auto lease = [&](const std::string& name) {
    return json{{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", {{"name", name}, {"namespace", ns_}}},
                {"spec", {{"holderIdentity", "x"}}}};
  };
  for (const char* name : {"a", "b", "c"}) createOk(leases, lease(name));
  auto compact = [&] {
    if (real()) {
      auto compacted = plane_->compactEtcd();
      EXPECT_TRUE(compacted) << compacted.error();
    } else {
      fake_->compactForTest();
    }
  };
  ListOptions paged;
  paged.limit = 1;
  auto page1 = client_->list(leases, ns_, paged);
  ASSERT_TRUE(page1) << page1.error().toString();
  createOk(leases, lease("d"));
  compact();
  paged.continue_token = page1->continue_token;
  auto expired = client_->list(leases, ns_, paged);
  ASSERT_FALSE(expired);
  EXPECT_EQ(expired.error().kind, KubeErrorKind::kGone) << expired.error().toString();
  EXPECT_EQ(expired.error().http_code, 410);

  ActBetweenPages slow(*client_, [&] {
    createOk(leases, lease("e"));
    compact();
  });
  ListOptions two;
  two.limit = 2;
  auto all = slow.listAll(leases, ns_, two);
  ASSERT_TRUE(all) << all.error().toString();
  // Continue requests: one Gone, then two for the fresh list (5 objects in pages of 2).
  EXPECT_EQ(slow.acted, 3);
  std::vector<std::string> names;
  for (const auto& item : all->items) names.push_back(item["metadata"]["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
}

// The apiserver's watch cache serves watches from its own window of history: an etcd
// compaction alone does not expire a resourceVersion the cache still holds (here a cached
// resource). The fake, without compaction, does the same.
TEST_P(KubeClientConformanceTest, WatchCacheOutlivesEtcdCompaction) {
  const json a = createOk(kConfigMaps, configMap("a"));
  createOk(kConfigMaps, configMap("b"));
  createOk(kConfigMaps, configMap("c"));
  if (real()) {
    ASSERT_TRUE(plane_->compactEtcd());
  }
  Recorder r;
  WatchOptions o;
  o.resource_version = rv(a);
  auto watch = client_->watch(kConfigMaps, ns_, o, r.onEvent(), r.onEnd());
  ASSERT_TRUE(watch) << watch.error().toString();
  EXPECT_EQ(describe(r.waitFor(2)), (std::vector<std::string>{"ADDED b", "ADDED c"}));
}

TEST_P(KubeClientConformanceTest, WatchEndsAtItsTimeout) {
  Recorder r;
  WatchOptions o;
  o.resource_version = rv(createOk(kConfigMaps, configMap("a")));
  o.timeout_seconds = 2;
  const auto start = std::chrono::steady_clock::now();
  auto watch = client_->watch(kConfigMaps, ns_, o, r.onEvent(), r.onEnd());
  ASSERT_TRUE(watch) << watch.error().toString();
  auto end = r.waitEnd(60s);
  ASSERT_TRUE(end);
  EXPECT_EQ(end->reason, WatchEndReason::kServerClosed);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1s);
}

INSTANTIATE_TEST_SUITE_P(Backends, KubeClientConformanceTest,
                         ::testing::Values("fake", "apiserver"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace rtable::op
