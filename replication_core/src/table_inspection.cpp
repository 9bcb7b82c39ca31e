#include "rtable/replication_core/table_inspection.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace rtable::core {
namespace {

std::string_view statusOf(const SequentialCounter& counter, const HeadroomThreshold& threshold) {
  if (counter.exhausted()) return "EXHAUSTED";
  return threshold.isBelow(counter) ? "LOW" : "ok";
}

KeeperStatus walk(Keeper& keeper, const std::string& path, int depth_left, bool is_root,
                  std::vector<TableCounterReport>& out) {
  auto refused = [&](const KeeperError& error) {
    if (error.code != KeeperCode::kNoAuth) return false;
    out.push_back(TableCounterReport{path, {}, std::nullopt});
    return true;
  };
  auto listed = keeper.children(path);
  if (!listed) {
    // A node removed while we walk is not an error, unless it is the root the user named.
    if (listed.error().code == KeeperCode::kNoNode && !is_root) return {};
    if (!is_root && refused(listed.error())) return {};
    return std::unexpected(listed.error());
  }
  const auto& names = listed->names;
  const bool is_table = std::ranges::find(names, "log") != names.end() &&
                        std::ranges::find(names, "replicas") != names.end();
  if (is_table) {
    auto counter = SequentialCounter::read(keeper, joinPath(path, "log"), "log-");
    if (!counter && refused(counter.error())) return {};
    if (!counter) return std::unexpected(counter.error());
    auto replicas = keeper.children(joinPath(path, "replicas"));
    if (!replicas && refused(replicas.error())) return {};
    if (!replicas) return std::unexpected(replicas.error());
    std::ranges::sort(replicas->names);
    out.push_back(TableCounterReport{path, std::move(replicas->names), *counter});
    return {};
  }
  if (depth_left == 0) return {};
  for (const auto& name : names) {
    if (auto walked = walk(keeper, joinPath(path, name), depth_left - 1, false, out); !walked) {
      return walked;
    }
  }
  return {};
}

}  // namespace

KeeperResult<std::vector<TableCounterReport>> findReplicatedTables(Keeper& keeper,
                                                                   const std::string& root,
                                                                   int max_depth) {
  std::vector<TableCounterReport> reports;
  if (auto walked = walk(keeper, root, max_depth, true, reports); !walked) {
    return std::unexpected(walked.error());
  }
  std::ranges::sort(reports, {}, &TableCounterReport::path);
  return reports;
}

std::string formatReportsAsTable(const std::vector<TableCounterReport>& reports,
                                 const HeadroomThreshold& threshold) {
  std::size_t path_width = 5;
  for (const auto& r : reports) path_width = std::max(path_width, r.path.size());
  constexpr auto kRow = "{:<{}}  {:>8}  {:>13}  {:>10}  {:>9}  {:>12}  {}\n";
  std::string text = fmt::format(kRow, "TABLE", path_width, "REPLICAS", "LOG_MAX_INDEX", "COUNTER",
                                 "HEADROOM", "ENTRIES_LEFT", "STATUS");
  for (const auto& r : reports) {
    if (!r.log) {
      text += fmt::format(kRow, r.path, path_width, "-", "-", "-", "-", "-",
                          "NO_ACCESS (its ACL: --zookeeper-credentials)");
      continue;
    }
    text += fmt::format(kRow, r.path, path_width, r.replicas.size(), r.log->maxIndex(),
                        r.log->counter(), fmt::format("{:.3f}%", r.log->headroomRatio() * 100.0),
                        r.log->createsLeft(), statusOf(*r.log, threshold));
  }
  if (reports.empty()) text += "(no replicated tables)\n";
  return text;
}

std::string formatReportsAsJson(const std::string& root,
                                const std::vector<TableCounterReport>& reports,
                                const HeadroomThreshold& threshold) {
  nlohmann::json tables = nlohmann::json::array();
  for (const auto& r : reports) {
    if (!r.log) {
      tables.push_back({{"path", r.path}, {"readable", false}});
      continue;
    }
    tables.push_back({
        {"path", r.path},
        {"readable", true},
        {"replicas", r.replicas},
        {"log_max_index", r.log->maxIndex()},
        {"log_counter", r.log->counter()},
        {"creates_left", r.log->createsLeft()},
        {"headroom_ratio", r.log->headroomRatio()},
        {"exhausted", r.log->exhausted()},
        {"below_threshold", threshold.isBelow(*r.log)},
    });
  }
  nlohmann::json doc = {
      {"root", root}, {"min_headroom_percent", threshold.min_percent}, {"tables", tables}};
  return doc.dump(2) + "\n";
}

}  // namespace rtable::core
