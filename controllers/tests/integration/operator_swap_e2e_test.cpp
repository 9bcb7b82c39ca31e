// The automatic table swap end to end (issue 20), on the stack of operator_stack.h: a 3-replica
// ReplicatedTable takes a continuous stream of inserts from writers that retry every failed or
// timed-out block with its insert_deduplication_token (single rows and batches, round-robin over
// the replicas). With autoRecover off, ZooKeeper is stopped, the table's log counter raised in its
// snapshot and ZooKeeper started again; a real Prometheus, scraping the replica pods the chart's
// PodMonitor selects and the operator, with the chart's rules, fires RtableLogCounterHeadroomLow
// while the operator only reports HeadroomLow. autoRecover switched on, the operator swaps the
// table to generation 2. In the end every replica holds exactly the acknowledged rows, each once,
// with identical parts, `kubectl get replicatedtables` shows generation 2, and the alert is
// resolved. Once with the counter just under the threshold, once with the log already stuck.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "operator_stack.h"
#include "rtable/common/testing/local_prometheus.h"
#include "rtable/controllers/yaml_json.h"
#include "rtable/replication_core/testing/retrying_writers.h"

namespace rtable::controllers {
namespace {

using namespace testing;  // the stack's names: kNs, eventually, httpRequest, ...
using common::testing::LocalPrometheus;
using common::testing::LocalPrometheusOptions;
using common::testing::PrometheusTargetGroup;

constexpr const char* kHeadroomAlert = "RtableLogCounterHeadroomLow";
// ZooKeeper names log entries from an int32: log-2147483647 is the last one (DESIGN.md 2.5).
constexpr int64_t kLastLogEntry = 2147483647;
constexpr double kNameSpace = 2147483648.0;  // 2^31, what the headroom is a share of

class SwapEndToEnd : public OperatorStack {
 protected:
  void TearDown() override {
    if (prometheus_ && HasFailure()) {
      prometheus_->keepWorkDir();
      std::fprintf(stderr, "kept: prometheus %s\n", prometheus_->workDir().c_str());
    }
    prometheus_.reset();
    OperatorStack::TearDown();
  }

  // The chart rendered with its monitoring on, as a cluster with prometheus-operator would get it.
  std::vector<json> renderedMonitoring() {
    auto rendered = common::testing::runCommand(
        {(plane_->binDir() / "helm").string(), "template", "rtable", RTABLE_CHART_DIR,
         "--namespace", "rtable-system", "--set",
         // The alert's `for` shortened from 10m: the test watches it fire within seconds.
         "prometheusRule.enabled=true,prometheusRule.headroomFor=3s,podMonitor.enabled=true"},
        60s);
    EXPECT_TRUE(rendered && rendered->exit_code == 0)
        << (rendered ? rendered->out + rendered->err : rendered.error());
    if (!rendered || rendered->exit_code != 0) return {};
    auto documents = yamlDocumentsToJson(rendered->out);
    EXPECT_TRUE(documents) << documents.error();
    return documents ? *documents : std::vector<json>{};
  }

  // Prometheus with the chart's rules, scraping the pods its PodMonitor selects (at the container
  // port the PodMonitor names, with the namespace and pod labels prometheus-operator adds) and the
  // operator's /metrics.
  void startPrometheus() {
    json rule, monitor;
    for (const json& document : renderedMonitoring()) {
      if (document.value("kind", "") == "PrometheusRule") rule = document;
      if (document.value("kind", "") == "PodMonitor") monitor = document;
    }
    ASSERT_TRUE(rule.is_object() && monitor.is_object()) << "no PrometheusRule or PodMonitor";
    LocalPrometheusOptions options;
    options.rules = rule["spec"].dump();  // JSON is YAML: a rule file's `groups`
    std::vector<std::string> selector;
    for (const auto& [key, value] : monitor["spec"]["selector"]["matchLabels"].items()) {
      selector.push_back(key + "=" + value.get<std::string>());
    }
    const std::string port_name = monitor["spec"]["podMetricsEndpoints"][0]["port"];
    op::ListOptions list_options;
    list_options.label_selector = fmt::format("{}", fmt::join(selector, ","));
    auto pods = client_->list(op::resources::pods(), kNs, list_options);
    ASSERT_TRUE(pods) << pods.error().toString();
    for (const json& pod : pods->items) {
      for (const json& container : pod["spec"]["containers"]) {
        for (const json& port : container.value("ports", json::array())) {
          if (port.value("name", "") != port_name) continue;
          options.scrape.push_back(
              PrometheusTargetGroup{"rtable-replicas",
                                    {fmt::format("{}:{}", pod["status"].value("podIP", ""),
                                                 port["containerPort"].get<int>())},
                                    {{"namespace", pod["metadata"].value("namespace", "")},
                                     {"pod", pod["metadata"].value("name", "")}}});
        }
      }
    }
    ASSERT_EQ(options.scrape.size(), 3u)
        << "the PodMonitor (" << list_options.label_selector << ", port " << port_name
        << ") should select the 3 replica pods";
    std::optional<int> operator_port;
    ASSERT_TRUE(
        eventually([&] { return (operator_port = operatorMetricsPort()).has_value(); }, 60s));
    options.scrape.push_back(PrometheusTargetGroup{
        "rtable-operator", {fmt::format("127.0.0.1:{}", *operator_port)}, {}});
    auto started = LocalPrometheus::start(options);
    ASSERT_TRUE(started) << started.error();
    prometheus_ = std::move(*started);
    // Every target scraped, and the replicas' headroom series there.
    ASSERT_TRUE(eventually(
        [&] {
          auto targets = prometheus_->targets();
          if (!targets || targets->size() != 4) return false;
          for (const auto& target : *targets) {
            if (target.health != "up") return false;
          }
          auto headroom = prometheus_->query(
              R"(rtable_log_counter_headroom_ratio{namespace="analytics",table="events"})");
          return headroom && headroom->size() == 3;
        },
        60s))
        << "Prometheus does not scrape all targets: " << scrapeReport();
  }

  std::string scrapeReport() {
    std::string report;
    auto targets = prometheus_->targets();
    if (!targets) return targets.error();
    for (const auto& target : *targets) {
      report += fmt::format("\n{} {} {} {}", target.job, target.scrape_url, target.health,
                            target.last_error);
    }
    auto headroom = prometheus_->query("rtable_log_counter_headroom_ratio");
    if (!headroom) return report + "\n" + headroom.error();
    for (const auto& sample : *headroom) {
      report += fmt::format("\n{} {}", ::testing::PrintToString(sample.labels), sample.value);
    }
    return report;
  }

  // The headroom alert's state for generation `generation` of the table: "" when not active.
  std::string alertState(const std::string& generation) {
    auto alerts = prometheus_->alerts();
    if (!alerts) return "error: " + alerts.error();
    for (const auto& alert : *alerts) {
      if (alert.labels.at("alertname") == kHeadroomAlert && alert.labels.contains("table") &&
          alert.labels.at("table") == "events" && alert.labels.contains("namespace") &&
          alert.labels.at("namespace") == kNs && alert.labels.contains("generation") &&
          alert.labels.at("generation") == generation) {
        return alert.state;
      }
    }
    return "";
  }
  bool anyHeadroomAlert() {
    auto alerts = prometheus_->alerts();
    if (!alerts) return true;
    for (const auto& alert : *alerts) {
      if (alert.labels.at("alertname") == kHeadroomAlert) return true;
    }
    return false;
  }

  // The names in generation 1's log past 2147483600, or wrapped below 0.
  std::string lastLogEntries() {
    auto children = tableKeeper().children(root() + "/1/log");
    if (!children) return children.error().toString();
    std::vector<std::string> last;
    for (const auto& name : children->names) {
      if (name.starts_with("log--") || name > "log-2147483600") last.push_back(name);
    }
    std::sort(last.begin(), last.end());
    return fmt::format("{}", fmt::join(last, " "));
  }

  // The scenario: `counter` is what generation 1's log counter is raised to.
  void swapUnderLoad(int32_t counter, bool stuck) {
    applyTable();
    if (HasFatalFailure()) return;
    startWriters();
    startPrometheus();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(eventually([&] { return writers_->acknowledgedBlocks() >= 20; }, 60s))
        << "inserts do not succeed: " << ::testing::PrintToString(writers_->errorCodes());
    EXPECT_EQ(alertState("1"), "") << "the alert fires with a fresh counter";

    // ZooKeeper stopped, the counter raised in its snapshot, ZooKeeper started: the writers and
    // replicas ride it out.
    ASSERT_TRUE(zookeeper_->setSequentialCounter(root() + "/1/log", counter));
    if (stuck) {
      ASSERT_TRUE(
          eventually([&] { return writers_->errorCodes().contains("LOG_COUNTER_EXHAUSTED"); }, 90s))
          << "the log never ran out: " << ::testing::PrintToString(writers_->errorCodes());
      // Not asserted: that log-2147483647 itself exists. The log cleaner may have removed it
      // (once, 2026-12-06, it was gone while every insert was refused); the counter stays at the
      // last name either way, and the operator counts that as exhausted (counterHeadroom). What
      // the log ends with is printed.
      std::printf("generation 1's log ends with: %s\n", lastLogEntries().c_str());
    }
    // The alert fires; the operator reports HeadroomLow and, autoRecover off, does not swap.
    ASSERT_TRUE(eventually([&] { return alertState("1") == "firing"; }, 120s))
        << "alert state '" << alertState("1") << "'; table " << tableState();
    // Stuck: Exhausted, whether or not the cleaner removed log-2147483647.
    ASSERT_TRUE(eventually(
        [&] { return conditionReason("HeadroomLow") == (stuck ? "Exhausted" : "BelowThreshold"); },
        60s))
        << tableState();
    EXPECT_EQ(status().value("activeGeneration", 0), 1) << tableState();
    EXPECT_FALSE(status().contains("recovery")) << "a swap started with autoRecover off";
    auto low = prometheus_->query(
        R"(min(rtable_log_counter_headroom_ratio{namespace="analytics",table="events"}))");
    ASSERT_TRUE(low && low->size() == 1) << (low ? "no series" : low.error());
    EXPECT_LT(low->front().value, 0.05);
    EXPECT_NEAR(low->front().value, stuck ? 0.0 : (kLastLogEntry + 1 - counter) / kNameSpace,
                0.001);

    // autoRecover on: the operator swaps while the writers go on.
    const std::size_t blocks_before_swap = writers_->acknowledgedBlocks();
    {
      auto done = plane_->kubectlOk({"patch", "replicatedtable/events", "-n", kNs, "--type=merge",
                                     "-p", R"({"spec":{"headroom":{"autoRecover":true}}})"});
      ASSERT_TRUE(done) << done.error();
    }
    const auto patched = std::chrono::steady_clock::now();
    ASSERT_TRUE(eventually(
        [&] {
          const json s = status();
          return s.value("activeGeneration", 0) == 2 &&
                 s.value(json::json_pointer("/recovery/result"), "") == "Succeeded";
        },
        150s))
        << tableState();
    std::printf("autoRecover on -> generation 2 serving: %.1f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - patched).count());
    EXPECT_EQ(status().value(json::json_pointer("/recovery/trigger"), ""), "headroom");
    // Inserts go on in generation 2.
    ASSERT_TRUE(
        eventually([&] { return writers_->acknowledgedBlocks() >= blocks_before_swap + 20; }, 60s))
        << ::testing::PrintToString(writers_->errorCodes());
    ASSERT_TRUE(writers_->stop()) << "a block was never acknowledged";
    const std::set<std::string> codes = writers_->errorCodes();
    EXPECT_TRUE(codes.contains("TABLE_SWAP_IN_PROGRESS") || codes.contains("UNAVAILABLE"))
        << "no insert met the swap's pause: " << ::testing::PrintToString(codes);
    std::printf("%zu rows in %zu blocks acknowledged, %zu retries; errors met: %s\n",
                writers_->acknowledged().size(), writers_->acknowledgedBlocks(),
                writers_->retries(), ::testing::PrintToString(codes).c_str());

    // Every replica: generation 2, exactly the acknowledged rows, each once, the same parts.
    expectReplicasHoldExactly(writers_->acknowledged(), 2);
    if (HasFatalFailure()) return;
    EXPECT_FALSE(zkExists(root() + "/1")) << "generation 1's subtree is still there";

    // kubectl shows the new generation in its printer column.
    auto printed = plane_->kubectl({"get", "replicatedtables", "-n", kNs});
    ASSERT_TRUE(printed);
    std::istringstream lines(printed->out);
    std::string header, line;
    std::getline(lines, header);
    std::getline(lines, line);
    const std::size_t column = header.find("GENERATION");
    ASSERT_NE(column, std::string::npos) << printed->out;
    EXPECT_EQ(line.substr(column, line.find(' ', column) - column), "2") << printed->out;

    // The alert resolves: generation 1 has no series left, generation 2 has room.
    EXPECT_TRUE(eventually([&] { return !anyHeadroomAlert(); }, 60s))
        << "alert for generation 1: '" << alertState("1") << "', for 2: '" << alertState("2")
        << "'";
    auto old_series = prometheus_->query(R"(rtable_log_counter_headroom_ratio{generation="1"})");
    ASSERT_TRUE(old_series) << old_series.error();
    EXPECT_TRUE(old_series->empty()) << old_series->size() << " series of generation 1 remain";
    auto new_series = prometheus_->query(
        R"(rtable_log_counter_headroom_ratio{namespace="analytics",generation="2"} > 0.99)");
    ASSERT_TRUE(new_series) << new_series.error();
    EXPECT_EQ(new_series->size(), 3u);
  }

  std::unique_ptr<LocalPrometheus> prometheus_;
};

// 4.5% of the counter left: under the default 5% threshold, far from stuck.
TEST_F(SwapEndToEnd, ACounterJustUnderTheThresholdIsSwappedWithoutLosingAnInsert) {
  swapUnderLoad(static_cast<int32_t>(kLastLogEntry + 1 - 0.045 * kNameSpace), /*stuck=*/false);
}

// Three creates left: the writers use them up, ZooKeeper's next log name already exists, and
// every insert answers LOG_COUNTER_EXHAUSTED until the swap.
TEST_F(SwapEndToEnd, AStuckTableIsSwappedWithoutLosingAnInsert) {
  swapUnderLoad(static_cast<int32_t>(kLastLogEntry - 2), /*stuck=*/true);
}

}  // namespace
}  // namespace rtable::controllers
