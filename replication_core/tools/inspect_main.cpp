// rtable-inspect: log counter headroom of every replicated table under a ZooKeeper root.
// Exit codes: 0 every table above the threshold, 1 some table below it (or stuck), 2 an error
// (also: a table whose ACL refused every credential given).
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "rtable/common/secret_file.h"
#include "rtable/common/version.h"
#include "rtable/replication_core/table_inspection.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace {

constexpr int kExitBelowThreshold = 1;
constexpr int kExitError = 2;

constexpr const char* kUsage =
    "usage: rtable-inspect --zookeeper HOST:PORT[,HOST:PORT...] [--root PATH]\n"
    "                      [--format table|json] [--min-headroom-percent P]\n"
    "                      [--max-depth N] [--timeout-ms MS]\n"
    "                      [--zookeeper-credentials DIR]...\n"
    "Lists every replicated table (a node with `log` and `replicas` children) under PATH\n"
    "(default /) with log_max_index, the log's int32 sequential counter, and its headroom.\n"
    "A table with a ZooKeeper ACL needs its credential: DIR holds `username` and `password`\n"
    "files (its Secret, mounted or extracted); the flag may be given once per table.\n"
    "Exits 1 when a table's headroom is under P percent (default 5), 2 on an error or when a\n"
    "table could not be read (NO_ACCESS). --version prints the version.\n";

struct Options {
  std::string zookeeper;
  std::string root = "/";
  std::string format = "table";
  double min_headroom_percent = 5.0;
  int max_depth = 10;
  int timeout_ms = 5000;
  bool version = false;  // --version: print it and exit
  std::vector<rtable::core::ZooKeeperDigest> credentials;
};

struct UsageError {
  std::string message;
};

// A credential directory's `username` and `password` files, without a trailing line break.
std::expected<rtable::core::ZooKeeperDigest, UsageError> readCredentials(const std::string& dir) {
  rtable::core::ZooKeeperDigest digest;
  for (auto [name, into] : {std::pair{"username", &digest.user}, {"password", &digest.password}}) {
    auto secret = rtable::common::readSecretFile(std::filesystem::path(dir) / name);
    if (!secret) return std::unexpected(UsageError{"--zookeeper-credentials: " + secret.error()});
    *into = std::move(*secret);
  }
  return digest;
}

template <class T>
std::optional<T> parseNumber(const std::string& text) {
  T value{};
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::expected<Options, UsageError> parseOptions(int argc, char** argv) {
  Options options;
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return std::unexpected(UsageError{});
    if (arg == "--version") {
      options.version = true;
      return options;
    }
    if (!arg.starts_with("--")) {
      return std::unexpected(UsageError{fmt::format("unexpected argument '{}'", arg)});
    }
    std::string value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return std::unexpected(UsageError{fmt::format("flag {} needs a value", arg)});
    }
    if (arg == "--zookeeper-credentials") {
      auto digest = readCredentials(value);
      if (!digest) return std::unexpected(digest.error());
      options.credentials.push_back(std::move(*digest));
      continue;
    }
    values[arg] = value;
  }
  for (const auto& [flag, value] : values) {
    if (flag == "--zookeeper") {
      options.zookeeper = value;
    } else if (flag == "--root") {
      if (!value.starts_with('/') || (value.size() > 1 && value.ends_with('/'))) {
        return std::unexpected(UsageError{fmt::format(
            "--root must be an absolute ZooKeeper path without a trailing '/', got '{}'", value)});
      }
      options.root = value;
    } else if (flag == "--format") {
      if (value != "table" && value != "json") {
        return std::unexpected(
            UsageError{fmt::format("--format must be 'table' or 'json', got '{}'", value)});
      }
      options.format = value;
    } else if (flag == "--min-headroom-percent") {
      auto number = parseNumber<double>(value);
      if (!number || *number < 0 || *number > 100) {
        return std::unexpected(UsageError{
            fmt::format("--min-headroom-percent must be a number from 0 to 100, got '{}'", value)});
      }
      options.min_headroom_percent = *number;
    } else if (flag == "--max-depth") {
      auto number = parseNumber<int>(value);
      if (!number || *number < 0) {
        return std::unexpected(
            UsageError{fmt::format("--max-depth must be a whole number >= 0, got '{}'", value)});
      }
      options.max_depth = *number;
    } else if (flag == "--timeout-ms") {
      auto number = parseNumber<int>(value);
      if (!number || *number <= 0) {
        return std::unexpected(
            UsageError{fmt::format("--timeout-ms must be a whole number > 0, got '{}'", value)});
      }
      options.timeout_ms = *number;
    } else {
      return std::unexpected(UsageError{fmt::format("unknown flag {}", flag)});
    }
  }
  if (options.zookeeper.empty()) {
    return std::unexpected(UsageError{"--zookeeper HOST:PORT is required"});
  }
  return options;
}

int fail(const std::string& message) {
  fmt::print(stderr, "rtable-inspect: {}\n", message);
  return kExitError;
}

}  // namespace

int main(int argc, char** argv) {
  auto options = parseOptions(argc, argv);
  if (!options) {
    if (options.error().message.empty()) {
      fmt::print("{}", kUsage);
      return 0;
    }
    return fail(options.error().message + " (see --help)");
  }
  if (options->version) {
    fmt::print("rtable-inspect {}\n", rtable::common::version());
    return 0;
  }
  using rtable::core::KeeperCode;
  rtable::core::ZooKeeperClient::silenceLibraryLog();
  // The tool creates nothing: the digests' subtrees only matter for creates.
  rtable::core::ZooKeeperConfig config{
      options->zookeeper, std::chrono::milliseconds(options->timeout_ms * 2),
      std::chrono::milliseconds(options->timeout_ms), options->credentials};
  auto keeper = rtable::core::ZooKeeperClient::connect(config);
  if (!keeper) {
    return fail(fmt::format("cannot connect to ZooKeeper at {} within {} ms", options->zookeeper,
                            options->timeout_ms));
  }
  auto reports = rtable::core::findReplicatedTables(**keeper, options->root, options->max_depth);
  if (!reports) {
    if (reports.error().code == KeeperCode::kNoNode && reports.error().path == options->root) {
      return fail(fmt::format("root {} does not exist in ZooKeeper at {}", options->root,
                              options->zookeeper));
    }
    return fail(fmt::format("ZooKeeper at {}: {}", options->zookeeper, reports.error().toString()));
  }
  const rtable::core::HeadroomThreshold threshold{options->min_headroom_percent};
  if (options->format == "json") {
    fmt::print("{}", rtable::core::formatReportsAsJson(options->root, *reports, threshold));
  } else {
    fmt::print("{}", rtable::core::formatReportsAsTable(*reports, threshold));
  }
  for (const auto& report : *reports) {
    if (threshold.isBelow(report)) return kExitBelowThreshold;
  }
  for (const auto& report : *reports) {
    if (!report.log) return kExitError;
  }
  return 0;
}
