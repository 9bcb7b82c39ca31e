// KubeEventRecorder on FakeKubeClient and simulated time: the Event it posts, a repeat within
// the window patching count and lastTimestamp, the per-object spam filter, the bounded queue that
// never blocks a caller, and failures that are logged, retried only without an answer, and never
// reach the caller.
#include "rtable/operator/event_recorder.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>

#include "rtable/common/testing/fake_clock.h"
#include "rtable/operator/testing/fake_event_recorder.h"
#include "rtable/operator/testing/fake_kube_client.h"
#include "runtime_test_support.h"

namespace rtable::op {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using common::testing::FakeClock;
using testing::FakeKubeClient;
using testing::InterceptingKubeClient;
using testing::Verb;

const ResourceType kEvents = resources::events();

// A settable wall clock: 2024-05-01T12:00:00Z plus what the test adds.
class WallClock {
 public:
  std::function<std::chrono::system_clock::time_point()> function() {
    return [this] {
      std::lock_guard lock(mu_);
      return now_;
    };
  }
  void advance(std::chrono::seconds d) {
    std::lock_guard lock(mu_);
    now_ += d;
  }

 private:
  std::mutex mu_;
  std::chrono::system_clock::time_point now_ =
      std::chrono::system_clock::from_time_t(1714564800);  // 2024-05-01T12:00:00Z
};

class EventRecorderTest : public ::testing::Test {
 protected:
  EventRecorderTest() {
    auto created =
        client_.create(resources::configMaps(),
                       json{{"apiVersion", "v1"},
                            {"kind", "ConfigMap"},
                            {"metadata", {{"name", "events-config"}, {"namespace", "default"}}}});
    EXPECT_TRUE(created) << created.error().toString();
    object_ = *created;
  }

  KubeEventRecorderOptions options() {
    KubeEventRecorderOptions o;
    o.clock = &clock_;
    o.wall_clock = wall_.function();
    o.instance = "rtable-operator-0";
    return o;
  }

  std::vector<json> events(const std::string& ns = "default") {
    auto listed = client_.list(kEvents, ns);
    EXPECT_TRUE(listed) << listed.error().toString();
    return listed ? listed->items : std::vector<json>{};
  }

  std::size_t actions(Verb verb) {
    std::size_t n = 0;
    for (const auto& a : client_.actionsForTest()) n += a.verb == verb && a.resource == "events";
    return n;
  }

  FakeKubeClient client_;
  FakeClock clock_;
  WallClock wall_;
  json object_;
};

TEST_F(EventRecorderTest, PostsACoreV1EventAboutTheObject) {
  KubeEventRecorder recorder(client_, options());
  recorder.record(ObjectReference::of(object_), EventType::kNormal, "Created",
                  "created the ConfigMap");
  ASSERT_TRUE(recorder.flush(10s));
  const auto all = events();
  ASSERT_EQ(all.size(), 1u);
  const json& e = all[0];
  EXPECT_EQ(e["type"], "Normal");
  EXPECT_EQ(e["reason"], "Created");
  EXPECT_EQ(e["message"], "created the ConfigMap");
  EXPECT_EQ(e["count"], 1);
  EXPECT_EQ(e["firstTimestamp"], "2024-05-01T12:00:00Z");
  EXPECT_EQ(e["lastTimestamp"], "2024-05-01T12:00:00Z");
  EXPECT_EQ(e["source"]["component"], "rtable-operator");
  EXPECT_EQ(e["reportingComponent"], "rtable-operator");
  EXPECT_EQ(e["reportingInstance"], "rtable-operator-0");
  EXPECT_EQ(e["metadata"]["namespace"], "default");
  EXPECT_TRUE(e["metadata"]["name"].get<std::string>().starts_with("events-config."));
  const json& involved = e["involvedObject"];
  EXPECT_EQ(involved["apiVersion"], "v1");
  EXPECT_EQ(involved["kind"], "ConfigMap");
  EXPECT_EQ(involved["namespace"], "default");
  EXPECT_EQ(involved["name"], "events-config");
  EXPECT_EQ(involved["uid"], object_["metadata"]["uid"]);
  EXPECT_EQ(involved["resourceVersion"], object_["metadata"]["resourceVersion"]);
  EXPECT_EQ(recorder.stats().created, 1);
}

TEST_F(EventRecorderTest, ARepeatWithinTenMinutesPatchesCountAndLastTimestamp) {
  KubeEventRecorder recorder(client_, options());
  const auto ref = ObjectReference::of(object_);
  recorder.record(ref, EventType::kWarning, "HeadroomLow", "4.2% left");
  ASSERT_TRUE(recorder.flush(10s));
  const std::string name = events()[0]["metadata"]["name"];
  for (int i = 0; i < 3; ++i) {
    clock_.advance(9min);  // each within 10 min of the one before
    wall_.advance(9min);
    recorder.record(ref, EventType::kWarning, "HeadroomLow", "4.2% left");
  }
  ASSERT_TRUE(recorder.flush(10s));
  auto all = events();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0]["metadata"]["name"], name);
  EXPECT_EQ(all[0]["count"], 4);
  EXPECT_EQ(all[0]["firstTimestamp"], "2024-05-01T12:00:00Z");
  EXPECT_EQ(all[0]["lastTimestamp"], "2024-05-01T12:27:00Z");
  EXPECT_EQ(actions(Verb::kCreate), 1u);
  EXPECT_EQ(actions(Verb::kPatch), 3u);

  // Another message, type or reason is another Event.
  recorder.record(ref, EventType::kWarning, "HeadroomLow", "4.1% left");
  recorder.record(ref, EventType::kNormal, "HeadroomLow", "4.2% left");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(events().size(), 3u);

  // More than 10 minutes after the last occurrence: a new Event.
  clock_.advance(10min + 1s);
  wall_.advance(10min + 1s);
  recorder.record(ref, EventType::kWarning, "HeadroomLow", "4.2% left");
  ASSERT_TRUE(recorder.flush(10s));
  all = events();
  ASSERT_EQ(all.size(), 4u);
  int fresh = 0;
  for (const auto& e : all) {
    if (e["message"] == "4.2% left" && e["type"] == "Warning" && e["count"] == 1) {
      ++fresh;
      EXPECT_EQ(e["firstTimestamp"], "2024-05-01T12:37:01Z");
    }
  }
  EXPECT_EQ(fresh, 1);
  const auto stats = recorder.stats();
  EXPECT_EQ(stats.created, 4);
  EXPECT_EQ(stats.patched, 3);
}

TEST_F(EventRecorderTest, TheSpamFilterAllowsABurstOf25PerObjectThenOnePer5Minutes) {
  KubeEventRecorder recorder(client_, options());
  const auto ref = ObjectReference::of(object_);
  ObjectReference other = ref;
  other.name = "other";
  other.uid = "uid-other";
  for (int i = 0; i < 30; ++i) {
    recorder.record(ref, EventType::kNormal, "Step", fmt::format("step {}", i));
  }
  recorder.record(other, EventType::kNormal, "Step", "another object has its own bucket");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(events().size(), 26u);
  EXPECT_EQ(recorder.stats().filtered, 5);

  clock_.advance(4min);
  recorder.record(ref, EventType::kNormal, "Step", "still no token");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(recorder.stats().filtered, 6);

  clock_.advance(1min);  // 5 min since the bucket ran dry: one token
  recorder.record(ref, EventType::kNormal, "Step", "one token");
  recorder.record(ref, EventType::kNormal, "Step", "and no more");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(events().size(), 27u);
  EXPECT_EQ(recorder.stats().filtered, 7);
}

TEST_F(EventRecorderTest, ACountedButFilteredRepeatCarriesTheFullCountLater) {
  KubeEventRecorderOptions o = options();
  o.spam_burst = 2;
  KubeEventRecorder recorder(client_, o);
  const auto ref = ObjectReference::of(object_);
  for (int i = 0; i < 4; ++i) recorder.record(ref, EventType::kWarning, "Failed", "boom");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(events()[0]["count"], 2);
  clock_.advance(5min);
  recorder.record(ref, EventType::kWarning, "Failed", "boom");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(events()[0]["count"], 5);  // client-go counts every occurrence
}

TEST_F(EventRecorderTest, TheQueueIsBoundedAndRecordNeverBlocks) {
  // The poster is stuck in its first create (an apiserver that does not answer).
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool gate_open = false;
  std::atomic<int> held{0};
  InterceptingKubeClient blocking(client_);
  blocking.setHook([&](InterceptingKubeClient::Call call) -> std::optional<KubeError> {
    if (call != InterceptingKubeClient::Call::kCreate) return std::nullopt;
    std::unique_lock lock(gate_mu);
    ++held;
    gate_cv.wait_for(lock, 30s, [&] { return gate_open; });
    return std::nullopt;
  });
  KubeEventRecorderOptions o = options();
  o.queue_capacity = 3;
  KubeEventRecorder recorder(blocking, o);
  const auto ref = ObjectReference::of(object_);
  recorder.record(ref, EventType::kNormal, "E0", "taken by the poster");
  ASSERT_TRUE(testing::eventually([&] { return held.load() == 1; }));
  const auto before = std::chrono::steady_clock::now();
  for (int i = 1; i <= 5; ++i) {
    recorder.record(ref, EventType::kNormal, fmt::format("E{}", i), "queued or dropped");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - before, 1s);
  EXPECT_EQ(recorder.queuedForTest(), 3u);
  EXPECT_EQ(recorder.stats().dropped, 2);
  {
    std::lock_guard lock(gate_mu);
    gate_open = true;
  }
  gate_cv.notify_all();
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(recorder.stats().created, 4);
  std::set<std::string> reasons;
  for (const auto& e : events()) reasons.insert(e["reason"]);
  EXPECT_EQ(reasons, (std::set<std::string>{"E0", "E1", "E2", "E3"}));
}

TEST_F(EventRecorderTest, AnAnswerIsNotRetriedAndNoAnswerIs) {
  KubeEventRecorderOptions o = options();
  o.max_tries = 3;
  o.retry_delay = 0s;
  KubeEventRecorder recorder(client_, o);
  const auto ref = ObjectReference::of(object_);
  client_.failNextForTest(Verb::kCreate, kubeErrorFromResponse(403, R"({"kind":"Status","code":403,
                            "reason":"Forbidden","message":"events is forbidden"})"));
  recorder.record(ref, EventType::kNormal, "Denied", "RBAC says no");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(recorder.stats().failed, 1);
  EXPECT_EQ(actions(Verb::kCreate), 1u);

  client_.clearActionsForTest();
  client_.failNextForTest(Verb::kCreate, KubeError::connection("connection reset"), 2);
  recorder.record(ref, EventType::kNormal, "Flaky", "third time lucky");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(actions(Verb::kCreate), 3u);
  EXPECT_EQ(recorder.stats().created, 1);

  client_.clearActionsForTest();
  client_.failNextForTest(Verb::kCreate, KubeError::connection("connection refused"), 3);
  recorder.record(ref, EventType::kNormal, "Down", "gives up after max_tries");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(actions(Verb::kCreate), 3u);
  EXPECT_EQ(recorder.stats().failed, 2);
  EXPECT_EQ(events().size(), 1u);
}

TEST_F(EventRecorderTest, ALostAnswerToACreateDoesNotDuplicateTheEvent) {
  KubeEventRecorderOptions o = options();
  o.retry_delay = 0s;
  KubeEventRecorder recorder(client_, o);
  // Applied, but the answer is lost: the retry finds its own Event (AlreadyExists).
  client_.failNextForTest(Verb::kCreate, KubeError::connection("reset after the write"), 1,
                          FakeKubeClient::FaultTiming::kAfterApply);
  recorder.record(ObjectReference::of(object_), EventType::kNormal, "Once", "one Event");
  ASSERT_TRUE(recorder.flush(10s));
  EXPECT_EQ(events().size(), 1u);
  EXPECT_EQ(recorder.stats().created, 1);
  EXPECT_EQ(recorder.stats().failed, 0);
}

TEST_F(EventRecorderTest, ARepeatOfAnEventThatIsGoneCreatesItAgain) {
  KubeEventRecorder recorder(client_, options());
  const auto ref = ObjectReference::of(object_);
  recorder.record(ref, EventType::kNormal, "Synced", "in sync");
  ASSERT_TRUE(recorder.flush(10s));
  const std::string name = events()[0]["metadata"]["name"];
  ASSERT_TRUE(client_.remove(kEvents, {"default", name}));  // expired (the apiserver's event TTL)
  recorder.record(ref, EventType::kNormal, "Synced", "in sync");
  ASSERT_TRUE(recorder.flush(10s));
  const auto all = events();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0]["count"], 2);
  EXPECT_EQ(recorder.stats().failed, 0);
}

TEST_F(EventRecorderTest, ClusterScopedObjectsHaveTheirEventsInDefault) {
  KubeEventRecorder recorder(client_, options());
  ObjectReference ns{"v1", "Namespace", "", "tenant-a", "uid-ns", "1"};
  recorder.record(ns, EventType::kNormal, "Seen", "a cluster-scoped object");
  ASSERT_TRUE(recorder.flush(10s));
  const auto all = events("default");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_FALSE(all[0]["involvedObject"].contains("namespace"));
}

TEST_F(EventRecorderTest, AfterShutdownRecordsAreDroppedQuietly) {
  KubeEventRecorder recorder(client_, options());
  recorder.shutdown(0s);
  recorder.record(ObjectReference::of(object_), EventType::kNormal, "Late", "after shutdown");
  EXPECT_EQ(recorder.stats().dropped, 1);
  EXPECT_TRUE(events().empty());
}

TEST(FakeEventRecorderTest, KeepsWhatWasRecorded) {
  testing::FakeEventRecorder recorder;
  ObjectReference ref{"rtable.io/v1alpha1", "ReplicatedTable", "ns", "events", "u1", "5"};
  recorder.record(ref, EventType::kWarning, "HeadroomLow", "4% left");
  recorder.record(ref, EventType::kNormal, "Scaled", "3 replicas");
  ASSERT_EQ(recorder.events().size(), 2u);
  EXPECT_EQ(recorder.events()[0].toString(), "Warning HeadroomLow ns/events: 4% left");
  ASSERT_EQ(recorder.withReason("Scaled").size(), 1u);
  EXPECT_EQ(recorder.withReason("Scaled")[0].object, ref);
  recorder.clear();
  EXPECT_TRUE(recorder.events().empty());
}

}  // namespace
}  // namespace rtable::op
