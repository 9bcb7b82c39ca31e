// The runtime against a real kube-apiserver (LocalControlPlane), where the fake could be wrong:
// an informer resumes across an apiserver restart without missing or repeating an object version;
// a 410 from a compacted etcd relists into a cache equal to a fresh list; 1000 objects are listed
// in pages; RBAC's Forbidden reaches the caller; two LeaderElectors hand a real Lease over; a GET
// on a keep-alive connection the restart killed is sent again on a fresh one.
//
// ConfigMaps bypass the apiserver's watch cache here (--watch-cache-sizes=configmaps#0): their
// watches and lists read etcd, so an etcd compaction really expires an old resourceVersion (the
// cache would keep serving its own window of history).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "../unit/runtime_test_support.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/informer.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/leader_election.h"
#include "rtable/operator/testing/local_control_plane.h"

namespace rtable::op {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using testing::eventually;
using testing::InterceptingKubeClient;

const ResourceType kConfigMaps = resources::configMaps();

KubeResult<std::unique_ptr<HttpKubeClient>> clientFor(const std::filesystem::path& kubeconfig) {
  auto config = KubeConfig::load(kubeconfig);
  if (!config) return std::unexpected(KubeError::decode(config.error().toString()));
  auto cluster = config->clusterConfig();
  if (!cluster) return std::unexpected(KubeError::decode(cluster.error().toString()));
  return HttpKubeClient::create(*cluster);
}

json configMap(const std::string& ns, const std::string& name, json labels = json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", std::move(labels)}}},
          {"data", {{"k", "v"}}}};
}

std::string rv(const json& o) {
  return o["metadata"]["resourceVersion"].get<std::string>();
}

// What the handlers were told: "add name@rv", "update name@rv", "delete name".
class HandlerLog {
 public:
  ResourceEventHandlers handlers() {
    return {
        [this](const json& o) { push("add " + name(o) + "@" + rv(o)); },
        [this](const json&, const json& o) { push("update " + name(o) + "@" + rv(o)); },
        [this](const json& o) { push("delete " + name(o)); },
    };
  }
  std::vector<std::string> entries() const {
    std::lock_guard lock(mu_);
    return entries_;
  }
  std::size_t size() const { return entries().size(); }
  bool waitSize(std::size_t n, std::chrono::milliseconds timeout = 60s) const {
    return eventually([&] { return size() >= n; }, timeout);
  }
  bool waitFor(const std::string& entry, std::chrono::milliseconds timeout = 60s) const {
    return eventually(
        [&] {
          auto all = entries();
          return std::find(all.begin(), all.end(), entry) != all.end();
        },
        timeout);
  }

 private:
  static std::string name(const json& o) { return o["metadata"]["name"].get<std::string>(); }
  void push(std::string entry) {
    std::lock_guard lock(mu_);
    entries_.push_back(std::move(entry));
  }
  mutable std::mutex mu_;
  std::vector<std::string> entries_;
};

class ErrorLog {
 public:
  std::function<void(const KubeError&)> callback() {
    return [this](const KubeError& e) {
      std::lock_guard lock(mu_);
      errors_.push_back(e);
    };
  }
  std::vector<KubeError> errors() const {
    std::lock_guard lock(mu_);
    return errors_;
  }
  bool has(KubeErrorKind kind) const {
    for (const auto& e : errors()) {
      if (e.kind == kind) return true;
    }
    return false;
  }

 private:
  mutable std::mutex mu_;
  std::vector<KubeError> errors_;
};

class RuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::LocalControlPlaneOptions options;
    options.extra_apiserver_flags.push_back("--watch-cache-sizes=configmaps#0");
    auto plane = testing::LocalControlPlane::start(options);
    if (!plane) {
      start_error_ = plane.error();
      return;
    }
    plane_ = std::make_unique<testing::LocalControlPlane>(std::move(*plane));
    auto client = clientFor(plane_->kubeconfigPath());
    if (!client) {
      start_error_ = client.error().toString();
      return;
    }
    admin_ = std::move(*client);
  }

  static void TearDownTestSuite() {
    if (plane_ && ::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      plane_->keepWorkDir();
      fmt::print(stderr, "control plane logs kept in {}\n", plane_->workDir().string());
    }
    admin_.reset();
    plane_.reset();
  }

  void SetUp() override {
    ASSERT_TRUE(admin_) << "no control plane: " << start_error_;
    ASSERT_TRUE(plane_->apiServerRunning());
  }

  static void createNamespace(const std::string& ns) {
    auto created = admin_->create(resources::namespaces(), json{{"metadata", {{"name", ns}}}});
    ASSERT_TRUE(created || created.error().kind == KubeErrorKind::kAlreadyExists)
        << created.error().toString();
  }
  static json createOk(const json& object) {
    auto created = admin_->create(kConfigMaps, object);
    EXPECT_TRUE(created) << created.error().toString();
    return created ? *created : json();
  }
  static json updateOk(const std::string& ns, const std::string& name, const std::string& value) {
    auto got = admin_->get(kConfigMaps, {ns, name});
    EXPECT_TRUE(got) << got.error().toString();
    if (!got) return json();
    json o = *got;
    o["data"]["k"] = value;
    auto updated = admin_->update(kConfigMaps, o);
    EXPECT_TRUE(updated) << updated.error().toString();
    return updated ? *updated : json();
  }
  static void removeOk(const std::string& ns, const std::string& name) {
    auto removed = admin_->remove(kConfigMaps, {ns, name});
    EXPECT_TRUE(removed) << removed.error().toString();
  }

  static InformerOptions informerOptions(const std::string& ns, ErrorLog* errors = nullptr) {
    InformerOptions o;
    o.type = kConfigMaps;
    o.ns = ns;
    o.backoff_max = 1s;  // reconnect quickly after the restart
    if (errors != nullptr) o.on_error = errors->callback();
    return o;
  }

  // The cache holds exactly what a fresh list returns, version for version.
  static void expectCacheEqualsList(const Informer& informer, const std::string& ns) {
    auto listed = admin_->listAll(kConfigMaps, ns);
    ASSERT_TRUE(listed) << listed.error().toString();
    std::map<std::string, std::string> want, have;
    for (const auto& item : listed->items) want[item["metadata"]["name"]] = rv(item);
    for (const auto& o : informer.store().list()) have[(*o)["metadata"]["name"]] = rv(*o);
    EXPECT_EQ(have, want);
  }

  static inline std::unique_ptr<testing::LocalControlPlane> plane_;
  static inline std::unique_ptr<HttpKubeClient> admin_;
  static inline std::string start_error_;
};

TEST_F(RuntimeTest, InformerSeesEveryVersionOnceAcrossAnApiServerRestart) {
  const std::string ns = "restart";
  createNamespace(ns);
  // The informer has a client of its own that lives through the restart.
  auto watcher = clientFor(plane_->kubeconfigPath());
  ASSERT_TRUE(watcher) << watcher.error().toString();
  ErrorLog errors;
  Informer informer(**watcher, informerOptions(ns, &errors));
  HandlerLog log;
  informer.addHandlers(log.handlers());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(60s));

  std::vector<std::string> want;
  want.push_back("add a@" + rv(createOk(configMap(ns, "a"))));
  want.push_back("add b@" + rv(createOk(configMap(ns, "b"))));
  want.push_back("update a@" + rv(updateOk(ns, "a", "2")));
  ASSERT_TRUE(log.waitSize(want.size()));

  ASSERT_TRUE(plane_->stopApiServer());
  ASSERT_TRUE(plane_->startApiServer());
  // The writer starts afresh: its pooled keep-alive connections died with the server, and a
  // write on one fails with an unknown outcome (KubeClient never retries writes).
  auto writer = clientFor(plane_->kubeconfigPath());
  ASSERT_TRUE(writer) << writer.error().toString();
  admin_ = std::move(*writer);
  // Once a write made after the restart is seen, the informer is connected again: the writes that
  // follow arrive in order on its watch.
  want.push_back("add probe@" + rv(createOk(configMap(ns, "probe"))));
  ASSERT_TRUE(log.waitFor(want.back())) << fmt::format("{}", fmt::join(log.entries(), ", "));
  want.push_back("update b@" + rv(updateOk(ns, "b", "2")));
  want.push_back("add c@" + rv(createOk(configMap(ns, "c"))));
  removeOk(ns, "a");
  want.push_back("delete a");
  ASSERT_TRUE(log.waitSize(want.size()));
  std::this_thread::sleep_for(500ms);  // a repeated event would arrive about now
  EXPECT_EQ(log.entries(), want);
  expectCacheEqualsList(informer, ns);
  fmt::print("restart: {} lists, {} watches, errors:", informer.listCount(), informer.watchCount());
  for (const auto& e : errors.errors()) fmt::print(" [{}]", e.toString());
  fmt::print("\n");
}

TEST_F(RuntimeTest, AfterAnApiServerRestartTheNextGetSucceedsAtOnce) {
  const std::string ns = "stale";
  createNamespace(ns);
  // Clients with pooled keep-alive connections, as a running operator has.
  auto reader = clientFor(plane_->kubeconfigPath());
  ASSERT_TRUE(reader) << reader.error().toString();
  auto writer = clientFor(plane_->kubeconfigPath());
  ASSERT_TRUE(writer) << writer.error().toString();
  ASSERT_TRUE((*reader)->get(resources::namespaces(), {"", ns}));
  ASSERT_TRUE((*writer)->get(resources::namespaces(), {"", ns}));

  ASSERT_TRUE(plane_->stopApiServer());
  ASSERT_TRUE(plane_->startApiServer());
  auto fresh = clientFor(plane_->kubeconfigPath());
  ASSERT_TRUE(fresh);
  admin_ = std::move(*fresh);

  // A GET on the dead pooled connection is sent again on a fresh one: the caller sees success.
  // (Here cpprestsdk resends it itself, having found the pooled connection closed while waiting
  // for the status line; HttpKubeClient's retry covers the other failures, see its unit tests.)
  auto got = (*reader)->get(resources::namespaces(), {"", ns});
  EXPECT_TRUE(got) << got.error().toString();
  // A write goes out once: it succeeds (the dead connection failed while the body was written,
  // and it was resent: what happens on loopback) or reports the unknown outcome; it is never
  // applied twice (a second create would answer AlreadyExists).
  auto created = (*writer)->create(kConfigMaps, configMap(ns, "after-restart"));
  if (!created) {
    EXPECT_EQ(created.error().kind, KubeErrorKind::kConnection) << created.error().toString();
    EXPECT_TRUE(created.error().outcomeUnknown());
  }
  // Either way the writer's next request goes out on a fresh connection.
  auto again = (*writer)->get(kConfigMaps, {ns, "after-restart"});
  EXPECT_TRUE(again || again.error().kind == KubeErrorKind::kNotFound) << again.error().toString();
  fmt::print("after the restart: reader retried {} time(s); writer {} ({} retries)\n",
             (*reader)->retriesOnFreshConnection(),
             created ? "created" : created.error().toString(),
             (*writer)->retriesOnFreshConnection());
}

TEST_F(RuntimeTest, GoneAfterEtcdCompactionRelistsIntoAConsistentCache) {
  const std::string ns = "gone";
  createNamespace(ns);
  // The informer's next watch is held back (a slow client) while objects change and etcd is
  // compacted past the resourceVersion it would resume from.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool gate_open = true;
  std::atomic<int> held{0};
  InterceptingKubeClient client(*admin_);
  client.setHook([&](InterceptingKubeClient::Call call) -> std::optional<KubeError> {
    if (call != InterceptingKubeClient::Call::kWatch) return std::nullopt;
    std::unique_lock lock(gate_mu);
    ++held;
    gate_cv.wait_for(lock, 120s, [&] { return gate_open; });
    --held;
    return std::nullopt;
  });
  ErrorLog errors;
  InformerOptions o = informerOptions(ns, &errors);
  o.watch_timeout = [] { return 3s; };  // the server ends each watch soon
  Informer informer(client, o);
  HandlerLog log;
  informer.addHandlers(log.handlers());
  const json a = createOk(configMap(ns, "a"));
  createOk(configMap(ns, "b"));
  const json c = createOk(configMap(ns, "c"));
  informer.start();
  ASSERT_TRUE(informer.waitForSync(60s));
  ASSERT_EQ(log.size(), 3u);

  {
    std::lock_guard lock(gate_mu);
    gate_open = false;
  }
  ASSERT_TRUE(eventually([&] { return held.load() == 1; }, 60s));
  const std::string stale = informer.lastSyncResourceVersion();
  const json a2 = updateOk(ns, "a", "2");
  removeOk(ns, "b");
  const json d = createOk(configMap(ns, "d"));
  auto compacted = plane_->compactEtcd();
  ASSERT_TRUE(compacted) << compacted.error();
  EXPECT_GT(*compacted, std::stoll(stale));
  {
    std::lock_guard lock(gate_mu);
    gate_open = true;
  }
  gate_cv.notify_all();

  ASSERT_TRUE(log.waitSize(6));
  const auto entries = log.entries();
  EXPECT_EQ(std::vector<std::string>(entries.begin() + 3, entries.end()),
            (std::vector<std::string>{"update a@" + rv(a2), "delete b", "add d@" + rv(d)}));
  EXPECT_TRUE(errors.has(KubeErrorKind::kGone));
  EXPECT_EQ(informer.listCount(), 2);
  expectCacheEqualsList(informer, ns);
  EXPECT_EQ(rv(*informer.store().get({ns, "c"})), rv(c));

  // And it watches on from the new list.
  const json e = createOk(configMap(ns, "e"));
  EXPECT_TRUE(log.waitFor("add e@" + rv(e)));
  informer.stop();
}

TEST_F(RuntimeTest, InformerListsAThousandObjectsInPages) {
  const std::string ns = "many";
  createNamespace(ns);
  constexpr int kObjects = 1000;
  constexpr int kWriters = 8;
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int i = w; i < kObjects; i += kWriters) {
        auto created = admin_->create(kConfigMaps,
                                      configMap(ns, fmt::format("cm-{:04}", i), {{"bulk", "yes"}}));
        if (!created) ++failures;
      }
    });
  }
  for (auto& t : writers) t.join();
  ASSERT_EQ(failures.load(), 0);

  InterceptingKubeClient client(*admin_);
  std::mutex mu;
  std::vector<ListOptions> pages;
  client.setListObserver([&](const ListOptions& o) {
    std::lock_guard lock(mu);
    pages.push_back(o);
  });
  InformerOptions o = informerOptions(ns);
  o.label_selector = "bulk=yes";
  o.page_size = 100;
  Informer informer(client, o);
  std::atomic<int> adds{0};
  informer.addHandlers({[&](const json&) { ++adds; }, nullptr, nullptr});
  informer.start();
  ASSERT_TRUE(informer.waitForSync(120s));
  EXPECT_EQ(informer.store().size(), static_cast<std::size_t>(kObjects));
  EXPECT_EQ(adds.load(), kObjects);
  std::lock_guard lock(mu);
  ASSERT_GE(pages.size(), 10u);
  ASSERT_LE(pages.size(), 11u);
  EXPECT_TRUE(pages[0].continue_token.empty());
  for (std::size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(pages[i].limit, 100);
    if (i > 0) {
      EXPECT_FALSE(pages[i].continue_token.empty());
    }
  }
  EXPECT_EQ(informer.listCount(), 1);
  EXPECT_EQ((*informer.store().get({ns, "cm-0999"}))["kind"], "ConfigMap");
}

TEST_F(RuntimeTest, ForbiddenIsSurfacedNotSwallowed) {
  // Configmaps yes, secrets only by name: listing (and so informing on) secrets is forbidden.
  ASSERT_TRUE(plane_->apply(R"(apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: rtable-test-no-secret-list
rules:
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
)"));
  auto kubeconfig =
      plane_->serviceAccountKubeconfig("rbac", "restricted", "rtable-test-no-secret-list");
  ASSERT_TRUE(kubeconfig) << kubeconfig.error();
  auto restricted = clientFor(*kubeconfig);
  ASSERT_TRUE(restricted) << restricted.error().toString();

  ErrorLog errors;
  InformerOptions o;
  o.type = resources::secrets();
  o.ns = "rbac";
  o.on_error = errors.callback();
  Informer secrets(**restricted, o);
  secrets.start();
  ASSERT_TRUE(eventually([&] { return !errors.errors().empty(); }, 60s));
  const KubeError error = errors.errors().front();
  EXPECT_EQ(error.kind, KubeErrorKind::kForbidden) << error.toString();
  EXPECT_EQ(error.http_code, 403);
  EXPECT_NE(error.message.find("secrets"), std::string::npos) << error.message;
  ASSERT_TRUE(secrets.lastError());
  EXPECT_EQ(secrets.lastError()->kind, KubeErrorKind::kForbidden);
  EXPECT_FALSE(secrets.hasSynced());
  secrets.stop();

  // The same identity may inform on configmaps.
  Informer configmaps(**restricted, informerOptions("rbac"));
  configmaps.start();
  EXPECT_TRUE(configmaps.waitForSync(60s));
}

TEST_F(RuntimeTest, TwoLeaderElectorsHandARealLeaseOver) {
  const std::string ns = "leader";
  createNamespace(ns);
  std::atomic<int> leaders{0};
  std::atomic<int> violations{0};
  auto options = [&](const std::string& id) {
    LeaderElectionOptions o;
    o.lease = {ns, "rtable-operator"};
    o.identity = id;
    o.lease_duration = 3s;
    o.renew_deadline = 2s;
    o.retry_period = 500ms;
    o.on_started_leading = [&] {
      if (++leaders > 1) ++violations;
    };
    o.on_stopped_leading = [&] { --leaders; };
    return o;
  };
  // Separate connections, as two operator pods would have.
  auto second = clientFor(plane_->kubeconfigPath());
  ASSERT_TRUE(second);
  LeaderElector a(*admin_, options("a"));
  LeaderElector b(**second, options("b"));
  a.start();
  b.start();
  ASSERT_TRUE(eventually([&] { return a.isLeader() || b.isLeader(); }, 30s));
  std::this_thread::sleep_for(3s);  // more than a lease time: still exactly one
  ASSERT_NE(a.isLeader(), b.isLeader());
  LeaderElector& leader = a.isLeader() ? a : b;
  LeaderElector& other = a.isLeader() ? b : a;
  auto lease = admin_->get(resources::leases(), {ns, "rtable-operator"});
  ASSERT_TRUE(lease) << lease.error().toString();
  EXPECT_EQ(LeaseRecord::fromLease(*lease).holder_identity, leader.identity());
  EXPECT_EQ(LeaseRecord::fromLease(*lease).lease_duration_seconds, 3);

  // The leader stops without releasing: the other takes over once the lease has expired.
  const auto stopped = std::chrono::steady_clock::now();
  leader.stop();
  ASSERT_TRUE(eventually([&] { return other.isLeader(); }, 30s));
  const auto took = std::chrono::steady_clock::now() - stopped;
  EXPECT_GE(took, 2s);                         // not before the lease could have expired
  EXPECT_LE(took, 3s + 2 * 500ms * 2.2 + 3s);  // lease + a jittered retry or two + slack
  lease = admin_->get(resources::leases(), {ns, "rtable-operator"});
  ASSERT_TRUE(lease);
  EXPECT_EQ(LeaseRecord::fromLease(*lease).holder_identity, other.identity());
  EXPECT_EQ(LeaseRecord::fromLease(*lease).lease_transitions, 1);
  fmt::print("takeover after {} ms\n",
             std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
  other.stop();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(leaders.load(), 0);
}

}  // namespace
}  // namespace rtable::op
