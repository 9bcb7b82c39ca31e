// A blocking HTTP/1.1 GET over loopback for tests of the probe and metrics servers: one request
// per connection (Connection: close), the whole answer read until the server closes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>

namespace rtable::op::test {

struct HttpAnswer {
  int status = 0;
  std::string headers;
  std::string body;
};

// nullopt when nothing answered within `timeout`.
inline std::optional<HttpAnswer> httpGet(
    int port, const std::string& path,
    std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  const std::string request = "GET " + path +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                              "Accept: */*\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return std::nullopt;
  }
  std::string raw;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::close(fd);
      return std::nullopt;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    raw.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const auto head_end = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.1 ") != 0 && raw.compare(0, 9, "HTTP/1.0 ") != 0) {
    return std::nullopt;
  }
  if (head_end == std::string::npos) return std::nullopt;
  HttpAnswer answer;
  answer.status = std::atoi(raw.c_str() + 9);
  answer.headers = raw.substr(0, head_end);
  answer.body = raw.substr(head_end + 4);
  // A chunked body (civetweb may send one): join the chunks.
  if (answer.headers.find("Transfer-Encoding: chunked") != std::string::npos ||
      answer.headers.find("transfer-encoding: chunked") != std::string::npos) {
    std::string joined;
    std::size_t pos = 0;
    while (pos < answer.body.size()) {
      const auto line_end = answer.body.find("\r\n", pos);
      if (line_end == std::string::npos) break;
      const std::size_t size = std::strtoul(answer.body.c_str() + pos, nullptr, 16);
      if (size == 0) break;
      joined += answer.body.substr(line_end + 2, size);
      pos = line_end + 2 + size + 2;
    }
    answer.body = std::move(joined);
  }
  return answer;
}

}  // namespace rtable::op::test
