// A loopback HTTP/1.1 server for HttpKubeClient's unit tests: binds port 0, records every
// request and answers with raw bytes chosen by the test, written in the pieces the test gives
// (to split chunked watch streams at chosen places). Not a general server: enough for one client.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rtable::op::test {

struct RecordedRequest {
  std::string method;
  std::string target;                          // path and query, as sent
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  bool complete = true;  // false: the connection was reset before the body was read

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// One write of the answer; `pause` is waited before writing. `hold_open` keeps the connection
// open after the last piece until the server stops or the client goes away; `close_after` closes
// it (without a Connection: close header, so the client still pools it): with no pieces, the
// request gets no answer at all.
struct Piece {
  std::string bytes;
  std::chrono::milliseconds pause{0};
};
struct Answer {
  std::vector<Piece> pieces;
  bool hold_open = false;
  bool close_after = false;
};

inline Answer simpleAnswer(int code, const std::string& body,
                           const std::vector<std::string>& extra_headers = {}) {
  std::string head =
      "HTTP/1.1 " + std::to_string(code) + " X\r\nContent-Type: application/json\r\n";
  for (const auto& h : extra_headers) head += h + "\r\n";
  head += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  return Answer{{Piece{head + body}}, false};
}

inline std::string chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

class ScriptedHttpServer {
 public:
  using Handler = std::function<Answer(const RecordedRequest&)>;

  explicit ScriptedHttpServer(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(listen_fd_, 16);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { acceptLoop(); });
  }

  ~ScriptedHttpServer() { stop(); }

  void stop() {
    if (stopping_.exchange(true)) return;
    ::shutdown(listen_fd_, SHUT_RDWR);
    {
      std::lock_guard lock(mu_);
      for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    accept_thread_.join();
    for (auto& t : connection_threads_) t.join();
    ::close(listen_fd_);
  }

  int port() const { return port_; }

  // The next `n` requests with a body are answered by a TCP reset as soon as their headers are
  // read: the client fails while writing the body (when it is larger than the socket buffers).
  void resetBeforeBody(int n) { reset_before_body_.store(n); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::vector<RecordedRequest> requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }

  // Waits until `n` requests arrived (5 s at most).
  bool waitForRequests(std::size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return requests_.size() >= n; });
  }

 private:
  void acceptLoop() {
    while (!stopping_) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::lock_guard lock(mu_);
      connections_.push_back(fd);
      connection_threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  bool readMore(int fd, std::string& buffer) {
    char data[4096];
    const ssize_t n = ::recv(fd, data, sizeof(data), 0);
    if (n <= 0) return false;
    buffer.append(data, static_cast<std::size_t>(n));
    return true;
  }

  void serve(int fd) {
    std::string buffer;
    while (!stopping_) {
      std::size_t end;
      while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
        if (!readMore(fd, buffer)) return finish(fd);
      }
      RecordedRequest request;
      std::string head = buffer.substr(0, end);
      buffer.erase(0, end + 4);
      std::size_t line_end = head.find("\r\n");
      const std::string request_line = head.substr(0, line_end);
      const std::size_t sp1 = request_line.find(' ');
      const std::size_t sp2 = request_line.find(' ', sp1 + 1);
      request.method = request_line.substr(0, sp1);
      request.target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
      while (line_end != std::string::npos) {
        const std::size_t next = head.find("\r\n", line_end + 2);
        const std::string line = head.substr(
            line_end + 2, next == std::string::npos ? std::string::npos : next - line_end - 2);
        const std::size_t colon = line.find(':');
        if (colon != std::string::npos) {
          std::string name = line.substr(0, colon);
          std::transform(name.begin(), name.end(), name.begin(),
                         [](unsigned char c) { return std::tolower(c); });
          std::string value = line.substr(colon + 1);
          while (!value.empty() && value.front() == ' ') value.erase(0, 1);
          request.headers[name] = value;
        }
        line_end = next;
      }
      const std::size_t length = request.headers.contains("content-length")
                                     ? std::stoul(request.headers["content-length"])
                                     : 0;
      if (length > 0 && reset_before_body_.load() > 0) {
        reset_before_body_.fetch_sub(1);
        request.complete = false;
        {
          std::lock_guard lock(mu_);
          requests_.push_back(request);
        }
        cv_.notify_all();
        const linger reset{1, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
        return finish(fd);
      }
      while (buffer.size() < length) {
        if (!readMore(fd, buffer)) return finish(fd);
      }
      request.body = buffer.substr(0, length);
      buffer.erase(0, length);
      {
        std::lock_guard lock(mu_);
        requests_.push_back(request);
      }
      cv_.notify_all();
      const Answer answer = handler_(request);
      for (const auto& piece : answer.pieces) {
        if (piece.pause.count() > 0) std::this_thread::sleep_for(piece.pause);
        if (::send(fd, piece.bytes.data(), piece.bytes.size(), MSG_NOSIGNAL) < 0) return finish(fd);
      }
      if (answer.close_after) return finish(fd);
      if (answer.hold_open) {
        // Until the client closes (recv returns 0) or the server stops.
        char c;
        while (!stopping_ && ::recv(fd, &c, 1, 0) > 0) {
        }
        return finish(fd);
      }
    }
    finish(fd);
  }

  void finish(int fd) {
    std::lock_guard lock(mu_);
    connections_.erase(std::remove(connections_.begin(), connections_.end(), fd),
                       connections_.end());
    ::close(fd);
  }

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> reset_before_body_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> connections_;
  std::vector<RecordedRequest> requests_;
  std::thread accept_thread_;
  std::vector<std::thread> connection_threads_;
};

}  // namespace rtable::op::test
