// CachedKubeClient on FakeKubeClient (which counts the requests it is sent): reads come from a
// synced informer's store and go to the server otherwise; an apply of the same configuration to
// an object nobody changed since is answered from the cache, and any change (a hand edit, a new
// configuration, a cache that has not seen the last answer) sends it.
#include "rtable/operator/cached_kube_client.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>

#include "rtable/operator/testing/fake_kube_client.h"
#include "runtime_test_support.h"

namespace rtable::op {
namespace {

using nlohmann::json;
using testing::eventually;
using testing::FakeKubeClient;
using testing::Verb;

const ResourceType kCachedKind = resources::configMaps();
constexpr const char* kManaged = "app.kubernetes.io/managed-by";

json ownedConfigMap(const std::string& name, const std::string& value, bool managed = true) {
  json labels = json::object();
  if (managed) labels[kManaged] = "rtable-operator";
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"labels", labels}}},
          {"data", {{"k", value}}}};
}

class CachedKubeClientTest : public ::testing::Test {
 protected:
  CachedKubeClientTest() : cached_(server_, &registry_) {
    InformerOptions options;
    options.type = kCachedKind;
    options.label_selector = std::string(kManaged) + "=rtable-operator";
    options.transform = stripManagedFields;
    informer_ = std::make_unique<Informer>(server_, options);
    cached_.serveFrom(*informer_);
  }

  void startInformer() {
    informer_->start();
    ASSERT_TRUE(informer_->waitForSync(std::chrono::seconds(10)));
  }
  // Requests of `verb` the server has been sent.
  std::size_t sent(Verb verb) const {
    const auto actions = server_.actionsForTest();
    return static_cast<std::size_t>(std::count_if(
        actions.begin(), actions.end(), [verb](const auto& a) { return a.verb == verb; }));
  }
  // Waits until the informer's cache holds `object`'s resourceVersion.
  bool cacheHolds(const json& object) {
    return eventually([&] {
      ObjectPtr cached = informer_->store().get(objectKeyOf(object));
      return cached && resourceVersionOf(*cached) == resourceVersionOf(object);
    });
  }
  KubeResult<json> apply(const std::string& name, const std::string& value) {
    PatchOptions options;
    options.field_manager = "rtable-operator";
    options.force = true;
    return cached_.patch(kCachedKind, {"default", name}, PatchType::kApply,
                         ownedConfigMap(name, value), options);
  }
  std::string metrics() { return prometheus::TextSerializer().Serialize(registry_.Collect()); }

  FakeKubeClient server_;
  prometheus::Registry registry_;
  CachedKubeClient cached_;
  std::unique_ptr<Informer> informer_;
};

TEST_F(CachedKubeClientTest, ReadsComeFromTheSyncedCacheAndFromTheServerForWhatItLacks) {
  ASSERT_TRUE(server_.create(kCachedKind, ownedConfigMap("ours", "1")));
  ASSERT_TRUE(server_.create(kCachedKind, ownedConfigMap("users", "2", /*managed=*/false)));

  // Not synced yet: the server answers.
  auto before = cached_.get(kCachedKind, {"default", "ours"});
  ASSERT_TRUE(before);
  EXPECT_EQ(sent(Verb::kGet), 1u);

  startInformer();
  const std::size_t gets = sent(Verb::kGet);
  auto ours = cached_.get(kCachedKind, {"default", "ours"});
  ASSERT_TRUE(ours);
  EXPECT_EQ((*ours)["data"]["k"], "1");
  EXPECT_EQ(sent(Verb::kGet), gets) << "a cached object was read from the server";

  // Not selected by the informer (no managed-by label): from the server.
  auto users = cached_.get(kCachedKind, {"default", "users"});
  ASSERT_TRUE(users);
  EXPECT_EQ((*users)["data"]["k"], "2");
  // Absent: the server says so (the cache may merely not have seen it yet).
  auto missing = cached_.get(kCachedKind, {"default", "missing"});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().kind, KubeErrorKind::kNotFound);
  EXPECT_EQ(sent(Verb::kGet), gets + 2);

  // A type without an informer: always the server.
  ASSERT_FALSE(cached_.get(resources::secrets(), {"default", "ours"}));
  EXPECT_EQ(sent(Verb::kGet), gets + 3);

  const auto counts = cached_.counts();
  EXPECT_EQ(counts.cache_reads, 1);
  EXPECT_EQ(counts.server_reads, 4);
  EXPECT_NE(metrics().find(
                R"(rtable_operator_cache_reads_total{resource="configmaps",source="cache"} 1)"),
            std::string::npos)
      << metrics();
}

TEST_F(CachedKubeClientTest, AnApplyIsSentOnlyWhenItCouldChangeSomething) {
  startInformer();
  auto first = apply("x", "a");
  ASSERT_TRUE(first) << first.error().toString();
  EXPECT_EQ(sent(Verb::kPatch), 1u);
  ASSERT_TRUE(cacheHolds(*first));

  // The same configuration, the object as that apply left it: not sent, the cached object back.
  auto again = apply("x", "a");
  ASSERT_TRUE(again);
  EXPECT_EQ(sent(Verb::kPatch), 1u);
  EXPECT_EQ((*again)["data"]["k"], "a");
  EXPECT_EQ(resourceVersionOf(*again), resourceVersionOf(*first));

  // A hand edit moves the resourceVersion: the apply is sent and reverts it.
  auto edited = server_.patch(kCachedKind, {"default", "x"}, PatchType::kMerge,
                              json{{"data", {{"k", "by hand"}}}});
  ASSERT_TRUE(edited);
  ASSERT_TRUE(cacheHolds(*edited));
  auto reverted = apply("x", "a");
  ASSERT_TRUE(reverted);
  EXPECT_EQ(sent(Verb::kPatch), 3u);  // the edit and the apply
  EXPECT_EQ((*server_.get(kCachedKind, {"default", "x"}))["data"]["k"], "a");
  ASSERT_TRUE(cacheHolds(*reverted));

  // Another configuration: sent.
  ASSERT_TRUE(apply("x", "b"));
  EXPECT_EQ(sent(Verb::kPatch), 4u);
  EXPECT_EQ((*server_.get(kCachedKind, {"default", "x"}))["data"]["k"], "b");

  // Deleted through the client: forgotten, the next apply is sent (and creates it again).
  ASSERT_TRUE(cached_.remove(kCachedKind, {"default", "x"}));
  ASSERT_TRUE(apply("x", "b"));
  EXPECT_EQ(sent(Verb::kPatch), 5u);
  ASSERT_TRUE(server_.get(kCachedKind, {"default", "x"}));

  const auto counts = cached_.counts();
  EXPECT_EQ(counts.applies_sent, 4);
  EXPECT_EQ(counts.applies_unchanged, 1);
  EXPECT_NE(metrics().find(
                R"(rtable_operator_applies_total{resource="configmaps",result="unchanged"} 1)"),
            std::string::npos)
      << metrics();
}

TEST_F(CachedKubeClientTest, AnApplyIsSentWhileTheCacheHasNotSeenTheLastAnswer) {
  startInformer();
  // The cache stops where it is: it never sees what the applies make.
  informer_->stop();
  ASSERT_TRUE(apply("x", "a"));
  ASSERT_TRUE(apply("x", "a"));
  EXPECT_EQ(sent(Verb::kPatch), 2u);
  EXPECT_EQ(cached_.counts().applies_unchanged, 0);
}

TEST_F(CachedKubeClientTest, TheCacheHoldsObjectsWithoutTheirManagedFields) {
  json object = ownedConfigMap("ours", "1");
  object["metadata"]["managedFields"] = json::array({{{"manager", "kubectl"},
                                                      {"operation", "Apply"},
                                                      {"fieldsV1", {{"f:data", json::object()}}}}});
  ASSERT_TRUE(server_.create(kCachedKind, object));
  ASSERT_TRUE(server_.get(kCachedKind, {"default", "ours"})
                  ->contains(json::json_pointer("/metadata/managedFields")));
  startInformer();
  ObjectPtr cached = informer_->store().get({"default", "ours"});
  ASSERT_TRUE(cached);
  EXPECT_FALSE(cached->contains(json::json_pointer("/metadata/managedFields"))) << cached->dump();
  EXPECT_EQ((*cached)["data"]["k"], "1");
}

}  // namespace
}  // namespace rtable::op
