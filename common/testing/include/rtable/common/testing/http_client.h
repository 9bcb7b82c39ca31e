// A small blocking HTTP/1.1 client for tests: one request per connection, so a test sees exactly
// what a killed server did or did not answer.
#pragma once

#include <chrono>
#include <expected>
#include <string>

#include "rtable/common/tls.h"

namespace rtable::common::testing {

struct HttpResponse {
  int status = 0;
  std::string body;
  std::string headers;  // raw header block
};

// `method` "GET" or "POST"; `target` like "/insert?format=TSV"; `headers` more header lines,
// each ending in "\r\n". An error means no complete answer arrived (refused, reset, cut short,
// timed out).
std::expected<HttpResponse, std::string> httpRequest(
    const std::string& host, int port, const std::string& method, const std::string& target,
    const std::string& body = "", std::chrono::milliseconds timeout = std::chrono::seconds(30),
    const std::string& headers = "");

// The same over HTTPS with a client context (its roots, and `peer_name`, else `host`, checked
// against the server's certificate: a pod reached by address whose certificate names its DNS
// name). A failed handshake is an error naming why.
std::expected<HttpResponse, std::string> httpsRequest(
    TlsContext& tls, const std::string& host, int port, const std::string& method,
    const std::string& target, const std::string& body = "",
    std::chrono::milliseconds timeout = std::chrono::seconds(30), const std::string& headers = "",
    const std::string& peer_name = "");

}  // namespace rtable::common::testing
