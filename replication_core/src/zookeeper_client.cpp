#include "rtable/replication_core/zookeeper_client.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "rtable/common/base64.h"

namespace rtable::core {
namespace {

// getMany's window of outstanding reads: the pipeline stays full (a round trip is worth a few
// hundred reads), and another request of the session waits behind at most this many.
constexpr std::size_t kGetsInFlight = 256;

KeeperCode toKeeperCode(int rc) {
  switch (rc) {
    case ZOK:
      return KeeperCode::kOk;
    case ZCONNECTIONLOSS:
      return KeeperCode::kConnectionLoss;
    case ZOPERATIONTIMEOUT:
      return KeeperCode::kOperationTimeout;
    case ZSESSIONEXPIRED:
      return KeeperCode::kSessionExpired;
    // The handle is unusable after expiry; the C client then answers ZINVALIDSTATE.
    case ZINVALIDSTATE:
      return KeeperCode::kSessionExpired;
    case ZNONODE:
      return KeeperCode::kNoNode;
    case ZNODEEXISTS:
      return KeeperCode::kNodeExists;
    case ZBADVERSION:
      return KeeperCode::kBadVersion;
    case ZNOTEMPTY:
      return KeeperCode::kNotEmpty;
    case ZNOCHILDRENFOREPHEMERALS:
      return KeeperCode::kNoChildrenForEphemerals;
    case ZBADARGUMENTS:
      return KeeperCode::kBadArguments;
    case ZNOAUTH:
      return KeeperCode::kNoAuth;
    case ZRUNTIMEINCONSISTENCY:
      return KeeperCode::kRuntimeInconsistency;
    default:
      return KeeperCode::kOther;
  }
}

KeeperError toError(int rc, const std::string& path) {
  KeeperCode code = toKeeperCode(rc);
  return KeeperError{code, path, code == KeeperCode::kOther ? zerror(rc) : std::string{}, {}};
}

Stat toStat(const struct ::Stat& s) {
  return Stat{s.czxid,    s.mzxid,          s.ctime,      s.mtime,       s.version, s.cversion,
              s.aversion, s.ephemeralOwner, s.dataLength, s.numChildren, s.pzxid};
}

int toZooMode(CreateMode mode) {
  switch (mode) {
    case CreateMode::kPersistent:
      return ZOO_PERSISTENT;
    case CreateMode::kEphemeral:
      return ZOO_EPHEMERAL;
    case CreateMode::kPersistentSequential:
      return ZOO_PERSISTENT_SEQUENTIAL;
    case CreateMode::kEphemeralSequential:
      return ZOO_EPHEMERAL_SEQUENTIAL;
  }
  return ZOO_PERSISTENT;
}

// Room for the sequence suffix ZooKeeper appends ("%010d", or 11 chars once negative).
std::size_t createdPathCapacity(const std::string& path) {
  return path.size() + 16;
}

constexpr int kServersResolutionDelayMs = 30'000;

// An ACL in the C client's form, owning the strings its entries point into. Immutable, neither
// copied nor moved (the pointers stay good); a create holds it shared while it is sent.
class NodeAcl {
 public:
  struct Entry {
    std::string scheme;
    std::string id;
    int32_t perms = ZOO_PERM_ALL;
  };

  explicit NodeAcl(std::vector<Entry> entries) : entries_(std::move(entries)) {
    c_entries_.resize(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      c_entries_[i].perms = entries_[i].perms;
      c_entries_[i].id.scheme = entries_[i].scheme.data();
      c_entries_[i].id.id = entries_[i].id.data();
    }
    acl_.count = static_cast<int32_t>(c_entries_.size());
    acl_.data = c_entries_.data();
  }
  NodeAcl(const NodeAcl&) = delete;
  NodeAcl& operator=(const NodeAcl&) = delete;

  // Every permission for each id (digest scheme); with `others`, those for anyone too.
  static std::shared_ptr<const NodeAcl> forIds(const std::vector<std::string>& ids,
                                               int32_t others = 0) {
    std::vector<Entry> entries;
    for (const auto& id : ids) entries.push_back({"digest", id, ZOO_PERM_ALL});
    if (others != 0) entries.push_back({"world", "anyone", others});
    return std::make_shared<const NodeAcl>(std::move(entries));
  }
  // As ZooKeeper answered it.
  static std::shared_ptr<const NodeAcl> of(const struct ACL_vector& acl) {
    std::vector<Entry> entries;
    for (int32_t i = 0; i < acl.count; ++i) {
      entries.push_back({acl.data[i].id.scheme, acl.data[i].id.id, acl.data[i].perms});
    }
    return std::make_shared<const NodeAcl>(std::move(entries));
  }
  static std::shared_ptr<const NodeAcl> open() {
    static const auto kOpen =
        std::make_shared<const NodeAcl>(std::vector<Entry>{{"world", "anyone", ZOO_PERM_ALL}});
    return kOpen;
  }

  // The C client takes a non-const pointer and only reads through it.
  struct ACL_vector* get() const { return const_cast<struct ACL_vector*>(&acl_); }

 private:
  std::vector<Entry> entries_;  // never changed after construction
  std::vector<struct ::ACL> c_entries_;
  struct ACL_vector acl_{};
};

// The ACL of the nodes of a subtree: an identity's own (everything, for its password and, during
// a rotation, its previous one; nobody else), or one several identities share.
struct SubtreeAcl {
  std::string subtree;
  std::vector<std::string> ids;
  std::shared_ptr<const NodeAcl> acl;

  explicit SubtreeAcl(const ZooKeeperDigest& digest)
      : subtree(digest.subtree), ids(digestAclIds(digest)), acl(NodeAcl::forIds(ids)) {}
  explicit SubtreeAcl(const SharedSubtree& shared)
      : subtree(shared.subtree), ids(shared.ids), acl(NodeAcl::forIds(ids, ZOO_PERM_READ)) {}

  bool holds(const std::string& path) const {
    return path.starts_with(subtree) &&
           (path.size() == subtree.size() || path[subtree.size()] == '/' || subtree == "/");
  }
};

// The deepest of `acls` holding `path` (of two for the same subtree, the later), or null.
const SubtreeAcl* deepestHolding(const std::vector<std::unique_ptr<SubtreeAcl>>& acls,
                                 const std::string& path) {
  const SubtreeAcl* best = nullptr;
  for (const auto& acl : acls) {
    if (acl->holds(path) && (!best || acl->subtree.size() >= best->subtree.size()))
      best = acl.get();
  }
  return best;
}

// Inherited ACLs remembered per ancestor; past this many the memory starts again (a replica
// meets one operation per backup, for as long as it runs).
constexpr std::size_t kInheritedAclsKept = 256;

class ZooKeeperClientImpl;

// One registered watch. The C client calls it once for its node event, and for every session
// event until then.
struct WatchContext {
  ZooKeeperClientImpl* client;
  WatchCallback callback;
};

class ZooKeeperClientImpl final : public ZooKeeperClient {
 public:
  explicit ZooKeeperClientImpl(ZooKeeperConfig config) : config_(std::move(config)) {
    for (const auto& digest : config_.digests)
      subtree_acls_.push_back(std::make_unique<SubtreeAcl>(digest));
    for (const auto& shared : config_.shared_subtrees)
      shared_acls_.push_back(std::make_unique<SubtreeAcl>(shared));
  }

  ~ZooKeeperClientImpl() override {
    if (handle_) zookeeper_close(handle_);
    // After zookeeper_close no callback runs any more.
    for (WatchContext* ctx : watches_) delete ctx;
  }

  KeeperStatus start() {
    static std::once_flag quiet_logs;
    // The C client logs every reconnect attempt at INFO to stderr; errors are ours to report.
    std::call_once(quiet_logs, [] { zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR); });
    handle_ = zookeeper_init(config_.connect_string.c_str(), &ZooKeeperClientImpl::sessionWatcher,
                             static_cast<int>(config_.session_timeout.count()), nullptr, this, 0);
    if (!handle_) {
      return std::unexpected(KeeperError{
          KeeperCode::kBadArguments,
          "",
          fmt::format("invalid connect string '{}': {}", config_.connect_string, strerror(errno)),
          {}});
    }
    // By default the C client re-resolves the connect string (getaddrinfo: a netlink dump) on every
    // turn of its I/O loop, i.e. before each request and after each answer: ~1 ms per request on
    // these machines. Routine re-resolution every 30 s still follows servers that move (pods get
    // new addresses); a lost connection always resolves again.
    zoo_set_servers_resolution_delay(handle_, kServersResolutionDelayMs);
    std::unique_lock lock(mu_);
    if (!state_changed_.wait_for(lock, config_.connect_timeout,
                                 [this] { return connected_ || expired_; }) ||
        expired_) {
      return std::unexpected(
          KeeperError{KeeperCode::kConnectionLoss,
                      "",
                      fmt::format("could not connect to ZooKeeper at {} within {} ms",
                                  config_.connect_string, config_.connect_timeout.count()),
                      {}});
    }
    lock.unlock();
    return addAuth();
  }

  // Adds every digest identity to the session before its first request.
  KeeperStatus addAuth() {
    for (const auto& digest : config_.digests) {
      if (auto added = addAuth(digest); !added) return added;
    }
    return {};
  }

  // Adds one identity (with its previous password, when rotating) to the session.
  KeeperStatus addAuth(const ZooKeeperDigest& digest) {
    if (auto added = addAuth(digest, digest.password); !added) return added;
    if (digest.previous_password.empty()) return {};
    return addAuth(digest, digest.previous_password);
  }

  // Adds one credential to the session and waits for ZooKeeper's verdict.
  KeeperStatus addAuth(const ZooKeeperDigest& digest, const std::string& password) {
    {
      const std::string credential = digest.user + ":" + password;
      std::promise<int> answered;
      auto answer = answered.get_future();
      const int rc = zoo_add_auth(
          handle_, "digest", credential.data(), static_cast<int>(credential.size()),
          [](int rc, const void* data) {
            static_cast<std::promise<int>*>(const_cast<void*>(data))->set_value(rc);
          },
          &answered);
      if (rc != ZOK) return std::unexpected(toError(rc, digest.subtree));
      if (answer.wait_for(config_.connect_timeout) != std::future_status::ready) {
        // The completion still points at `answered`: it must not outlive this frame.
        zookeeper_close(handle_);
        handle_ = nullptr;
        return std::unexpected(KeeperError{
            KeeperCode::kConnectionLoss,
            digest.subtree,
            fmt::format("ZooKeeper did not answer the authentication of '{}' within {} ms",
                        digest.user, config_.connect_timeout.count()),
            {}});
      }
      if (const int added = answer.get(); added != ZOK) {
        return std::unexpected(KeeperError{
            KeeperCode::kOther,
            digest.subtree,
            fmt::format("authentication of '{}' refused: {}", digest.user, zerror(added)),
            {}});
      }
    }
    return {};
  }

  // The ACL for a node created at `path` (ZooKeeperConfig): the deepest subtree's identity, else
  // the deepest shared subtree's, else the inherited one, else open to all.
  KeeperResult<std::shared_ptr<const NodeAcl>> aclFor(const std::string& path) {
    std::string ancestor;
    {
      std::lock_guard lock(mu_);
      if (const SubtreeAcl* own = deepestHolding(subtree_acls_, path)) return own->acl;
      if (const SubtreeAcl* shared = deepestHolding(shared_acls_, path)) return shared->acl;
      for (const auto& root : config_.inheriting_roots) {
        if (!path.starts_with(root) || path.size() <= root.size() + 1 || path[root.size()] != '/')
          continue;
        const std::size_t end = path.find('/', root.size() + 1);
        if (end == std::string::npos) continue;  // a child of the root itself
        ancestor = path.substr(0, end);
        if (auto known = inherited_acls_.find(ancestor); known != inherited_acls_.end())
          return known->second;
        break;
      }
    }
    if (ancestor.empty()) return NodeAcl::open();
    struct ACL_vector acl{};
    struct ::Stat stat{};
    const int rc = zoo_get_acl(handle_, ancestor.c_str(), &acl, &stat);
    if (rc != ZOK) return std::unexpected(toError(rc, ancestor));
    auto inherited = NodeAcl::of(acl);
    deallocate_ACL_vector(&acl);
    std::lock_guard lock(mu_);
    if (inherited_acls_.size() >= kInheritedAclsKept) inherited_acls_.clear();
    inherited_acls_.emplace(ancestor, inherited);
    return inherited;
  }

  KeeperStatus addDigest(const ZooKeeperDigest& digest) override {
    {
      std::lock_guard lock(mu_);
      auto held = std::find(config_.digests.begin(), config_.digests.end(), digest);
      if (held != config_.digests.end()) {
        // Authenticated already; it becomes the subtree's policy again if another took over (a
        // rotation undone: the previous password put back).
        const SubtreeAcl* latest = nullptr;
        for (const auto& acl : subtree_acls_) {
          if (acl->subtree == digest.subtree) latest = acl.get();
        }
        if (!latest || latest->ids != digestAclIds(digest)) {
          config_.digests.erase(held);
          config_.digests.push_back(digest);
          subtree_acls_.push_back(std::make_unique<SubtreeAcl>(digest));
        }
        return {};
      }
    }
    // Concurrent adds of one digest may both send it: ZooKeeper keeps an identity once.
    if (auto added = addAuth(digest); !added) return added;
    std::lock_guard lock(mu_);
    if (std::find(config_.digests.begin(), config_.digests.end(), digest) ==
        config_.digests.end()) {
      config_.digests.push_back(digest);
      subtree_acls_.push_back(std::make_unique<SubtreeAcl>(digest));
    }
    return {};
  }

  KeeperResult<std::size_t> restrictSubtree(const std::string& subtree) override {
    const SubtreeAcl* policy = nullptr;
    {
      std::lock_guard lock(mu_);
      for (const auto& acl : subtree_acls_) {
        if (acl->subtree == subtree) policy = acl.get();  // the latest for the subtree
      }
    }
    if (!policy) {
      return std::unexpected(
          KeeperError{KeeperCode::kBadArguments,
                      subtree,
                      "this session holds no identity for the subtree: add its digest first",
                      {}});
    }
    // Pipelined: the walk keeps up to kGetsInFlight requests on the connection, so it is bound by
    // ZooKeeper's work rather than by one round trip after another (rtable-acl-walk-bench). Per
    // node: getAcl; setAcl when it differs; then getChildren. Top-down as before: a node's
    // children are listed (and so visited) only once it has the ACL, which stops anyone else
    // creating open children under it meanwhile, and which lets the walk read it.
    struct Walk;
    enum class Kind { kAcl, kChildren, kSet };
    struct Call {
      Walk* walk;
      Kind kind;
      std::string path;
      int rc = ZOK;
      bool same = false;                  // kAcl: the node has the wanted ACL already
      std::vector<std::string> children;  // kChildren
    };
    struct Walk {
      const SubtreeAcl* policy;
      std::mutex mu;
      std::condition_variable answered;
      std::deque<Call*> done;  // in the order of the answers

      // On the C client's completion thread.
      void deliver(Call* call) {
        std::lock_guard lock(mu);
        done.push_back(call);
        answered.notify_all();
      }
    };
    Walk walk{policy, {}, {}, {}};
    static constexpr acl_completion_t kAclDone = [](int rc, struct ACL_vector* acl, struct ::Stat*,
                                                    const void* data) {
      auto* call = static_cast<Call*>(const_cast<void*>(data));
      call->rc = rc;
      if (rc == ZOK) {
        // The same ids, each with every permission, in any order.
        std::set<std::string> ids;
        bool same = acl->count == static_cast<int32_t>(call->walk->policy->ids.size());
        for (int32_t i = 0; same && i < acl->count; ++i) {
          same = std::string_view(acl->data[i].id.scheme) == "digest" &&
                 acl->data[i].perms == ZOO_PERM_ALL;
          ids.insert(acl->data[i].id.id);
        }
        const auto& wanted = call->walk->policy->ids;
        call->same = same && ids == std::set<std::string>(wanted.begin(), wanted.end());
      }
      call->walk->deliver(call);
    };
    static constexpr strings_completion_t kChildrenDone =
        [](int rc, const struct String_vector* strings, const void* data) {
          auto* call = static_cast<Call*>(const_cast<void*>(data));
          call->rc = rc;
          if (rc == ZOK && strings) {
            for (int32_t i = 0; i < strings->count; ++i)
              call->children.emplace_back(strings->data[i]);
          }
          call->walk->deliver(call);
        };
    static constexpr void_completion_t kSetDone = [](int rc, const void* data) {
      auto* call = static_cast<Call*>(const_cast<void*>(data));
      call->rc = rc;
      call->walk->deliver(call);
    };

    std::size_t in_flight = 0;  // this thread's count; every request sent gets one answer
    std::optional<KeeperError> failure;
    auto send = [&](Kind kind, const std::string& path) {
      auto* call = new Call{&walk, kind, path, ZOK, false, {}};
      int rc = ZOK;
      switch (kind) {
        case Kind::kAcl:
          rc = zoo_aget_acl(handle_, call->path.c_str(), kAclDone, call);
          break;
        case Kind::kChildren:
          rc = zoo_aget_children(handle_, call->path.c_str(), 0, kChildrenDone, call);
          break;
        case Kind::kSet:
          rc = zoo_aset_acl(handle_, call->path.c_str(), -1, walk.policy->acl->get(), kSetDone,
                            call);
          break;
      }
      if (rc != ZOK) {  // not queued: no answer will come
        if (!failure) failure = toError(rc, path);
        delete call;
        return;
      }
      ++in_flight;
    };
    std::size_t changed = 0;
    std::deque<std::string> to_visit{subtree};
    for (;;) {
      while (!failure && !to_visit.empty() && in_flight < kGetsInFlight) {
        const std::string path = std::move(to_visit.front());
        to_visit.pop_front();
        send(Kind::kAcl, path);
      }
      if (in_flight == 0 && (failure || to_visit.empty())) break;
      std::deque<Call*> answers;
      {
        std::unique_lock lock(walk.mu);
        walk.answered.wait(lock, [&] { return !walk.done.empty(); });
        answers.swap(walk.done);
      }
      for (Call* call : answers) {
        std::unique_ptr<Call> owned(call);
        --in_flight;
        // A node deleted meanwhile is skipped; the subtree's root must exist.
        if (call->rc == ZNONODE && (call->path != subtree || call->kind != Kind::kAcl)) continue;
        if (call->rc != ZOK) {
          if (!failure) failure = toError(call->rc, call->path);
          continue;
        }
        if (failure) continue;
        switch (call->kind) {
          case Kind::kAcl:
            send(call->same ? Kind::kChildren : Kind::kSet, call->path);
            break;
          case Kind::kChildren:
            for (const auto& name : call->children) to_visit.push_back(call->path + "/" + name);
            break;
          case Kind::kSet:
            ++changed;
            send(Kind::kChildren, call->path);
            break;
        }
      }
    }
    if (failure) return std::unexpected(*failure);
    return changed;
  }

  KeeperResult<GetResult> get(const std::string& path, WatchCallback watch) override {
    // Try a buffer that fits most nodes; the Stat says when the data was longer.
    std::string buffer(64 * 1024, '\0');
    for (;;) {
      struct ::Stat stat{};
      int len = static_cast<int>(buffer.size());
      WatchContext* ctx = registerWatch(std::move(watch));
      const int rc =
          zoo_wget(handle_, path.c_str(), ctx ? &ZooKeeperClientImpl::nodeWatcher : nullptr, ctx,
                   buffer.data(), &len, &stat);
      if (rc != ZOK) {
        unregisterWatch(ctx);
        return std::unexpected(toError(rc, path));
      }
      if (stat.dataLength <= static_cast<int>(buffer.size())) {
        buffer.resize(len < 0 ? 0 : static_cast<std::size_t>(len));
        return GetResult{std::move(buffer), toStat(stat)};
      }
      // The data grew past the buffer: read again with room for all of it. The watch set by the
      // first read stays and fires for the next change, which is what the caller asked for.
      watch = {};
      buffer.assign(static_cast<std::size_t>(stat.dataLength), '\0');
    }
  }

  std::vector<KeeperResult<GetResult>> getMany(const std::vector<std::string>& paths) override {
    // The requests go out on the connection back to back, at most kGetsInFlight at a time; the
    // C client answers them in order on its completion thread. ZooKeeper answers a session's
    // requests in order, and the session is shared (the inserts' commits use it): with every
    // request of a big batch queued at once, a commit sent meanwhile waited for all of them (a
    // first dedup window cleanup reading 50,000 ids held 64 async inserts' commits 1.7 s).
    // A lost connection or session completes every outstanding request with an error, so the
    // waits below always end.
    struct Batch {
      std::mutex mu;
      std::condition_variable done;
      std::size_t pending = 0;
      std::vector<KeeperResult<GetResult>> results;
    };
    struct Slot {
      Batch* batch;
      std::size_t index;
      const std::string* path;
    };
    Batch batch;
    batch.results.assign(paths.size(),
                         std::unexpected(KeeperError{KeeperCode::kOther, "", "not answered", {}}));
    std::vector<Slot> slots(paths.size());
    static constexpr data_completion_t kCompletion =
        [](int rc, const char* value, int value_len, const struct ::Stat* stat, const void* data) {
          const auto* slot = static_cast<const Slot*>(data);
          KeeperResult<GetResult> result =
              rc == ZOK
                  ? KeeperResult<GetResult>(GetResult{
                        value ? std::string(value, static_cast<std::size_t>(std::max(value_len, 0)))
                              : std::string(),
                        toStat(*stat)})
                  : std::unexpected(toError(rc, *slot->path));
          std::lock_guard lock(slot->batch->mu);
          slot->batch->results[slot->index] = std::move(result);
          const std::size_t pending = --slot->batch->pending;
          if (pending == 0 || pending == kGetsInFlight - 1) slot->batch->done.notify_all();
        };
    for (std::size_t i = 0; i < paths.size(); ++i) {
      slots[i] = Slot{&batch, i, &paths[i]};
      {
        std::unique_lock lock(batch.mu);
        batch.done.wait(lock, [&] { return batch.pending < kGetsInFlight; });
        ++batch.pending;
      }
      const int rc = zoo_aget(handle_, paths[i].c_str(), 0, kCompletion, &slots[i]);
      if (rc != ZOK) {
        // Not queued: no completion will come for it.
        std::lock_guard lock(batch.mu);
        --batch.pending;
        batch.results[i] = std::unexpected(toError(rc, paths[i]));
      }
    }
    std::unique_lock lock(batch.mu);
    batch.done.wait(lock, [&] { return batch.pending == 0; });
    return std::move(batch.results);
  }

  KeeperResult<std::optional<Stat>> exists(const std::string& path, WatchCallback watch) override {
    struct ::Stat stat{};
    WatchContext* ctx = registerWatch(std::move(watch));
    const int rc = zoo_wexists(handle_, path.c_str(),
                               ctx ? &ZooKeeperClientImpl::nodeWatcher : nullptr, ctx, &stat);
    if (rc == ZNONODE) return std::optional<Stat>{};  // the watch stays, for the creation
    if (rc != ZOK) {
      unregisterWatch(ctx);
      return std::unexpected(toError(rc, path));
    }
    return std::optional<Stat>{toStat(stat)};
  }

  KeeperResult<ChildrenResult> children(const std::string& path, WatchCallback watch) override {
    struct String_vector names{};
    struct ::Stat stat{};
    WatchContext* ctx = registerWatch(std::move(watch));
    const int rc =
        zoo_wget_children2(handle_, path.c_str(), ctx ? &ZooKeeperClientImpl::nodeWatcher : nullptr,
                           ctx, &names, &stat);
    if (rc != ZOK) {
      unregisterWatch(ctx);
      return std::unexpected(toError(rc, path));
    }
    ChildrenResult result{{}, toStat(stat)};
    result.names.reserve(static_cast<std::size_t>(names.count));
    for (int i = 0; i < names.count; ++i) result.names.emplace_back(names.data[i]);
    deallocate_String_vector(&names);
    return result;
  }

  KeeperResult<std::string> create(const std::string& path, const std::string& data,
                                   CreateMode mode) override {
    auto acl = aclFor(path);
    if (!acl) return std::unexpected(acl.error());
    std::string created(createdPathCapacity(path), '\0');
    const int rc =
        zoo_create(handle_, path.c_str(), data.data(), static_cast<int>(data.size()), (*acl)->get(),
                   toZooMode(mode), created.data(), static_cast<int>(created.size()));
    if (rc != ZOK) return std::unexpected(toError(rc, path));
    created.resize(std::strlen(created.c_str()));
    return created;
  }

  KeeperResult<Stat> set(const std::string& path, const std::string& data,
                         int32_t version) override {
    struct ::Stat stat{};
    const int rc =
        zoo_set2(handle_, path.c_str(), data.data(), static_cast<int>(data.size()), version, &stat);
    if (rc != ZOK) return std::unexpected(toError(rc, path));
    return toStat(stat);
  }

  KeeperStatus remove(const std::string& path, int32_t version) override {
    const int rc = zoo_delete(handle_, path.c_str(), version);
    if (rc != ZOK) return std::unexpected(toError(rc, path));
    return {};
  }

  bool expired() const override {
    std::lock_guard lock(mu_);
    return expired_;
  }

  bool connected() const override {
    std::lock_guard lock(mu_);
    return connected_ && !expired_;
  }

  int64_t sessionId() const override { return zoo_client_id(handle_)->client_id; }

  KeeperResult<std::unique_ptr<Keeper>> startNewSession() const override {
    ZooKeeperConfig config;
    {
      std::lock_guard lock(mu_);
      config = config_;
    }
    auto client = ZooKeeperClient::connect(config);
    if (!client) return std::unexpected(client.error());
    return std::unique_ptr<Keeper>(std::move(*client));
  }

  SessionCredentials sessionCredentialsForTest() const override {
    const clientid_t* id = zoo_client_id(handle_);
    return SessionCredentials{id->client_id, std::string(id->passwd, sizeof(id->passwd))};
  }

 protected:
  KeeperResult<std::vector<OpResult>> multiImpl(const std::vector<Op>& ops) override {
    if (ops.empty()) return std::vector<OpResult>{};
    // libzookeeper_mt 3.8's zoo_amulti frees an uninitialised request path for every op after the
    // first one whose path check fails, and on an expired handle that check fails: a double free
    // (seen in the fault tests). Never hand it an expired handle. (A session that expires while
    // the request is being built can still hit it: a window of microseconds.)
    if (is_unrecoverable(handle_) != ZOK) {
      return std::unexpected(KeeperError{KeeperCode::kSessionExpired, "", "session expired", {}});
    }
    const std::size_t n = ops.size();
    std::vector<zoo_op_t> zoo_ops(n);
    std::vector<zoo_op_result_t> zoo_results(n);
    std::vector<std::string> created(n);
    std::vector<struct ::Stat> stats(n);
    std::vector<std::shared_ptr<const NodeAcl>> acls(n);  // held until the request is sent
    for (std::size_t i = 0; i < n; ++i) {
      if (const auto* create = std::get_if<op::Create>(&ops[i])) {
        auto acl = aclFor(create->path);
        if (!acl) return std::unexpected(acl.error());
        acls[i] = std::move(*acl);
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      std::visit(
          [&](const auto& o) {
            using T = std::decay_t<decltype(o)>;
            if constexpr (std::is_same_v<T, op::Create>) {
              created[i].assign(createdPathCapacity(o.path), '\0');
              zoo_create_op_init(&zoo_ops[i], o.path.c_str(), o.data.data(),
                                 static_cast<int>(o.data.size()), acls[i]->get(), toZooMode(o.mode),
                                 created[i].data(), static_cast<int>(created[i].size()));
            } else if constexpr (std::is_same_v<T, op::Remove>) {
              zoo_delete_op_init(&zoo_ops[i], o.path.c_str(), o.version);
            } else if constexpr (std::is_same_v<T, op::Set>) {
              zoo_set_op_init(&zoo_ops[i], o.path.c_str(), o.data.data(),
                              static_cast<int>(o.data.size()), o.version, &stats[i]);
            } else if constexpr (std::is_same_v<T, op::Check>) {
              zoo_check_op_init(&zoo_ops[i], o.path.c_str(), o.version);
            } else {
              static_assert(std::is_same_v<T, op::CheckNotExists>);
              // Expanded by Keeper::multi; a check of "-2" versions can never pass.
              zoo_check_op_init(&zoo_ops[i], o.path.c_str(), -2);
            }
          },
          ops[i]);
    }
    const int rc = zoo_multi(handle_, static_cast<int>(n), zoo_ops.data(), zoo_results.data());
    if (rc != ZOK) {
      // The failed op is the first whose result is neither ok nor "not executed".
      for (std::size_t i = 0; i < n; ++i) {
        const int err = zoo_results[i].err;
        if (err != ZOK && err != ZRUNTIMEINCONSISTENCY) {
          KeeperError error =
              toError(err, std::visit([](const auto& o) { return o.path; }, ops[i]));
          error.failed_op_index = i;
          return std::unexpected(std::move(error));
        }
      }
      // No per-op verdict: the whole request failed (connection loss, expiry).
      return std::unexpected(toError(rc, ""));
    }
    std::vector<OpResult> results(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (std::holds_alternative<op::Create>(ops[i])) {
        results[i].path_created = created[i].c_str();
      } else if (std::holds_alternative<op::Set>(ops[i])) {
        results[i].stat = toStat(stats[i]);
      }
    }
    return results;
  }

 private:
  static void sessionWatcher(zhandle_t*, int type, int state, const char*, void* context) {
    if (type != ZOO_SESSION_EVENT) return;
    auto* self = static_cast<ZooKeeperClientImpl*>(context);
    std::lock_guard lock(self->mu_);
    // Every change of the connection comes here: CONNECTING after a loss, CONNECTED once a server
    // took the session back.
    self->connected_ = state == ZOO_CONNECTED_STATE;
    // A refused authentication (sent again after a reconnect) leaves the handle unusable, as
    // expiry does: a new session authenticates again, and says why if it cannot.
    if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) self->expired_ = true;
    self->state_changed_.notify_all();
  }

  static void nodeWatcher(zhandle_t*, int type, int state, const char* path, void* context) {
    auto* ctx = static_cast<WatchContext*>(context);
    WatchEvent event{WatchEvent::Type::kChanged, path ? path : ""};
    if (type == ZOO_SESSION_EVENT) {
      // Disconnects and reconnects keep the watch; only expiry ends it.
      if (state != ZOO_EXPIRED_SESSION_STATE) return;
      event.type = WatchEvent::Type::kSessionExpired;
    } else if (type == ZOO_CREATED_EVENT) {
      event.type = WatchEvent::Type::kCreated;
    } else if (type == ZOO_DELETED_EVENT) {
      event.type = WatchEvent::Type::kDeleted;
    } else if (type == ZOO_CHILD_EVENT) {
      event.type = WatchEvent::Type::kChild;
    } else if (type != ZOO_CHANGED_EVENT) {
      return;  // ZOO_NOTWATCHING_EVENT: removed watches are not used here
    }
    WatchCallback callback = std::move(ctx->callback);
    ctx->callback = nullptr;
    // A node event removes the watcher from the C client's tables, so the context can go. After
    // expiry the C client may still hold it: it stays (spent) until the client is destroyed.
    if (event.type != WatchEvent::Type::kSessionExpired) ctx->client->unregisterWatch(ctx);
    if (callback) callback(event);
  }

  WatchContext* registerWatch(WatchCallback callback) {
    if (!callback) return nullptr;
    auto* ctx = new WatchContext{this, std::move(callback)};
    std::lock_guard lock(mu_);
    watches_.insert(ctx);
    return ctx;
  }

  void unregisterWatch(WatchContext* ctx) {
    if (!ctx) return;
    {
      std::lock_guard lock(mu_);
      watches_.erase(ctx);
    }
    delete ctx;
  }

  ZooKeeperConfig config_;  // its digests grow by addDigest, under mu_
  std::vector<std::unique_ptr<SubtreeAcl>> subtree_acls_;                 // under mu_
  std::vector<std::unique_ptr<SubtreeAcl>> shared_acls_;                  // fixed at construction
  std::map<std::string, std::shared_ptr<const NodeAcl>> inherited_acls_;  // under mu_
  zhandle_t* handle_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable state_changed_;
  bool connected_ = false;
  bool expired_ = false;
  std::set<WatchContext*> watches_;
};

}  // namespace

std::string digestAclId(const std::string& user, const std::string& password) {
  const std::string credential = user + ":" + password;
  unsigned char sha[EVP_MAX_MD_SIZE];
  unsigned int sha_size = 0;
  EVP_Digest(credential.data(), credential.size(), sha, &sha_size, EVP_sha1(), nullptr);
  return user + ":" +
         common::base64Encode(std::string_view(reinterpret_cast<const char*>(sha), sha_size));
}

std::vector<std::string> digestAclIds(const ZooKeeperDigest& digest) {
  std::vector<std::string> ids{digestAclId(digest.user, digest.password)};
  if (!digest.previous_password.empty())
    ids.push_back(digestAclId(digest.user, digest.previous_password));
  return ids;
}

void ZooKeeperClient::silenceLibraryLog() {
  static FILE* const null_stream = std::fopen("/dev/null", "w");
  if (null_stream) zoo_set_log_stream(null_stream);
}

KeeperResult<std::unique_ptr<ZooKeeperClient>> ZooKeeperClient::connect(
    const ZooKeeperConfig& config) {
  auto client = std::make_unique<ZooKeeperClientImpl>(config);
  if (auto started = client->start(); !started) return std::unexpected(started.error());
  return std::unique_ptr<ZooKeeperClient>(std::move(client));
}

}  // namespace rtable::core
