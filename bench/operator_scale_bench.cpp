// The operator at scale (issue 24): rtable-operator against a real kube-apiserver (etcd,
// kube-apiserver and kube-controller-manager from LocalControlPlane: the StatefulSets' pods are
// created and stay Pending, there is no kubelet) and a real ZooKeeper 3.8, with --tables
// ReplicatedTables of one replica each in one namespace. Figures:
//   - load: the --tables tables created by 4 client threads as fast as the apiserver takes them;
//     the time from each create's send to its StatefulSet's ADDED event (the bench's own watch),
//     p50/p99/max, and until the last StatefulSet exists;
//   - steady state: --settle seconds later, a window of --window seconds: reconciles/s and the
//     operator's apiserver requests/s (its own rest_client_requests_total), its RSS and peak RSS;
//   - apply -> StatefulSet with the tables in place: --probes more tables, one every 250 ms,
//     p50/p99/max (the issue's goal: p99 < 200 ms);
//   - /metrics: --scrapes GETs, p50/p99 and the size (goal < 50 ms);
//   - a full resync: the operator restarted (SIGTERM, then a new process), the time until it has
//     reconciled every table once (its controller_runtime_reconcile_total) and its RSS then.
// Usage: rtable-operator-scale-bench [--tables 1000] [--probes 50] [--settle 30] [--window 30]
//                                    [--scrapes 20] [--operator <binary>]
// --operator: another build of rtable-operator (an older commit's, to compare in one run).
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.h"
#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/controllers/replicated_table_reconciler.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/informer.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/testing/local_control_plane.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using rtable::common::testing::httpRequest;
using rtable::common::testing::Subprocess;

constexpr const char* kNs = "scale";

double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto index = static_cast<std::size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

std::string summary(const std::vector<double>& values) {
  return fmt::format("p50 {:.1f} ms, p99 {:.1f} ms, max {:.1f} ms (n={})", percentile(values, 0.5),
                     percentile(values, 0.99), percentile(values, 1.0), values.size());
}

json tableObject(const std::string& name, const std::string& zookeeper) {
  return json{{"apiVersion", "rtable.io/v1alpha1"},
              {"kind", "ReplicatedTable"},
              {"metadata", {{"name", name}, {"namespace", kNs}}},
              {"spec",
               {{"table", "events"},
                {"columns", json::array({{{"name", "id"}, {"type", "UInt64"}},
                                         {{"name", "d"}, {"type", "Date"}}})},
                {"partitionBy", "toYYYYMM(d)"},
                {"orderBy", json::array({"id"})},
                {"replicas", 1},
                {"zookeeper", {{"connect", zookeeper}}},
                {"storage", {{"size", "1Gi"}}}}}};
}

// VmRSS and VmHWM of a process, in MiB.
std::pair<double, double> rssMiB(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  double rss = 0, peak = 0;
  while (std::getline(in, line)) {
    if (line.starts_with("VmRSS:")) rss = std::stod(line.substr(6)) / 1024;
    if (line.starts_with("VmHWM:")) peak = std::stod(line.substr(6)) / 1024;
  }
  return {rss, peak};
}

// The sum of every sample of `name` whose labels contain `label` ("" for any).
double metricSum(const std::string& text, const std::string& name, const std::string& label) {
  double sum = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || !line.starts_with(name)) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    const auto space = line.rfind(' ');
    sum += std::stod(line.substr(space + 1));
  }
  return sum;
}

class Operator {
 public:
  Operator(std::string binary, const fs::path& kubeconfig, const fs::path& log)
      : binary_(std::move(binary)), kubeconfig_(kubeconfig), log_(log) {}

  std::expected<void, std::string> start() {
    fs::remove(log_);
    ::setenv("RTABLE_CORE_IMAGE", "rtable/rtable:bench", 1);
    auto process = Subprocess::start(
        {binary_, "--kubeconfig", kubeconfig_.string(), "--leader-elect=false",
         "--health-probe-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0"},
        log_);
    if (!process) return std::unexpected(process.error());
    process_ = std::make_unique<Subprocess>(std::move(*process));
    started_ = Clock::now();
    // "listening on http://127.0.0.1:<port>/metrics" in its log.
    const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+)/metrics)");
    for (auto deadline = Clock::now() + 60s; Clock::now() < deadline;
         std::this_thread::sleep_for(50ms)) {
      std::ifstream in(log_);
      std::stringstream text;
      text << in.rdbuf();
      std::smatch match;
      const std::string s = text.str();
      if (std::regex_search(s, match, listening)) {
        port_ = std::stoi(match[1]);
        return {};
      }
    }
    return std::unexpected("the operator never said where /metrics listens; log " + log_.string());
  }
  void stop() {
    if (process_) process_->stop(30s);
    process_.reset();
  }
  pid_t pid() const { return process_->pid(); }
  Clock::time_point started() const { return started_; }
  std::expected<std::string, std::string> metrics(Clock::duration* took = nullptr) const {
    const auto t0 = Clock::now();
    auto answer = httpRequest("127.0.0.1", port_, "GET", "/metrics");
    if (took) *took = Clock::now() - t0;
    if (!answer) return std::unexpected(answer.error());
    if (answer->status != 200) return std::unexpected(fmt::format("/metrics: {}", answer->status));
    return answer->body;
  }
  double reconciles() const {
    auto text = metrics();
    return text ? metricSum(*text, "controller_runtime_reconcile_total",
                            "controller=\"replicatedtable\"")
                : -1;
  }
  // The ReplicatedTable work queue's depth (keys waiting for a worker), -1 if unreadable.
  double depth() const {
    auto text = metrics();
    return text ? metricSum(*text, "workqueue_depth", "name=\"replicatedtable\"") : -1;
  }
  double requests() const {
    auto text = metrics();
    return text ? metricSum(*text, "rest_client_requests_total", "") : -1;
  }

 private:
  std::string binary_;
  fs::path kubeconfig_;
  fs::path log_;
  std::unique_ptr<Subprocess> process_;
  Clock::time_point started_;
  int port_ = 0;
};

// When each StatefulSet of the namespace was first seen (the bench's own informer).
class StatefulSetWatch {
 public:
  explicit StatefulSetWatch(rtable::op::KubeClient& client) {
    rtable::op::InformerOptions options;
    options.type = rtable::op::resources::statefulSets();
    options.ns = kNs;
    informer_ = std::make_unique<rtable::op::Informer>(client, options);
    rtable::op::ResourceEventHandlers handlers;
    handlers.on_add = [this](const json& object) {
      std::lock_guard lock(mu_);
      seen_.emplace(object["metadata"]["name"].get<std::string>(), Clock::now());
    };
    informer_->addHandlers(std::move(handlers));
    informer_->start();
    informer_->waitForSync(60s);
  }
  std::optional<Clock::time_point> seen(const std::string& name) {
    std::lock_guard lock(mu_);
    auto it = seen_.find(name);
    if (it == seen_.end()) return std::nullopt;
    return it->second;
  }
  std::size_t count() {
    std::lock_guard lock(mu_);
    return seen_.size();
  }

 private:
  std::mutex mu_;
  std::map<std::string, Clock::time_point> seen_;
  std::unique_ptr<rtable::op::Informer> informer_;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "rtable-operator-scale-bench: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each figure as it comes, into a file too
  if (rtable::bench::wantsHelp(argc, argv)) {
    std::printf(
        "usage: rtable-operator-scale-bench [--tables 1000] [--probes 50] [--settle 30] "
        "[--window 30] [--scrapes 20] [--operator <binary>]\n");
    return 0;
  }
  if (auto paired = rtable::bench::pairedFlags(argc, argv); !paired) return fail(paired.error());
  std::map<std::string, int64_t> flags = {
      {"--tables", 1000}, {"--probes", 50}, {"--settle", 30}, {"--window", 30}, {"--scrapes", 20}};
  std::string binary = RTABLE_OPERATOR_BINARY;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string_view(argv[i]) == "--operator") {
      binary = argv[i + 1];
      continue;
    }
    auto it = flags.find(argv[i]);
    if (it == flags.end()) return fail(fmt::format("unknown flag {}", argv[i]));
    auto value =
        rtable::bench::wholeNumber(argv[i], argv[i + 1], it->first == "--settle" ? 0 : 1, 100000);
    if (!value) return fail(value.error());
    it->second = *value;
  }
  const int tables = static_cast<int>(flags["--tables"]);
  const int probes = static_cast<int>(flags["--probes"]);

  rtable::core::ZooKeeperClient::silenceLibraryLog();
  rtable::op::testing::LocalControlPlaneOptions plane_options;
  plane_options.controller_manager = true;  // the StatefulSets' pods exist, Pending
  // A ClusterIP for each table's client Service: the test plane's /24 holds 254.
  plane_options.extra_apiserver_flags.push_back("--service-cluster-ip-range=10.0.0.0/16");
  auto plane = rtable::op::testing::LocalControlPlane::start(plane_options);
  if (!plane) return fail(plane.error());
  for (const char* crd : {"rtable.io_replicatedtables.yaml", "rtable.io_clusterbackups.yaml",
                          "rtable.io_backupschedules.yaml"}) {
    if (auto applied = plane->kubectlOk({"apply", "-f", std::string(RTABLE_CRD_DIR) + "/" + crd});
        !applied) {
      return fail(applied.error());
    }
  }
  if (auto done = plane->kubectlOk({"wait", "--for=condition=Established",
                                    "crd/replicatedtables.rtable.io", "--timeout=60s"});
      !done) {
    return fail(done.error());
  }
  if (auto made = plane->kubectlOk({"create", "namespace", kNs}); !made) return fail(made.error());
  auto zookeeper = rtable::core::testing::LocalZooKeeper::start();
  if (!zookeeper) return fail(zookeeper.error());
  const std::string connect = (*zookeeper)->connectString();

  auto config = rtable::op::KubeConfig::load(plane->kubeconfigPath());
  if (!config) return fail("kubeconfig");
  auto cluster = config->clusterConfig();
  if (!cluster) return fail("cluster config");
  auto client = rtable::op::HttpKubeClient::create(*cluster);
  if (!client) return fail("client");
  StatefulSetWatch sets(**client);

  Operator op(binary, plane->kubeconfigPath(), plane->workDir() / "rtable-operator.log");
  if (auto started = op.start(); !started) return fail(started.error());
  std::printf("operator %s, %d tables, ZooKeeper %s, control plane %s\n", binary.c_str(), tables,
              connect.c_str(), plane->workDir().c_str());
  {
    auto [rss, peak] = rssMiB(op.pid());
    std::printf("idle operator: RSS %.1f MiB\n", rss);
  }

  // --- load ---
  std::vector<Clock::time_point> sent(static_cast<std::size_t>(tables));
  std::atomic<int> next{0};
  std::atomic<int> errors{0};
  const auto load_start = Clock::now();
  std::vector<std::thread> creators;
  for (int t = 0; t < 4; ++t) {
    creators.emplace_back([&] {
      for (int i = next++; i < tables; i = next++) {
        sent[static_cast<std::size_t>(i)] = Clock::now();
        auto created = (*client)->create(rtable::controllers::replicatedTables(),
                                         tableObject(fmt::format("t{:04}", i), connect));
        if (!created) {
          ++errors;
          std::fprintf(stderr, "create t%04d: %s\n", i, created.error().toString().c_str());
        }
      }
    });
  }
  for (auto& thread : creators) thread.join();
  const double created_s = ms(Clock::now() - load_start) / 1000;
  if (errors) return fail(fmt::format("{} creates failed", errors.load()));
  for (auto deadline = Clock::now() + 30min;
       sets.count() < static_cast<std::size_t>(tables) && Clock::now() < deadline;) {
    std::this_thread::sleep_for(100ms);
  }
  if (sets.count() < static_cast<std::size_t>(tables)) {
    return fail(fmt::format("only {} of {} StatefulSets after 30 min", sets.count(), tables));
  }
  std::vector<double> load_latency;
  Clock::time_point last{};
  for (int i = 0; i < tables; ++i) {
    const auto seen = *sets.seen(fmt::format("t{:04}", i));
    last = std::max(last, seen);
    load_latency.push_back(ms(seen - sent[static_cast<std::size_t>(i)]));
  }
  std::printf("load: %d tables created in %.1f s; every StatefulSet after %.1f s\n", tables,
              created_s, ms(last - load_start) / 1000);
  std::printf("load: create -> StatefulSet %s\n", summary(load_latency).c_str());
  {
    auto [rss, peak] = rssMiB(op.pid());
    std::printf("after load: RSS %.1f MiB (peak %.1f MiB)\n", rss, peak);
  }

  // --- steady state ---
  std::this_thread::sleep_for(std::chrono::seconds(flags["--settle"]));
  const double r0 = op.reconciles(), q0 = op.requests();
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(flags["--window"]));
  const double window_s = ms(Clock::now() - w0) / 1000;
  const double r1 = op.reconciles(), q1 = op.requests();
  std::printf("steady: %.1f reconciles/s, %.1f apiserver requests/s (%.2f per reconcile)\n",
              (r1 - r0) / window_s, (q1 - q0) / window_s, r1 > r0 ? (q1 - q0) / (r1 - r0) : 0.0);
  {
    auto [rss, peak] = rssMiB(op.pid());
    std::printf("steady: RSS %.1f MiB (peak %.1f MiB)\n", rss, peak);
  }

  // --- apply -> StatefulSet with the tables in place ---
  std::vector<double> probe_latency;
  for (int i = 0; i < probes; ++i) {
    const std::string name = fmt::format("p{:04}", i);
    const auto t0 = Clock::now();
    auto created =
        (*client)->create(rtable::controllers::replicatedTables(), tableObject(name, connect));
    if (!created) return fail("create " + name + ": " + created.error().toString());
    std::optional<Clock::time_point> seen;
    for (auto deadline = t0 + 120s; !(seen = sets.seen(name)) && Clock::now() < deadline;) {
      std::this_thread::sleep_for(1ms);
    }
    if (!seen) return fail("no StatefulSet for " + name + " after 120 s");
    probe_latency.push_back(ms(*seen - t0));
    std::this_thread::sleep_until(t0 + 250ms);
  }
  std::printf("apply -> StatefulSet beside %d tables: %s\n", tables,
              summary(probe_latency).c_str());

  // --- /metrics ---
  std::vector<double> scrape;
  std::size_t bytes = 0;
  for (int i = 0; i < flags["--scrapes"]; ++i) {
    Clock::duration took{};
    auto text = op.metrics(&took);
    if (!text) return fail(text.error());
    bytes = text->size();
    scrape.push_back(ms(took));
    std::this_thread::sleep_for(100ms);
  }
  std::printf("/metrics: %s, %zu bytes\n", summary(scrape).c_str(), bytes);
  if (const char* dump = std::getenv("RTABLE_BENCH_DUMP")) {
    // For a look at what the figures are made of: the last /metrics and one table twice.
    std::ofstream out(dump);
    out << op.metrics().value_or("") << "\n";
    for (int i = 0; i < 2; ++i) {
      auto table = (*client)->get(rtable::controllers::replicatedTables(), {kNs, "t0000"});
      if (table) out << table->dump(2) << "\n";
      std::this_thread::sleep_for(5s);
    }
  }
  {
    auto [rss, peak] = rssMiB(op.pid());
    std::printf("before restart: RSS %.1f MiB (peak %.1f MiB)\n", rss, peak);
  }

  // --- full resync ---
  op.stop();
  const int all = tables + probes;
  if (auto started = op.start(); !started) return fail(started.error());
  // Done when the reconciles reach the tables' count and the queue is empty: each key the
  // informer's first list enqueued has then been reconciled (a table requeued 15 s after its
  // first reconcile can only make this later, never earlier).
  double done = 0;
  std::optional<double> counted_s;
  for (auto deadline = Clock::now() + 30min; Clock::now() < deadline;
       std::this_thread::sleep_for(100ms)) {
    done = op.reconciles();
    if (done >= all && !counted_s) counted_s = ms(Clock::now() - op.started()) / 1000;
    if (done >= all && op.depth() == 0) break;
  }
  if (!counted_s) return fail(fmt::format("resync: {} of {} reconciled after 30 min", done, all));
  std::printf(
      "resync: %d reconciles %.1f s after the operator started, its queue empty after %.1f s\n",
      all, *counted_s, ms(Clock::now() - op.started()) / 1000);
  {
    auto [rss, peak] = rssMiB(op.pid());
    std::printf("after resync: RSS %.1f MiB (peak %.1f MiB)\n", rss, peak);
  }
  op.stop();
  return 0;
}
