#include "rtable/replication_core/part_exchange.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "posix_file.h"
#include "rtable/common/percent_encoding.h"
#include "rtable/common/quoted_excerpt.h"
#include "rtable/common/secret_file.h"
#include "rtable/replication_core/fail_points.h"
#include "rtable/replication_core/hash128.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/part_name.h"

namespace rtable::core {
namespace fs = std::filesystem;

namespace {

using common::quotedExcerpt;

constexpr std::string_view kMagicLine = "rtable part transfer v1";
// part_format.cpp refuses a larger checksums.txt (its kMaxTextFileBytes), so no valid part has one.
constexpr uint64_t kMaxChecksumsBytes = 16 << 20;
// A line of the body is short: the magic line, a count, or `<name>\t<size>` with a column file's
// name; a longer one is not a transfer of ours, and is not buffered.
constexpr std::size_t kMaxLineBytes = 4096;
constexpr std::size_t kMaxResponseHeadBytes = 64 << 10;
// An error answer is a small JSON object; more of it is not read.
constexpr std::size_t kMaxErrorBodyBytes = 64 << 10;
// Bytes per receive and per file write.
constexpr std::size_t kChunkBytes = 256 << 10;

std::optional<uint64_t> parseDecimal(std::string_view text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || text[0] < '0' || text[0] > '9' || ec != std::errc() || ptr != end) {
    return std::nullopt;
  }
  return value;
}

// A file name from the wire that is safe to create inside the part directory.
bool isSafeFileName(std::string_view name) {
  if (name.empty() || name.find('/') != std::string_view::npos ||
      name.find("..") != std::string_view::npos) {
    return false;
  }
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f; });
}

}  // namespace

bool interserverSecretMatches(std::string_view secret, std::string_view presented) {
  return common::secretsEqual(secret, presented);
}

namespace {

std::string fetchMac(std::string_view secret, std::string_view source, std::string_view target,
                     int64_t unix_seconds) {
  const std::string message = fmt::format("v1\n{}\n{}\n{}", source, target, unix_seconds);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &size);
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) hex += fmt::format("{:02x}", mac[i]);
  return hex;
}

}  // namespace

std::string signFetch(std::string_view secret, std::string_view source, std::string_view target,
                      int64_t unix_seconds) {
  return fmt::format("v1 {} {}", unix_seconds, fetchMac(secret, source, target, unix_seconds));
}

std::string checkFetchAuth(std::string_view secret, std::string_view source,
                           std::string_view target, std::string_view header,
                           int64_t now_unix_seconds) {
  // "v1 <seconds> <64 hex digits>"
  const auto first = header.find(' ');
  const auto second = first == std::string_view::npos ? first : header.find(' ', first + 1);
  int64_t seconds = 0;
  if (second == std::string_view::npos || header.substr(0, first) != "v1" ||
      std::from_chars(header.data() + first + 1, header.data() + second, seconds).ptr !=
          header.data() + second) {
    return fmt::format("{} is not 'v1 <unix seconds> <hmac>'", kFetchAuthHeader);
  }
  if (seconds < now_unix_seconds - kFetchAuthMaxAgeSeconds ||
      seconds > now_unix_seconds + kFetchAuthMaxAgeSeconds) {
    return fmt::format(
        "{} was made at {} s, {} s from this replica's clock (at most {} s): "
        "expired, or a clock is wrong",
        kFetchAuthHeader, seconds, seconds - now_unix_seconds, kFetchAuthMaxAgeSeconds);
  }
  if (!common::secretsEqual(fetchMac(secret, source, target, seconds), header.substr(second + 1))) {
    return fmt::format(
        "{} does not prove the interserver secret for {} (another secret, or "
        "made for another replica or request)",
        kFetchAuthHeader, source);
  }
  return "";
}

// --- The sending side ------------------------------------------------------------------------

// The body as pieces: text held here (the header lines, checksums.txt), or a file's bytes.
struct PartTransferReader::State {
  struct Piece {
    std::string text;
    Fd file;
    std::string file_name;
    uint64_t size = 0;
    std::optional<std::string_view> memory;  // a file of `image`
  };
  fs::path part_dir;
  std::shared_ptr<const PartImage> image;
  std::vector<Piece> pieces;
  std::size_t current = 0;
  uint64_t offset = 0;  // in pieces[current]
  uint64_t length = 0;

  void appendText(std::string_view text) {
    if (pieces.empty() || pieces.back().file.get() >= 0 || pieces.back().memory)
      pieces.emplace_back();
    pieces.back().text += text;
    pieces.back().size = pieces.back().text.size();
  }
};

PartTransferReader::PartTransferReader(std::unique_ptr<State> state) : state_(std::move(state)) {}
PartTransferReader::PartTransferReader(PartTransferReader&&) noexcept = default;
PartTransferReader& PartTransferReader::operator=(PartTransferReader&&) noexcept = default;
PartTransferReader::~PartTransferReader() = default;

std::expected<PartTransferReader, std::string> PartTransferReader::open(
    const fs::path& part_dir, const PartChecksums& expected) {
  auto fail = [&](std::string_view file, std::string_view what) {
    return std::unexpected(fmt::format("part {}: {}: {}", part_dir.string(), file, what));
  };
  auto openSized =
      [&](std::string_view name) -> std::expected<std::pair<Fd, uint64_t>, std::string> {
    auto opened = openFd(part_dir / name, O_RDONLY);
    if (!opened) return fail(name, opened.error());
    Fd fd = std::move(*opened);
    struct stat st{};
    if (::fstat(fd.get(), &st) != 0) return fail(name, fmt::format("fstat: {}", errnoText(errno)));
    if (!S_ISREG(st.st_mode)) return fail(name, "not a regular file");
    return std::pair{std::move(fd), static_cast<uint64_t>(st.st_size)};
  };

  auto checksums_file = openSized(kChecksumsFile);
  if (!checksums_file) return std::unexpected(checksums_file.error());
  auto& [checksums_fd, checksums_size] = *checksums_file;
  if (checksums_size > kMaxChecksumsBytes) {
    return fail(kChecksumsFile, fmt::format("larger than {} bytes", kMaxChecksumsBytes));
  }
  std::string checksums_text(checksums_size, '\0');
  for (std::size_t done = 0; done < checksums_text.size();) {
    const ssize_t n = ::pread(checksums_fd.get(), checksums_text.data() + done,
                              checksums_text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(kChecksumsFile, fmt::format("read failed: {}", errnoText(errno)));
    if (n == 0) return fail(kChecksumsFile, "shrank while being read");
    done += static_cast<std::size_t>(n);
  }
  auto checksums = PartChecksums::parse(checksums_text);
  if (!checksums) return fail(kChecksumsFile, checksums.error());
  if (*checksums != expected) {
    return fail(kChecksumsFile,
                fmt::format("says total {}, the replica loaded the part with total {}",
                            checksums->total.hex(), expected.total.hex()));
  }

  auto state = std::make_unique<State>();
  state->part_dir = part_dir;
  state->appendText(fmt::format("{}\n{}\n{}\t{}\n", kMagicLine, checksums->files.size() + 1,
                                kChecksumsFile, checksums_text.size()));
  state->appendText(checksums_text);
  for (const auto& file : checksums->files) {
    auto opened = openSized(file.name);
    if (!opened) return std::unexpected(opened.error());
    if (opened->second != file.size) {
      return fail(file.name,
                  fmt::format("size {} bytes, checksums.txt says {}", opened->second, file.size));
    }
    state->appendText(fmt::format("{}\t{}\n", file.name, file.size));
    state->pieces.push_back(
        State::Piece{{}, std::move(opened->first), file.name, file.size, std::nullopt});
  }
  for (const auto& piece : state->pieces) state->length += piece.size;
  return PartTransferReader(std::move(state));
}

std::expected<PartTransferReader, std::string> PartTransferReader::open(
    std::shared_ptr<const PartImage> image, const PartChecksums& expected) {
  if (image->checksums != expected) {
    return std::unexpected(
        fmt::format("part in memory: total {}, the replica loaded it with total {}",
                    image->checksums.total.hex(), expected.total.hex()));
  }
  const PartFile* checksums_file = image->find(kChecksumsFile);
  if (!checksums_file) return std::unexpected(std::string("part in memory: no checksums.txt"));
  auto state = std::make_unique<State>();
  state->appendText(fmt::format("{}\n{}\n{}\t{}\n", kMagicLine, expected.files.size() + 1,
                                kChecksumsFile, checksums_file->bytes.size()));
  state->appendText(checksums_file->bytes);
  for (const auto& file : expected.files) {
    const PartFile* held = image->find(file.name);
    if (!held || held->bytes.size() != file.size) {
      return std::unexpected(
          fmt::format("part in memory: {} does not match checksums.txt", file.name));
    }
    state->appendText(fmt::format("{}\t{}\n", file.name, file.size));
    state->pieces.push_back(State::Piece{{}, Fd(), file.name, file.size, held->bytes});
  }
  for (const auto& piece : state->pieces) state->length += piece.size;
  state->image = std::move(image);
  return PartTransferReader(std::move(state));
}

uint64_t PartTransferReader::contentLength() const {
  return state_->length;
}

std::expected<std::size_t, std::string> PartTransferReader::read(uint8_t* data,
                                                                 std::size_t capacity) {
  State& s = *state_;
  std::size_t done = 0;
  while (done < capacity && s.current < s.pieces.size()) {
    State::Piece& piece = s.pieces[s.current];
    if (s.offset == piece.size) {
      ++s.current;
      s.offset = 0;
      continue;
    }
    const std::size_t n =
        static_cast<std::size_t>(std::min<uint64_t>(capacity - done, piece.size - s.offset));
    if (piece.file.get() < 0) {
      std::memcpy(data + done, (piece.memory ? piece.memory->data() : piece.text.data()) + s.offset,
                  n);
      done += n;
      s.offset += n;
      continue;
    }
    const ssize_t got = ::pread(piece.file.get(), data + done, n, static_cast<off_t>(s.offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return std::unexpected(fmt::format("part {}: {}: read failed: {}", s.part_dir.string(),
                                         piece.file_name, errnoText(errno)));
    }
    if (got == 0) {
      return std::unexpected(fmt::format("part {}: {}: ends after {} of its {} bytes",
                                         s.part_dir.string(), piece.file_name, s.offset,
                                         piece.size));
    }
    done += static_cast<std::size_t>(got);
    s.offset += static_cast<uint64_t>(got);
  }
  return done;
}

// --- The fetching side -----------------------------------------------------------------------
//
// A plain blocking socket, one request per connection ("Connection: close"), rather than
// cpprestsdk's http_client: the client reads the response body at its own pace with TCP's flow
// control (cpprestsdk's client copies the body into an unbounded stream buffer as fast as it
// arrives), a short body is an exact count against Content-Length, every wait has our deadline,
// and no request depends on cpprestsdk's thread pool, which a fetch thread must not wait on.

std::string_view fetchErrorKindName(FetchError::Kind kind) {
  switch (kind) {
    case FetchError::Kind::kUnauthorized:
      return "unauthorized";
    case FetchError::Kind::kNotFound:
      return "not found";
    case FetchError::Kind::kTransfer:
      return "transfer failed";
    case FetchError::Kind::kCorrupt:
      return "corrupt";
    case FetchError::Kind::kLocal:
      return "local error";
  }
  return "unknown";
}

std::string FetchError::toString() const {
  return http_status != 0
             ? fmt::format("{} (HTTP {}): {}", fetchErrorKindName(kind), http_status, message)
             : fmt::format("{}: {}", fetchErrorKindName(kind), message);
}

namespace {

using Kind = FetchError::Kind;
template <class T>
using FetchResult = std::expected<T, FetchError>;

// What the errors of one fetch start with.
struct FetchContext {
  const FetchSource& from;
  const std::string& part_name;

  // A fault a test armed at this step of this fetch (fail_points.h): its errno, or 0.
  int fault(FailPoint step) const {
    return faultFor(step, fmt::format("{}:{}/{}", from.host, from.port, part_name));
  }

  std::unexpected<FetchError> error(Kind kind, std::string_view what, int status = 0) const {
    return std::unexpected(
        FetchError{kind,
                   fmt::format("fetching part {} from replica {} ({}:{}): {}", part_name,
                               from.replica, from.host, from.port, what),
                   status});
  }
};

class Connection {
 public:
  static FetchResult<Connection> open(const FetchContext& context, FetchTimeouts timeouts) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(context.from.port);
    if (int error = context.fault(FailPoint::kResolve)) {
      return context.error(Kind::kTransfer, fmt::format("cannot resolve host '{}': {}",
                                                        context.from.host, errnoText(error)));
    }
    const int rc = ::getaddrinfo(context.from.host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0) {
      return context.error(Kind::kTransfer, fmt::format("cannot resolve host '{}': {}",
                                                        context.from.host, ::gai_strerror(rc)));
    }
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
    if (int error = context.fault(FailPoint::kConnect)) {
      return context.error(Kind::kTransfer, fmt::format("cannot connect: {}", errnoText(error)));
    }
    std::string last_error = "no address";
    for (const addrinfo* address = found; address; address = address->ai_next) {
      Fd fd(::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                     address->ai_protocol));
      if (fd.get() < 0) {
        last_error = fmt::format("socket: {}", errnoText(errno));
        continue;
      }
      Connection connection(std::move(fd), timeouts.receive);
      if (::connect(connection.fd_.get(), address->ai_addr, address->ai_addrlen) == 0) {
        return connection;
      }
      if (errno != EINPROGRESS) {
        last_error = errnoText(errno);
        continue;
      }
      // A source that is cut off answers nothing: the next replica that has the part is tried
      // after `connect`, not after the much longer receive timeout.
      if (!connection.waitFor(POLLOUT, timeouts.connect)) {
        last_error = fmt::format("no connection within {} ms", timeouts.connect.count());
        continue;
      }
      int error = 0;
      socklen_t length = sizeof(error);
      if (::getsockopt(connection.fd_.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
        error = errno;
      }
      if (error == 0) return connection;
      last_error = errnoText(error);
    }
    return context.error(Kind::kTransfer, fmt::format("cannot connect: {}", last_error));
  }

  // TLS from here on: the handshake (within the receive timeout), the source's certificate
  // checked against `tls`'s roots and the source's advertised host name or address.
  FetchResult<void> startTls(const FetchContext& context, common::TlsContext& tls) {
    auto stream = common::TlsStream::open(tls, fd_.get());
    if (!stream) return context.error(Kind::kLocal, stream.error());
    if (auto named = stream->setPeerName(context.from.host); !named)
      return context.error(Kind::kLocal, named.error());
    for (;;) {
      if (stream->connect() == 1) break;
      if (stream->wants() == common::TlsStream::Wants::kFailed)
        return context.error(Kind::kTransfer, stream->error());
      if (!waitFor(stream->wants() == common::TlsStream::Wants::kRead ? POLLIN : POLLOUT,
                   timeout_)) {
        return context.error(Kind::kTransfer,
                             fmt::format("no TLS handshake within {} ms", timeout_.count()));
      }
    }
    tls_.emplace(std::move(*stream));
    return {};
  }

  FetchResult<void> sendAll(const FetchContext& context, std::string_view data) {
    if (int error = context.fault(FailPoint::kSend)) {
      return context.error(Kind::kTransfer,
                           fmt::format("sending the request: {}", errnoText(error)));
    }
    while (!data.empty()) {
      const ssize_t n = tls_ ? tls_->write(data.data(), data.size())
                             : ::send(fd_.get(), data.data(), data.size(), MSG_NOSIGNAL);
      if (n >= 0) {
        data.remove_prefix(static_cast<std::size_t>(n));
      } else if (auto wait = wanted(POLLOUT)) {
        if (!waitFor(*wait, timeout_)) {
          return context.error(
              Kind::kTransfer,
              fmt::format("the request could not be sent within {} ms", timeout_.count()));
        }
      } else if (tls_ || errno != EINTR) {
        return context.error(Kind::kTransfer, fmt::format("sending the request: {}",
                                                          tls_ ? tls_->error() : errnoText(errno)));
      }
    }
    return {};
  }

  // Some bytes into `data`; 0 when the source closed the connection.
  FetchResult<std::size_t> receive(const FetchContext& context, char* data, std::size_t capacity) {
    for (;;) {
      const ssize_t n = tls_ ? tls_->read(data, capacity) : ::recv(fd_.get(), data, capacity, 0);
      if (n >= 0) return static_cast<std::size_t>(n);
      if (auto wait = wanted(POLLIN)) {
        if (!waitFor(*wait, timeout_)) {
          return context.error(Kind::kTransfer,
                               fmt::format("nothing received for {} ms", timeout_.count()));
        }
      } else if (tls_ || errno != EINTR) {
        return context.error(Kind::kTransfer,
                             fmt::format("receiving: {}", tls_ ? tls_->error() : errnoText(errno)));
      }
    }
  }

 private:
  Connection(Fd fd, std::chrono::milliseconds timeout) : fd_(std::move(fd)), timeout_(timeout) {}

  // Whether the socket became ready for `events` (or has an error to report) within `timeout`.
  bool waitFor(short events, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_.get(), events, 0};
      const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX)));
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return true;  // the next call reports the error
    }
  }

  // After a call that could not go on: what to poll for (a TLS read may need to write, and a
  // write to read), or nullopt when it failed.
  std::optional<short> wanted(short plain) const {
    if (!tls_) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return plain;
      return std::nullopt;
    }
    switch (tls_->wants()) {
      case common::TlsStream::Wants::kRead:
        return POLLIN;
      case common::TlsStream::Wants::kWrite:
        return POLLOUT;
      default:
        return std::nullopt;
    }
  }

  Fd fd_;
  std::chrono::milliseconds timeout_;
  std::optional<common::TlsStream> tls_;  // declared after fd_: freed before the socket closes
};

struct ResponseHead {
  int status = 0;
  std::optional<uint64_t> content_length;
  bool chunked = false;
};

// The response: its head, then a body of exactly Content-Length bytes. Reads never go past the
// body, whatever the body's contents announce.
class Response {
 public:
  Response(Connection connection, const FetchContext& context)
      : connection_(std::move(connection)), context_(context) {}

  FetchResult<ResponseHead> readHead() {
    if (int error = context_.fault(FailPoint::kReceiveHead)) {
      return context_.error(Kind::kTransfer, fmt::format("receiving: {}", errnoText(error)));
    }
    std::size_t head_end;
    while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (buffer_.size() > kMaxResponseHeadBytes) {
        return context_.error(Kind::kTransfer, fmt::format("the answer's head is longer than {} "
                                                           "bytes",
                                                           kMaxResponseHeadBytes));
      }
      auto more = receiveMore();
      if (!more) return std::unexpected(more.error());
      if (!*more) {
        return context_.error(Kind::kTransfer,
                              buffer_.empty() ? "the connection closed without an answer"
                                              : "the connection closed inside the answer's head");
      }
    }
    const std::string_view head = std::string_view(buffer_).substr(0, head_end);
    ResponseHead result;
    std::size_t line_end = head.find("\r\n");
    const std::string_view status_line = head.substr(0, line_end);
    if (!status_line.starts_with("HTTP/1.") || status_line.size() < 12 || status_line[8] != ' ') {
      return context_.error(Kind::kTransfer,
                            fmt::format("not an HTTP answer: {}", quotedExcerpt(status_line)));
    }
    auto status = parseDecimal(status_line.substr(9, 3));
    if (!status) {
      return context_.error(Kind::kTransfer,
                            fmt::format("unreadable status line {}", quotedExcerpt(status_line)));
    }
    result.status = static_cast<int>(*status);
    while (line_end != std::string_view::npos) {
      const std::size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string_view line =
          head.substr(start, line_end == head.npos ? head.npos : line_end - start);
      const std::size_t colon = line.find(':');
      if (colon == std::string_view::npos) continue;
      std::string name(line.substr(0, colon));
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
        value.remove_prefix(1);
      }
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) {
        value.remove_suffix(1);
      }
      if (name == "content-length") {
        result.content_length = parseDecimal(value);
        if (!result.content_length) {
          return context_.error(Kind::kTransfer,
                                fmt::format("unreadable Content-Length {}", quotedExcerpt(value)));
        }
      } else if (name == "transfer-encoding") {
        result.chunked = true;
      }
    }
    position_ = head_end + 4;
    body_left_ = result.content_length.value_or(0);
    body_length_ = body_left_;
    return result;
  }

  // An error answer's body: up to kMaxErrorBodyBytes of it, whatever arrived of it.
  std::string readErrorBody(const ResponseHead& head) {
    body_left_ =
        std::min<uint64_t>(head.content_length.value_or(kMaxErrorBodyBytes), kMaxErrorBodyBytes);
    std::string body;
    while (body_left_ > 0) {
      auto chunk = nextBodyBytes(body_left_);
      if (!chunk) break;
      body += *chunk;
    }
    return body;
  }

  uint64_t bodyLeft() const { return body_left_; }
  uint64_t bodyLength() const { return body_length_; }

  // The next 1..max bytes of the body (valid until the next call); an error at the end of the
  // body or of the connection.
  FetchResult<std::string_view> nextBodyBytes(uint64_t max) {
    if (body_left_ == 0 || max == 0) {
      return context_.error(Kind::kCorrupt, "read past the end of the body");  // callers check
    }
    if (int error = context_.fault(FailPoint::kReceiveBody)) {
      return context_.error(Kind::kTransfer, fmt::format("receiving: {}", errnoText(error)));
    }
    if (position_ == buffer_.size()) {
      buffer_.clear();
      position_ = 0;
      auto more = receiveMore();
      if (!more) return std::unexpected(more.error());
      if (!*more) {
        return context_.error(Kind::kTransfer,
                              fmt::format("the connection closed after {} of the body's {} bytes",
                                          body_length_ - body_left_, body_length_));
      }
    }
    const std::size_t n =
        static_cast<std::size_t>(std::min<uint64_t>({max, body_left_, buffer_.size() - position_}));
    const std::string_view bytes = std::string_view(buffer_).substr(position_, n);
    position_ += n;
    body_left_ -= n;
    return bytes;
  }

  // A line of the body without its '\n'. `what` names it for errors.
  FetchResult<std::string> readLine(std::string_view what) {
    std::string line;
    for (;;) {
      if (body_left_ == 0) {
        return context_.error(
            Kind::kCorrupt,
            fmt::format("the body ends {} {}", line.empty() ? "before" : "inside", what));
      }
      // Peek at what is buffered, so that only the line is consumed.
      if (position_ == buffer_.size()) {
        auto more = nextBodyBytes(1);
        if (!more) return std::unexpected(more.error());
        if ((*more)[0] == '\n') return line;
        line += *more;
        continue;
      }
      const std::string_view buffered = std::string_view(buffer_).substr(
          position_,
          static_cast<std::size_t>(std::min<uint64_t>(body_left_, buffer_.size() - position_)));
      const std::size_t newline = buffered.find('\n');
      const std::size_t take = newline == std::string_view::npos ? buffered.size() : newline;
      if (line.size() + take > kMaxLineBytes) {
        return context_.error(Kind::kCorrupt, fmt::format("{} is longer than {} bytes: {}", what,
                                                          kMaxLineBytes, quotedExcerpt(line)));
      }
      line += buffered.substr(0, take);
      const std::size_t consumed = take + (newline == std::string_view::npos ? 0 : 1);
      position_ += consumed;
      body_left_ -= consumed;
      if (newline != std::string_view::npos) return line;
    }
  }

 private:
  // Appends what the connection has; false when it closed.
  FetchResult<bool> receiveMore() {
    const std::size_t old_size = buffer_.size();
    buffer_.resize(old_size + kChunkBytes);
    auto n = connection_.receive(context_, buffer_.data() + old_size, kChunkBytes);
    buffer_.resize(old_size + (n ? *n : 0));
    if (!n) return std::unexpected(n.error());
    return *n > 0;
  }

  Connection connection_;
  const FetchContext& context_;
  std::string buffer_;
  std::size_t position_ = 0;  // in buffer_: the next byte not consumed
  uint64_t body_left_ = 0;
  uint64_t body_length_ = 0;
};

// The `<name>\t<size>` line before each file.
struct FileLine {
  std::string name;
  uint64_t size = 0;
};

FetchResult<FileLine> readFileLine(Response& response, const FetchContext& context,
                                   std::size_t index) {
  auto line = response.readLine(fmt::format("the line of file {}", index + 1));
  if (!line) return std::unexpected(line.error());
  const std::size_t tab = line->find('\t');
  std::optional<uint64_t> size;
  if (tab != std::string::npos) size = parseDecimal(std::string_view(*line).substr(tab + 1));
  if (!size) {
    return context.error(Kind::kCorrupt, fmt::format("file {}: expected '<name>\\t<size>', got {}",
                                                     index + 1, quotedExcerpt(*line)));
  }
  FileLine file{line->substr(0, tab), *size};
  if (!isSafeFileName(file.name)) {
    return context.error(Kind::kCorrupt, fmt::format("file {}: {} is not a file name of a part",
                                                     index + 1, quotedExcerpt(file.name)));
  }
  if (file.size > response.bodyLeft()) {
    return context.error(Kind::kCorrupt,
                         fmt::format("file {}: {} bytes announced, the body has {} bytes left",
                                     file.name, file.size, response.bodyLeft()));
  }
  return file;
}

// Files written into the part directory, fsynced together once all are there.
class PartFiles {
 public:
  PartFiles(const fs::path& dir, const FetchContext& context) : dir_(dir), context_(context) {}

  // The index of the new file, for write().
  FetchResult<std::size_t> create(const std::string& name) {
    auto fd = openFd(dir_ / name, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (!fd) {
      return context_.error(Kind::kLocal,
                            fmt::format("{}: {}: {}", name, (dir_ / name).string(), fd.error()));
    }
    files_.emplace_back(name, std::move(*fd));
    return files_.size() - 1;
  }

  FetchResult<void> write(std::size_t file, std::string_view bytes) {
    const auto& [name, fd] = files_[file];
    if (auto written = writeAll(fd, bytes); !written) {
      return context_.error(Kind::kLocal, fmt::format("{}: write to {} failed: {}", name,
                                                      dir_.string(), written.error()));
    }
    return {};
  }

  // Every file, then the directory.
  FetchResult<void> syncAll() {
    for (auto& [name, fd] : files_) {
      auto done = fsyncFd(fd);
      if (done) done = fd.close();
      if (!done) {
        return context_.error(Kind::kLocal,
                              fmt::format("{} in {}: {}", name, dir_.string(), done.error()));
      }
    }
    files_.clear();
    if (auto synced = fsyncDirectory(dir_); !synced) {
      return context_.error(Kind::kLocal, synced.error());
    }
    return {};
  }

 private:
  const fs::path& dir_;
  const FetchContext& context_;
  std::vector<std::pair<std::string, Fd>> files_;
};

// The body into `dest_dir` (created, empty), checked as it arrives. See docs/formats.md.
FetchResult<PartChecksums> receivePart(Response& response, const FetchContext& context,
                                       const fs::path& dest_dir, const TableSchema& schema) {
  auto magic = response.readLine("the first line");
  if (!magic) return std::unexpected(magic.error());
  if (*magic != kMagicLine) {
    return context.error(Kind::kCorrupt, fmt::format("the body starts with {}, not '{}'",
                                                     quotedExcerpt(*magic), kMagicLine));
  }
  auto count_line = response.readLine("the file count");
  if (!count_line) return std::unexpected(count_line.error());
  const auto count = parseDecimal(*count_line);
  if (!count || *count == 0) {
    return context.error(Kind::kCorrupt,
                         fmt::format("expected a file count, got {}", quotedExcerpt(*count_line)));
  }

  PartFiles files(dest_dir, context);
  // checksums.txt first: it says what every other file must be.
  auto first = readFileLine(response, context, 0);
  if (!first) return std::unexpected(first.error());
  if (first->name != kChecksumsFile) {
    return context.error(Kind::kCorrupt, fmt::format("the first file is {}, not {}",
                                                     quotedExcerpt(first->name), kChecksumsFile));
  }
  if (first->size > kMaxChecksumsBytes) {
    return context.error(Kind::kCorrupt,
                         fmt::format("{}: {} bytes, more than the {} allowed", kChecksumsFile,
                                     first->size, kMaxChecksumsBytes));
  }
  std::string checksums_text;
  checksums_text.reserve(static_cast<std::size_t>(first->size));
  while (checksums_text.size() < first->size) {
    auto bytes = response.nextBodyBytes(first->size - checksums_text.size());
    if (!bytes) return std::unexpected(bytes.error());
    checksums_text += *bytes;
  }
  auto checksums = PartChecksums::parse(checksums_text);
  if (!checksums) {
    return context.error(Kind::kCorrupt, fmt::format("{}: {}", kChecksumsFile, checksums.error()));
  }
  auto checksums_fd = files.create(first->name);
  if (!checksums_fd) return std::unexpected(checksums_fd.error());
  if (auto ok = files.write(*checksums_fd, checksums_text); !ok) return std::unexpected(ok.error());
  if (*count != checksums->files.size() + 1) {
    return context.error(Kind::kCorrupt,
                         fmt::format("the body announces {} files, checksums.txt lists {} besides "
                                     "itself",
                                     *count, checksums->files.size()));
  }

  for (std::size_t i = 0; i < checksums->files.size(); ++i) {
    const PartChecksums::File& expected = checksums->files[i];
    auto line = readFileLine(response, context, i + 1);
    if (!line) return std::unexpected(line.error());
    if (line->name != expected.name) {
      return context.error(Kind::kCorrupt,
                           fmt::format("file {} arrived where checksums.txt lists {} next",
                                       quotedExcerpt(line->name), expected.name));
    }
    if (line->size != expected.size) {
      return context.error(Kind::kCorrupt,
                           fmt::format("{}: {} bytes announced, checksums.txt says {}",
                                       expected.name, line->size, expected.size));
    }
    auto fd = files.create(expected.name);
    if (!fd) return std::unexpected(fd.error());
    Hasher128 hasher;
    for (uint64_t left = expected.size; left > 0;) {
      auto bytes = response.nextBodyBytes(left);
      if (!bytes) return std::unexpected(bytes.error());
      hasher.update(bytes->data(), bytes->size());
      if (auto ok = files.write(*fd, *bytes); !ok) return std::unexpected(ok.error());
      left -= bytes->size();
    }
    if (const Hash128 hash = hasher.digest(); hash != expected.hash) {
      return context.error(
          Kind::kCorrupt, fmt::format("{}: hash {}, checksums.txt says {} (the content is corrupt)",
                                      expected.name, hash.hex(), expected.hash.hex()));
    }
  }
  if (response.bodyLeft() != 0) {
    return context.error(Kind::kCorrupt,
                         fmt::format("{} bytes follow the last file", response.bodyLeft()));
  }

  // Sizes and hashes hold; now the part as a whole: the schema's files, columns that decode.
  auto verified = verifyPart(dest_dir, schema);
  if (!verified) return context.error(Kind::kCorrupt, verified.error());
  if (auto synced = files.syncAll(); !synced) return std::unexpected(synced.error());
  return std::move(*verified);
}

FetchResult<PartChecksums> fetchInto(const FetchContext& context, const std::string& secret,
                                     const fs::path& dest_dir, const TableSchema& schema,
                                     FetchTimeouts timeouts, common::TlsContext* tls) {
  auto connection = Connection::open(context, timeouts);
  if (!connection) return std::unexpected(connection.error());
  if (context.from.tls) {
    if (auto started = connection->startTls(context, *tls); !started)
      return std::unexpected(started.error());
  }
  const std::string& host = context.from.host;
  const std::string target = fmt::format(
      "{}?name={}{}", kPartTransferPath, common::percentEncode(context.part_name),
      context.from.generation > 0 ? fmt::format("&generation={}", context.from.generation)
                                  : std::string());
  // The secret itself never goes on the wire: a proof bound to this source and this request.
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const std::string request =
      fmt::format("GET {} HTTP/1.1\r\nHost: {}:{}\r\n{}: {}\r\nConnection: close\r\n\r\n", target,
                  host.find(':') == std::string::npos ? host : fmt::format("[{}]", host),
                  context.from.port, kFetchAuthHeader,
                  signFetch(secret, fmt::format("{}:{}", host, context.from.port), target, now));
  if (auto sent = connection->sendAll(context, request); !sent)
    return std::unexpected(sent.error());

  Response response(std::move(*connection), context);
  auto head = response.readHead();
  if (!head) return std::unexpected(head.error());
  if (head->status != 200) {
    const std::string body = response.readErrorBody(*head);
    std::string what = fmt::format("HTTP {}", head->status);
    const auto json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (json.is_object() && json.contains("error") && json["error"].is_string()) {
      what += " " + json["error"].get<std::string>();
    }
    if (json.is_object() && json.contains("message") && json["message"].is_string()) {
      what += ": " + json["message"].get<std::string>();
    } else if (!body.empty()) {
      what += ": " + quotedExcerpt(body);
    }
    const Kind kind = head->status == 401   ? Kind::kUnauthorized
                      : head->status == 404 ? Kind::kNotFound
                                            : Kind::kTransfer;
    return context.error(kind, what, head->status);
  }
  if (!head->content_length || head->chunked) {
    return context.error(Kind::kTransfer, "the answer has no Content-Length", head->status);
  }
  auto received = receivePart(response, context, dest_dir, schema);
  if (!received) received.error().http_status = head->status;
  return received;
}

}  // namespace

std::expected<PartChecksums, FetchError> fetchPart(
    const FetchSource& from, const std::string& secret, const std::string& part_name,
    const fs::path& dest_dir, const TableSchema& schema, FetchTimeouts timeouts,
    common::TlsContext* tls) {
  const FetchContext context{from, part_name};
  if (from.tls && !tls) {
    return context.error(Kind::kLocal,
                         "the source serves HTTPS (scheme: https in its host node) and this "
                         "replica has no tls.dir whose ca.crt could verify it");
  }
  if (secret.empty()) {
    return context.error(Kind::kUnauthorized,
                         "this replica has no interserver secret (spec replication.secretFile), "
                         "so it fetches no parts");
  }
  if (!std::all_of(secret.begin(), secret.end(),
                   [](char c) { return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f; })) {
    return context.error(Kind::kLocal,
                         "the interserver secret holds control characters, which an HTTP header "
                         "cannot carry");
  }
  auto name = PartName::parse(part_name);
  if (!name || name->format() != part_name) {
    return context.error(
        Kind::kLocal,
        name ? fmt::format("not a part name as written (that would be '{}')", name->format())
             : name.error());
  }
  // mkdir is the claim on dest_dir: a directory that exists is someone else's and stays as it is.
  std::error_code ec;
  if (auto made = makeDirectory(dest_dir); !made || !*made) {
    return context.error(
        Kind::kLocal,
        made ? fmt::format("cannot create {}: it exists", dest_dir.string()) : made.error());
  }
  auto fetched = fetchInto(context, secret, dest_dir, schema, timeouts, tls);
  if (!fetched) fs::remove_all(dest_dir, ec);
  return fetched;
}

}  // namespace rtable::core
