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

// A request over the socket, or over TLS on it when `tls` is given.
std::expected<HttpResponse, std::string> request(TlsContext* tls, const std::string& host, int port,
                                                 const std::string& method,
                                                 const std::string& target, const std::string& body,
                                                 std::chrono::milliseconds timeout,
                                                 const std::string& headers,
                                                 const std::string& peer_name) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (socket.fd() < 0) return std::unexpected(fmt::format("socket: {}", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return std::unexpected("bad host " + host);
  if (::connect(socket.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS)
      return std::unexpected(fmt::format("connect {}:{}: {}", host, port, strerror(errno)));
    if (!waitFor(socket.fd(), POLLOUT, deadline)) return std::unexpected("timed out connecting");
    int error = 0;
    socklen_t length = sizeof(error);
    ::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0)
      return std::unexpected(fmt::format("connect {}:{}: {}", host, port, strerror(error)));
  }
  // The socket does not block: a TLS call that cannot go on says what to wait for.
  std::optional<TlsStream> stream;
  auto wait = [&](short plain) {
    short events = plain;
    if (stream && stream->wants() == TlsStream::Wants::kRead) events = POLLIN;
    if (stream && stream->wants() == TlsStream::Wants::kWrite) events = POLLOUT;
    return waitFor(socket.fd(), events, deadline);
  };
  auto retry = [&]() {
    return stream ? stream->wants() == TlsStream::Wants::kRead ||
                        stream->wants() == TlsStream::Wants::kWrite
                  : errno == EAGAIN || errno == EINTR;
  };
  auto failure = [&](const char* what) {
    return fmt::format("{}: {}", what, stream ? stream->error() : strerror(errno));
  };
  if (tls) {
    auto opened = TlsStream::open(*tls, socket.fd());
    if (!opened) return std::unexpected(opened.error());
    stream.emplace(std::move(*opened));
    if (auto named = stream->setPeerName(peer_name.empty() ? host : peer_name); !named)
      return std::unexpected(named.error());
    while (stream->connect() != 1) {
      if (!retry()) return std::unexpected(stream->error());
      if (!wait(POLLIN)) return std::unexpected("timed out in the TLS handshake");
    }
  }
  const std::string request = fmt::format(
      "{} {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n{}",
      method, target, host, port, body.size(), headers, body);
  for (std::size_t sent = 0; sent < request.size();) {
    const ssize_t n =
        stream ? stream->write(request.data() + sent, request.size() - sent)
               : ::send(socket.fd(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (!retry()) return std::unexpected(failure("send"));
    if (!wait(POLLOUT)) return std::unexpected("timed out sending");
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
    const ssize_t n = stream ? stream->read(buffer, sizeof(buffer))
                             : ::recv(socket.fd(), buffer, sizeof(buffer), 0);
    if (n < 0) {
      if (!retry()) return std::unexpected(failure("recv"));
      if (!wait(POLLIN)) return std::unexpected("timed out waiting for the answer");
      continue;
    }
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

}  // namespace

std::expected<HttpResponse, std::string> httpRequest(
    const std::string& host, int port, const std::string& method, const std::string& target,
    const std::string& body, std::chrono::milliseconds timeout, const std::string& headers) {
  return request(nullptr, host, port, method, target, body, timeout, headers, "");
}

std::expected<HttpResponse, std::string> httpsRequest(
    TlsContext& tls, const std::string& host, int port, const std::string& method,
    const std::string& target, const std::string& body, std::chrono::milliseconds timeout,
    const std::string& headers, const std::string& peer_name) {
  return request(&tls, host, port, method, target, body, timeout, headers, peer_name);
}

}  // namespace rtable::common::testing
