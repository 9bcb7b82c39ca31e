#include "rtable/replication_core/testing/fake_keeper.h"

#include <fmt/format.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <unordered_set>

namespace rtable::core::testing {
namespace {

std::string parentOf(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

// ZooKeeper's PathUtils.validatePath, for the cases that matter here.
bool validPath(const std::string& path, bool sequential) {
  if (path.empty() || path[0] != '/') return false;
  if (path == "/") return true;
  if (path.back() == '/' && !sequential) return false;
  std::size_t start = 1;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string_view part(path.data() + start, end - start);
    const bool trailing = end == path.size();
    if (part.empty() && !(trailing && sequential)) return false;
    if (part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

KeeperError error(KeeperCode code, std::string path) {
  return KeeperError{code, std::move(path), {}, {}};
}

struct Node {
  std::string data;
  Stat stat;            // cversion is not kept here: it is derived from `counter`
  int32_t counter = 0;  // the sequential counter (ZooKeeper's internal cversion)
  std::set<std::string> children;
};

struct PendingWatch {
  int64_t session;
  WatchCallback callback;
};

struct Notification {
  WatchCallback callback;
  WatchEvent event;
};
using Notifications = std::vector<Notification>;

class FakeKeeperServerImpl final : public FakeKeeperServer {
 public:
  FakeKeeperServerImpl() { nodes_["/"] = Node{}; }

  std::unique_ptr<Keeper> connect() override;

  void expireSession(int64_t session_id) override {
    Notifications notifications;
    {
      std::lock_guard lock(mu_);
      if (!live_sessions_.erase(session_id)) return;
      expired_sessions_.insert(session_id);
      removeEphemeralsLocked(session_id, notifications);
      for (auto* watches : {&data_watches_, &child_watches_}) {
        for (auto it = watches->begin(); it != watches->end();) {
          if (it->second.session == session_id) {
            notifications.push_back(
                {std::move(it->second.callback), {WatchEvent::Type::kSessionExpired, it->first}});
            it = watches->erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    deliver(notifications);
  }

  void closeSession(int64_t session_id) {
    Notifications notifications;
    {
      std::lock_guard lock(mu_);
      if (!live_sessions_.erase(session_id)) return;
      removeEphemeralsLocked(session_id, notifications);
      for (auto* watches : {&data_watches_, &child_watches_}) {
        std::erase_if(*watches, [&](const auto& w) { return w.second.session == session_id; });
      }
    }
    deliver(notifications);
  }

  bool isExpired(int64_t session_id) const {
    std::lock_guard lock(mu_);
    return expired_sessions_.contains(session_id);
  }

  KeeperStatus setSequentialCounterForTest(const std::string& path, int32_t counter) override {
    std::lock_guard lock(mu_);
    auto it = nodes_.find(path);
    if (it == nodes_.end()) return std::unexpected(error(KeeperCode::kNoNode, path));
    it->second.counter = counter;
    return {};
  }

  void failNextRequestsForTest(int count, int after) override {
    std::lock_guard lock(mu_);
    failures_to_inject_ = count;
    requests_before_failures_ = after;
  }

  void loseNextMultiAnswersForTest(int count, int after) override {
    std::lock_guard lock(mu_);
    multi_answers_to_lose_ = count;
    multis_before_losses_ = after;
  }

  void setTimeForTest(int64_t ms) override {
    std::lock_guard lock(mu_);
    fixed_time_ms_ = ms;
  }

  int64_t requestCountForTest() const override {
    std::lock_guard lock(mu_);
    return requests_;
  }

  KeeperResult<GetResult> get(int64_t session, const std::string& path, WatchCallback watch) {
    std::lock_guard lock(mu_);
    if (auto rejected = admitLocked(session, path)) return std::unexpected(*rejected);
    auto it = nodes_.find(path);
    if (it == nodes_.end()) return std::unexpected(error(KeeperCode::kNoNode, path));
    if (watch) data_watches_.emplace(path, PendingWatch{session, std::move(watch)});
    return GetResult{it->second.data, visibleStat(it->second)};
  }

  KeeperResult<std::optional<Stat>> exists(int64_t session, const std::string& path,
                                           WatchCallback watch) {
    std::lock_guard lock(mu_);
    if (auto rejected = admitLocked(session, path)) return std::unexpected(*rejected);
    if (watch) data_watches_.emplace(path, PendingWatch{session, std::move(watch)});
    auto it = nodes_.find(path);
    if (it == nodes_.end()) return std::optional<Stat>{};
    return std::optional<Stat>{visibleStat(it->second)};
  }

  KeeperResult<ChildrenResult> children(int64_t session, const std::string& path,
                                        WatchCallback watch) {
    std::lock_guard lock(mu_);
    if (auto rejected = admitLocked(session, path)) return std::unexpected(*rejected);
    auto it = nodes_.find(path);
    if (it == nodes_.end()) return std::unexpected(error(KeeperCode::kNoNode, path));
    if (watch) child_watches_.emplace(path, PendingWatch{session, std::move(watch)});
    return ChildrenResult{{it->second.children.begin(), it->second.children.end()},
                          visibleStat(it->second)};
  }

  // Applies `ops` atomically under one zxid, as ZooKeeper's multi does.
  KeeperResult<std::vector<OpResult>> transact(int64_t session, const std::vector<Op>& ops) {
    Notifications notifications;
    std::vector<OpResult> results;
    bool lose_answer = false;
    {
      std::lock_guard lock(mu_);
      if (auto rejected = admitLocked(session, ops.empty() ? "" : pathOf(ops.front()))) {
        return std::unexpected(*rejected);
      }
      Transaction txn{*this, session, ++zxid_};
      for (std::size_t i = 0; i < ops.size(); ++i) {
        auto result = std::visit([&](const auto& o) { return txn.apply(o); }, ops[i]);
        if (!result) {
          txn.rollback();
          --zxid_;
          KeeperError failed = std::move(result.error());
          failed.failed_op_index = i;
          return std::unexpected(std::move(failed));
        }
        results.push_back(std::move(*result));
      }
      notifications = std::move(txn.notifications);
      if (multi_answers_to_lose_ > 0 && multis_before_losses_ > 0) {
        --multis_before_losses_;
      } else if (multi_answers_to_lose_ > 0) {
        --multi_answers_to_lose_;
        lose_answer = true;  // applied; the reply is what goes missing
      }
    }
    deliver(notifications);
    if (lose_answer) {
      return std::unexpected(error(KeeperCode::kConnectionLoss, pathOf(ops.front())));
    }
    return results;
  }

 private:
  using WatchMap = std::multimap<std::string, PendingWatch>;

  // Records the prior state of every node it touches so a failed multi can be undone.
  struct Transaction {
    FakeKeeperServerImpl& server;
    int64_t session;
    int64_t zxid;
    std::vector<std::pair<std::string, std::optional<Node>>> undo = {};
    std::unordered_set<std::string> saved = {};
    Notifications notifications = {};

    Node* mutableNode(const std::string& path) {
      auto it = server.nodes_.find(path);
      if (saved.insert(path).second) {
        undo.emplace_back(
            path, it == server.nodes_.end() ? std::nullopt : std::optional<Node>(it->second));
      }
      return it == server.nodes_.end() ? nullptr : &it->second;
    }

    void rollback() {
      for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
        if (it->second) {
          server.nodes_[it->first] = std::move(*it->second);
        } else {
          server.nodes_.erase(it->first);
        }
      }
      notifications.clear();
    }

    void notify(WatchMap& watches, const std::string& path, WatchEvent::Type type) {
      auto [begin, end] = watches.equal_range(path);
      for (auto it = begin; it != end; ++it) {
        notifications.push_back({std::move(it->second.callback), {type, path}});
      }
      watches.erase(begin, end);
    }

    KeeperResult<OpResult> apply(const op::Create& o) {
      const bool sequential = isSequential(o.mode);
      if (!validPath(o.path, sequential) || o.path == "/") {
        return std::unexpected(error(KeeperCode::kBadArguments, o.path));
      }
      const std::string parent_path = parentOf(o.path);
      auto parent_it = server.nodes_.find(parent_path);
      if (parent_it == server.nodes_.end()) {
        return std::unexpected(error(KeeperCode::kNoNode, o.path));
      }
      if (parent_it->second.stat.ephemeral_owner != 0) {
        return std::unexpected(error(KeeperCode::kNoChildrenForEphemerals, o.path));
      }
      const std::string path =
          sequential ? o.path + fmt::format("{:010d}", parent_it->second.counter) : o.path;
      if (server.nodes_.contains(path))
        return std::unexpected(error(KeeperCode::kNodeExists, o.path));

      Node* parent = mutableNode(parent_path);
      // ZooKeeper >= 3.6 (DataTree.createNode) only raises the counter: an overflow is dropped.
      const auto next = static_cast<int32_t>(static_cast<uint32_t>(parent->counter) + 1u);
      if (next > parent->counter) parent->counter = next;
      parent->children.insert(path.substr(parent_path.size() == 1 ? 1 : parent_path.size() + 1));
      parent->stat.num_children = static_cast<int32_t>(parent->children.size());
      parent->stat.pzxid = zxid;

      mutableNode(path);
      Node& node = server.nodes_[path];
      node.data = o.data;
      node.stat.czxid = node.stat.mzxid = node.stat.pzxid = zxid;
      node.stat.ctime = node.stat.mtime = server.nowMsLocked();
      node.stat.ephemeral_owner = isEphemeral(o.mode) ? session : 0;

      notify(server.data_watches_, path, WatchEvent::Type::kCreated);
      notify(server.child_watches_, parent_path, WatchEvent::Type::kChild);
      return OpResult{path, {}};
    }

    KeeperResult<OpResult> apply(const op::Remove& o) {
      if (!validPath(o.path, false))
        return std::unexpected(error(KeeperCode::kBadArguments, o.path));
      if (o.path == "/") return std::unexpected(error(KeeperCode::kBadArguments, o.path));
      auto it = server.nodes_.find(o.path);
      if (it == server.nodes_.end()) return std::unexpected(error(KeeperCode::kNoNode, o.path));
      if (o.version != -1 && o.version != it->second.stat.version) {
        return std::unexpected(error(KeeperCode::kBadVersion, o.path));
      }
      if (!it->second.children.empty())
        return std::unexpected(error(KeeperCode::kNotEmpty, o.path));
      removeNode(o.path);
      return OpResult{};
    }

    void removeNode(const std::string& path) {
      const std::string parent_path = parentOf(path);
      mutableNode(path);
      server.nodes_.erase(path);
      // Deletes do not touch the counter (DataTree.deleteNode only moves pzxid).
      Node* parent = mutableNode(parent_path);
      parent->children.erase(path.substr(parent_path.size() == 1 ? 1 : parent_path.size() + 1));
      parent->stat.num_children = static_cast<int32_t>(parent->children.size());
      parent->stat.pzxid = zxid;
      notify(server.data_watches_, path, WatchEvent::Type::kDeleted);
      notify(server.child_watches_, path, WatchEvent::Type::kDeleted);
      notify(server.child_watches_, parent_path, WatchEvent::Type::kChild);
    }

    KeeperResult<OpResult> apply(const op::Set& o) {
      if (!validPath(o.path, false))
        return std::unexpected(error(KeeperCode::kBadArguments, o.path));
      if (!server.nodes_.contains(o.path))
        return std::unexpected(error(KeeperCode::kNoNode, o.path));
      Node* node = mutableNode(o.path);
      if (o.version != -1 && o.version != node->stat.version) {
        return std::unexpected(error(KeeperCode::kBadVersion, o.path));
      }
      node->data = o.data;
      node->stat.version++;
      node->stat.mzxid = zxid;
      node->stat.mtime = server.nowMsLocked();
      notify(server.data_watches_, o.path, WatchEvent::Type::kChanged);
      return OpResult{{}, visibleStat(*node)};
    }

    KeeperResult<OpResult> apply(const op::Check& o) {
      auto it = server.nodes_.find(o.path);
      if (it == server.nodes_.end()) return std::unexpected(error(KeeperCode::kNoNode, o.path));
      if (o.version != -1 && o.version != it->second.stat.version) {
        return std::unexpected(error(KeeperCode::kBadVersion, o.path));
      }
      return OpResult{};
    }

    KeeperResult<OpResult> apply(const op::CheckNotExists& o) {
      // Keeper::multi expands this op before it reaches an implementation.
      return std::unexpected(
          KeeperError{KeeperCode::kBadArguments, o.path, "unexpanded check-not-exists", {}});
    }
  };

  static std::string pathOf(const Op& o) {
    return std::visit([](const auto& x) { return x.path; }, o);
  }

  static Stat visibleStat(const Node& node) {
    Stat stat = node.stat;
    // DataNode.copyStat: the client sees counter * 2 - numChildren, wrapping in int32.
    stat.cversion = static_cast<int32_t>(static_cast<uint32_t>(node.counter) * 2u -
                                         static_cast<uint32_t>(node.stat.num_children));
    stat.data_length = static_cast<int32_t>(node.data.size());
    return stat;
  }

  // Session state and injected faults decide whether a request reaches the tree at all.
  std::optional<KeeperError> admitLocked(int64_t session, const std::string& path) {
    if (expired_sessions_.contains(session)) return error(KeeperCode::kSessionExpired, path);
    if (!live_sessions_.contains(session)) return error(KeeperCode::kConnectionLoss, path);
    if (failures_to_inject_ > 0 && requests_before_failures_ > 0) {
      --requests_before_failures_;
    } else if (failures_to_inject_ > 0) {
      --failures_to_inject_;
      return error(KeeperCode::kConnectionLoss, path);
    }
    ++requests_;
    return std::nullopt;
  }

  void removeEphemeralsLocked(int64_t session, Notifications& notifications) {
    std::vector<std::string> owned;
    for (const auto& [path, node] : nodes_) {
      if (node.stat.ephemeral_owner == session) owned.push_back(path);
    }
    if (owned.empty()) return;
    Transaction txn{*this, session, ++zxid_};
    for (const auto& path : owned) txn.removeNode(path);
    for (auto& n : txn.notifications) notifications.push_back(std::move(n));
  }

  static void deliver(Notifications& notifications) {
    for (auto& n : notifications) n.callback(n.event);
  }

  mutable std::mutex mu_;
  std::map<std::string, Node> nodes_;
  WatchMap data_watches_;
  WatchMap child_watches_;
  std::set<int64_t> live_sessions_;
  std::set<int64_t> expired_sessions_;
  int64_t zxid_ = 0;
  int64_t next_session_ = 0x100000000;
  int failures_to_inject_ = 0;
  int requests_before_failures_ = 0;
  int multi_answers_to_lose_ = 0;
  int multis_before_losses_ = 0;
  std::optional<int64_t> fixed_time_ms_;
  int64_t requests_ = 0;

  int64_t nowMsLocked() const {
    if (fixed_time_ms_) return *fixed_time_ms_;
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  friend class FakeKeeper;
};

class FakeKeeper final : public Keeper {
 public:
  FakeKeeper(std::shared_ptr<FakeKeeperServerImpl> server, int64_t session)
      : server_(std::move(server)), session_(session) {}
  ~FakeKeeper() override { server_->closeSession(session_); }

  KeeperResult<GetResult> get(const std::string& path, WatchCallback watch) override {
    return server_->get(session_, path, std::move(watch));
  }
  KeeperResult<std::optional<Stat>> exists(const std::string& path, WatchCallback watch) override {
    return server_->exists(session_, path, std::move(watch));
  }
  KeeperResult<ChildrenResult> children(const std::string& path, WatchCallback watch) override {
    return server_->children(session_, path, std::move(watch));
  }
  KeeperResult<std::string> create(const std::string& path, const std::string& data,
                                   CreateMode mode) override {
    auto result = server_->transact(session_, {op::Create{path, data, mode}});
    if (!result) return std::unexpected(singleOpError(std::move(result.error())));
    return std::move(result->front().path_created);
  }
  KeeperResult<Stat> set(const std::string& path, const std::string& data,
                         int32_t version) override {
    auto result = server_->transact(session_, {op::Set{path, data, version}});
    if (!result) return std::unexpected(singleOpError(std::move(result.error())));
    return result->front().stat;
  }
  KeeperStatus remove(const std::string& path, int32_t version) override {
    auto result = server_->transact(session_, {op::Remove{path, version}});
    if (!result) return std::unexpected(singleOpError(std::move(result.error())));
    return {};
  }
  bool expired() const override { return server_->isExpired(session_); }
  int64_t sessionId() const override { return session_; }
  KeeperResult<std::unique_ptr<Keeper>> startNewSession() const override {
    return server_->connect();
  }

 protected:
  KeeperResult<std::vector<OpResult>> multiImpl(const std::vector<Op>& ops) override {
    return server_->transact(session_, ops);
  }

 private:
  static KeeperError singleOpError(KeeperError e) {
    e.failed_op_index.reset();
    return e;
  }

  std::shared_ptr<FakeKeeperServerImpl> server_;
  int64_t session_;
};

std::unique_ptr<Keeper> FakeKeeperServerImpl::connect() {
  int64_t session;
  {
    std::lock_guard lock(mu_);
    session = next_session_++;
    live_sessions_.insert(session);
  }
  return std::make_unique<FakeKeeper>(
      std::static_pointer_cast<FakeKeeperServerImpl>(shared_from_this()), session);
}

}  // namespace

std::shared_ptr<FakeKeeperServer> FakeKeeperServer::create() {
  return std::make_shared<FakeKeeperServerImpl>();
}

}  // namespace rtable::core::testing
