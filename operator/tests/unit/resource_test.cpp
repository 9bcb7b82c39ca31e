#include "rtable/operator/resource.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace rtable::op {
namespace {

const ResourceType kTables{"rtable.io",       "v1alpha1", "replicatedtables",
                           "ReplicatedTable", true,       true};

TEST(ResourcePathTest, CoreAndNamedGroups) {
  EXPECT_EQ(collectionPath(resources::pods(), "ns"), "/api/v1/namespaces/ns/pods");
  EXPECT_EQ(collectionPath(resources::pods(), ""), "/api/v1/pods");  // all namespaces
  EXPECT_EQ(objectPath(resources::pods(), "ns", "p-0"), "/api/v1/namespaces/ns/pods/p-0");
  EXPECT_EQ(objectPath(resources::statefulSets(), "ns", "events", "status"),
            "/apis/apps/v1/namespaces/ns/statefulsets/events/status");
  EXPECT_EQ(collectionPath(kTables, "default"),
            "/apis/rtable.io/v1alpha1/namespaces/default/replicatedtables");
  // Cluster-scoped: the namespace is ignored.
  EXPECT_EQ(objectPath(resources::namespaces(), "ignored", "default"),
            "/api/v1/namespaces/default");
  EXPECT_EQ(objectPath(resources::customResourceDefinitions(), "", "replicatedtables.rtable.io"),
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/replicatedtables.rtable.io");
}

TEST(ResourcePathTest, EncodesSegments) {
  EXPECT_EQ(objectPath(resources::configMaps(), "a b", "x/y?z"),
            "/api/v1/namespaces/a%20b/configmaps/x%2Fy%3Fz");
}

TEST(ResourceTypeTest, Names) {
  EXPECT_EQ(resources::pods().apiVersion(), "v1");
  EXPECT_EQ(resources::leases().apiVersion(), "coordination.k8s.io/v1");
  EXPECT_EQ(resources::statefulSets().groupResource(), "statefulsets.apps");
  EXPECT_EQ(resources::configMaps().groupResource(), "configmaps");
  EXPECT_FALSE(resources::configMaps().status_subresource);
  EXPECT_TRUE(resources::statefulSets().status_subresource);
}

TEST(QueryTest, List) {
  ListOptions o;
  EXPECT_EQ(withQuery("/p", listQuery(o)), "/p");
  o.label_selector = "app=rtable,tier in (a,b)";
  o.field_selector = "metadata.name!=x";
  o.limit = 500;
  o.continue_token = "eyJ2Ijo+/=";
  o.resource_version = "42";
  o.resource_version_match = ResourceVersionMatch::kExact;
  o.timeout_seconds = 30;
  EXPECT_EQ(listQuery(o).encode(),
            "labelSelector=app%3Drtable%2Ctier%20in%20%28a%2Cb%29"
            "&fieldSelector=metadata.name%21%3Dx&limit=500&continue=eyJ2Ijo%2B%2F%3D"
            "&resourceVersion=42&resourceVersionMatch=Exact&timeoutSeconds=30");
  o = {};
  o.resource_version = "0";
  o.resource_version_match = ResourceVersionMatch::kNotOlderThan;
  EXPECT_EQ(listQuery(o).encode(), "resourceVersion=0&resourceVersionMatch=NotOlderThan");
}

TEST(QueryTest, Watch) {
  WatchOptions o;
  EXPECT_EQ(watchQuery(o).encode(), "watch=1&allowWatchBookmarks=true");
  o.resource_version = "1234";
  o.timeout_seconds = 347;
  o.label_selector = "!gone";
  o.allow_watch_bookmarks = false;
  EXPECT_EQ(watchQuery(o).encode(),
            "watch=1&labelSelector=%21gone&resourceVersion=1234&timeoutSeconds=347");
}

TEST(QueryTest, WritesPatchesDeletes) {
  EXPECT_EQ(writeQuery({}).encode(), "");
  EXPECT_EQ(writeQuery({.field_manager = "rtable-operator", .dry_run = true}).encode(),
            "dryRun=All&fieldManager=rtable-operator");

  PatchOptions p;
  p.field_manager = "rtable";
  p.force = true;
  EXPECT_EQ(patchQuery(PatchType::kApply, p).encode(), "fieldManager=rtable&force=true");
  // force is only legal for apply.
  EXPECT_EQ(patchQuery(PatchType::kMerge, p).encode(), "fieldManager=rtable");
  EXPECT_EQ(patchContentType(PatchType::kMerge), "application/merge-patch+json");
  EXPECT_EQ(patchContentType(PatchType::kJson), "application/json-patch+json");
  EXPECT_EQ(patchContentType(PatchType::kStrategicMerge), "application/strategic-merge-patch+json");
  EXPECT_EQ(patchContentType(PatchType::kApply), "application/apply-patch+yaml");

  DeleteOptions d;
  d.propagation_policy = PropagationPolicy::kForeground;
  d.grace_period_seconds = 0;
  EXPECT_EQ(deleteQuery(d).encode(), "gracePeriodSeconds=0&propagationPolicy=Foreground");
  d.precondition_uid = "u-1";
  d.precondition_resource_version = "77";
  d.dry_run = true;
  const auto body = nlohmann::json::parse(deleteOptionsBody(d));
  EXPECT_EQ(body["kind"], "DeleteOptions");
  EXPECT_EQ(body["preconditions"]["uid"], "u-1");
  EXPECT_EQ(body["preconditions"]["resourceVersion"], "77");
  EXPECT_EQ(body["propagationPolicy"], "Foreground");
  EXPECT_EQ(body["gracePeriodSeconds"], 0);
  EXPECT_EQ(body["dryRun"], nlohmann::json::array({"All"}));
  EXPECT_FALSE(nlohmann::json::parse(deleteOptionsBody({})).contains("preconditions"));
}

}  // namespace
}  // namespace rtable::op
