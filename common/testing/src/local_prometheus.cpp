#include "rtable/common/testing/local_prometheus.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "rtable/common/percent_encoding.h"
#include "rtable/common/testing/http_client.h"

namespace rtable::common::testing {
namespace {

using nlohmann::json;

// Prometheus 2.42 on two shared cores opens an empty TSDB and loads its rules in a few seconds.
constexpr auto kStartTimeout = std::chrono::seconds(60);

std::string promDuration(std::chrono::milliseconds d) {
  return fmt::format("{}ms", d.count());
}

PrometheusLabels labelsOf(const json& object) {
  PrometheusLabels labels;
  for (const auto& [key, value] : object.items()) labels[key] = value.get<std::string>();
  return labels;
}

}  // namespace

std::expected<std::unique_ptr<LocalPrometheus>, std::string> LocalPrometheus::start(
    LocalPrometheusOptions options) {
  bool owns = false;
  if (options.work_dir.empty()) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "rtable-prometheus-XXXXXX").string();
    if (!mkdtemp(pattern.data())) return std::unexpected("mkdtemp failed for " + pattern);
    options.work_dir = pattern;
    owns = true;
  }
  std::unique_ptr<LocalPrometheus> prometheus(new LocalPrometheus(options.work_dir, owns));
  // The port is free when we look; another process may take it before Prometheus binds.
  std::string last_error;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto port = findFreeLoopbackPort();
    if (!port) return std::unexpected(port.error());
    prometheus->port_ = *port;
    auto launched = prometheus->launch(options);
    if (launched) return prometheus;
    last_error = launched.error();
  }
  return std::unexpected(last_error);
}

LocalPrometheus::~LocalPrometheus() {
  if (process_) process_->stop();
  if (owns_work_dir_ && !std::getenv("RTABLE_KEEP_TEST_DIRS")) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir_, ec);
  }
}

TestStatus LocalPrometheus::launch(const LocalPrometheusOptions& options) {
  // YAML is a superset of JSON: the configuration is written as JSON, quoting done by the library.
  json scrape_configs = json::array();
  std::map<std::string, json> jobs;
  for (const auto& group : options.scrape) {
    json& job = jobs[group.job];
    if (job.is_null()) {
      job = {{"job_name", group.job},
             {"scrape_interval", promDuration(options.scrape_interval)},
             {"scrape_timeout", promDuration(options.scrape_interval)},
             {"static_configs", json::array()}};
    }
    job["static_configs"].push_back({{"targets", group.targets}, {"labels", group.labels}});
  }
  for (auto& [name, job] : jobs) scrape_configs.push_back(std::move(job));
  json config = {{"global",
                  {{"scrape_interval", promDuration(options.scrape_interval)},
                   {"evaluation_interval", promDuration(options.evaluation_interval)}}},
                 {"scrape_configs", scrape_configs}};
  if (!options.rules.empty()) {
    std::ofstream(work_dir_ / "rules.yaml") << options.rules;
    config["rule_files"] = json::array({(work_dir_ / "rules.yaml").string()});
  }
  const auto config_file = work_dir_ / "prometheus.yml";
  std::ofstream(config_file) << config.dump(2) << "\n";
  auto process = Subprocess::start(
      {options.binary, "--config.file=" + config_file.string(),
       "--storage.tsdb.path=" + (work_dir_ / "data").string(),
       fmt::format("--web.listen-address=127.0.0.1:{}", port_), "--log.level=info"},
      logFile());
  if (!process) return std::unexpected(process.error());
  process_.emplace(std::move(*process));
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_->running()) {
      process_.reset();
      return std::unexpected(fmt::format("prometheus on port {} exited during start; log tail:\n{}",
                                         port_, tailOfFile(logFile())));
    }
    auto ready = httpRequest("127.0.0.1", port_, "GET", "/-/ready", "", std::chrono::seconds(2));
    if (ready && ready->status == 200) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  process_->kill();
  process_.reset();
  return std::unexpected(fmt::format("prometheus on port {} not ready after {} s; log tail:\n{}",
                                     port_, kStartTimeout.count(), tailOfFile(logFile())));
}

std::expected<std::string, std::string> LocalPrometheus::apiGet(const std::string& target) {
  auto answer = httpRequest("127.0.0.1", port_, "GET", target, "", std::chrono::seconds(5));
  if (!answer) return std::unexpected(target + ": " + answer.error());
  if (answer->status != 200) {
    return std::unexpected(fmt::format("{}: HTTP {}: {}", target, answer->status, answer->body));
  }
  return std::move(answer->body);
}

std::expected<std::vector<PrometheusAlert>, std::string> LocalPrometheus::alerts() {
  auto body = apiGet("/api/v1/alerts");
  if (!body) return std::unexpected(body.error());
  const json answer = json::parse(*body, nullptr, /*allow_exceptions=*/false);
  const json list =
      answer.is_object() ? answer.value(json::json_pointer("/data/alerts"), json()) : json();
  if (!list.is_array()) return std::unexpected("/api/v1/alerts: " + *body);
  std::vector<PrometheusAlert> alerts;
  for (const auto& alert : list) {
    alerts.push_back({labelsOf(alert.value("labels", json::object())), alert.value("state", "")});
  }
  return alerts;
}

std::expected<std::vector<PrometheusSample>, std::string> LocalPrometheus::query(
    const std::string& promql) {
  auto body = apiGet("/api/v1/query?query=" + percentEncode(promql));
  if (!body) return std::unexpected(body.error());
  const json answer = json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object() || answer.value(json::json_pointer("/data/resultType"), "") != "vector") {
    return std::unexpected("query " + promql + ": " + *body);
  }
  std::vector<PrometheusSample> samples;
  for (const auto& sample : answer["data"]["result"]) {
    samples.push_back({labelsOf(sample.value("metric", json::object())),
                       std::stod(sample["value"][1].get<std::string>())});
  }
  return samples;
}

std::expected<std::vector<PrometheusTarget>, std::string> LocalPrometheus::targets() {
  auto body = apiGet("/api/v1/targets?state=active");
  if (!body) return std::unexpected(body.error());
  const json answer = json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object() ||
      !answer.value(json::json_pointer("/data/activeTargets"), json()).is_array()) {
    return std::unexpected("/api/v1/targets: " + *body);
  }
  std::vector<PrometheusTarget> targets;
  for (const auto& target : answer["data"]["activeTargets"]) {
    targets.push_back({target.value(json::json_pointer("/labels/job"), ""),
                       target.value("scrapeUrl", ""), target.value("health", ""),
                       target.value("lastError", "")});
  }
  return targets;
}

}  // namespace rtable::common::testing
