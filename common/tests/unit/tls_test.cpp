// TlsContext and TlsStream with certificates the openssl tool makes (cert-manager's layout): what
// loads and what is refused with a message naming the file, whom a client trusts, and a renewed
// certificate served without a restart. Handshakes run over a socketpair, server on a thread.
#include "rtable/common/tls.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "rtable/common/testing/tls_certificates.h"

namespace rtable::common {
namespace {

namespace fs = std::filesystem;
using testing::makeTestCertificates;

class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-tls-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    auto made = makeTestCertificates(dir_ / "replica", {"replica.example", "127.0.0.1"});
    ASSERT_TRUE(made) << made.error();
    made = makeTestCertificates(dir_ / "stranger", {"replica.example", "127.0.0.1"});
    ASSERT_TRUE(made) << made.error();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::shared_ptr<TlsContext> load(
      TlsContext::Side side, const fs::path& dir,
      std::chrono::milliseconds recheck = TlsContext::kDefaultRecheck) {
    auto loaded = TlsContext::load(side, TlsFiles::inDirectory(dir), recheck);
    EXPECT_TRUE(loaded) << loaded.error();
    return loaded ? *loaded : nullptr;
  }

  // A handshake and one message each way; "" when both ends succeeded, else the client's error.
  static std::string talk(TlsContext& server, TlsContext& client, const std::string& peer_name) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    timeval timeout{10, 0};
    for (int fd : fds) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    auto served = std::async(std::launch::async, [&server, fd = fds[0]]() -> std::string {
      auto stream = TlsStream::open(server, fd);
      if (!stream) return stream.error();
      if (stream->accept() != 1) return stream->error();
      char buffer[5];
      if (stream->read(buffer, 5) != 5 || std::string(buffer, 5) != "hello") return "no hello";
      if (stream->write("world", 5) != 5) return stream->error();
      stream->shutdown();
      return "";
    });
    std::string error;
    {
      auto stream = TlsStream::open(client, fds[1]);
      if (!stream) {
        error = stream.error();
      } else if (auto named = stream->setPeerName(peer_name); !named) {
        error = named.error();
      } else if (stream->connect() != 1) {
        error = stream->error();
      } else {
        char buffer[5];
        if (stream->write("hello", 5) != 5 || stream->read(buffer, 5) != 5 ||
            std::string(buffer, 5) != "world") {
          error = "no world: " + stream->error();
        }
      }
    }
    ::close(fds[1]);
    const std::string server_error = served.get();
    ::close(fds[0]);
    if (error.empty() && !server_error.empty()) return "server: " + server_error;
    return error;
  }

  fs::path dir_;
};

TEST_F(Tls, CertManagersLayoutLoadsAndWhatIsWrongIsNamed) {
  EXPECT_NE(load(TlsContext::Side::kServer, dir_ / "replica"), nullptr);
  EXPECT_NE(load(TlsContext::Side::kClient, dir_ / "replica"), nullptr);
  EXPECT_EQ(TlsFiles::inDirectory(dir_ / "replica").ca, dir_ / "replica" / "ca.crt");

  auto missing = TlsContext::load(TlsContext::Side::kServer, TlsFiles::inDirectory(dir_ / "none"));
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("certificate chain '" + (dir_ / "none/tls.crt").string()),
            std::string::npos)
      << missing.error();

  // A key that belongs to another certificate.
  fs::create_directories(dir_ / "mixed");
  fs::copy_file(dir_ / "replica/tls.crt", dir_ / "mixed/tls.crt");
  fs::copy_file(dir_ / "stranger/tls.key", dir_ / "mixed/tls.key");
  auto mixed = TlsContext::load(TlsContext::Side::kServer, TlsFiles::inDirectory(dir_ / "mixed"));
  ASSERT_FALSE(mixed);
  EXPECT_NE(mixed.error().find("does not match the certificate"), std::string::npos)
      << mixed.error();

  std::ofstream(dir_ / "mixed/ca.crt") << "not a certificate\n";
  auto garbage = TlsContext::load(TlsContext::Side::kClient, TlsFiles::inDirectory(dir_ / "mixed"));
  ASSERT_FALSE(garbage);
  EXPECT_NE(garbage.error().find("CA certificates '" + (dir_ / "mixed/ca.crt").string()),
            std::string::npos)
      << garbage.error();
}

TEST_F(Tls, AClientTrustsItsCaAndTheNameItAskedFor) {
  auto server = load(TlsContext::Side::kServer, dir_ / "replica");
  auto client = load(TlsContext::Side::kClient, dir_ / "replica");
  auto stranger = load(TlsContext::Side::kClient, dir_ / "stranger");
  auto unverified = load(TlsContext::Side::kUnverifiedClient, dir_ / "stranger");
  ASSERT_TRUE(server && client && stranger && unverified);

  EXPECT_EQ(talk(*server, *client, "replica.example"), "");
  EXPECT_EQ(talk(*server, *client, "127.0.0.1"), "");
  // The same CA, but a name or address the certificate does not hold.
  const std::string other_name = talk(*server, *client, "other.example");
  EXPECT_NE(other_name.find("not trusted: hostname mismatch"), std::string::npos) << other_name;
  const std::string other_ip = talk(*server, *client, "127.0.0.2");
  EXPECT_NE(other_ip.find("not trusted: IP address mismatch"), std::string::npos) << other_ip;
  // Another CA (a host posing as a replica with a certificate of its own).
  const std::string untrusted = talk(*server, *stranger, "replica.example");
  EXPECT_NE(untrusted.find("not trusted: unable to get local issuer certificate"),
            std::string::npos)
      << untrusted;
  EXPECT_EQ(talk(*server, *unverified, "other.example"), "");
}

TEST_F(Tls, ARenewedCertificateIsServedWithoutARestartAndABrokenOneIsNot) {
  auto made = makeTestCertificates(dir_ / "renewed", {"old.example"}, dir_ / "replica");
  ASSERT_TRUE(made) << made.error();
  auto server = load(TlsContext::Side::kServer, dir_ / "renewed", std::chrono::milliseconds(0));
  auto client = load(TlsContext::Side::kClient, dir_ / "replica");
  ASSERT_TRUE(server && client);
  EXPECT_EQ(talk(*server, *client, "old.example"), "");
  EXPECT_NE(talk(*server, *client, "new.example"), "");

  // cert-manager renews: the same CA signs a certificate with another name.
  made = makeTestCertificates(dir_ / "renewed", {"new.example"}, dir_ / "replica");
  ASSERT_TRUE(made) << made.error();
  EXPECT_EQ(talk(*server, *client, "new.example"), "");
  EXPECT_NE(talk(*server, *client, "old.example"), "");
  EXPECT_EQ(server->loads(), 2u);

  // Files that do not load: the server keeps the last good certificate.
  std::ofstream(dir_ / "renewed/tls.crt.new") << "garbage\n";
  fs::rename(dir_ / "renewed/tls.crt.new", dir_ / "renewed/tls.crt");
  EXPECT_EQ(talk(*server, *client, "new.example"), "");
  EXPECT_EQ(server->loads(), 2u);
}

// OpenSSL sends without MSG_NOSIGNAL: a write to a peer that hung up must fail, not raise SIGPIPE
// (whose default action would end the process: a replica killed by a client that went away).
TEST_F(Tls, AWriteToAPeerThatWentAwayFailsInsteadOfEndingTheProcess) {
  auto server = load(TlsContext::Side::kServer, dir_ / "replica");
  auto client = load(TlsContext::Side::kClient, dir_ / "replica");
  ASSERT_TRUE(server && client);
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  auto accepted = std::async(std::launch::async, [&server, fd = fds[0]] {
    auto stream = TlsStream::open(*server, fd);
    EXPECT_TRUE(stream);
    EXPECT_EQ(stream->accept(), 1) << stream->error();
    return std::move(*stream);
  });
  {
    auto stream = TlsStream::open(*client, fds[1]);
    ASSERT_TRUE(stream);
    ASSERT_TRUE(stream->setPeerName("replica.example"));
    ASSERT_EQ(stream->connect(), 1) << stream->error();
  }
  TlsStream served = accepted.get();
  ::close(fds[1]);  // the client hangs up
  const std::string answer(64 * 1024, 'x');
  ssize_t written = 0;
  for (int i = 0; i < 100 && written >= 0; ++i)
    written = served.write(answer.data(), answer.size());
  EXPECT_LT(written, 0);
  EXPECT_EQ(served.wants(), TlsStream::Wants::kFailed);
  EXPECT_NE(served.error().find("Broken pipe"), std::string::npos) << served.error();
  served.shutdown();
  ::close(fds[0]);
}

}  // namespace
}  // namespace rtable::common
