// OperatorProcess on FakeKubeClient (real time, short leases): only the leader runs its tasks; a
// requested shutdown fails /readyz first, lets running work finish, releases the Lease and exits
// 0; a stop that takes too long keeps the Lease and exits 1; losing the Lease exits 1 with
// "leader election lost"; /readyz waits for the apiserver and the informers; /metrics serves the
// registry with leader_election_master_status.
#include "rtable/operator/operator_process.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>

#include "http_get.h"
#include "rtable/operator/controller.h"
#include "rtable/operator/informer.h"
#include "rtable/operator/testing/fake_kube_client.h"
#include "runtime_test_support.h"

namespace rtable::op {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using test::httpGet;
using testing::eventually;
using testing::FakeKubeClient;
using testing::InterceptingKubeClient;

const ObjectKey kProcessLease{"default", "rtable-operator-lock"};

// A leader task that counts its starts and stops; its stop can be held back by a gate.
class CountingTask {
 public:
  LeaderTask task(const std::string& name) {
    return {name, [this] { ++starts_; },
            [this] {
              std::unique_lock lock(mu_);
              stopping_ = true;
              cv_.notify_all();
              cv_.wait(lock, [&] { return !held_; });
              ++stops_;
            }};
  }
  void holdStop() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void releaseStop() {
    {
      std::lock_guard lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
  bool waitStopping(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return stopping_; });
  }
  int starts() const { return starts_.load(); }
  int stops() const { return stops_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  bool stopping_ = false;
  std::atomic<int> starts_{0};
  std::atomic<int> stops_{0};
};

OperatorProcessOptions fastOptions(const std::string& identity) {
  OperatorProcessOptions o;
  o.leader_election.lease = kProcessLease;
  o.leader_election.identity = identity;
  // Quick, yet with room: a leader starved of CPU for longer than renew_deadline (a loaded CI
  // machine under a sanitizer) would give up its lease in the middle of a test. 2.5 s is four
  // times the 600 ms these tests once had.
  o.leader_election.lease_duration = 3s;
  o.leader_election.renew_deadline = 2500ms;
  o.leader_election.retry_period = 100ms;
  o.health_probe_bind_address = "127.0.0.1:0";
  o.metrics_bind_address = "127.0.0.1:0";
  o.api_probe_interval = 20ms;
  o.event_flush_timeout = 1s;
  return o;
}

std::string holderOf(KubeClient& client) {
  auto lease = client.get(resources::leases(), kProcessLease);
  return lease ? LeaseRecord::fromLease(*lease).holder_identity
               : "<" + lease.error().toString() + ">";
}

// The value of `leader_election_master_status{name="rtable-operator-lock"}` on /metrics.
std::optional<std::string> leaderMetric(int port) {
  auto answer = httpGet(port, "/metrics");
  if (!answer || answer->status != 200) return std::nullopt;
  const std::string prefix = "leader_election_master_status{name=\"rtable-operator-lock\"} ";
  const auto at = answer->body.find(prefix);
  if (at == std::string::npos) return std::nullopt;
  const auto end = answer->body.find('\n', at);
  return answer->body.substr(at + prefix.size(), end - at - prefix.size());
}

int status(int port, const std::string& path) {
  auto answer = httpGet(port, path);
  return answer ? answer->status : 0;
}

TEST(OperatorProcessTest, OnlyTheLeaderRunsItsTasksAndAShutdownHandsOver) {
  FakeKubeClient client;
  CountingTask task_a, task_b;
  OperatorProcess a(client, fastOptions("a"));
  a.addLeaderTask(task_a.task("work"));
  ASSERT_TRUE(a.start());
  auto exit_a = std::async(std::launch::async, [&] { return a.wait(); });
  ASSERT_TRUE(eventually([&] { return task_a.starts() == 1; }));
  EXPECT_TRUE(a.leading());
  EXPECT_EQ(holderOf(client), "a");

  OperatorProcess b(client, fastOptions("b"));
  b.addLeaderTask(task_b.task("work"));
  ASSERT_TRUE(b.start());
  auto exit_b = std::async(std::launch::async, [&] { return b.wait(); });
  // The follower is alive and ready, and does not run the leader's work.
  ASSERT_TRUE(eventually([&] { return status(b.healthProbePort(), "/readyz") == 200; }));
  EXPECT_EQ(status(b.healthProbePort(), "/healthz"), 200);
  std::this_thread::sleep_for(3500ms);  // more than a lease time
  EXPECT_EQ(task_b.starts(), 0);
  EXPECT_FALSE(b.leading());
  EXPECT_EQ(leaderMetric(a.metricsPort()), "1");
  EXPECT_EQ(leaderMetric(b.metricsPort()), "0");

  a.requestShutdown();
  ASSERT_EQ(exit_a.wait_for(10s), std::future_status::ready);
  const ProcessExit ea = exit_a.get();
  EXPECT_EQ(ea.code, 0);
  EXPECT_FALSE(ea.tasks_abandoned);
  EXPECT_EQ(task_a.stops(), 1);
  // Released on the way out (b may have taken it already); b takes over at its next retry.
  const std::string after_exit = holderOf(client);
  EXPECT_TRUE(after_exit == "" || after_exit == "b") << after_exit;
  ASSERT_TRUE(eventually([&] { return task_b.starts() == 1; }));
  EXPECT_EQ(holderOf(client), "b");
  EXPECT_EQ(leaderMetric(b.metricsPort()), "1");

  b.requestShutdown();
  ASSERT_EQ(exit_b.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(exit_b.get().code, 0);
  EXPECT_EQ(holderOf(client), "");
}

TEST(OperatorProcessTest, ShutdownFailsReadinessFirstAndLetsRunningWorkFinish) {
  FakeKubeClient client;
  CountingTask task;
  OperatorProcess process(client, fastOptions("a"));
  process.addLeaderTask(task.task("work"));
  ASSERT_TRUE(process.start());
  auto exit = std::async(std::launch::async, [&] { return process.wait(); });
  ASSERT_TRUE(eventually([&] { return task.starts() == 1; }));
  ASSERT_TRUE(eventually([&] { return status(process.healthProbePort(), "/readyz") == 200; }));

  task.holdStop();  // a reconcile is still running
  process.requestShutdown();
  ASSERT_TRUE(task.waitStopping());
  auto ready = httpGet(process.healthProbePort(), "/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_NE(ready->body.find("[-]shutdown failed: shutting down"), std::string::npos)
      << ready->body;
  EXPECT_EQ(status(process.healthProbePort(), "/healthz"), 200);
  EXPECT_EQ(holderOf(client), "a");  // held while work runs
  EXPECT_NE(exit.wait_for(300ms), std::future_status::ready);

  task.releaseStop();
  ASSERT_EQ(exit.wait_for(10s), std::future_status::ready);
  const ProcessExit e = exit.get();
  EXPECT_EQ(e.code, 0);
  EXPECT_EQ(e.reason, "shutdown requested");
  EXPECT_EQ(holderOf(client), "");
}

TEST(OperatorProcessTest, AStopThatOutlastsTheGracePeriodKeepsTheLease) {
  FakeKubeClient client;
  CountingTask task;
  OperatorProcessOptions o = fastOptions("a");
  o.graceful_shutdown_timeout = 300ms;
  auto process = std::make_unique<OperatorProcess>(client, o);
  process->addLeaderTask(task.task("stuck"));
  ASSERT_TRUE(process->start());
  auto exit = std::async(std::launch::async, [&] { return process->wait(); });
  ASSERT_TRUE(eventually([&] { return task.starts() == 1; }));
  task.holdStop();
  process->requestShutdown();
  ASSERT_EQ(exit.wait_for(10s), std::future_status::ready);
  const ProcessExit e = exit.get();
  EXPECT_EQ(e.code, 1);
  EXPECT_TRUE(e.tasks_abandoned);
  EXPECT_EQ(e.reason, "graceful shutdown timed out");
  // A main would _Exit now; here the stuck stop ends later and the process is destroyed.
  task.releaseStop();
  process.reset();
  EXPECT_EQ(task.stops(), 1);
  EXPECT_EQ(holderOf(client), "a");  // never released: it expires on its own
}

TEST(OperatorProcessTest, LosingTheLeaseAfterLeadingExitsWithOne) {
  FakeKubeClient client;
  CountingTask task;
  OperatorProcessOptions o = fastOptions("a");
  o.leadership_lost_grace = 5s;  // stop cleanly, so that the test can check the stop
  OperatorProcess process(client, o);
  process.addLeaderTask(task.task("work"));
  ASSERT_TRUE(process.start());
  auto exit = std::async(std::launch::async, [&] { return process.wait(); });
  ASSERT_TRUE(eventually([&] { return task.starts() == 1; }));

  // Someone else takes the Lease (an apiserver that lost our renewals, a partition healed).
  auto lease = client.get(resources::leases(), kProcessLease);
  ASSERT_TRUE(lease);
  (*lease)["spec"]["holderIdentity"] = "thief";
  ASSERT_TRUE(client.update(resources::leases(), *lease));

  ASSERT_EQ(exit.wait_for(10s), std::future_status::ready);
  const ProcessExit e = exit.get();
  EXPECT_EQ(e.code, 1);
  EXPECT_EQ(e.reason, "leader election lost");
  EXPECT_FALSE(e.tasks_abandoned);
  EXPECT_EQ(task.stops(), 1);
  EXPECT_EQ(holderOf(client), "thief");
}

TEST(OperatorProcessTest, ByDefaultALostLeaseDoesNotWaitForRunningWork) {
  FakeKubeClient client;
  CountingTask task;
  auto process = std::make_unique<OperatorProcess>(client, fastOptions("a"));
  process->addLeaderTask(task.task("work"));
  ASSERT_TRUE(process->start());
  auto exit = std::async(std::launch::async, [&] { return process->wait(); });
  ASSERT_TRUE(eventually([&] { return task.starts() == 1; }));
  task.holdStop();
  auto lease = client.get(resources::leases(), kProcessLease);
  ASSERT_TRUE(lease);
  (*lease)["spec"]["holderIdentity"] = "thief";
  ASSERT_TRUE(client.update(resources::leases(), *lease));
  ASSERT_EQ(exit.wait_for(10s), std::future_status::ready);
  const ProcessExit e = exit.get();
  EXPECT_EQ(e.code, 1);
  EXPECT_TRUE(e.tasks_abandoned);
  task.releaseStop();
  process.reset();
  EXPECT_EQ(task.stops(), 1);
}

TEST(OperatorProcessTest, ReadinessWaitsForTheApiServerAndEveryInformer) {
  FakeKubeClient fake;
  std::atomic<bool> apiserver_up{false};
  std::atomic<bool> configmaps_listable{false};
  InterceptingKubeClient client(fake);
  // The observer runs just before the hook, on the same thread.
  static thread_local bool listing_configmaps = false;
  client.setListObserver([](const ListOptions& o) { listing_configmaps = o.limit != 1; });
  client.setHook([&](InterceptingKubeClient::Call call) -> std::optional<KubeError> {
    if (!apiserver_up) return KubeError::connection("connection refused");
    // The process probes with a list of namespaces (limit 1); the informer lists configmaps in
    // pages of 500.
    if (call == InterceptingKubeClient::Call::kList && !configmaps_listable && listing_configmaps) {
      return KubeError::connection("configmaps: connection reset");
    }
    return std::nullopt;
  });
  InformerOptions io;
  io.type = resources::configMaps();
  io.backoff_initial = 20ms;
  io.backoff_max = 50ms;
  Informer informer(client, io);
  OperatorProcessOptions o = fastOptions("a");
  o.leader_elect = false;
  OperatorProcess process(client, o);
  process.addInformer(informer);
  ASSERT_TRUE(process.start());
  auto exit = std::async(std::launch::async, [&] { return process.wait(); });

  auto ready = httpGet(process.healthProbePort(), "/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_NE(ready->body.find("[-]apiserver failed"), std::string::npos) << ready->body;
  EXPECT_NE(ready->body.find("[-]informers failed: not synced: configmaps"), std::string::npos)
      << ready->body;
  EXPECT_EQ(status(process.healthProbePort(), "/healthz"), 200);

  // The namespaces probe gets through, the informer's list does not yet.
  apiserver_up = true;
  ASSERT_TRUE(eventually([&] {
    auto r = httpGet(process.healthProbePort(), "/readyz");
    return r && r->body.find("[+]apiserver ok") != std::string::npos;
  }));
  configmaps_listable = true;
  ASSERT_TRUE(eventually([&] { return status(process.healthProbePort(), "/readyz") == 200; }));
  process.requestShutdown();
  ASSERT_EQ(exit.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(exit.get().code, 0);
}

TEST(OperatorProcessTest, WithoutLeaderElectionTheTasksStartAtOnce) {
  FakeKubeClient client;
  CountingTask task;
  OperatorProcessOptions o = fastOptions("a");
  o.leader_elect = false;
  OperatorProcess process(client, o);
  process.addLeaderTask(task.task("work"));
  ASSERT_TRUE(process.start());
  auto exit = std::async(std::launch::async, [&] { return process.wait(); });
  ASSERT_TRUE(eventually([&] { return task.starts() == 1; }));
  EXPECT_TRUE(process.leading());
  EXPECT_EQ(leaderMetric(process.metricsPort()), std::nullopt);
  EXPECT_FALSE(client.get(resources::leases(), kProcessLease));
  process.requestShutdown();
  ASSERT_EQ(exit.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(exit.get().code, 0);
  EXPECT_EQ(task.stops(), 1);
}

TEST(OperatorProcessTest, MetricsServeTheRegistryOfControllersAndQueues) {
  FakeKubeClient client;
  OperatorProcess process(client, fastOptions("a"));
  std::atomic<int> reconciles{0};
  ControllerOptions co;
  co.name = "tables";
  co.registry = &process.registry();
  auto controller = std::make_shared<Controller>(std::move(co), [&](const ObjectKey&) {
    ++reconciles;
    return ReconcileOutcome(ReconcileResult::done());
  });
  process.addController(*controller);
  process.adopt(controller);
  controller->queue().add("default/events");
  ASSERT_TRUE(process.start());
  auto exit = std::async(std::launch::async, [&] { return process.wait(); });
  ASSERT_TRUE(eventually([&] { return reconciles.load() == 1; }));
  ASSERT_TRUE(eventually([&] { return leaderMetric(process.metricsPort()) == "1"; }));
  auto metrics = httpGet(process.metricsPort(), "/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find(
                R"(controller_runtime_reconcile_total{controller="tables",result="success"} 1)"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find(R"(workqueue_adds_total{name="tables"} 1)"), std::string::npos);
  process.requestShutdown();
  ASSERT_EQ(exit.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(exit.get().code, 0);
}

TEST(OperatorProcessTest, APortInUseFailsTheStart) {
  FakeKubeClient client;
  OperatorProcess first(client, fastOptions("a"));
  ASSERT_TRUE(first.start());
  OperatorProcessOptions o = fastOptions("b");
  o.health_probe_bind_address = "127.0.0.1:" + std::to_string(first.healthProbePort());
  OperatorProcess second(client, o);
  auto started = second.start();
  ASSERT_FALSE(started);
  EXPECT_NE(started.error().find("cannot listen"), std::string::npos) << started.error();
  first.requestShutdown();
  EXPECT_EQ(first.wait().code, 0);
}

}  // namespace
}  // namespace rtable::op
