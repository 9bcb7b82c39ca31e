// The informer on FakeKubeClient and simulated time: the cache and the handlers follow adds,
// updates and deletes; a watch ended by the server resumes without a list and without repeating an
// event; a 410 relists and hands the differences to the handlers; failures back off; owner
// references map events to the owner's key.
#include "rtable/operator/informer.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <set>

#include "rtable/common/testing/fake_clock.h"
#include "rtable/operator/event_handlers.h"
#include "rtable/operator/testing/fake_kube_client.h"
#include "runtime_test_support.h"

namespace rtable::op {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using common::testing::FakeClock;
using testing::eventually;
using testing::FakeKubeClient;
using testing::InterceptingKubeClient;

const ResourceType kConfigMaps = resources::configMaps();

json configMap(const std::string& name, json labels = json::object(),
               const std::string& ns = "default") {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", labels}}},
          {"data", {{"k", "v"}}}};
}

std::string rv(const json& o) {
  return o["metadata"]["resourceVersion"].get<std::string>();
}

// What the handlers were told, as "add ns/name@rv", "update ns/name@old->new", "delete ns/name".
class HandlerLog {
 public:
  ResourceEventHandlers handlers() {
    return {
        [this](const json& o) { push(fmt("add", o) + "@" + rv(o)); },
        [this](const json& old_o, const json& new_o) {
          push(fmt("update", new_o) + "@" + rv(old_o) + "->" + rv(new_o));
        },
        [this](const json& o) { push(fmt("delete", o)); },
    };
  }
  std::vector<std::string> entries() const {
    std::lock_guard lock(mu_);
    return entries_;
  }
  std::size_t size() const { return entries().size(); }
  bool waitSize(std::size_t n) const {
    return eventually([&] { return size() >= n; });
  }
  // The entries from index `from` on.
  std::vector<std::string> since(std::size_t from) const {
    auto all = entries();
    return {all.begin() + static_cast<std::ptrdiff_t>(std::min(from, all.size())), all.end()};
  }

 private:
  static std::string fmt(const char* what, const json& o) {
    return std::string(what) + " " + objectKeyOf(o).toString();
  }
  void push(std::string entry) {
    std::lock_guard lock(mu_);
    entries_.push_back(std::move(entry));
  }
  mutable std::mutex mu_;
  std::vector<std::string> entries_;
};

// Holds watch requests while closed (30 s at most, so that a failing test still ends).
class WatchGate {
 public:
  void close() {
    std::lock_guard lock(mu_);
    open_ = false;
  }
  void open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  int held() const {
    std::lock_guard lock(mu_);
    return held_;
  }
  InterceptingKubeClient::Hook hook() {
    return [this](InterceptingKubeClient::Call call) -> std::optional<KubeError> {
      if (call != InterceptingKubeClient::Call::kWatch) return std::nullopt;
      std::unique_lock lock(mu_);
      ++held_;
      cv_.wait_for(lock, 30s, [&] { return open_; });
      --held_;
      return std::nullopt;
    };
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int held_ = 0;
};

class InformerTest : public ::testing::Test {
 protected:
  json create(const json& object) {
    auto created = fake_.create(kConfigMaps, object);
    EXPECT_TRUE(created) << created.error().toString();
    return created ? *created : json();
  }
  json update(const std::string& name, const std::string& value) {
    auto got = fake_.get(kConfigMaps, {"default", name});
    EXPECT_TRUE(got);
    json o = *got;
    o["data"]["k"] = value;
    auto updated = fake_.update(kConfigMaps, o);
    EXPECT_TRUE(updated) << updated.error().toString();
    return updated ? *updated : json();
  }
  void remove(const std::string& name) {
    auto removed = fake_.remove(kConfigMaps, {"default", name});
    EXPECT_TRUE(removed) << removed.error().toString();
  }
  InformerOptions options() {
    InformerOptions o;
    o.type = kConfigMaps;
    o.ns = "default";
    o.clock = &clock_;
    o.page_size = 2;  // several pages even for a few objects
    o.on_error = [this](const KubeError& e) {
      std::lock_guard lock(mu_);
      errors_.push_back(e);
    };
    return o;
  }
  std::vector<KubeError> errors() {
    std::lock_guard lock(mu_);
    return errors_;
  }
  int count(testing::Verb verb) const {
    int n = 0;
    for (const auto& a : fake_.actionsForTest()) n += a.verb == verb ? 1 : 0;
    return n;
  }
  // The cache equals a fresh list: same keys, same resourceVersions.
  void expectCacheEqualsList(const Informer& informer) {
    auto listed = fake_.list(kConfigMaps, "default");
    ASSERT_TRUE(listed);
    std::map<std::string, std::string> want, have;
    for (const auto& item : listed->items) want[objectKeyOf(item).toString()] = rv(item);
    for (const auto& o : informer.store().list()) have[objectKeyOf(*o).toString()] = rv(*o);
    EXPECT_EQ(have, want);
  }

  FakeClock clock_;
  FakeKubeClient fake_;
  std::mutex mu_;
  std::vector<KubeError> errors_;
};

TEST(StoreTest, IndexesFollowWritesAndReplace) {
  Store store;
  ASSERT_TRUE(store.addIndex("app", indexes::byLabel("app")));
  EXPECT_FALSE(store.addIndex("app", indexes::byLabel("x")));
  auto object = [](const std::string& name, const std::string& app, const std::string& version) {
    json o = configMap(name, {{"app", app}});
    o["metadata"]["resourceVersion"] = version;
    return std::make_shared<const json>(o);
  };
  store.upsert(object("a", "x", "1"));
  store.upsert(object("b", "x", "2"));
  store.upsert(object("c", "y", "3"));
  EXPECT_EQ(store.byIndex("app", "x").size(), 2u);
  EXPECT_EQ(store.byIndex("nope", "x").size(), 0u);
  auto old = store.upsert(object("b", "y", "4"));
  ASSERT_TRUE(old);
  EXPECT_EQ(rv(*old), "2");
  EXPECT_EQ(store.byIndex("app", "x").size(), 1u);
  EXPECT_EQ(store.byIndex("app", "y").size(), 2u);
  EXPECT_TRUE(store.erase({"default", "c"}));
  EXPECT_EQ(store.byIndex("app", "y").size(), 1u);
  EXPECT_EQ(store.list("default").size(), 2u);
  EXPECT_EQ(store.list("other").size(), 0u);

  // a unchanged (same resourceVersion), b changed, d new; gone: nothing else was there.
  const ObjectPtr a_before = store.get({"default", "a"});
  auto changes =
      store.replace({object("a", "x", "1"), object("b", "z", "5"), object("d", "x", "6")});
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].kind, StoreChange::Kind::kUpdated);
  EXPECT_EQ(rv(*changes[0].old_object), "4");
  EXPECT_EQ(changes[1].kind, StoreChange::Kind::kAdded);
  EXPECT_EQ(store.get({"default", "a"}), a_before);  // the same instance
  EXPECT_EQ(store.byIndex("app", "z").size(), 1u);
  changes = store.replace({});
  EXPECT_EQ(changes.size(), 3u);
  for (const auto& c : changes) EXPECT_EQ(c.kind, StoreChange::Kind::kDeleted);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_TRUE(store.byIndex("app", "x").empty());
}

TEST(StoreTest, OwnerIndexes) {
  Store store;
  store.addIndex(std::string(indexes::kOwnerUid), indexes::byOwnerUid());
  store.addIndex(std::string(indexes::kControllerUid), indexes::byControllerUid());
  json o = configMap("a");
  o["metadata"]["ownerReferences"] =
      json::array({{{"uid", "u1"}, {"kind", "X"}, {"name", "x"}, {"controller", true}},
                   {{"uid", "u2"}, {"kind", "Y"}, {"name", "y"}}});
  store.upsert(std::make_shared<const json>(o));
  EXPECT_EQ(store.byIndex(indexes::kOwnerUid, "u1").size(), 1u);
  EXPECT_EQ(store.byIndex(indexes::kOwnerUid, "u2").size(), 1u);
  EXPECT_EQ(store.byIndex(indexes::kControllerUid, "u1").size(), 1u);
  EXPECT_EQ(store.byIndex(indexes::kControllerUid, "u2").size(), 0u);
}

TEST_F(InformerTest, SeesAddsUpdatesAndDeletes) {
  const json a = create(configMap("a"));
  const json b = create(configMap("b"));
  create(configMap("elsewhere", {}, "kube-system"));  // another namespace: not ours
  Informer informer(fake_, options());
  HandlerLog log;
  informer.addHandlers(log.handlers());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  EXPECT_EQ(log.entries(),
            (std::vector<std::string>{"add default/a@" + rv(a), "add default/b@" + rv(b)}));
  EXPECT_EQ(informer.store().size(), 2u);
  // List items get kind and apiVersion, as watch events have them.
  EXPECT_EQ((*informer.store().get({"default", "a"}))["kind"], "ConfigMap");

  const json c = create(configMap("c"));
  const json a2 = update("a", "changed");
  remove("b");
  ASSERT_TRUE(log.waitSize(5));
  EXPECT_EQ(log.since(2), (std::vector<std::string>{"add default/c@" + rv(c),
                                                    "update default/a@" + rv(a) + "->" + rv(a2),
                                                    "delete default/b"}));
  EXPECT_EQ((*informer.store().get({"default", "a"}))["data"]["k"], "changed");
  EXPECT_EQ(informer.store().get({"default", "b"}), nullptr);
  EXPECT_TRUE(eventually([&] {
    return informer.lastSyncResourceVersion() ==
           std::to_string(fake_.currentResourceVersionForTest());
  }));
  expectCacheEqualsList(informer);
  EXPECT_EQ(informer.listCount(), 1);
  EXPECT_TRUE(errors().empty());
}

TEST_F(InformerTest, LabelSelectorTransitionsAreAddsAndDeletes) {
  InformerOptions o = options();
  o.label_selector = "app=rtable";
  Informer informer(fake_, o);
  HandlerLog log;
  informer.addHandlers(log.handlers());
  create(configMap("in", {{"app", "rtable"}}));
  create(configMap("out", {{"app", "other"}}));
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  ASSERT_EQ(log.size(), 1u);
  ASSERT_TRUE(fake_.patch(kConfigMaps, {"default", "in"}, PatchType::kMerge,
                          json{{"metadata", {{"labels", {{"app", "gone"}}}}}}));
  ASSERT_TRUE(log.waitSize(2));
  EXPECT_EQ(log.entries()[1], "delete default/in");
  EXPECT_EQ(informer.store().size(), 0u);
}

TEST_F(InformerTest, ResumesAfterTheServerEndsTheWatchWithoutRepeatingEvents) {
  Informer informer(fake_, options());
  HandlerLog log;
  informer.addHandlers(log.handlers());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  const json a = create(configMap("a"));
  ASSERT_TRUE(log.waitSize(1));
  // Writes elsewhere move the resourceVersion on; a bookmark tells the informer.
  create(configMap("x", {}, "kube-system"));
  fake_.bookmarkForTest();
  const std::string current = std::to_string(fake_.currentResourceVersionForTest());
  ASSERT_TRUE(eventually([&] { return informer.lastSyncResourceVersion() == current; }));

  ASSERT_EQ(fake_.activeWatchesForTest(), 1u);
  clock_.advance(5min);  // the watch ran for a while (not a "very short watch")
  fake_.closeWatchesForTest();
  ASSERT_TRUE(eventually([&] { return count(testing::Verb::kWatch) == 2; }));
  const json a2 = update("a", "after");
  const json b = create(configMap("b"));
  ASSERT_TRUE(log.waitSize(3));
  EXPECT_EQ(log.entries(), (std::vector<std::string>{
                               "add default/a@" + rv(a),
                               "update default/a@" + rv(a) + "->" + rv(a2),
                               "add default/b@" + rv(b),
                           }));
  EXPECT_EQ(informer.listCount(), 1);  // resumed, not relisted
  EXPECT_EQ(count(testing::Verb::kList), 1);
  EXPECT_TRUE(errors().empty());
}

TEST_F(InformerTest, GoneRelistsAndHandsTheDifferencesToTheHandlers) {
  InterceptingKubeClient client(fake_);
  WatchGate gate;
  client.setHook(gate.hook());
  const json a = create(configMap("a"));
  create(configMap("b"));
  const json c = create(configMap("c"));
  Informer informer(client, options());
  HandlerLog log;
  informer.addHandlers(log.handlers());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  ASSERT_EQ(log.size(), 3u);

  // The informer falls behind: its next watch waits while the objects change and the history
  // it would resume from is compacted away.
  ASSERT_TRUE(eventually([&] { return fake_.activeWatchesForTest() == 1; }));
  gate.close();
  clock_.advance(5min);
  fake_.closeWatchesForTest();
  ASSERT_TRUE(eventually([&] { return gate.held() == 1; }));
  const json a2 = update("a", "changed");
  remove("b");
  const json d = create(configMap("d"));
  fake_.compactForTest();
  gate.open();

  ASSERT_TRUE(log.waitSize(6));
  EXPECT_TRUE(eventually([&] { return informer.listCount() == 2; }));
  // In key order; c did not change and is not reported again.
  EXPECT_EQ(log.since(3), (std::vector<std::string>{
                              "update default/a@" + rv(a) + "->" + rv(a2),
                              "delete default/b",
                              "add default/d@" + rv(d),
                          }));
  expectCacheEqualsList(informer);
  ASSERT_TRUE(informer.lastError());
  EXPECT_EQ(informer.lastError()->kind, KubeErrorKind::kGone);
  ASSERT_EQ(errors().size(), 1u);
  EXPECT_EQ(errors()[0].http_code, 410);

  // And it watches on from the new list.
  const json e = create(configMap("e"));
  ASSERT_TRUE(log.waitSize(7));
  EXPECT_EQ(log.entries().back(), "add default/e@" + rv(e));
  EXPECT_EQ((*informer.store().get({"default", "c"}))["metadata"]["resourceVersion"], rv(c));
}

TEST_F(InformerTest, GoneAnswerToTheWatchRequestRelists) {
  Informer informer(fake_, options());
  HandlerLog log;
  informer.addHandlers(log.handlers());
  fake_.failNextForTest(testing::Verb::kWatch,
                        kubeErrorFromResponse(410, R"({"kind":"Status","code":410,
                                                        "reason":"Expired","message":"too old"})"));
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  EXPECT_TRUE(eventually([&] { return informer.listCount() == 2; }));
  EXPECT_TRUE(eventually([&] { return count(testing::Verb::kWatch) == 2; }));
  EXPECT_EQ(informer.lastError()->kind, KubeErrorKind::kGone);
}

TEST_F(InformerTest, ConnectionErrorRetriesTheWatchFromTheSameVersion) {
  Informer informer(fake_, options());
  HandlerLog log;
  informer.addHandlers(log.handlers());
  fake_.failNextForTest(testing::Verb::kWatch, KubeError::connection("refused"));
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  ASSERT_TRUE(eventually([&] { return count(testing::Verb::kWatch) == 2; }));
  const json a = create(configMap("a"));
  ASSERT_TRUE(log.waitSize(1));
  EXPECT_EQ(informer.listCount(), 1);
}

TEST_F(InformerTest, BrokenStreamRelists) {
  // A watch whose stream breaks mid-way: the informer cannot know what it missed.
  class BreakingClient final : public KubeClient {
   public:
    explicit BreakingClient(KubeClient& inner) : inner_(inner) {}
    int watches = 0;
    KubeResult<json> get(const ResourceType& t, const ObjectKey& k) override {
      return inner_.get(t, k);
    }
    KubeResult<ObjectList> list(const ResourceType& t, std::string_view ns,
                                const ListOptions& o) override {
      return inner_.list(t, ns, o);
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
                                             const WatchOptions& o, WatchEventHandler on_event,
                                             WatchEndHandler on_end) override {
      if (watches++ == 0) {
        // The first stream breaks as soon as it starts (the reader thread reports it).
        auto end = std::move(on_end);
        on_end = [end](const WatchEnd&) {
          end(WatchEnd{WatchEndReason::kError, KubeError::connection("connection reset")});
        };
        auto w = inner_.watch(t, ns, o, std::move(on_event), std::move(on_end));
        if (w) (*w)->stop();
        return w;
      }
      return inner_.watch(t, ns, o, std::move(on_event), std::move(on_end));
    }

   private:
    KubeClient& inner_;
  };
  BreakingClient client(fake_);
  Informer informer(client, options());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  EXPECT_TRUE(eventually([&] { return informer.listCount() == 2; }));
  EXPECT_EQ(informer.lastError()->kind, KubeErrorKind::kConnection);
}

TEST_F(InformerTest, FailuresBackOffExponentially) {
  Informer informer(fake_, options());
  fake_.failNextForTest(testing::Verb::kList,
                        KubeError::of(KubeErrorKind::kServerError, "etcd is slow"), 3);
  informer.start();
  // The first retry is immediate, then 800 ms, then 1.6 s.
  ASSERT_TRUE(eventually([&] { return informer.consecutiveFailures() == 2; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(informer.listCount(), 2);
  clock_.advance(799ms);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(informer.listCount(), 2);
  clock_.advance(1ms);
  ASSERT_TRUE(eventually([&] { return informer.consecutiveFailures() == 3; }));
  clock_.advance(1599ms);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(informer.listCount(), 3);
  EXPECT_FALSE(informer.hasSynced());
  clock_.advance(1ms);
  ASSERT_TRUE(informer.waitForSync(10s));
  EXPECT_EQ(informer.listCount(), 4);
  EXPECT_EQ(errors().size(), 3u);
}

TEST_F(InformerTest, BackoffIsCapped) {
  InformerOptions o = options();
  o.backoff_max = 2s;
  Informer informer(fake_, o);
  fake_.failNextForTest(testing::Verb::kList, KubeError::connection("refused"), 6);
  informer.start();
  // Delays 0, 0.8, 1.6, then 2 (capped) each time.
  for (int failures = 2; failures <= 6; ++failures) {
    ASSERT_TRUE(eventually([&] { return informer.consecutiveFailures() == failures; }));
    clock_.advance(2s);
  }
  ASSERT_TRUE(informer.waitForSync(10s));
}

TEST_F(InformerTest, ForbiddenIsSurfacedAndRetried) {
  Informer informer(fake_, options());
  KubeError forbidden = kubeErrorFromResponse(
      403, R"({"kind":"Status","code":403,"reason":"Forbidden","message":"no list"})");
  fake_.failNextForTest(testing::Verb::kList, forbidden, 2);
  informer.start();
  ASSERT_TRUE(eventually([&] { return errors().size() == 2; }));
  EXPECT_FALSE(informer.hasSynced());
  EXPECT_EQ(informer.lastError()->kind, KubeErrorKind::kForbidden);
  clock_.advance(800ms);
  ASSERT_TRUE(informer.waitForSync(10s));
}

TEST_F(InformerTest, StopEndsTheWatchAndHandlersStop) {
  Informer informer(fake_, options());
  HandlerLog log;
  informer.addHandlers(log.handlers());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  ASSERT_TRUE(eventually([&] { return fake_.activeWatchesForTest() == 1; }));
  informer.stop();
  informer.stop();  // idempotent
  EXPECT_TRUE(eventually([&] { return fake_.activeWatchesForTest() == 0; }));
  create(configMap("late"));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(log.size(), 0u);
}

TEST_F(InformerTest, WatchTimeoutIsInjectedAndJitteredByDefault) {
  InformerOptions o = options();
  o.watch_timeout = [] { return 42s; };
  Informer informer(fake_, o);
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  EXPECT_TRUE(eventually([&] { return informer.watchCount() == 1; }));
}

TEST(ObjectKeyStringTest, RoundTrips) {
  EXPECT_EQ(objectKeyFromString("ns/name"), (ObjectKey{"ns", "name"}));
  EXPECT_EQ(objectKeyFromString("name"), (ObjectKey{"", "name"}));
  EXPECT_EQ(objectKeyFromString(ObjectKey{"a", "b"}.toString()), (ObjectKey{"a", "b"}));
}

json ownedStatefulSet(const std::string& name, json owner_refs) {
  return {{"apiVersion", "apps/v1"},
          {"kind", "StatefulSet"},
          {"metadata",
           {{"name", name}, {"namespace", "default"}, {"ownerReferences", std::move(owner_refs)}}},
          {"spec", {{"replicas", 1}}}};
}

json ownerRef(const std::string& api_version, const std::string& kind, const std::string& name,
              bool controller) {
  return {{"apiVersion", api_version},
          {"kind", kind},
          {"name", name},
          {"uid", "uid-" + name},
          {"controller", controller}};
}

TEST(OwnerKeysTest, MatchGroupAndKindAndController) {
  const OwnerFilter tables{"rtable.io", "ReplicatedTable"};
  json sts = ownedStatefulSet(
      "s", json::array({ownerRef("rtable.io/v1alpha1", "ReplicatedTable", "t1", true),
                        ownerRef("rtable.io/v1alpha1", "ReplicatedTable", "t2", false),
                        ownerRef("other.io/v1", "ReplicatedTable", "t3", true)}));
  EXPECT_EQ(ownerKeysOf(sts, tables), (std::vector<ObjectKey>{{"default", "t1"}}));
  OwnerFilter any = tables;
  any.controller_only = false;
  EXPECT_EQ(ownerKeysOf(sts, any), (std::vector<ObjectKey>{{"default", "t1"}, {"default", "t2"}}));
  OwnerFilter cluster_scoped = tables;
  cluster_scoped.namespaced = false;
  EXPECT_EQ(ownerKeysOf(sts, cluster_scoped), (std::vector<ObjectKey>{{"", "t1"}}));
  EXPECT_TRUE(ownerKeysOf(configMap("plain"), tables).empty());
}

TEST_F(InformerTest, OwnerMappingEnqueuesTheOwner) {
  WorkQueue::Options qo;
  qo.name = "tables";
  qo.clock = &clock_;
  WorkQueue queue(std::move(qo));
  InformerOptions o = options();
  o.type = resources::statefulSets();
  Informer informer(fake_, o);
  informer.addHandlers(enqueueOwner(queue, OwnerFilter{"rtable.io", "ReplicatedTable"}));
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));

  const ResourceType sts = resources::statefulSets();
  ASSERT_TRUE(fake_.create(
      sts, ownedStatefulSet(
               "t1-replicas",
               json::array({ownerRef("rtable.io/v1alpha1", "ReplicatedTable", "t1", true)}))));
  ASSERT_TRUE(fake_.create(sts, ownedStatefulSet("unowned", json::array())));
  ASSERT_TRUE(eventually([&] { return informer.store().size() == 2; }));
  ASSERT_EQ(queue.len(), 1u);
  auto key = queue.getUntil(clock_.now());
  ASSERT_TRUE(key);
  EXPECT_EQ(*key, "default/t1");
  queue.done(*key);

  // An update that moves the controller reference tells both the former and the new owner.
  ASSERT_TRUE(fake_.patch(
      sts, {"default", "t1-replicas"}, PatchType::kMerge,
      json{{"metadata",
            {{"ownerReferences",
              json::array({ownerRef("rtable.io/v1alpha1", "ReplicatedTable", "t9", true)})}}}}));
  ASSERT_TRUE(eventually([&] { return queue.len() == 2; }));
  std::set<std::string> keys;
  while (auto k = queue.getUntil(clock_.now())) {
    keys.insert(*k);
    queue.done(*k);
  }
  EXPECT_EQ(keys, (std::set<std::string>{"default/t1", "default/t9"}));

  // A delete tells the owner too.
  ASSERT_TRUE(fake_.remove(sts, {"default", "t1-replicas"}));
  ASSERT_TRUE(eventually([&] { return queue.len() == 1; }));
  EXPECT_EQ(queue.getUntil(clock_.now()), "default/t9");
}

TEST_F(InformerTest, EnqueueObjectUsesTheObjectsKey) {
  WorkQueue::Options qo;
  qo.name = "cms";
  qo.clock = &clock_;
  WorkQueue queue(std::move(qo));
  Informer informer(fake_, options());
  informer.addHandlers(enqueueObject(queue));
  create(configMap("a"));
  informer.start();
  ASSERT_TRUE(informer.waitForSync(10s));
  ASSERT_EQ(queue.len(), 1u);
  EXPECT_EQ(queue.getUntil(clock_.now()), "default/a");
}

}  // namespace
}  // namespace rtable::op
