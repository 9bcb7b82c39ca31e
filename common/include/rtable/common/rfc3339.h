// RFC 3339 timestamps in UTC, the two forms Kubernetes writes: metav1.Time (whole seconds,
// "2025-01-02T03:04:05Z": creationTimestamp, a condition's lastTransitionTime, an Event's times)
// and metav1.MicroTime ("2025-01-02T03:04:05.123456Z": a Lease's renewTime, events.k8s.io
// eventTime). Both round down. Pure functions: thread-safe.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace rtable::common {

std::string formatRfc3339(std::chrono::system_clock::time_point time);
std::string formatRfc3339Micros(std::chrono::system_clock::time_point time);
// Reads either form back (UTC, "Z" only: what Kubernetes and the functions above write); none for
// anything else. Fractions beyond microseconds are dropped.
std::optional<std::chrono::system_clock::time_point> parseRfc3339(std::string_view text);

}  // namespace rtable::common
