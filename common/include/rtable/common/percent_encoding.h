// Percent-encoding (RFC 3986 section 2.1) for URLs we build: Kubernetes API paths and query
// parameters, a part fetch's ?name=, a test's ?where=. Pure function: thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace rtable::common {

// Every byte but the unreserved characters (RFC 3986 section 2.3: ALPHA DIGIT - . _ ~) as %XX,
// so the result is safe in a path segment and in a query parameter's name or value.
std::string percentEncode(std::string_view value);

}  // namespace rtable::common
