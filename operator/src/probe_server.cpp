#include "rtable/operator/probe_server.h"

#include <arpa/inet.h>
#include <cpprest/containerstream.h>
#include <cpprest/http_listener.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <tuple>

namespace rtable::op {

namespace http = web::http;
using http::experimental::listener::http_listener;

namespace {

// Tries before giving up on port 0: another process must take the port we found, every time.
constexpr int kPortZeroTries = 10;

// A port the kernel hands out for `host` right now (bind to port 0, read it, close).
std::expected<int, std::string> freePort(const std::string& host) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    length = sizeof(sockaddr_in6);
  } else {
    return std::unexpected(fmt::format("'{}' is not an IP address", host));
  }
  const int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::unexpected(fmt::format("socket: {}", std::strerror(errno)));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return std::unexpected(fmt::format("bind {}:0: {}", host, error));
  }
  ::close(fd);
  return ntohs(storage.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
}

std::string hostForUri(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// "verbose", "verbose=1", "a=b&verbose": a key with or without a value (split_query drops keys
// without '=').
bool hasQueryKey(const std::string& query, std::string_view key) {
  std::string_view rest = query;
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    if (pair.substr(0, pair.find('=')) == key) return true;
    if (amp == std::string_view::npos) break;
    rest.remove_prefix(amp + 1);
  }
  return false;
}

struct CheckOutcome {
  bool ok = true;
  std::string body;
};

// controller-runtime's healthz handler output.
CheckOutcome runChecks(const std::vector<NamedCheck>& checks, const std::string& kind,
                       bool verbose) {
  CheckOutcome out;
  std::string lines;
  for (const auto& c : checks) {
    auto result = c.check();
    if (result) {
      lines += fmt::format("[+]{} ok\n", c.name);
    } else {
      out.ok = false;
      lines += fmt::format("[-]{} failed: {}\n", c.name, result.error());
    }
  }
  if (out.ok && !verbose) {
    out.body = "ok";
  } else {
    out.body = lines + fmt::format("{} check {}\n", kind, out.ok ? "passed" : "failed");
  }
  return out;
}

}  // namespace

std::string BindAddress::toString() const {
  return fmt::format("{}:{}", hostForUri(host), port);
}

std::expected<BindAddress, std::string> parseBindAddress(const std::string& text) {
  BindAddress out;
  if (text == "0") {
    out.disabled = true;
    return out;
  }
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) {
    return std::unexpected(fmt::format("'{}': expected host:port, :port or 0", text));
  }
  std::string host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";
  if (host == "localhost") host = "127.0.0.1";
  int value = -1;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value < 0 ||
      value > 65535) {
    return std::unexpected(fmt::format("'{}': the port must be a number from 0 to 65535", text));
  }
  in6_addr scratch{};
  if (inet_pton(AF_INET, host.c_str(), &scratch) != 1 &&
      inet_pton(AF_INET6, host.c_str(), &scratch) != 1) {
    return std::unexpected(fmt::format("'{}': the host must be an IP address", text));
  }
  out.host = host;
  out.port = value;
  return out;
}

class ProbeServer::Impl {
 public:
  Impl(BindAddress address, std::vector<NamedCheck> healthz, std::vector<NamedCheck> readyz)
      : address_(std::move(address)), healthz_(std::move(healthz)), readyz_(std::move(readyz)) {}

  ~Impl() {
    if (listener_) {
      try {
        listener_->close().wait();
      } catch (const std::exception&) {  // closing anyway
      }
    }
  }

  std::expected<void, std::string> open() {
    const bool any_port = address_.port == 0;
    std::string last_error;
    for (int attempt = 0; attempt < (any_port ? kPortZeroTries : 1); ++attempt) {
      BindAddress bound = address_;
      if (any_port) {
        auto port = freePort(address_.host);
        if (!port) return std::unexpected(port.error());
        bound.port = *port;
      }
      try {
        auto listener =
            std::make_unique<http_listener>(web::uri(fmt::format("http://{}/", bound.toString())));
        listener->support([this](const http::http_request& request) { handle(request); });
        listener->open().wait();
        listener_ = std::move(listener);
        address_ = bound;
        return {};
      } catch (const std::exception& e) {
        last_error = fmt::format("cannot listen on {}: {}", bound.toString(), e.what());
      }
    }
    return std::unexpected(last_error);
  }

  const BindAddress& address() const { return address_; }

 private:
  void handle(const http::http_request& request) {
    try {
      const std::string path = request.relative_uri().path();
      const bool verbose = hasQueryKey(request.relative_uri().query(), "verbose");
      if (request.method() != http::methods::GET && request.method() != http::methods::HEAD) {
        reply(request, http::status_codes::MethodNotAllowed, "method not allowed\n");
        return;
      }
      for (const auto& [prefix, checks, kind] :
           {std::tuple{std::string("/healthz"), &healthz_, std::string("healthz")},
            std::tuple{std::string("/readyz"), &readyz_, std::string("readyz")}}) {
        if (path == prefix || path == prefix + "/") {
          const CheckOutcome outcome = runChecks(*checks, kind, verbose);
          reply(request, status(outcome.ok), outcome.body);
          return;
        }
        if (path.starts_with(prefix + "/")) {
          const std::string name = path.substr(prefix.size() + 1);
          for (const auto& c : *checks) {
            if (c.name != name) continue;
            auto result = c.check();
            reply(request, status(result.has_value()),
                  result ? std::string("ok")
                         : fmt::format("[-]{} failed: {}\n", name, result.error()));
            return;
          }
        }
      }
      reply(request, http::status_codes::NotFound, "404 page not found\n");
    } catch (const std::exception&) {  // the client went away: nothing to answer
    }
  }

  static http::status_code status(bool ok) {
    return ok ? http::status_codes::OK : http::status_codes::ServiceUnavailable;
  }

  static void reply(const http::http_request& request, http::status_code code,
                    const std::string& body) {
    http::http_response response(code);
    response.headers().add("X-Content-Type-Options", "nosniff");
    // A byte buffer of the stream's own type: set_body(std::string) reads chars through an
    // unsigned-char stream, a type pun UBSan reports.
    std::vector<uint8_t> bytes(body.begin(), body.end());
    const auto size = bytes.size();
    response.set_body(concurrency::streams::bytestream::open_istream(std::move(bytes)), size,
                      "text/plain; charset=utf-8");
    request.reply(response).then([](pplx::task<void> sent) {
      try {
        sent.get();
      } catch (...) {  // the prober went away: nothing to tell it
      }
    });
  }

  BindAddress address_;
  const std::vector<NamedCheck> healthz_;
  const std::vector<NamedCheck> readyz_;
  std::unique_ptr<http_listener> listener_;
};

std::expected<std::unique_ptr<ProbeServer>, std::string> ProbeServer::start(
    const BindAddress& address, std::vector<NamedCheck> healthz, std::vector<NamedCheck> readyz) {
  if (address.disabled) return std::unexpected(std::string("the probe server is disabled"));
  auto impl = std::make_unique<Impl>(address, std::move(healthz), std::move(readyz));
  if (auto opened = impl->open(); !opened) return std::unexpected(opened.error());
  return std::unique_ptr<ProbeServer>(new ProbeServer(std::move(impl)));
}

ProbeServer::ProbeServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProbeServer::~ProbeServer() = default;

int ProbeServer::port() const {
  return impl_->address().port;
}

std::string ProbeServer::address() const {
  return impl_->address().toString();
}

}  // namespace rtable::op
