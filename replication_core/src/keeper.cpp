#include "rtable/replication_core/keeper.h"

#include <fmt/format.h>

namespace rtable::core {

std::string_view keeperCodeName(KeeperCode code) {
  switch (code) {
    case KeeperCode::kOk:
      return "ok";
    case KeeperCode::kConnectionLoss:
      return "connection loss";
    case KeeperCode::kOperationTimeout:
      return "operation timeout";
    case KeeperCode::kSessionExpired:
      return "session expired";
    case KeeperCode::kNoNode:
      return "no node";
    case KeeperCode::kNodeExists:
      return "node exists";
    case KeeperCode::kBadVersion:
      return "bad version";
    case KeeperCode::kNotEmpty:
      return "not empty";
    case KeeperCode::kNoChildrenForEphemerals:
      return "no children for ephemerals";
    case KeeperCode::kBadArguments:
      return "bad arguments";
    case KeeperCode::kNoAuth:
      return "not authorized (the node's ACL does not grant this session's credential)";
    case KeeperCode::kRuntimeInconsistency:
      return "runtime inconsistency";
    case KeeperCode::kOther:
      return "other error";
  }
  return "unknown";
}

bool isConnectionLevel(KeeperCode code) {
  return code == KeeperCode::kConnectionLoss || code == KeeperCode::kOperationTimeout ||
         code == KeeperCode::kSessionExpired;
}

std::string KeeperError::toString() const {
  std::string text(keeperCodeName(code));
  if (!path.empty()) text += ": " + path;
  if (failed_op_index) text += fmt::format(" (multi op #{})", *failed_op_index);
  if (!detail.empty()) text += " (" + detail + ")";
  return text;
}

bool isSequential(CreateMode mode) {
  return mode == CreateMode::kPersistentSequential || mode == CreateMode::kEphemeralSequential;
}

bool isEphemeral(CreateMode mode) {
  return mode == CreateMode::kEphemeral || mode == CreateMode::kEphemeralSequential;
}

std::vector<KeeperResult<GetResult>> Keeper::getMany(const std::vector<std::string>& paths) {
  std::vector<KeeperResult<GetResult>> results;
  results.reserve(paths.size());
  for (const auto& path : paths) results.push_back(get(path));
  return results;
}

KeeperResult<std::vector<OpResult>> Keeper::multi(const std::vector<Op>& ops) {
  // Expand CheckNotExists into create + delete; remember where each caller op starts so results
  // and the failed index map back to the caller's numbering.
  std::vector<Op> expanded;
  std::vector<std::size_t> first_expanded_index;
  expanded.reserve(ops.size());
  for (const Op& o : ops) {
    first_expanded_index.push_back(expanded.size());
    if (const auto* check = std::get_if<op::CheckNotExists>(&o)) {
      expanded.push_back(op::Create{check->path, "", CreateMode::kPersistent});
      expanded.push_back(op::Remove{check->path, -1});
    } else {
      expanded.push_back(o);
    }
  }
  auto result = multiImpl(expanded);
  if (!result) {
    KeeperError error = std::move(result.error());
    if (error.failed_op_index) {
      std::size_t caller_index = 0;
      while (caller_index + 1 < first_expanded_index.size() &&
             first_expanded_index[caller_index + 1] <= *error.failed_op_index) {
        ++caller_index;
      }
      error.failed_op_index = caller_index;
    }
    return std::unexpected(std::move(error));
  }
  std::vector<OpResult> mapped;
  mapped.reserve(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    mapped.push_back(std::move((*result)[first_expanded_index[i]]));
    if (std::holds_alternative<op::CheckNotExists>(ops[i])) mapped.back().path_created.clear();
  }
  return mapped;
}

std::string joinPath(std::string_view parent, std::string_view child) {
  std::string path(parent);
  if (path.empty() || path.back() != '/') path += '/';
  path += child;
  return path;
}

KeeperStatus createAncestorsAndSelf(Keeper& keeper, const std::string& path) {
  if (path == "/") return {};
  for (std::size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = slash == std::string::npos ? path : path.substr(0, slash);
    auto created = keeper.create(prefix, "", CreateMode::kPersistent);
    if (!created && created.error().code != KeeperCode::kNodeExists) {
      return std::unexpected(created.error());
    }
    if (slash == std::string::npos) return {};
  }
}

namespace {

// Appends `path`'s subtree to `out` children first. A node that vanished meanwhile is skipped.
KeeperStatus collectSubtree(Keeper& keeper, const std::string& path,
                            std::vector<std::string>& out) {
  auto listed = keeper.children(path);
  if (!listed) {
    if (listed.error().code == KeeperCode::kNoNode) return {};
    return std::unexpected(listed.error());
  }
  const std::vector<std::string> names = std::move(listed->names);
  for (const auto& name : names) {
    if (auto collected = collectSubtree(keeper, joinPath(path, name), out); !collected) {
      return collected;
    }
  }
  out.push_back(path);
  return {};
}

}  // namespace

KeeperStatus removeRecursive(Keeper& keeper, const std::string& path) {
  // A table's parts/ and queue/ hold thousands of nodes: removing them in multis of 100 costs one
  // round trip per hundred instead of one per node, and keeps each request far under ZooKeeper's
  // 1 MB request limit.
  static constexpr std::size_t kRemovesPerMulti = 100;
  static constexpr int kAttempts = 5;
  for (int attempt = 0;; ++attempt) {
    std::vector<std::string> nodes;
    if (auto collected = collectSubtree(keeper, path, nodes); !collected) return collected;
    bool raced = false;
    for (std::size_t begin = 0; begin < nodes.size() && !raced; begin += kRemovesPerMulti) {
      const std::size_t end = std::min(nodes.size(), begin + kRemovesPerMulti);
      std::vector<Op> ops;
      for (std::size_t i = begin; i < end; ++i) ops.push_back(op::Remove{nodes[i], -1});
      auto removed = keeper.multi(ops);
      if (removed) continue;
      const KeeperCode code = removed.error().code;
      if (code != KeeperCode::kNoNode && code != KeeperCode::kNotEmpty) {
        return std::unexpected(removed.error());
      }
      // Someone else removed a node, or created a child, meanwhile: one by one, then look again.
      for (std::size_t i = begin; i < end; ++i) {
        auto one = keeper.remove(nodes[i]);
        if (one || one.error().code == KeeperCode::kNoNode) continue;
        if (one.error().code != KeeperCode::kNotEmpty) return std::unexpected(one.error());
        raced = true;
        break;
      }
    }
    if (!raced) return {};
    if (attempt + 1 == kAttempts) {
      return std::unexpected(
          KeeperError{KeeperCode::kNotEmpty, path, "children keep being created under it", {}});
    }
  }
}

}  // namespace rtable::core
