#include "rtable/common/testing/http_client.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace rtable::common::testing {
namespace {

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

bool waitFor(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return false;
  pollfd p{fd, events, 0};
  return ::poll(&p, 1, static_cast<int>(left.count())) > 0;
}

// A `Transfer-Encoding: chunked` body (RFC 9112 section 7.1) without its framing; nullopt when
// the last (empty) chunk never came. Chunk extensions and trailers are passed over.
std::optional<std::string> decodeChunked(std::string_view framed) {
  std::string body;
  for (std::size_t at = 0;;) {
    const std::size_t line_end = framed.find("\r\n", at);
    if (line_end == std::string_view::npos) return std::nullopt;
    std::size_t size = 0;
    const std::string size_line(framed.substr(at, line_end - at));
    if (std::sscanf(size_line.c_str(), "%zx", &size) != 1) return std::nullopt;
    if (size == 0) return body;
    at = line_end + 2;
    if (framed.size() < at + size + 2) return std::nullopt;
    body.append(framed.substr(at, size));
    at += size + 2;
  }
}

}  // namespace

std::expected<HttpResponse, std::string> httpRequest(
    const std::string& host, int port, const std::string& method, const std::string& target,
    const std::string& body, std::chrono::milliseconds timeout, const std::string& headers) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (socket.fd() < 0) return std::unexpected(fmt::format("socket: {}", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return std::unexpected("bad host " + host);
  if (::connect(socket.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return std::unexpected(fmt::format("connect {}:{}: {}", host, port, strerror(errno)));
  }
  const std::string request = fmt::format(
      "{} {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n{}",
      method, target, host, port, body.size(), headers, body);
  for (std::size_t sent = 0; sent < request.size();) {
    if (!waitFor(socket.fd(), POLLOUT, deadline)) return std::unexpected("timed out sending");
    const ssize_t n =
        ::send(socket.fd(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return std::unexpected(fmt::format("send: {}", strerror(errno)));
    sent += static_cast<std::size_t>(n);
  }
  std::string raw;
  char buffer[65536];
  std::size_t header_end = std::string::npos;
  std::size_t content_length = std::string::npos;
  for (;;) {
    if (header_end != std::string::npos && content_length != std::string::npos &&
        raw.size() >= header_end + 4 + content_length) {
      break;
    }
    if (!waitFor(socket.fd(), POLLIN, deadline))
      return std::unexpected("timed out waiting for the answer");
    const ssize_t n = ::recv(socket.fd(), buffer, sizeof(buffer), 0);
    if (n < 0) return std::unexpected(fmt::format("recv: {}", strerror(errno)));
    if (n == 0) break;
    raw.append(buffer, static_cast<std::size_t>(n));
    if (header_end == std::string::npos &&
        (header_end = raw.find("\r\n\r\n")) != std::string::npos) {
      std::string lower = raw.substr(0, header_end);
      for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (auto at = lower.find("content-length:"); at != std::string::npos) {
        content_length = std::stoul(lower.substr(at + 15));
      }
    }
  }
  if (header_end == std::string::npos) return std::unexpected("connection closed before an answer");
  HttpResponse response;
  response.headers = raw.substr(0, header_end);
  if (std::sscanf(response.headers.c_str(), "HTTP/1.%*d %d", &response.status) != 1) {
    return std::unexpected("unreadable status line");
  }
  response.body = raw.substr(header_end + 4);
  if (content_length != std::string::npos && response.body.size() < content_length) {
    return std::unexpected("answer cut short");
  }
  // Servers that stream (Prometheus' API) frame the body in chunks; Connection: close above means
  // the whole answer was read up to the end of the stream.
  std::string lower = response.headers;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("transfer-encoding: chunked") != std::string::npos) {
    auto decoded = decodeChunked(response.body);
    if (!decoded) return std::unexpected("chunked answer cut short");
    response.body = std::move(*decoded);
  }
  return response;
}

}  // namespace rtable::common::testing
