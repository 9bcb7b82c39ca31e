// Moving a part between replicas over HTTP (DESIGN.md 2.4 "Fetch"; the wire format is in
// docs/formats.md "Part transfer between replicas").
//
// The sending side is `GET /replication/part?name=<part>` on the replica's HTTP server
// (http_api.cpp), which streams a PartTransferReader's bytes. The fetching side is fetchPart: it
// writes the files as they arrive, checks every size and hash against the part's checksums.txt,
// verifies the whole part, and leaves a durable directory only when all of it is right. Both sides
// need the replicas' shared secret (TableSpec::interserver_secret).
//
// Thread safety: free functions may be called concurrently; a PartTransferReader is used by one
// thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "rtable/common/tls.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/table_schema.h"

namespace rtable::core {

inline constexpr std::string_view kPartTransferPath = "/replication/part";
// Up to 2026-12-07 a fetch sent the interserver secret itself in this header; a replica still
// accepts it from replicas not yet upgraded, and sends kFetchAuthHeader instead.
inline constexpr std::string_view kInterserverSecretHeader = "X-Rtable-Interserver-Secret";

// Whether `presented` is the secret. The time taken does not depend on where the two differ (it
// may depend on their lengths).
bool interserverSecretMatches(std::string_view secret, std::string_view presented);

// A fetch's proof of the interserver secret that does not give the secret away: "v1 <unix
// seconds> <hex HMAC-SHA256(secret, "v1\n<source>\n<target>\n<seconds>")>", where <source> is the
// replica asked, "host:port" as it advertises itself in ZooKeeper, and <target> the request's
// path and query as sent. A host that receives it learns nothing it could use elsewhere: another
// replica computes the HMAC over its own address and refuses it, and after kFetchAuthMaxAge it is
// refused everywhere.
inline constexpr std::string_view kFetchAuthHeader = "X-Rtable-Fetch-Auth";
inline constexpr int64_t kFetchAuthMaxAgeSeconds = 300;  // either way: clocks differ a little
std::string signFetch(std::string_view secret, std::string_view source, std::string_view target,
                      int64_t unix_seconds);
// Empty when `header` proves the secret for this source and target at `now_unix_seconds`; else
// why not (for the 401's message: it names no secret).
std::string checkFetchAuth(std::string_view secret, std::string_view source,
                           std::string_view target, std::string_view header,
                           int64_t now_unix_seconds);

// The body of a part transfer, read front to back. open() opens every file of the part and checks
// its size against checksums.txt, so the body's length is known before its first byte is sent and
// the files stay readable even if the part directory is removed meanwhile.
class PartTransferReader {
 public:
  // `expected`: the checksums the replica loaded for the part; checksums.txt on disk must say the
  // same. Errors name the part directory and the file.
  static std::expected<PartTransferReader, std::string> open(const std::filesystem::path& part_dir,
                                                             const PartChecksums& expected);
  // The body of a part held in memory (its files are shared, not copied).
  static std::expected<PartTransferReader, std::string> open(std::shared_ptr<const PartImage> image,
                                                             const PartChecksums& expected);
  PartTransferReader(PartTransferReader&&) noexcept;
  PartTransferReader& operator=(PartTransferReader&&) noexcept;
  ~PartTransferReader();

  // The whole body in bytes: the Content-Length of the response.
  uint64_t contentLength() const;
  // Up to `capacity` next bytes of the body into `data`; 0 once contentLength() bytes were read.
  // An error (a file that shrank or cannot be read) means the body cannot be completed.
  std::expected<std::size_t, std::string> read(uint8_t* data, std::size_t capacity);

 private:
  struct State;
  explicit PartTransferReader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// How long a fetch waits for a source: to connect (one address at a time), and for each next
// bytes of the answer (an idle connection; not the whole transfer, whose length depends on the
// part's size).
struct FetchTimeouts {
  std::chrono::milliseconds connect{1000};
  std::chrono::milliseconds receive{30000};
};

// A replica to fetch from: its name (for messages) and where its HTTP API listens.
struct FetchSource {
  std::string replica;
  std::string host;
  uint16_t port = 0;
  // The table generation the part belongs to (during a swap a replica serves two); 0: the one
  // the source serves.
  int64_t generation = 0;
  // HTTPS ("scheme: https" in its host node): the source's certificate must name `host`.
  bool tls = false;
};

struct FetchError {
  enum class Kind {
    kUnauthorized,  // the source refused our secret, has none, or we have none
    kNotFound,      // the part is not active on the source
    kTransfer,      // no complete answer: refused, reset, cut short, timed out, or an HTTP error
    kCorrupt,       // the bytes arrived but are not the part: a size, hash or format mismatch
    kLocal,         // on our side: our disk, dest_dir exists, or a request we cannot make
  };
  Kind kind;
  std::string message;  // names the source replica, and the file for kCorrupt
  int http_status = 0;  // the source's HTTP status; 0 when no HTTP answer arrived

  std::string toString() const;
};

std::string_view fetchErrorKindName(FetchError::Kind kind);

// Fetches `part_name` from `from` into `dest_dir`, which must not exist (it is not touched if it
// does). The files are written as they arrive and checked against the received checksums.txt
// (size and XXH3-128) while writing; then the whole part is verified (verifyPart: the schema's
// files, columns decode), every file and `dest_dir` are fsynced. The part becomes visible (and
// durable) when the caller renames `dest_dir` into the table directory and fsyncs that, as for
// writeStagedPart. On any failure `dest_dir` is removed.
//
// A source with `tls` is fetched from over HTTPS, trusting `tls`'s roots (a client context:
// the table's ca.crt); without a context such a fetch fails as kLocal. A source without `tls` is
// fetched from over plain HTTP even when `tls` is given (a table that turns TLS on rolls its
// replicas one at a time; the scheme comes from ZooKeeper, which only the table can write).
//
// Host name resolution is not bounded by `timeouts`.
std::expected<PartChecksums, FetchError> fetchPart(
    const FetchSource& from, const std::string& secret, const std::string& part_name,
    const std::filesystem::path& dest_dir, const TableSchema& schema, FetchTimeouts timeouts,
    common::TlsContext* tls = nullptr);

}  // namespace rtable::core
