// ProbeServer: /healthz and /readyz on their own port, answered from named checks the way
// controller-runtime's healthz handler does (sigs.k8s.io/controller-runtime/pkg/healthz).
//
//   GET /healthz, /readyz        200 "ok" when every check passes; otherwise 503 and one line per
//                                check, "[+]name ok" or "[-]name failed: reason", then
//                                "readyz check failed". ?verbose lists the lines on success too.
//   GET /healthz/<name>, /readyz/<name>   that check alone.
//
// Served by cpprestsdk's http_listener: unlike prometheus-cpp's Exposer (which serves /metrics,
// see OperatorProcess) it can answer with any status and body. http_listener cannot tell the port
// it bound, so port 0 is resolved first (bind a socket to port 0, read the port, close it, open
// the listener there, and try another port if someone took it in between).
//
// Checks run on cpprestsdk's threads, concurrently: they must be quick and thread-safe (read
// flags; no API calls). Thread safety: the server is immutable after start(); destroy it from one
// thread. Checks must outlive the server.
#pragma once

#include <expected>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rtable::op {

// The check passes, or fails with a reason.
using CheckFunc = std::function<std::expected<void, std::string>()>;
struct NamedCheck {
  std::string name;
  CheckFunc check;
};

// A bind address as controller-runtime takes it: "host:port", ":port" (every interface),
// "[v6]:port", or "0" (off). Port 0 means any free port.
struct BindAddress {
  std::string host;  // "0.0.0.0" for ":port"
  int port = 0;
  bool disabled = false;
  std::string toString() const;  // "host:port"
};
std::expected<BindAddress, std::string> parseBindAddress(const std::string& text);

class ProbeServer {
 public:
  static std::expected<std::unique_ptr<ProbeServer>, std::string> start(
      const BindAddress& address, std::vector<NamedCheck> healthz, std::vector<NamedCheck> readyz);
  ~ProbeServer();  // closes the listener
  ProbeServer(const ProbeServer&) = delete;
  ProbeServer& operator=(const ProbeServer&) = delete;

  int port() const;
  std::string address() const;  // "host:port" as bound

  class Impl;

 private:
  explicit ProbeServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rtable::op
