#pragma once

#include <optional>
#include <string>

namespace rtable::op::testing {

// The ports an operator process reports in its log ("health probes listening on
// http://H:P/healthz", "metrics listening on http://H:P/metrics"), for tests that start it with
// ":0" addresses. The last report of each counts: a log may be appended to across restarts.
struct ReportedPorts {
  std::optional<int> probes;
  std::optional<int> metrics;
};
ReportedPorts reportedPorts(const std::string& log_text);

}  // namespace rtable::op::testing
