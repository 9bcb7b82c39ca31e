#include "rtable/operator/testing/operator_log.h"

#include <regex>

namespace rtable::op::testing {

namespace {

std::optional<int> lastPort(const std::string& text, const std::regex& line) {
  std::optional<int> port;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it) {
    port = std::stoi((*it)[1].str());
  }
  return port;
}

}  // namespace

ReportedPorts reportedPorts(const std::string& log_text) {
  static const std::regex probes(R"(health probes listening on http://[0-9.]+:([0-9]+)/healthz)");
  static const std::regex metrics(R"(metrics listening on http://[0-9.]+:([0-9]+)/metrics)");
  return {lastPort(log_text, probes), lastPort(log_text, metrics)};
}

}  // namespace rtable::op::testing
