// rtable-operator as users run it, against a real kube-apiserver (LocalControlPlane): two
// processes elect exactly one leader on a real Lease, kill -9 of the leader hands over within
// the lease time, SIGTERM exits 0 and releases the Lease so that the other takes over at once,
// a stolen Lease ends the leader with exit 1 ("leader election lost"), a bad flag exits 2. And
// KubeEventRecorder's Events as the apiserver and `kubectl get events` see them.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "../unit/http_get.h"
#include "../unit/runtime_test_support.h"
#include "rtable/common/testing/files.h"
#include "rtable/common/testing/loopback_firewall.h"
#include "rtable/operator/event_recorder.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/leader_election.h"
#include "rtable/operator/testing/local_control_plane.h"
#include "rtable/operator/testing/operator_log.h"

#ifndef RTABLE_OPERATOR_BINARY
#error "RTABLE_OPERATOR_BINARY must name the rtable-operator binary (operator/tests/CMakeLists.txt)"
#endif

namespace rtable::op {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using common::testing::readFile;
using common::testing::Subprocess;
using test::httpGet;
using testing::eventually;

constexpr auto kLease = 4s;
constexpr auto kRenewDeadline = 3s;
constexpr auto kRetry = 1s;
const std::string kLeaseNamespace = "operator-election";
const std::string kLeaseName = "rtable-operator-lock";

std::string hostName() {
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  return host.data();
}

// One rtable-operator process, its log and its ports.
struct OperatorRun {
  std::optional<Subprocess> process;
  std::filesystem::path log;
  std::string identity;  // defaultLeaderIdentity(): <hostname>_<pid>
  int probe_port = 0;
  int metrics_port = 0;

  std::string logText() const { return readFile(log); }

  // leader_election_master_status for our Lease, "" when not (yet) exported.
  std::string leaderMetric() const {
    auto answer = httpGet(metrics_port, "/metrics");
    if (!answer || answer->status != 200) return "";
    const std::string prefix =
        fmt::format("leader_election_master_status{{name=\"{}\"}} ", kLeaseName);
    const auto at = answer->body.find(prefix);
    if (at == std::string::npos) return "";
    return answer->body.substr(at + prefix.size(),
                               answer->body.find('\n', at) - at - prefix.size());
  }
};

class OperatorProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto plane = testing::LocalControlPlane::start();
    if (!plane) {
      start_error_ = plane.error();
      return;
    }
    plane_ = std::make_unique<testing::LocalControlPlane>(std::move(*plane));
    // rtable-operator watches its custom resources: without the CRDs its informers never sync
    // and /readyz stays 503, as in a real cluster.
    auto crds = plane_->kubectl({"apply", "-f", RTABLE_CRDS_DIR});
    if (!crds || crds->exit_code != 0) {
      start_error_ = "kubectl apply -f crds/: " + (crds ? crds->out + crds->err : crds.error());
      return;
    }
    auto config = KubeConfig::load(plane_->kubeconfigPath());
    if (!config) {
      start_error_ = config.error().toString();
      return;
    }
    auto cluster = config->clusterConfig();
    if (!cluster) {
      start_error_ = cluster.error().toString();
      return;
    }
    auto client = HttpKubeClient::create(*cluster);
    if (!client) {
      start_error_ = client.error().toString();
      return;
    }
    admin_ = std::move(*client);
  }

  static void TearDownTestSuite() {
    if (plane_ && ::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      plane_->keepWorkDir();
      fmt::print(stderr, "control plane and operator logs kept in {}\n",
                 plane_->workDir().string());
    }
    admin_.reset();
    plane_.reset();
    if (!copies_dir_.empty()) std::filesystem::remove_all(copies_dir_);
  }

  void SetUp() override { ASSERT_TRUE(admin_) << "no control plane: " << start_error_; }

  static void createNamespace(const std::string& ns) {
    auto created = admin_->create(resources::namespaces(), json{{"metadata", {{"name", ns}}}});
    ASSERT_TRUE(created || created.error().kind == KubeErrorKind::kAlreadyExists)
        << created.error().toString();
  }

  static std::string goDuration(std::chrono::milliseconds d) {
    return fmt::format("{}ms", d.count());
  }

  // Starts rtable-operator and waits for the log line with its ports. With `uid`, it runs as that
  // uid from copies of its binary and kubeconfig that the uid can reach (accessibleCopies).
  static std::expected<OperatorRun, std::string> startOperator(const std::string& name,
                                                               std::optional<uid_t> uid = {}) {
    OperatorRun run;
    run.log = plane_->workDir() / (name + ".log");
    std::filesystem::path binary = RTABLE_OPERATOR_BINARY;
    std::filesystem::path kubeconfig = plane_->kubeconfigPath();
    if (uid) {
      auto copies = accessibleCopies();
      if (!copies) return std::unexpected(copies.error());
      binary = copies->first;
      kubeconfig = copies->second;
    }
    auto process = Subprocess::start(
        {binary.string(), "--kubeconfig", kubeconfig.string(),
         "--leader-election-namespace=" + kLeaseNamespace, "--leader-election-id=" + kLeaseName,
         "--leader-election-lease-duration=" + goDuration(kLease),
         "--leader-election-renew-deadline=" + goDuration(kRenewDeadline),
         "--leader-election-retry-period=" + goDuration(kRetry),
         "--health-probe-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0",
         "--log-level=debug"},
        run.log, uid);
    if (!process) return std::unexpected(process.error());
    run.process.emplace(std::move(*process));
    run.identity = fmt::format("{}_{}", hostName(), run.process->pid());
    const bool listening = eventually(
        [&] {
          const testing::ReportedPorts ports = testing::reportedPorts(run.logText());
          if (!ports.probes || !ports.metrics) return false;
          run.probe_port = *ports.probes;
          run.metrics_port = *ports.metrics;
          return true;
        },
        30s);
    if (!listening) {
      return std::unexpected(fmt::format("{} did not report its ports:\n{}", name,
                                         common::testing::tailOfFile(run.log)));
    }
    return run;
  }

  // The operator binary and the admin kubeconfig copied to a folder every uid can enter (the
  // build folder may sit in one only root can, as CI's clone does), once per test binary.
  static std::expected<std::pair<std::filesystem::path, std::filesystem::path>, std::string>
  accessibleCopies() {
    if (copies_dir_.empty()) {
      char pattern[] = "/tmp/rtable-operator-bin-XXXXXX";
      if (!mkdtemp(pattern)) return std::unexpected("mkdtemp failed");
      copies_dir_ = pattern;
    }
    const std::filesystem::path& dir = copies_dir_;
    std::error_code ec;
    std::filesystem::permissions(dir, std::filesystem::perms(0755), ec);
    const auto binary = dir / "rtable-operator";
    const auto kubeconfig = dir / "admin.kubeconfig";
    using std::filesystem::copy_options;
    std::filesystem::copy_file(RTABLE_OPERATOR_BINARY, binary, copy_options::skip_existing, ec);
    if (!ec)
      std::filesystem::copy_file(plane_->kubeconfigPath(), kubeconfig,
                                 copy_options::overwrite_existing, ec);
    if (!ec) std::filesystem::permissions(kubeconfig, std::filesystem::perms(0644), ec);
    if (ec) return std::unexpected("copying to " + dir.string() + ": " + ec.message());
    return std::make_pair(binary, kubeconfig);
  }

  static std::string holder() {
    auto lease = admin_->get(resources::leases(), {kLeaseNamespace, kLeaseName});
    return lease ? LeaseRecord::fromLease(*lease).holder_identity : "";
  }

  static inline std::unique_ptr<testing::LocalControlPlane> plane_;
  static inline std::unique_ptr<HttpKubeClient> admin_;
  static inline std::string start_error_;
  static inline std::filesystem::path copies_dir_;  // accessibleCopies
};

TEST_F(OperatorProcessTest, TwoProcessesElectOneLeaderAndHandOver) {
  createNamespace(kLeaseNamespace);
  auto first = startOperator("operator-1");
  ASSERT_TRUE(first) << first.error();
  auto second = startOperator("operator-2");
  ASSERT_TRUE(second) << second.error();
  std::array<OperatorRun*, 2> runs{&*first, &*second};

  // Exactly one leads: the Lease names it and its /metrics says 1, the other's 0.
  ASSERT_TRUE(eventually([&] { return !holder().empty(); }, 30s));
  OperatorRun* leader = nullptr;
  for (OperatorRun* r : runs) {
    if (r->identity == holder()) leader = r;
  }
  ASSERT_NE(leader, nullptr) << "holder " << holder() << " is neither " << first->identity
                             << " nor " << second->identity;
  OperatorRun* follower = leader == runs[0] ? runs[1] : runs[0];
  ASSERT_TRUE(eventually([&] { return leader->leaderMetric() == "1"; }, 10s))
      << leader->leaderMetric();
  EXPECT_EQ(follower->leaderMetric(), "0");
  for (OperatorRun* r : runs) {
    ASSERT_TRUE(eventually(
        [&] {
          auto ready = httpGet(r->probe_port, "/readyz");
          return ready && ready->status == 200;
        },
        30s))
        << r->logText();
    EXPECT_EQ(httpGet(r->probe_port, "/healthz")->status, 200);
  }
  std::this_thread::sleep_for(kLease + kRetry);  // still exactly one after a lease time
  EXPECT_EQ(holder(), leader->identity);
  EXPECT_EQ(follower->leaderMetric(), "0");

  // kill -9: the follower takes over once the lease has expired by its own observation.
  const auto killed = std::chrono::steady_clock::now();
  leader->process->kill();
  ASSERT_TRUE(eventually([&] { return holder() == follower->identity; }, 3 * kLease));
  const auto takeover = std::chrono::steady_clock::now() - killed;
  fmt::print("takeover after kill -9: {} ms (lease {} s, retry {} s)\n",
             std::chrono::duration_cast<std::chrono::milliseconds>(takeover).count(),
             kLease.count(), kRetry.count());
  EXPECT_GE(takeover, kLease - kRetry - 500ms);  // it waited for the expiry: never two leaders
  EXPECT_LT(takeover, 3 * kLease);
  ASSERT_TRUE(eventually([&] { return follower->leaderMetric() == "1"; }, 10s));
  OperatorRun* leader2 = follower;

  // A new follower; then SIGTERM to the leader: exit 0, the Lease released, the follower leads
  // at its next retry instead of after the lease time.
  auto third = startOperator("operator-3");
  ASSERT_TRUE(third) << third.error();
  ASSERT_TRUE(eventually([&] { return third->leaderMetric() == "0"; }, 30s));
  // The handover is timed on a thread of its own: the process exits a little after it has
  // released the Lease (its HTTP servers stop last).
  const auto terminated = std::chrono::steady_clock::now();
  std::atomic<int64_t> handover_ms{-1};
  std::thread watch_lease([&] {
    if (eventually([&] { return holder() == third->identity; }, 3 * kLease)) {
      handover_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - terminated)
                        .count();
    }
  });
  const auto status = leader2->process->stop(30s);
  watch_lease.join();
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status << "\n"
                                                               << leader2->logText();
  EXPECT_NE(leader2->logText().find("released the lease"), std::string::npos) << leader2->logText();
  ASSERT_GE(handover_ms.load(), 0) << "holder " << holder();
  fmt::print("handover after SIGTERM: {} ms\n", handover_ms.load());
  // A released Lease: no waiting for its expiry (the lease duration).
  EXPECT_LT(handover_ms.load(), std::chrono::milliseconds(kLease).count());
  ASSERT_TRUE(eventually([&] { return third->leaderMetric() == "1"; }, 10s));

  // Someone else takes the Lease: the leader stops leading and exits 1.
  auto lease = admin_->get(resources::leases(), {kLeaseNamespace, kLeaseName});
  ASSERT_TRUE(lease) << lease.error().toString();
  (*lease)["spec"]["holderIdentity"] = "someone-else";
  ASSERT_TRUE(admin_->update(resources::leases(), *lease));
  ASSERT_TRUE(eventually(
      [&] { return third->logText().find("exiting: leader election lost") != std::string::npos; },
      3 * kLease))
      << third->logText();
  // Signals are blocked by then: stop() only collects the exit status.
  const auto lost = third->process->stop(10s);
  ASSERT_TRUE(lost);
  EXPECT_TRUE(WIFEXITED(*lost) && WEXITSTATUS(*lost) == 1) << "wait status " << *lost;
}

// The leader cut from the kube-apiserver (its packets to the apiserver's port dropped: a
// partition, each process its own uid): it stops leading once it could not renew within the renew
// deadline, before the Lease expires for the standby, which then takes over. At no moment do
// both lead.
TEST_F(OperatorProcessTest, ALeaderCutFromTheApiServerStopsBeforeTheStandbyTakesOver) {
  createNamespace(kLeaseNamespace);
  const std::vector<uid_t> uids = common::testing::testUids(2);
  auto first = startOperator("cut-operator-1", uids[0]);
  ASSERT_TRUE(first) << first.error();
  auto second = startOperator("cut-operator-2", uids[1]);
  ASSERT_TRUE(second) << second.error();
  std::array<OperatorRun*, 2> runs{&*first, &*second};
  OperatorRun* leader = nullptr;
  // An earlier test may have left the Lease held by another name: it expires first.
  ASSERT_TRUE(eventually(
      [&] {
        for (OperatorRun* r : runs) {
          if (r->identity == holder() && r->leaderMetric() == "1") leader = r;
        }
        return leader != nullptr;
      },
      3 * kLease + 30s))
      << "holder " << holder();
  OperatorRun* standby = leader == runs[0] ? runs[1] : runs[0];
  const uid_t leader_uid = leader == runs[0] ? uids[0] : uids[1];
  ASSERT_TRUE(eventually([&] { return standby->leaderMetric() == "0"; }, 30s));

  auto firewall = common::testing::LoopbackFirewall::create();
  ASSERT_TRUE(firewall) << firewall.error();
  const std::string url = plane_->serverUrl();
  const int apiserver_port = std::stoi(url.substr(url.rfind(':') + 1));
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_TRUE((*firewall)->drop({leader_uid}, {apiserver_port}));
  // Each round: first who holds the Lease, then whether the cut leader still leads. Once the
  // standby holds it, the leader must already have stopped.
  bool leader_stopped = false;
  std::optional<std::chrono::milliseconds> stopped_after, taken_after;
  const bool taken = eventually(
      [&] {
        const bool standby_holds = holder() == standby->identity;
        const bool stopped = !leader->process->running() || leader->leaderMetric() != "1";
        const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - cut);
        if (stopped && !leader_stopped) stopped_after = since;
        leader_stopped = leader_stopped || stopped;
        if (standby_holds) {
          EXPECT_TRUE(leader_stopped) << "the standby took the Lease while the cut leader led";
          taken_after = since;
        }
        return standby_holds;
      },
      6 * kLease);
  ASSERT_TRUE(taken) << "the standby never took over; holder " << holder() << "\n"
                     << (*firewall)->describe();
  ASSERT_TRUE(stopped_after);
  fmt::print(
      "cut leader stopped leading after {} ms, the standby took over after {} ms (lease {} "
      "s, renew deadline {} s)\n",
      stopped_after->count(), taken_after->count(), kLease.count(),
      std::chrono::duration_cast<std::chrono::seconds>(kRenewDeadline).count());
  EXPECT_LE(*stopped_after, *taken_after);
  ASSERT_TRUE(eventually([&] { return standby->leaderMetric() == "1"; }, 10s));
  EXPECT_TRUE((*firewall)->heal());
  // The cut leader ended itself ("leader election lost"), or leads no more.
  EXPECT_TRUE(
      eventually([&] { return !leader->process->running() || leader->leaderMetric() == "0"; }, 30s))
      << leader->logText();
  EXPECT_EQ(holder(), standby->identity);
}

TEST_F(OperatorProcessTest, ABadFlagExitsTwoNamingIt) {
  auto result = common::testing::runCommand(
      {RTABLE_OPERATOR_BINARY, "--leader-election-lease-duration=forever"}, 30s);
  ASSERT_TRUE(result) << result.error();
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_NE(result->err.find("--leader-election-lease-duration"), std::string::npos) << result->err;
  result = common::testing::runCommand({RTABLE_OPERATOR_BINARY, "--no-such-flag"}, 30s);
  ASSERT_TRUE(result) << result.error();
  EXPECT_EQ(result->exit_code, 2);
  EXPECT_NE(result->err.find("--no-such-flag"), std::string::npos) << result->err;
}

TEST_F(OperatorProcessTest, EventsReachTheApiServerAndARepeatIncrementsCount) {
  const std::string ns = "operator-events";
  createNamespace(ns);
  auto object = admin_->create(resources::configMaps(),
                               json{{"apiVersion", "v1"},
                                    {"kind", "ConfigMap"},
                                    {"metadata", {{"name", "events-config"}, {"namespace", ns}}}});
  ASSERT_TRUE(object) << object.error().toString();
  KubeEventRecorder recorder(*admin_);
  const auto ref = ObjectReference::of(*object);
  recorder.record(ref, EventType::kNormal, "Created", "created the replicas");
  recorder.record(ref, EventType::kWarning, "HeadroomLow", "4.2% of the log counter left");
  ASSERT_TRUE(recorder.flush(30s));
  recorder.record(ref, EventType::kNormal, "Created", "created the replicas");
  ASSERT_TRUE(recorder.flush(30s));
  const auto stats = recorder.stats();
  EXPECT_EQ(stats.created, 2);
  EXPECT_EQ(stats.patched, 1);
  EXPECT_EQ(stats.failed, 0);

  auto events = admin_->list(resources::events(), ns);
  ASSERT_TRUE(events) << events.error().toString();
  ASSERT_EQ(events->items.size(), 2u);
  for (const auto& e : events->items) {
    EXPECT_EQ(e["involvedObject"]["uid"], (*object)["metadata"]["uid"]);
    EXPECT_EQ(e["involvedObject"]["kind"], "ConfigMap");
    EXPECT_EQ(e["source"]["component"], "rtable-operator");
    if (e["reason"] == "Created") {
      EXPECT_EQ(e["count"], 2);
      EXPECT_EQ(e["type"], "Normal");
    } else {
      EXPECT_EQ(e["reason"], "HeadroomLow");
      EXPECT_EQ(e["count"], 1);
      EXPECT_EQ(e["type"], "Warning");
    }
  }

  auto shown = plane_->kubectl({"get", "events", "-n", ns});
  ASSERT_TRUE(shown) << shown.error();
  EXPECT_EQ(shown->exit_code, 0) << shown->err;
  EXPECT_NE(shown->out.find("Created"), std::string::npos) << shown->out;
  EXPECT_NE(shown->out.find("configmap/events-config"), std::string::npos) << shown->out;
  EXPECT_NE(shown->out.find("created the replicas"), std::string::npos) << shown->out;
  EXPECT_NE(shown->out.find("Warning"), std::string::npos) << shown->out;
  // kubectl 1.34 prints the count only in the wide columns.
  auto counted = plane_->kubectl({"get", "events", "-n", ns, "--sort-by=.reason", "-o",
                                  "custom-columns=REASON:.reason,COUNT:.count,TYPE:.type"});
  ASSERT_TRUE(counted) << counted.error();
  EXPECT_TRUE(std::regex_search(counted->out, std::regex(R"(Created\s+2\s+Normal)")))
      << counted->out;
  EXPECT_TRUE(std::regex_search(counted->out, std::regex(R"(HeadroomLow\s+1\s+Warning)")))
      << counted->out;
  auto described = plane_->kubectl({"describe", "configmap", "-n", ns, "events-config"});
  ASSERT_TRUE(described) << described.error();
  EXPECT_NE(described->out.find("HeadroomLow"), std::string::npos) << described->out;
  fmt::print("kubectl get events:\n{}", shown->out);
}

}  // namespace
}  // namespace rtable::op
