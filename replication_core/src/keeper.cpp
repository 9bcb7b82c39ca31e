#include "rtable/replication_core/keeper.h"

#include <fmt/format.h>

namespace rtable::core {

std::string_view keeperCodeName(KeeperCode code) {
  switch (code) {
    case KeeperCode::kOk: return "ok";
    case KeeperCode::kConnectionLoss: return "connection loss";
    case KeeperCode::kOperationTimeout: return "operation timeout";
    case KeeperCode::kSessionExpired: return "session expired";
    case KeeperCode::kNoNode: return "no node";
    case KeeperCode::kNodeExists: return "node exists";
    case KeeperCode::kBadVersion: return "bad version";
    case KeeperCode::kNotEmpty: return "not empty";
    case KeeperCode::kNoChildrenForEphemerals: return "no children for ephemerals";
    case KeeperCode::kBadArguments: return "bad arguments";
    case KeeperCode::kRuntimeInconsistency: return "runtime inconsistency";
    case KeeperCode::kOther: return "other error";
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

}  // namespace rtable::core
