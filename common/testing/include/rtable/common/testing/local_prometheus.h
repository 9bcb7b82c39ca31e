// A real Prometheus (Debian's `prometheus`) as a local process on a free loopback port, for tests
// that watch alerts the way an operator's monitoring would: it scrapes fixed targets and
// evaluates a rule file, and its HTTP API answers what fires.
//
// Thread safety: one thread at a time. Lifetime: the process is stopped on destruction, and its
// work directory removed unless keepWorkDir() was called or RTABLE_KEEP_TEST_DIRS is set.
#pragma once

#include <chrono>
#include <expected>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rtable/common/testing/subprocess.h"

namespace rtable::common::testing {

using PrometheusLabels = std::map<std::string, std::string>;

// host:port targets scraped at /metrics under one job, each series given `labels` (what a
// PodMonitor's relabelling adds: namespace, pod).
struct PrometheusTargetGroup {
  std::string job;
  std::vector<std::string> targets;
  PrometheusLabels labels;
};

struct LocalPrometheusOptions {
  std::string binary = "prometheus";
  // Empty: a new folder under the system temp dir.
  std::filesystem::path work_dir;
  std::vector<PrometheusTargetGroup> scrape;
  // A rule file's YAML (`groups: ...`); empty: no rules.
  std::string rules;
  std::chrono::milliseconds scrape_interval{1000};
  std::chrono::milliseconds evaluation_interval{1000};
};

struct PrometheusAlert {
  PrometheusLabels labels;
  std::string state;  // pending, firing
};

struct PrometheusSample {
  PrometheusLabels labels;
  double value = 0;
};

struct PrometheusTarget {
  std::string job;
  std::string scrape_url;
  std::string health;  // up, down, unknown
  std::string last_error;
};

class LocalPrometheus {
 public:
  static std::expected<std::unique_ptr<LocalPrometheus>, std::string> start(
      LocalPrometheusOptions options);
  ~LocalPrometheus();
  LocalPrometheus(const LocalPrometheus&) = delete;
  LocalPrometheus& operator=(const LocalPrometheus&) = delete;

  int port() const { return port_; }
  const std::filesystem::path& workDir() const { return work_dir_; }
  std::filesystem::path logFile() const { return work_dir_ / "prometheus.log"; }
  void keepWorkDir() { owns_work_dir_ = false; }

  // The active alerts (GET /api/v1/alerts): pending and firing; a resolved alert is not listed.
  std::expected<std::vector<PrometheusAlert>, std::string> alerts();
  // An instant vector query (GET /api/v1/query) at the server's now.
  std::expected<std::vector<PrometheusSample>, std::string> query(const std::string& promql);
  // GET /api/v1/targets: the active targets with their last scrape's health.
  std::expected<std::vector<PrometheusTarget>, std::string> targets();

 private:
  LocalPrometheus(std::filesystem::path work_dir, bool owns_work_dir)
      : work_dir_(std::move(work_dir)), owns_work_dir_(owns_work_dir) {}
  TestStatus launch(const LocalPrometheusOptions& options);
  std::expected<std::string, std::string> apiGet(const std::string& target);

  std::filesystem::path work_dir_;
  bool owns_work_dir_;
  int port_ = 0;
  std::optional<Subprocess> process_;
};

}  // namespace rtable::common::testing
