// Keeper: the one seam between rtable and ZooKeeper.
//
// Every ZooKeeper request of the core and the operator goes through this interface. It has a real
// side (ZooKeeperClient, on libzookeeper_mt) and an in-memory side (FakeKeeperServer) that one
// conformance suite holds to the same semantics. Errors are values, sorted by meaning:
// connection-level errors (the request may or may not have been applied) versus semantic answers
// (no node, node exists, bad version, ...), which are never retried blindly.
//
// Thread safety: every implementation may be called from several threads at once. Watch callbacks
// run on the implementation's event thread and must not block on a Keeper request.
#pragma once

#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace rtable::core {

enum class KeeperCode {
  kOk,
  // Connection level: the outcome of the request is unknown.
  kConnectionLoss,
  kOperationTimeout,
  kSessionExpired,
  // Semantic answers: the request was decided by the server.
  kNoNode,
  kNodeExists,
  kBadVersion,
  kNotEmpty,
  kNoChildrenForEphemerals,
  kBadArguments,
  // The node's ACL does not grant this session's identities the operation (ZNOAUTH).
  kNoAuth,
  // An op of a failed multi that was not executed because an earlier one failed.
  kRuntimeInconsistency,
  kOther,
};

std::string_view keeperCodeName(KeeperCode code);
bool isConnectionLevel(KeeperCode code);

struct KeeperError {
  KeeperCode code = KeeperCode::kOther;
  std::string path;  // the node the failed request (or failed multi op) was about
  std::string detail;
  std::optional<std::size_t> failed_op_index;  // set for a multi

  bool isConnectionLevel() const { return rtable::core::isConnectionLevel(code); }
  // e.g. "node exists: /t/log/log- (multi op #0)"
  std::string toString() const;
};

template <class T>
using KeeperResult = std::expected<T, KeeperError>;
using KeeperStatus = std::expected<void, KeeperError>;

// ZooKeeper's Stat, field for field. cversion is what the server reports: for ZooKeeper >= 3.6 that
// is counter * 2 - numChildren in int32 (see SequentialCounter).
struct Stat {
  int64_t czxid = 0;
  int64_t mzxid = 0;
  int64_t ctime = 0;  // ms since the epoch
  int64_t mtime = 0;
  int32_t version = 0;
  int32_t cversion = 0;
  int32_t aversion = 0;
  int64_t ephemeral_owner = 0;  // session id, 0 for persistent nodes
  int32_t data_length = 0;
  int32_t num_children = 0;
  int64_t pzxid = 0;

  friend bool operator==(const Stat&, const Stat&) = default;
};

enum class CreateMode { kPersistent, kEphemeral, kPersistentSequential, kEphemeralSequential };

bool isSequential(CreateMode mode);
bool isEphemeral(CreateMode mode);

struct WatchEvent {
  enum class Type { kCreated, kDeleted, kChanged, kChild, kSessionExpired };
  Type type;
  std::string path;
};
using WatchCallback = std::function<void(const WatchEvent&)>;

// Multi operations. Version -1 matches any version.
namespace op {
struct Create {
  std::string path;
  std::string data;
  CreateMode mode = CreateMode::kPersistent;
};
struct Remove {
  std::string path;
  int32_t version = -1;
};
struct Set {
  std::string path;
  std::string data;
  int32_t version = -1;
};
struct Check {
  std::string path;
  int32_t version = -1;  // -1: only that the node exists
};
// Fails the multi with kNodeExists when the node exists. ZooKeeper 3.8 has no such op: it is
// emulated as create + delete of the same path in the same multi, so (like the real thing) it bumps
// the parent's sequential counter by one.
struct CheckNotExists {
  std::string path;
};
}  // namespace op

using Op = std::variant<op::Create, op::Remove, op::Set, op::Check, op::CheckNotExists>;

struct OpResult {
  std::string path_created;  // for Create: the full path, with the sequence suffix
  Stat stat;                 // for Set: the node's new Stat
};

struct GetResult {
  std::string data;
  Stat stat;
};

struct ChildrenResult {
  std::vector<std::string> names;  // unordered, as ZooKeeper returns them
  Stat stat;
};

class Keeper {
 public:
  virtual ~Keeper() = default;

  // The watch (if any) is set only when the request succeeds; it fires once.
  virtual KeeperResult<GetResult> get(const std::string& path, WatchCallback watch = {}) = 0;
  // A missing node is an answer (nullopt), not an error; the watch then fires on its creation.
  virtual KeeperResult<std::optional<Stat>> exists(const std::string& path,
                                                   WatchCallback watch = {}) = 0;
  virtual KeeperResult<ChildrenResult> children(const std::string& path,
                                                WatchCallback watch = {}) = 0;
  // Returns the created path (with the sequence suffix for sequential modes).
  virtual KeeperResult<std::string> create(const std::string& path, const std::string& data,
                                           CreateMode mode) = 0;
  virtual KeeperResult<Stat> set(const std::string& path, const std::string& data,
                                 int32_t version = -1) = 0;
  virtual KeeperStatus remove(const std::string& path, int32_t version = -1) = 0;

  // Reads several nodes in one go, one result per path in the same order (a missing node is that
  // path's kNoNode). Not atomic: each node is read as it is at its own moment. The real client
  // pipelines the requests on its connection (ClickHouse's pullLogsToQueue does the same with
  // asyncTryGet), so N nodes cost about one round trip instead of N; this default reads them one
  // after another.
  virtual std::vector<KeeperResult<GetResult>> getMany(const std::vector<std::string>& paths);

  // All ops or none. On failure the error carries the index (into `ops`) of the op that failed.
  KeeperResult<std::vector<OpResult>> multi(const std::vector<Op>& ops);

  // True once the server expired this session: every request now fails with kSessionExpired and
  // the caller must start a new session.
  virtual bool expired() const = 0;
  // False while the client has lost its connection and not found a server again: the session may
  // live on, but nothing can be read or written meanwhile. The replica counts as read-only then,
  // as ClickHouse's does (its client ends the session on any connection loss).
  virtual bool connected() const { return !expired(); }
  virtual int64_t sessionId() const = 0;
  // A fresh session to the same servers, with the same settings.
  virtual KeeperResult<std::unique_ptr<Keeper>> startNewSession() const = 0;

 protected:
  // `ops` holds no CheckNotExists: multi() has expanded those.
  virtual KeeperResult<std::vector<OpResult>> multiImpl(const std::vector<Op>& ops) = 0;
};

// Creates every missing ancestor of `path` and `path` itself as persistent nodes with empty data.
// Concurrent creators are fine (kNodeExists is the expected answer for them).
KeeperStatus createAncestorsAndSelf(Keeper& keeper, const std::string& path);

// Removes `path` and everything under it (children first, in multis of up to 100). A missing
// `path` is success. Not atomic: a crash half-way leaves part of the subtree; calling it again
// finishes the job. Gives up with kNotEmpty when children keep appearing.
KeeperStatus removeRecursive(Keeper& keeper, const std::string& path);

// "/a/b" + "c" -> "/a/b/c"; "/" + "c" -> "/c".
std::string joinPath(std::string_view parent, std::string_view child);

}  // namespace rtable::core
