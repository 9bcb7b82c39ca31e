#include "rtable/replication_core/http_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/tls_certificates.h"

namespace rtable::core {
namespace {

// A raw client: what it sends is exactly what the test writes.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval timeout{10, 0};  // a missing answer fails the test instead of hanging it
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }

  void send(std::string_view text) {
    ASSERT_EQ(::send(fd_, text.data(), text.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(text.size()));
  }

  // Everything up to and including `marker`; "" on timeout or close.
  std::string readUntil(std::string_view marker) {
    std::size_t at;
    while ((at = buffer_.find(marker)) == std::string::npos) {
      char chunk[4096];
      const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
    std::string out = buffer_.substr(0, at + marker.size());
    buffer_.erase(0, at + marker.size());
    return out;
  }

  // One response: head and a Content-Length body.
  std::pair<std::string, std::string> response() {
    std::string head = readUntil("\r\n\r\n");
    const auto at = head.find("Content-Length: ");
    if (at == std::string::npos) return {head, ""};
    const std::size_t length = std::stoul(head.substr(at + 16));
    while (buffer_.size() < length) {
      char chunk[4096];
      const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) break;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
    std::string body = buffer_.substr(0, length);
    buffer_.erase(0, body.size());
    return {head, body};
  }

  // The socket's own send, for a test that sends after the server answered.
  ssize_t sendRaw(std::string_view text) {
    return ::send(fd_, text.data(), text.size(), MSG_NOSIGNAL);
  }
  void shutdownWrite() { ::shutdown(fd_, SHUT_WR); }
  // What recv says once the buffered bytes are read: 0 for a FIN, -1 (errno) for a reset.
  ssize_t endOfStream(int* error) {
    char c;
    const ssize_t n = recv(fd_, &c, 1, 0);
    *error = errno;
    return n;
  }

  bool closedByPeer() {
    char c;
    return buffer_.empty() && recv(fd_, &c, 1, 0) == 0;
  }

 private:
  int fd_;
  bool connected_ = false;
  std::string buffer_;
};

// Echoes the method, path, query and body it read.
void echo(HttpExchange& exchange) {
  std::string body;
  char chunk[7];  // small reads cross chunk boundaries
  for (;;) {
    auto n = exchange.readBody(chunk, sizeof(chunk));
    if (!n) {
      exchange.respond(400, {}, n.error());
      return;
    }
    if (*n == 0) break;
    body.append(chunk, *n);
  }
  const auto& request = exchange.request();
  exchange.respond(200, {{"Content-Type", "text/plain"}},
                   fmt::format("{} {} {} [{}]", request.method, request.path, request.query, body));
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(HttpServer::Handler handler = echo, HttpServerOptions options = {}) {
    auto started = HttpServer::start("127.0.0.1", 0, std::move(handler), options);
    ASSERT_TRUE(started) << started.error();
    server_ = std::move(*started);
  }
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, KeepAliveServesRequestsInTurnOnOneConnection) {
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.connected());
  client.send("POST /insert?format=TSV HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  auto [head, body] = client.response();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_EQ(head.find("Connection: close"), std::string::npos);
  EXPECT_EQ(body, "POST /insert format=TSV [hello]");
  client.send("GET /count HTTP/1.1\r\nHost: x\r\n\r\n");
  auto second = client.response();
  EXPECT_EQ(second.second, "GET /count  []");
}

TEST_F(HttpServerTest, HeaderNamesMatchInAnyCase) {
  start([](HttpExchange& exchange) {
    const auto& request = exchange.request();
    exchange.respond(200, {},
                     fmt::format("{}|{}", request.header("X-RTable-Secret").value_or("-"),
                                 request.header("x-rtable-secret").value_or("-")));
  });
  RawClient client(server_->port());
  client.send("GET /a HTTP/1.1\r\nx-RTABLE-secret: s3\r\n\r\n");
  EXPECT_EQ(client.response().second, "s3|s3");
}

TEST_F(HttpServerTest, ExpectContinueGetsTheInterimAnswerBeforeTheBodyIsSent) {
  start();
  RawClient client(server_->port());
  client.send(
      "POST /insert HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
  // curl waits for this line (a second by default) before it sends a body over 1 MiB.
  EXPECT_EQ(client.readUntil("\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  client.send("abc");
  EXPECT_EQ(client.response().second, "POST /insert  [abc]");
}

TEST_F(HttpServerTest, AChunkedBodyIsDecoded) {
  start();
  RawClient client(server_->port());
  client.send(
      "POST /insert HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\n");
  EXPECT_EQ(client.response().second, "POST /insert  [Wikipedia in\r\n\r\nchunks.]");
  // The connection is still usable: the whole chunked body was consumed.
  client.send("GET /x HTTP/1.1\r\n\r\n");
  EXPECT_EQ(client.response().second, "GET /x  []");
}

TEST_F(HttpServerTest, AMalformedChunkIsAnErrorForTheHandler) {
  start();
  RawClient client(server_->port());
  client.send("POST /insert HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
  auto [head, body] = client.response();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 400 ")) << head;
  EXPECT_NE(body.find("chunk size 'zz'"), std::string::npos) << body;
  EXPECT_NE(head.find("Connection: close"), std::string::npos);
}

TEST_F(HttpServerTest, ABadContentLengthIsRefusedAndTheConnectionClosed) {
  std::atomic<int> handled{0};
  start([&](HttpExchange& exchange) {
    ++handled;
    exchange.respond(200, {}, "");
  });
  RawClient client(server_->port());
  client.send("POST /insert HTTP/1.1\r\nContent-Length: 12\"x\r\n\r\n");
  auto [head, body] = client.response();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 400 Bad Request")) << head;
  // The client's bytes are quoted in the message, escaped: the body stays JSON.
  auto parsed = nlohmann::json::parse(body, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << body;
  EXPECT_EQ(parsed["message"], "Content-Length '12\"x' is not a number");
  EXPECT_TRUE(client.closedByPeer());
  EXPECT_EQ(handled, 0);
}

TEST_F(HttpServerTest, AnAnswerBeforeTheBodyWasReadClosesTheConnection) {
  start([](HttpExchange& exchange) { exchange.respond(404, {}, "no"); });
  RawClient client(server_->port());
  client.send("POST /nothing HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789");
  auto [head, body] = client.response();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 404 Not Found")) << head;
  // The unread body would otherwise be read as the next request.
  EXPECT_NE(head.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(client.closedByPeer());
}

TEST_F(HttpServerTest, AnEarlyAnswerIsFollowedByAnOrderlyCloseNotAReset) {
  // Bad input found in the first bytes of a large body: the answer comes while the client still
  // sends. Closing with its bytes unread would reset the connection under the answer.
  start([](HttpExchange& exchange) {
    char c;
    ASSERT_TRUE(exchange.readBody(&c, 1));
    exchange.respond(400, {}, "row 1 is bad");
  });
  RawClient client(server_->port());
  const std::string part(64 * 1024, 'x');
  client.send("POST /insert HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n" + part);
  auto [head, body] = client.response();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 400 ")) << head;
  EXPECT_EQ(body, "row 1 is bad");
  EXPECT_EQ(client.sendRaw(part), static_cast<ssize_t>(part.size()));  // still taken
  client.shutdownWrite();
  int error = 0;
  EXPECT_EQ(client.endOfStream(&error), 0) << std::strerror(error);
}

TEST_F(HttpServerTest, AStreamedResponseArrivesWhole) {
  start([](HttpExchange& exchange) {
    ASSERT_TRUE(
        exchange.beginResponse(200, {{"Content-Type", "application/octet-stream"}}, 300000));
    const std::string piece(1000, 'x');
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(exchange.writeBody(piece.data(), piece.size()));
  });
  RawClient client(server_->port());
  client.send("GET /replication/part?name=all_0_0_0 HTTP/1.1\r\n\r\n");
  auto [head, body] = client.response();
  EXPECT_NE(head.find("Content-Length: 300000"), std::string::npos) << head;
  EXPECT_EQ(body, std::string(300000, 'x'));
}

TEST_F(HttpServerTest, AResponseCutShortEndsTheConnection) {
  start([](HttpExchange& exchange) {
    ASSERT_TRUE(exchange.beginResponse(200, {}, 10));
    ASSERT_TRUE(exchange.writeBody("01234", 5));
    EXPECT_FALSE(exchange.writeBody("567890", 6));  // more than promised
  });
  RawClient client(server_->port());
  client.send("GET /a HTTP/1.1\r\n\r\n");
  EXPECT_NE(client.readUntil("\r\n\r\n").find("Content-Length: 10"), std::string::npos);
  EXPECT_EQ(client.readUntil("01234"), "01234");
  EXPECT_TRUE(client.closedByPeer());
}

TEST_F(HttpServerTest, Http10ClosesUnlessAskedToKeepAlive) {
  start();
  RawClient client(server_->port());
  client.send("GET /a HTTP/1.0\r\n\r\n");
  auto [head, body] = client.response();
  EXPECT_NE(head.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(client.closedByPeer());
}

TEST_F(HttpServerTest, StopEndsIdleAndBusyConnections) {
  std::atomic<bool> reading{false};
  start([&](HttpExchange& exchange) {
    if (exchange.request().method == "GET") return;
    reading = true;
    char c;
    auto n = exchange.readBody(&c, 1);  // the body never comes
    EXPECT_FALSE(n);
  });
  RawClient idle(server_->port());
  RawClient busy(server_->port());
  idle.send("GET /a HTTP/1.1\r\n\r\n");
  busy.send("POST /insert HTTP/1.1\r\nContent-Length: 10\r\n\r\n");
  EXPECT_EQ(idle.response().first.substr(0, 12), "HTTP/1.1 500");  // the handler answered nothing
  while (!reading) std::this_thread::yield();
  server_->stop();
  EXPECT_TRUE(busy.closedByPeer());
}

TEST_F(HttpServerTest, AHeadOverTheLimitIsRefused) {
  HttpServerOptions options;
  options.max_header_bytes = 1024;
  start(echo, options);
  RawClient client(server_->port());
  client.send("GET /a HTTP/1.1\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  auto [head, body] = client.response();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 431 ")) << head;
}

}  // namespace
}  // namespace rtable::core

namespace rtable::core {
namespace {

// With a TLS context the server speaks HTTPS only: a body larger than a TLS record both ways, a
// chunked request body, and a plain-HTTP client that gets no answer while the server goes on.
TEST_F(HttpServerTest, WithTlsItServesHttpsOnly) {
  char pattern[] = "/tmp/rtable-http-tls-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::filesystem::path dir = pattern;
  auto made = common::testing::makeTestCertificates(dir, {"127.0.0.1"});
  ASSERT_TRUE(made) << made.error();
  auto server_tls = common::TlsContext::load(common::TlsContext::Side::kServer,
                                             common::TlsFiles::inDirectory(dir));
  auto client_tls = common::TlsContext::load(common::TlsContext::Side::kClient,
                                             common::TlsFiles::inDirectory(dir));
  ASSERT_TRUE(server_tls && client_tls);
  HttpServerOptions options;
  options.tls = *server_tls;
  start(echo, options);

  const std::string big(100'000, 'x');
  auto answer = common::testing::httpsRequest(**client_tls, "127.0.0.1", server_->port(), "POST",
                                              "/insert?format=TSV", big);
  ASSERT_TRUE(answer) << answer.error();
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "POST /insert format=TSV [" + big + "]");

  RawClient plain(server_->port());
  ASSERT_TRUE(plain.connected());
  plain.send("GET /count HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(plain.readUntil("\r\n\r\n"), "") << "a plain request got an answer";

  answer = common::testing::httpsRequest(
      **client_tls, "127.0.0.1", server_->port(), "POST", "/insert", "5\r\nhello\r\n0\r\n\r\n",
      std::chrono::seconds(10), "Transfer-Encoding: chunked\r\n");
  // The client sends Content-Length too; the server takes chunked framing over it (RFC 9112 6.3).
  ASSERT_TRUE(answer) << answer.error();
  EXPECT_EQ(answer->body, "POST /insert  [hello]");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rtable::core
