// ProbeServer over loopback: controller-runtime's healthz answers (200 "ok", 503 with one line per
// check naming the failing one, ?verbose, a single check by path), port 0 resolved to the port
// really bound, a port in use as a start-up error; and the bind-address forms of the flags.
#include "rtable/operator/probe_server.h"

#include <gtest/gtest.h>

#include <atomic>

#include "http_get.h"

namespace rtable::op {
namespace {

using test::httpGet;

TEST(BindAddressTest, AcceptsTheFormsControllerRuntimeTakes) {
  auto any = parseBindAddress(":8081");
  ASSERT_TRUE(any) << any.error();
  EXPECT_EQ(any->host, "0.0.0.0");
  EXPECT_EQ(any->port, 8081);
  EXPECT_FALSE(any->disabled);
  auto loopback = parseBindAddress("127.0.0.1:0");
  ASSERT_TRUE(loopback);
  EXPECT_EQ(loopback->toString(), "127.0.0.1:0");
  auto v6 = parseBindAddress("[::1]:9090");
  ASSERT_TRUE(v6) << v6.error();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->toString(), "[::1]:9090");
  EXPECT_EQ(parseBindAddress("localhost:1")->host, "127.0.0.1");
  EXPECT_TRUE(parseBindAddress("0")->disabled);
  EXPECT_FALSE(parseBindAddress("8080"));
  EXPECT_FALSE(parseBindAddress(":http"));
  EXPECT_FALSE(parseBindAddress(":70000"));
  EXPECT_FALSE(parseBindAddress("example.com:80"));
}

class ProbeServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<ProbeServer> start() {
    std::vector<NamedCheck> healthz{{"ping", [] { return std::expected<void, std::string>(); }}};
    std::vector<NamedCheck> readyz{{"apiserver", [] { return std::expected<void, std::string>(); }},
                                   {"informers", [this]() -> std::expected<void, std::string> {
                                      if (synced_.load()) return {};
                                      return std::unexpected(std::string("not synced: configmaps"));
                                    }}};
    auto server = ProbeServer::start(*parseBindAddress("127.0.0.1:0"), healthz, readyz);
    EXPECT_TRUE(server) << server.error();
    return server ? std::move(*server) : nullptr;
  }
  std::atomic<bool> synced_{false};
};

TEST_F(ProbeServerTest, PortZeroIsResolvedToTheBoundPort) {
  auto server = start();
  ASSERT_TRUE(server);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
  auto answer = httpGet(server->port(), "/healthz");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "ok");
}

TEST_F(ProbeServerTest, AFailingCheckIsNamedWith503) {
  auto server = start();
  ASSERT_TRUE(server);
  auto answer = httpGet(server->port(), "/readyz");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 503);
  EXPECT_EQ(answer->body,
            "[+]apiserver ok\n[-]informers failed: not synced: configmaps\nreadyz check failed\n");
  // Liveness does not depend on readiness.
  EXPECT_EQ(httpGet(server->port(), "/healthz")->status, 200);
  // One check alone.
  EXPECT_EQ(httpGet(server->port(), "/readyz/apiserver")->status, 200);
  auto one = httpGet(server->port(), "/readyz/informers");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 503);
  EXPECT_EQ(one->body, "[-]informers failed: not synced: configmaps\n");

  synced_ = true;
  answer = httpGet(server->port(), "/readyz");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "ok");
  answer = httpGet(server->port(), "/readyz?verbose");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->body, "[+]apiserver ok\n[+]informers ok\nreadyz check passed\n");
}

TEST_F(ProbeServerTest, UnknownPathsAre404) {
  auto server = start();
  ASSERT_TRUE(server);
  EXPECT_EQ(httpGet(server->port(), "/metrics")->status, 404);
  EXPECT_EQ(httpGet(server->port(), "/readyz/nosuchcheck")->status, 404);
}

TEST_F(ProbeServerTest, APortInUseIsAnError) {
  auto first = start();
  ASSERT_TRUE(first);
  auto second = ProbeServer::start(*parseBindAddress(first->address()), {}, {});
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().find(first->address()), std::string::npos) << second.error();
}

}  // namespace
}  // namespace rtable::op
