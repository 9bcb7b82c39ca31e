// The part transfer stream on untrusted bytes: fetchPart reads a peer's HTTP answer (head, then
// the body: magic line, file count, each file's `<name>\t<size>` line and bytes, checksums.txt
// first) and writes the files into a new part directory, checking sizes and hashes as they
// arrive, then decodes every column (verifyPart). A served answer comes from an in-process server
// on loopback, the way a peer's would. Byte 0 picks the mode:
//   0: the rest is the whole answer, head included;
//   1: the rest is the body, after a correct head;
//   2: a real part's body (three columns, a few rows) with the rest as edits (2-byte offset,
//      1-byte xor), so that the checks deep in the body are reached;
//   3: a real part whose file number byte 1 is replaced by the rest, with checksums.txt made to
//      match, so that the column decoders run on arbitrary bytes past every hash check.
// Checked: a fetch either succeeds with a part whose checksums are what its checksums.txt says,
// or fails with the directory removed; nothing is ever written outside it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "rtable/replication_core/hash128.h"
#include "rtable/replication_core/part_exchange.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/row_format.h"
#include "rtable/replication_core/table_spec.h"

namespace {

namespace fs = std::filesystem;
using namespace rtable::core;

constexpr std::string_view kMagic = "rtable part transfer v1";

// Serves `answer` to every connection: reads the request head, sends the bytes, closes.
class OneAnswerServer {
 public:
  OneAnswerServer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::perror("loopback listener");
      std::abort();
    }
    port_ = ntohs(address.sin_port);
    std::thread([this] { serve(); }).detach();  // lives as long as the fuzzer
  }
  uint16_t port() const { return port_; }
  void setAnswer(std::string answer) {
    std::lock_guard lock(mu_);
    answer_ = std::move(answer);
  }

 private:
  void serve() {
    for (;;) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        request.append(buffer, static_cast<std::size_t>(n));
      }
      std::string answer;
      {
        std::lock_guard lock(mu_);
        answer = answer_;
      }
      for (std::size_t sent = 0; sent < answer.size();) {
        const ssize_t n = ::send(fd, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<std::size_t>(n);
      }
      ::shutdown(fd, SHUT_WR);
      ::close(fd);
    }
  }
  int listener_ = -1;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::string answer_;
};

struct Fixture {
  TableSchema schema;
  PartImage image;  // a real part of the schema
  OneAnswerServer server;
  fs::path dir;
};

Fixture& fixture() {
  static Fixture* made = [] {
    auto* f = new Fixture();
    auto spec = TableSpec::parseYaml(R"(
table: events
columns: [{name: d, type: Date}, {name: x, type: UInt64}, {name: s, type: String}]
orderBy: [x]
zookeeper: {connect: fake}
replica: {name: r1}
dataDir: /nonexistent
)");
    if (!spec) {
      std::fprintf(stderr, "spec: %s\n", spec.error().c_str());
      std::abort();
    }
    f->schema = spec->schema;
    Block block = f->schema.emptyBlock();
    RowParser parser(f->schema, RowFormat::kTabSeparated);
    auto keep = [&](Block&& parsed) { block = std::move(parsed); };
    if (!parser.feed("2026-12-01\t1\ta\n2026-12-02\t2\tbb\n2026-12-03\t3\tccc\n", keep) ||
        !parser.finish(keep)) {
      std::abort();
    }
    auto image = encodePart(f->schema, block);
    if (!image) {
      std::fprintf(stderr, "encodePart: %s\n", image.error().c_str());
      std::abort();
    }
    f->image = std::move(*image);
    // libFuzzer ends the process without running atexit handlers: the folder carries the pid,
    // and a later run removes those of processes gone.
    std::error_code ec;
    const std::string prefix = "rtable-fuzz-part-transfer-";
    for (const auto& entry : fs::directory_iterator(fs::temp_directory_path(), ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
        fs::remove_all(entry.path(), ec);
    }
    f->dir = fs::temp_directory_path() / (prefix + std::to_string(::getpid()));
    fs::remove_all(f->dir, ec);
    if (!fs::create_directories(f->dir, ec)) std::abort();
    return f;
  }();
  return *made;
}

// The body of a transfer of `files` (checksums.txt first, then as it lists them).
std::string bodyOf(const std::vector<PartFile>& files) {
  std::string body = std::string(kMagic) + "\n" + std::to_string(files.size()) + "\n";
  for (const auto& file : files) {
    body += file.name + "\t" + std::to_string(file.bytes.size()) + "\n" + file.bytes;
  }
  return body;
}

// The image's files in transfer order.
std::vector<PartFile> transferOrder(const PartImage& image) {
  std::vector<PartFile> files;
  files.push_back(*image.find(kChecksumsFile));
  for (const auto& listed : image.checksums.files) files.push_back(*image.find(listed.name));
  return files;
}

std::string withHead(const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nContent-Type: application/octet-stream\r\n\r\n" + body;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  Fixture& f = fixture();
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string answer;
  switch (data[0] % 4) {
    case 0:
      answer = rest;
      break;
    case 1:
      answer = withHead(rest);
      break;
    case 2: {
      std::string body = bodyOf(transferOrder(f.image));
      for (std::size_t i = 0; i + 3 <= rest.size(); i += 3) {
        const std::size_t at =
            (static_cast<uint8_t>(rest[i]) << 8 | static_cast<uint8_t>(rest[i + 1])) % body.size();
        body[at] = static_cast<char>(body[at] ^ rest[i + 2]);
      }
      answer = withHead(body);
      break;
    }
    default: {
      if (rest.empty()) return 0;
      std::vector<PartFile> files = transferOrder(f.image);
      const std::size_t target = 1 + static_cast<uint8_t>(rest[0]) % (files.size() - 1);
      files[target].bytes = rest.substr(1);
      std::vector<PartChecksums::File> listed;
      for (std::size_t i = 1; i < files.size(); ++i) {
        listed.push_back({files[i].name, files[i].bytes.size(), hash128(files[i].bytes)});
      }
      files[0].bytes = PartChecksums::fromFiles(std::move(listed)).format();
      answer = withHead(bodyOf(files));
      break;
    }
  }
  f.server.setAnswer(std::move(answer));
  const fs::path dest = f.dir / "tmp_fetch_202612_1_1_0";
  FetchSource from{"peer", "127.0.0.1", f.server.port(), 0, false};
  auto fetched =
      fetchPart(from, "fuzz-secret", "202612_1_1_0", dest, f.schema,
                FetchTimeouts{std::chrono::milliseconds(1000), std::chrono::milliseconds(2000)});
  // RTABLE_FUZZ_TRACE=1: what each input came to (to see a seed reach the end of a fetch).
  static const bool trace = std::getenv("RTABLE_FUZZ_TRACE") != nullptr;
  if (trace) {
    std::fprintf(stderr, "mode %d: %s\n", data[0] % 4,
                 fetched ? "fetched" : fetched.error().toString().c_str());
  }
  std::error_code ec;
  if (fetched) {
    std::ifstream in(dest / "checksums.txt", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto written = PartChecksums::parse(text);
    if (!written || !(*written == *fetched)) {
      std::fprintf(stderr, "a fetched part's checksums are not its checksums.txt\n");
      std::abort();
    }
    fs::remove_all(dest, ec);
  } else if (fs::exists(dest, ec)) {
    std::fprintf(stderr, "a failed fetch left %s behind: %s\n", dest.c_str(),
                 fetched.error().toString().c_str());
    std::abort();
  }
  // Nothing beside the fetch's own directory.
  for (const auto& entry : fs::directory_iterator(f.dir, ec)) {
    std::fprintf(stderr, "the fetch wrote %s outside its directory\n", entry.path().c_str());
    std::abort();
  }
  return 0;
}
