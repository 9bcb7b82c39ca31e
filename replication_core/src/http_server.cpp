#include "rtable/replication_core/http_server.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

namespace rtable::core {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r'))
    text.remove_suffix(1);
  return text;
}

bool sendAll(int fd, const iovec* parts, int count) {
  std::vector<iovec> left(parts, parts + count);
  std::size_t first = 0;
  while (first < left.size()) {
    msghdr message{};
    message.msg_iov = left.data() + first;
    message.msg_iovlen = left.size() - first;
    const ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;  // the peer went away, or took nothing for the socket timeout
    }
    auto sent = static_cast<std::size_t>(n);
    while (first < left.size() && sent >= left[first].iov_len) sent -= left[first++].iov_len;
    if (first < left.size()) {
      left[first].iov_base = static_cast<char*>(left[first].iov_base) + sent;
      left[first].iov_len -= sent;
    }
  }
  return true;
}

// A connection's bytes: the socket's own, or TLS over it. The socket blocks (with the socket
// timeout), so a TLS read or write that "wants" more is a timeout or a peer gone: the end.
class Transport {
 public:
  explicit Transport(int fd) : fd_(fd) {}
  Transport(int fd, common::TlsStream tls) : fd_(fd), tls_(std::move(tls)) {}

  ssize_t receive(char* data, std::size_t size) {
    if (tls_) return tls_->read(data, size);
    for (;;) {
      const ssize_t n = recv(fd_, data, size, 0);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  bool send(const iovec* parts, int count) {
    if (!tls_) return sendAll(fd_, parts, count);
    std::size_t total = 0;
    for (int i = 0; i < count; ++i) total += parts[i].iov_len;
    // A head and a small body in one TLS record rather than two.
    if (count > 1 && total <= kCoalesceBytes) {
      std::string joined;
      joined.reserve(total);
      for (int i = 0; i < count; ++i)
        joined.append(static_cast<const char*>(parts[i].iov_base), parts[i].iov_len);
      return writeTls(joined.data(), joined.size());
    }
    for (int i = 0; i < count; ++i) {
      if (!writeTls(static_cast<const char*>(parts[i].iov_base), parts[i].iov_len)) return false;
    }
    return true;
  }

  // Before the lingering close: TLS's close_notify, so that the client sees a clean end.
  void endWrites() {
    if (tls_) tls_->shutdown();
  }

 private:
  static constexpr std::size_t kCoalesceBytes = 16 * 1024;

  bool writeTls(const char* data, std::size_t size) {
    while (size > 0) {
      const ssize_t n = tls_->write(data, size);
      if (n <= 0) return false;
      data += n;
      size -= static_cast<std::size_t>(n);
    }
    return true;
  }

  const int fd_;
  std::optional<common::TlsStream> tls_;
};

// Closing a socket with unread request bytes makes the kernel answer with a reset instead of a
// FIN, which drops what of our response is still unsent, and some clients drop what they received.
// So we stop writing, and read and drop what the client still sends, for up to 5 s (nginx's
// lingering close). stop()'s shutdown ends the wait.
void lingeringClose(int fd) {
  ::shutdown(fd, SHUT_WR);
  timeval timeout{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char sink[64 * 1024];
  while (std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = recv(fd, sink, sizeof(sink), 0);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    break;
  }
}

enum class Framing { kNone, kLength, kChunked };

// One connection's requests, one at a time.
class Connection final : public HttpExchange {
 public:
  Connection(Transport& transport, const HttpServerOptions& options)
      : transport_(transport), options_(options) {}

  const HttpRequest& request() const override { return request_; }

  // Reads the next request's head. False: the connection ends (closed, idle, or malformed: then a
  // 400/431 was sent).
  bool readHead() {
    request_ = HttpRequest{};
    responded_ = false;
    body_unsent_ = 0;
    continue_sent_ = false;
    body_done_ = false;
    std::size_t end;
    std::size_t searched = 0;
    // Checked while the head is incomplete (memory) and once it is whole (it may come in one read).
    while ((end = buffer_.find("\r\n\r\n", searched)) == std::string::npos ||
           end > options_.max_header_bytes) {
      if (std::min(end, buffer_.size()) > options_.max_header_bytes) {
        return fail(431, fmt::format("the request line and headers exceed {} bytes",
                                     options_.max_header_bytes));
      }
      searched = buffer_.size() < 3 ? 0 : buffer_.size() - 3;
      if (!fill()) return false;
    }
    std::string_view head(buffer_.data(), end);
    const auto line_end = head.find("\r\n");
    std::string_view line = head.substr(0, line_end);
    const auto space1 = line.find(' ');
    const auto space2 = line.rfind(' ');
    if (space1 == std::string_view::npos || space2 == space1)
      return fail(400, "malformed request line");
    request_.method = std::string(line.substr(0, space1));
    const std::string_view target = line.substr(space1 + 1, space2 - space1 - 1);
    const std::string_view version = line.substr(space2 + 1);
    if (version == "HTTP/1.1") {
      request_.minor_version = 1;
    } else if (version == "HTTP/1.0") {
      request_.minor_version = 0;
    } else {
      return fail(400, fmt::format("unsupported protocol '{}'", version));
    }
    const auto question = target.find('?');
    request_.path = std::string(target.substr(0, question));
    if (question != std::string_view::npos)
      request_.query = std::string(target.substr(question + 1));
    std::string_view rest =
        line_end == std::string_view::npos ? std::string_view() : head.substr(line_end + 2);
    while (!rest.empty()) {
      const auto next = rest.find("\r\n");
      std::string_view field = rest.substr(0, next);
      rest = next == std::string_view::npos ? std::string_view() : rest.substr(next + 2);
      const auto colon = field.find(':');
      if (colon == std::string_view::npos || colon == 0) return fail(400, "malformed header line");
      request_.headers.emplace_back(lower(trim(field.substr(0, colon))),
                                    std::string(trim(field.substr(colon + 1))));
    }
    buffer_.erase(0, end + 4);

    const auto connection = lower(request_.header("connection").value_or(""));
    keep_alive_ = request_.minor_version == 1 ? connection.find("close") == std::string::npos
                                              : connection.find("keep-alive") != std::string::npos;
    expect_continue_ = request_.minor_version == 1 &&
                       lower(request_.header("expect").value_or("")) == "100-continue";
    framing_ = Framing::kNone;
    if (auto encoding = request_.header("transfer-encoding")) {
      if (lower(*encoding).find("chunked") == std::string::npos) {
        return fail(501, fmt::format("Transfer-Encoding '{}' is not supported", *encoding));
      }
      framing_ = Framing::kChunked;
      chunk_left_ = 0;
      chunk_started_ = false;
    } else if (auto length = request_.header("content-length")) {
      uint64_t value = 0;
      auto [ptr, ec] = std::from_chars(length->data(), length->data() + length->size(), value);
      if (ec != std::errc() || ptr != length->data() + length->size()) {
        return fail(400, fmt::format("Content-Length '{}' is not a number", *length));
      }
      framing_ = value > 0 ? Framing::kLength : Framing::kNone;
      body_left_ = value;
    }
    body_done_ = framing_ == Framing::kNone;
    return true;
  }

  std::expected<std::size_t, std::string> readBody(char* data, std::size_t size) override {
    if (body_done_ || size == 0) return 0;
    if (expect_continue_ && !continue_sent_) {
      continue_sent_ = true;
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      iovec part{const_cast<char*>(kContinue.data()), kContinue.size()};
      if (!transport_.send(&part, 1)) return std::unexpected("the client went away");
    }
    if (framing_ == Framing::kLength) {
      auto n = take(data, static_cast<std::size_t>(std::min<uint64_t>(size, body_left_)));
      if (!n) return n;
      body_left_ -= *n;
      if (body_left_ == 0) body_done_ = true;
      return n;
    }
    // Chunked: <hex size>[;ext]\r\n <data>\r\n ... 0\r\n [trailers] \r\n
    if (chunk_left_ == 0) {
      if (chunk_started_) {
        auto crlf = readLine();
        if (!crlf) return std::unexpected(crlf.error());
        if (!crlf->empty()) return std::unexpected("malformed chunked body: no CRLF after a chunk");
      }
      auto line = readLine();
      if (!line) return std::unexpected(line.error());
      const std::string_view digits = trim(std::string_view(*line).substr(0, line->find(';')));
      uint64_t chunk = 0;
      auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), chunk, 16);
      if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size()) {
        return std::unexpected(fmt::format("malformed chunked body: chunk size '{}'", digits));
      }
      chunk_started_ = true;
      if (chunk == 0) {
        for (;;) {  // trailers, up to the empty line
          auto trailer = readLine();
          if (!trailer) return std::unexpected(trailer.error());
          if (trailer->empty()) break;
        }
        body_done_ = true;
        return 0;
      }
      chunk_left_ = chunk;
    }
    auto n = take(data, static_cast<std::size_t>(std::min<uint64_t>(size, chunk_left_)));
    if (!n) return n;
    chunk_left_ -= *n;
    return n;
  }

  bool respond(int status, const HttpHeaders& headers, std::string_view body) override {
    if (!beginResponse(status, headers, body.size())) return false;
    return body.empty() || writeBody(body.data(), body.size());
  }

  bool beginResponse(int status, const HttpHeaders& headers, uint64_t content_length) override {
    if (responded_) return false;
    responded_ = true;
    // An unread body would be taken for the next request: the connection ends after this one.
    if (!body_done_) keep_alive_ = false;
    head_ = fmt::format("HTTP/1.1 {} {}\r\n", status, httpReasonPhrase(status));
    for (const auto& [name, value] : headers) head_ += fmt::format("{}: {}\r\n", name, value);
    head_ += fmt::format("Content-Length: {}\r\n", content_length);
    if (!keep_alive_) head_ += "Connection: close\r\n";
    head_ += "\r\n";
    head_pending_ = true;
    body_unsent_ = content_length;
    if (content_length == 0) return flushHead();
    return true;
  }

  // The head goes out with the first piece of the body, in one sendmsg.
  bool writeBody(const char* data, std::size_t size) override {
    if (!responded_ || size > body_unsent_) return false;
    body_unsent_ -= size;
    if (head_pending_) {
      head_pending_ = false;
      iovec parts[2] = {{head_.data(), head_.size()}, {const_cast<char*>(data), size}};
      return transport_.send(parts, size == 0 ? 1 : 2);
    }
    if (size == 0) return true;
    iovec part{const_cast<char*>(data), size};
    return transport_.send(&part, 1);
  }

  bool responded() const { return responded_; }
  // Not when a response ended short of its Content-Length: the peer would misread what follows.
  bool keepAlive() const { return keep_alive_ && body_unsent_ == 0; }
  // The connection ends with an answer sent and request bytes perhaps still coming.
  bool unreadInput() const { return answered_early_ || !body_done_; }

  // A request that answered 4xx/5xx before reading its body, or whose handler sent nothing.
  bool fail(int status, const std::string& message) {
    keep_alive_ = false;
    if (!responded_) {
      answered_early_ = true;
      // The message may quote what the client sent: JSON-escaped.
      const std::string body =
          nlohmann::json{{"error", "BAD_HTTP_REQUEST"}, {"message", message}}.dump(
              -1, ' ', false, nlohmann::json::error_handler_t::replace) +
          "\n";
      respond(status, {{"Content-Type", "application/json; charset=utf-8"}}, body);
    }
    return false;
  }

 private:
  bool flushHead() {
    head_pending_ = false;
    iovec part{head_.data(), head_.size()};
    return transport_.send(&part, 1);
  }

  // More bytes into buffer_. False: closed, timed out or failed.
  bool fill() {
    char chunk[64 * 1024];
    const ssize_t n = transport_.receive(chunk, sizeof(chunk));
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<std::size_t>(n));
    return true;
  }

  // Body bytes: first what the head's read brought along, then straight from the socket.
  std::expected<std::size_t, std::string> take(char* data, std::size_t size) {
    if (!buffer_.empty()) {
      const std::size_t n = std::min(size, buffer_.size());
      std::memcpy(data, buffer_.data(), n);
      buffer_.erase(0, n);
      return n;
    }
    const ssize_t n = transport_.receive(data, size);
    if (n > 0) return static_cast<std::size_t>(n);
    return std::unexpected(
        n == 0 ? std::string("the client closed the connection before the end of the body")
               : fmt::format("reading the body: {}", std::strerror(errno)));
  }

  std::expected<std::string, std::string> readLine() {
    std::size_t end;
    while ((end = buffer_.find("\r\n")) == std::string::npos) {
      if (buffer_.size() > 4096)
        return std::unexpected("malformed chunked body: a line over 4 KiB");
      if (!fill())
        return std::unexpected("the client closed the connection before the end of the body");
    }
    std::string line = buffer_.substr(0, end);
    buffer_.erase(0, end + 2);
    return line;
  }

  Transport& transport_;
  const HttpServerOptions& options_;
  std::string buffer_;
  HttpRequest request_;
  Framing framing_ = Framing::kNone;
  uint64_t body_left_ = 0;
  uint64_t chunk_left_ = 0;
  bool chunk_started_ = false;
  bool body_done_ = true;
  bool keep_alive_ = true;
  bool expect_continue_ = false;
  bool continue_sent_ = false;
  bool responded_ = false;
  bool head_pending_ = false;
  bool answered_early_ = false;
  uint64_t body_unsent_ = 0;
  std::string head_;
};

}  // namespace

std::optional<std::string> HttpRequest::header(std::string_view name) const {
  const std::string wanted = lower(name);
  for (const auto& [stored, value] : headers) {
    if (stored == wanted) return value;
  }
  return std::nullopt;
}

std::string_view httpReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 507:
      return "Insufficient Storage";
  }
  return "Unknown";
}

namespace {

// One connection's requests, each handed to `handler`, until the connection ends.
void serveOn(Transport& transport, int fd, const HttpServer::Handler& handler,
             const HttpServerOptions& options) {
  Connection connection(transport, options);
  while (connection.readHead()) {
    handler(connection);
    if (!connection.responded()) connection.fail(500, "the request got no response");
    if (!connection.keepAlive()) break;
  }
  transport.endWrites();
  if (connection.unreadInput()) lingeringClose(fd);
}

}  // namespace

class HttpServer::Impl : public std::enable_shared_from_this<HttpServer::Impl> {
 public:
  Impl(int listen_fd, uint16_t port, Handler handler, HttpServerOptions options)
      : listen_fd_(listen_fd), port_(port), handler_(std::move(handler)), options_(options) {}

  void run() {
    acceptor_ = std::thread([self = shared_from_this()] { self->acceptLoop(); });
  }

  void stop() {
    std::unique_lock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    // shutdown() wakes the blocked accept() and every blocked recv()/send().
    ::shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    lock.unlock();
    if (acceptor_.joinable()) acceptor_.join();
    lock.lock();
    ended_.wait(lock, [this] { return connections_.empty(); });
    ::close(listen_fd_);
  }

  uint16_t port() const { return port_; }

 private:
  void acceptLoop() {
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        {
          std::lock_guard lock(mu_);
          if (stopped_) return;
        }
        // EMFILE and the like: let connections end, then accept again.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      timeval timeout{static_cast<time_t>(options_.socket_timeout.count()), 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
      std::unique_lock lock(mu_);
      if (stopped_) {
        ::close(fd);
        return;
      }
      if (connections_.size() >= options_.max_connections) {
        lock.unlock();
        // A TLS client would read a plain answer as garbage: it only sees the connection close.
        if (!options_.tls) {
          Transport transport(fd);
          Connection refused(transport, options_);
          refused.fail(503, "too many connections");
        }
        ::close(fd);
        continue;
      }
      connections_.insert(fd);
      lock.unlock();
      std::thread([self = shared_from_this(), fd] { self->serve(fd); }).detach();
    }
  }

  void serve(int fd) {
    if (auto transport = open(fd)) serveOn(*transport, fd, handler_, options_);
    std::lock_guard lock(mu_);
    connections_.erase(fd);
    ::close(fd);
    ended_.notify_all();
  }

  // The connection's transport; nullopt when its TLS handshake failed (a plain-HTTP client, an
  // untrusted or timed-out one): the connection closes.
  std::optional<Transport> open(int fd) {
    if (!options_.tls) return std::optional<Transport>(std::in_place, fd);
    auto stream = common::TlsStream::open(*options_.tls, fd);
    if (!stream) {
      spdlog::warn("TLS: {}", stream.error());
      return std::nullopt;
    }
    if (stream->accept() != 1) {
      spdlog::debug("TLS: a connection closed without a handshake: {}", stream->error());
      return std::nullopt;
    }
    return std::optional<Transport>(std::in_place, fd, std::move(*stream));
  }

  const int listen_fd_;
  const uint16_t port_;
  const Handler handler_;
  const HttpServerOptions options_;
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable ended_;
  std::set<int> connections_;
  bool stopped_ = false;
};

void serveHttpConnection(int fd, const HttpServer::Handler& handler,
                         const HttpServerOptions& options) {
  Transport transport(fd);
  serveOn(transport, fd, handler, options);
}

std::expected<std::unique_ptr<HttpServer>, std::string> HttpServer::start(
    const std::string& address, uint16_t port, Handler handler, HttpServerOptions options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(address.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return std::unexpected(
        fmt::format("cannot listen on {}:{}: {}", address, port, gai_strerror(rc)));
  }
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* ai = found; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
    last_error = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0)
    return std::unexpected(fmt::format("cannot listen on {}:{}: {}", address, port, last_error));
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const uint16_t actual =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  auto impl = std::make_shared<Impl>(fd, actual, std::move(handler), options);
  impl->run();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  stop();
}

uint16_t HttpServer::port() const {
  return impl_->port();
}

void HttpServer::stop() {
  impl_->stop();
}

}  // namespace rtable::core
