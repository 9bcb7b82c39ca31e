#include "rtable/replication_core/quorum.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "rtable/replication_core/log_entry.h"

namespace rtable::core {
namespace {

// The next line of `text` from `at`, without its newline; nullopt at the end.
std::optional<std::string_view> nextLine(std::string_view text, std::size_t& at) {
  if (at >= text.size()) return std::nullopt;
  const std::size_t end = text.find('\n', at);
  if (end == std::string_view::npos) return std::nullopt;  // every line ends with a newline
  std::string_view line = text.substr(at, end - at);
  at = end + 1;
  return line;
}

std::optional<std::size_t> field(std::string_view line, std::string_view name) {
  if (!line.starts_with(name)) return std::nullopt;
  line.remove_prefix(name.size());
  std::size_t value = 0;
  auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), value);
  if (ec != std::errc() || end != line.data() + line.size()) return std::nullopt;
  return value;
}

}  // namespace

std::string QuorumEntry::format() const {
  std::string text = fmt::format(
      "version: 1\npart_name: {}\nrequired_number_of_replicas: {}\nactual_number_of_replicas: {}\n"
      "replicas:\n",
      part_name, required_replicas, replicas.size());
  for (const auto& replica : replicas) text += escapeString(replica) + "\n";
  return text;
}

std::expected<QuorumEntry, std::string> QuorumEntry::parse(std::string_view text) {
  QuorumEntry entry;
  std::size_t at = 0;
  auto expect = [&](std::string_view what) -> std::expected<std::string_view, std::string> {
    auto line = nextLine(text, at);
    if (!line)
      return std::unexpected(fmt::format("quorum entry: expected '{}', found the end", what));
    if (!line->starts_with(what)) {
      return std::unexpected(fmt::format("quorum entry: expected '{}', found '{}'", what, *line));
    }
    return *line;
  };
  auto version = expect("version: ");
  if (!version) return std::unexpected(version.error());
  if (*version != "version: 1")
    return std::unexpected(fmt::format("quorum entry: unknown {}", *version));
  auto part = expect("part_name: ");
  if (!part) return std::unexpected(part.error());
  entry.part_name = std::string(part->substr(11));
  auto required = expect("required_number_of_replicas: ");
  if (!required) return std::unexpected(required.error());
  auto required_value = field(*required, "required_number_of_replicas: ");
  if (!required_value)
    return std::unexpected(fmt::format("quorum entry: bad line '{}'", *required));
  entry.required_replicas = *required_value;
  auto actual = expect("actual_number_of_replicas: ");
  if (!actual) return std::unexpected(actual.error());
  auto actual_value = field(*actual, "actual_number_of_replicas: ");
  if (!actual_value) return std::unexpected(fmt::format("quorum entry: bad line '{}'", *actual));
  auto header = expect("replicas:");
  if (!header) return std::unexpected(header.error());
  for (std::size_t i = 0; i < *actual_value; ++i) {
    auto line = nextLine(text, at);
    if (!line)
      return std::unexpected(
          fmt::format("quorum entry: {} replicas announced, {} listed", *actual_value, i));
    auto name = unescapeString(*line);
    if (!name) return std::unexpected("quorum entry: " + name.error());
    entry.replicas.push_back(std::move(*name));
  }
  if (at != text.size()) return std::unexpected("quorum entry: unexpected text after the replicas");
  return entry;
}

KeeperResult<ReplicaCount> countReplicas(Keeper& keeper, const TablePaths& paths) {
  auto replicas = keeper.children(paths.replicas());
  if (!replicas) return std::unexpected(replicas.error());
  ReplicaCount count;
  count.total = replicas->names.size();
  for (const auto& name : replicas->names) {
    TablePaths other = paths;
    other.replica = name;
    auto is_active = keeper.exists(other.isActive());
    if (!is_active) return std::unexpected(is_active.error());
    if (*is_active) count.live.push_back(name);
  }
  return count;
}

KeeperStatus addToQuorum(Keeper& keeper, const TablePaths& paths, const std::string& part) {
  const std::string node = paths.quorumParallel(part);
  for (;;) {
    auto current = keeper.get(node);
    if (!current) {
      if (current.error().code == KeeperCode::kNoNode) return {};  // no quorum, or reached
      return std::unexpected(current.error());
    }
    auto entry = QuorumEntry::parse(current->data);
    if (!entry)
      return std::unexpected(KeeperError{KeeperCode::kBadArguments, node, entry.error(), {}});
    if (std::find(entry->replicas.begin(), entry->replicas.end(), paths.replica) !=
        entry->replicas.end()) {
      return {};
    }
    entry->replicas.push_back(paths.replica);
    KeeperStatus updated;
    if (entry->replicas.size() >= entry->required_replicas) {
      updated = keeper.remove(node, current->stat.version);
    } else {
      auto set = keeper.set(node, entry->format(), current->stat.version);
      if (!set) updated = std::unexpected(set.error());
    }
    if (updated) return {};
    // Another replica counted itself meanwhile (bad version) or finished it (no node): look again.
    if (updated.error().code != KeeperCode::kBadVersion &&
        updated.error().code != KeeperCode::kNoNode) {
      return updated;
    }
  }
}

KeeperResult<bool> waitForQuorum(Keeper& keeper, const TablePaths& paths, const std::string& part,
                                 std::chrono::steady_clock::time_point deadline) {
  struct Signal {
    std::mutex mu;
    std::condition_variable cv;
    bool fired = false;
  };
  for (;;) {
    // The watch may fire after we stopped waiting: it holds its own reference.
    auto signal = std::make_shared<Signal>();
    auto exists = keeper.exists(paths.quorumParallel(part), [signal](const WatchEvent&) {
      std::lock_guard lock(signal->mu);
      signal->fired = true;
      signal->cv.notify_all();
    });
    if (!exists) return std::unexpected(exists.error());
    if (!*exists) return true;
    std::unique_lock lock(signal->mu);
    if (!signal->cv.wait_until(lock, deadline, [&] { return signal->fired; })) return false;
  }
}

}  // namespace rtable::core
