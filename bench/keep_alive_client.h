// The benchmarks' HTTP client (bench/): keep-alive, one write per request, TCP_NODELAY.
#pragma once

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <string>
#include <string_view>

namespace rtable::bench {

// A keep-alive HTTP/1.1 client that sends each request in one write with TCP_NODELAY, so that
// neither server is measured through Nagle/delayed-ACK stalls of the client.
class KeepAliveClient {
 public:
  KeepAliveClient(std::string name, int port, std::string insert_path)
      : name_(std::move(name)), port_(port), insert_path_(std::move(insert_path)) {}
  ~KeepAliveClient() {
    if (fd_ >= 0) close(fd_);
  }
  const std::string& name() const { return name_; }
  // The last answer's status and body (0: no answer).
  int lastStatus() const { return last_status_; }
  const std::string& lastBody() const { return last_body_; }
  // Non-200 answers are not printed (many clients: the caller counts them).
  void setQuiet(bool quiet) { quiet_ = quiet; }
  // A fresh connection: the server may have closed an idle keep-alive one.
  void reconnect() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    buffer_.clear();
  }

  bool post(const std::string& body) {
    last_status_ = 0;
    last_body_.clear();
    if (fd_ < 0 && !connectSocket()) return false;
    const std::string head = fmt::format(
        "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: "
        "keep-alive\r\n\r\n",
        insert_path_, body.size());
    // Head and body as they are: a copy of an 83 MB body into one request string cost the
    // client tens of milliseconds inside the timed insert, the same for both servers.
    if (!sendAll(head, MSG_MORE) || !sendAll(body, 0)) return fail("send failed");
    // Status line and headers, then a Content-Length body or a chunked one.
    std::size_t header_end;
    while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!readMore()) return fail("connection closed");
    }
    const std::string headers = buffer_.substr(0, header_end);
    buffer_.erase(0, header_end + 4);
    int status = 0;
    std::sscanf(headers.c_str(), "HTTP/1.%*d %d", &status);
    std::string lower = headers;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string body_text;
    if (auto at = lower.find("content-length:"); at != std::string::npos) {
      const std::size_t length = std::stoul(lower.substr(at + 15));
      while (buffer_.size() < length) {
        if (!readMore()) return fail("body cut short");
      }
      body_text = buffer_.substr(0, length);
      buffer_.erase(0, length);
    } else if (lower.find("transfer-encoding: chunked") != std::string::npos) {
      for (;;) {
        std::size_t line_end;
        while ((line_end = buffer_.find("\r\n")) == std::string::npos) {
          if (!readMore()) return fail("chunk cut short");
        }
        const std::size_t size = std::stoul(buffer_.substr(0, line_end), nullptr, 16);
        while (buffer_.size() < line_end + 2 + size + 2) {
          if (!readMore()) return fail("chunk cut short");
        }
        body_text += buffer_.substr(line_end + 2, size);
        buffer_.erase(0, line_end + 2 + size + 2);
        if (size == 0) break;
      }
    }
    last_status_ = status;
    last_body_ = std::move(body_text);
    if (status != 200) {
      if (!quiet_) fmt::print(stderr, "{}: HTTP {} {}\n", name_, status, last_body_);
      return false;
    }
    return true;
  }

 private:
  bool sendAll(std::string_view bytes, int flags) {
    for (std::size_t sent = 0; sent < bytes.size();) {
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | flags);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }
  bool connectSocket() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    return connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ||
           fail("connect failed");
  }
  bool readMore() {
    char chunk[65536];
    const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<std::size_t>(n));
    return true;
  }
  bool fail(const char* what) {
    if (!quiet_) fmt::print(stderr, "{}: {}\n", name_, what);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    buffer_.clear();
    return false;
  }

  std::string name_;
  int port_;
  std::string insert_path_;
  int fd_ = -1;
  std::string buffer_;
  int last_status_ = 0;
  std::string last_body_;
  bool quiet_ = false;
};

}  // namespace rtable::bench
