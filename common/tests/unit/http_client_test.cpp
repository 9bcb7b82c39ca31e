// The test HTTP client against a one-shot local server that answers with canned bytes: bodies
// framed by Content-Length and by chunks (Prometheus' API streams its answers).
#include "rtable/common/testing/http_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "rtable/common/testing/subprocess.h"

namespace rtable::common::testing {
namespace {

// Accepts one connection on a loopback port, reads the request head, writes `answer`, closes.
class OneShotServer {
 public:
  explicit OneShotServer(std::string answer) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(fd_, 1), 0);
    socklen_t length = sizeof(address);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this, answer = std::move(answer)] {
      const int connection = ::accept(fd_, nullptr, nullptr);
      if (connection < 0) return;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(connection, buffer, sizeof(buffer), 0);
        if (n <= 0) break;
        request.append(buffer, static_cast<std::size_t>(n));
      }
      (void)::send(connection, answer.data(), answer.size(), MSG_NOSIGNAL);
      ::close(connection);
    });
  }
  ~OneShotServer() {
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(HttpRequest, ReadsABodyOfContentLength) {
  OneShotServer server("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
  auto answer = httpRequest("127.0.0.1", server.port(), "GET", "/");
  ASSERT_TRUE(answer) << answer.error();
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "hello");
}

TEST(HttpRequest, DecodesAChunkedBody) {
  OneShotServer server(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n7;ext=1\r\n, world\r\n9\r\n {\"a\":1}\n\r\n0\r\n\r\n");
  auto answer = httpRequest("127.0.0.1", server.port(), "GET", "/api/v1/targets");
  ASSERT_TRUE(answer) << answer.error();
  EXPECT_EQ(answer->body, "hello, world {\"a\":1}\n");
}

TEST(HttpRequest, AChunkedBodyWithoutItsLastChunkIsCutShort) {
  OneShotServer server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  auto answer = httpRequest("127.0.0.1", server.port(), "GET", "/");
  ASSERT_FALSE(answer);
  EXPECT_NE(answer.error().find("cut short"), std::string::npos) << answer.error();
}

// Test servers get ports the kernel never hands out as the local end of an outgoing connection,
// so one restarted on its old port finds it free (findFreeLoopbackPort).
TEST(FindFreeLoopbackPort, GivesBindablePortsBelowTheEphemeralRange) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int ephemeral_start = 0;
  ASSERT_TRUE(range >> ephemeral_start);
  std::set<int> ports;
  for (int i = 0; i < 20; ++i) {
    auto port = findFreeLoopbackPort();
    ASSERT_TRUE(port) << port.error();
    EXPECT_GE(*port, 10000);
    EXPECT_LT(*port, ephemeral_start);
    ports.insert(*port);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(*port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << *port;
    ::close(fd);
  }
  EXPECT_GT(ports.size(), 15u);  // picked at random, not the same few
}

}  // namespace
}  // namespace rtable::common::testing
