// rtable-core: serves one replica of a table (DESIGN.md 2). Reads the table spec (with this
// replica's identity, address and data dir optionally given by flags), creates or joins the table
// in ZooKeeper, opens the generation <root>/active names and follows table swaps (TableHost),
// loads its parts, serves the HTTP API and /metrics. SIGTERM or SIGINT: stop taking
// requests, finish those in flight, hand off the parts only this replica has (other replicas
// fetch them meanwhile), exit 0.
#include <fmt/format.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <expected>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string_view>
#include <thread>
#include <vector>

#include "rtable/backup/backup_agent.h"
#include "rtable/backup/open_destination.h"
#include "rtable/backup/replica_backup_source.h"
#include "rtable/common/version.h"
#include "rtable/replication_core/fail_points.h"
#include "rtable/replication_core/http_api.h"
#include "rtable/replication_core/keeper_retry.h"
#include "rtable/replication_core/table_host.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace {

constexpr int kExitUsage = 2;
constexpr auto kDrainGrace = std::chrono::seconds(30);
// After the requests in flight: how long a stopping replica waits for the others to have every
// part only it has (a scale-down's pod never comes back). The pods get 45 s in all.
constexpr auto kHandOffTimeout = std::chrono::seconds(10);

constexpr const char* kUsage =
    "usage: rtable-core --config SPEC.yaml [--replica-name NAME] [--replica-host HOST]\n"
    "                   [--listen ADDRESS] [--data-dir DIR] [--backup-credentials-dir DIR]\n"
    "                   [--backup-volumes-dir DIR]\n"
    "Serves one replica of the table the spec describes (see docs/rtable-core.md).\n"
    "The flags --replica-name, --replica-host, --listen and --data-dir override the spec's\n"
    "replica.name, replica.host, listen and dataDir, so one spec file (a ConfigMap) can serve\n"
    "every replica. --backup-credentials-dir: where the Secrets an S3 backup destination names\n"
    "are mounted, one folder each (default /etc/rtable/backup-credentials).\n"
    "--backup-volumes-dir: where the PersistentVolumeClaims a volume backup destination names\n"
    "are mounted, one folder each (default /var/lib/rtable-backup-volumes).\n"
    "Each takes --flag VALUE or --flag=VALUE. --version prints the version.\n"
    "--test-stall OP[@PATH]:MS (repeatable, for tests only): every matching file or fetch step\n"
    "stalls MS milliseconds (fail_points.h), e.g. receive_head:1500.\n";

// The backup fail point of RTABLE_CORE_FAILPOINT, for the e2e tests of a replica killed or
// stalled mid-backup: "backup:<replica>:<point>" ends this process at once, as a kill -9 would
// (no cleanup, its ZooKeeper session left to expire), when replica
// <replica>'s backup host reaches <point> ("writing files", "after <stage>"; BackupHostOptions::
// test_point); "backup:<replica>:<point>:pause=<seconds>" sleeps there instead. Once per data
// directory (a marker file there): the replica that the kubelet restarts, with the same
// environment, takes its next backups normally. Unset: nothing.
std::expected<std::function<void(std::string_view)>, std::string> backupFailPoint(
    const std::string& replica, const std::filesystem::path& data_dir) {
  const char* value = std::getenv("RTABLE_CORE_FAILPOINT");
  if (!value || !*value) return nullptr;
  const std::string spec = value;
  auto bad = [&] {
    return std::unexpected(fmt::format(
        "RTABLE_CORE_FAILPOINT '{}': expected backup:<replica>:<point>[:pause=<seconds>]", spec));
  };
  std::vector<std::string> fields;
  for (std::size_t start = 0;;) {
    const std::size_t end = spec.find(':', start);
    fields.push_back(spec.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (fields.size() < 3 || fields.size() > 4 || fields[0] != "backup" || fields[2].empty()) {
    return bad();
  }
  int pause_seconds = -1;  // -1: kill
  if (fields.size() == 4) {
    if (!fields[3].starts_with("pause=")) return bad();
    const std::string_view digits = std::string_view(fields[3]).substr(6);
    const auto [end, error] =
        std::from_chars(digits.data(), digits.data() + digits.size(), pause_seconds);
    if (error != std::errc() || end != digits.data() + digits.size() || pause_seconds < 0) {
      return bad();
    }
  }
  if (fields[1] != replica) return nullptr;
  spdlog::warn("fail point armed: {}", spec);
  return [point = fields[2], pause_seconds,
          marker = data_dir / "failpoint-fired"](std::string_view reached) {
    if (reached != point || std::filesystem::exists(marker)) return;
    std::ofstream(marker) << point << "\n";
    if (pause_seconds >= 0) {
      spdlog::warn("fail point: backup reached '{}': pausing {} s", point, pause_seconds);
      std::this_thread::sleep_for(std::chrono::seconds(pause_seconds));
      return;
    }
    spdlog::warn("fail point: backup reached '{}': exiting at once, as killed", point);
    spdlog::default_logger()->flush();
    // Not raise(SIGKILL): in a container this process is PID 1 of its PID namespace, which the
    // kernel shields from its own SIGKILL. _Exit runs no destructor or atexit handler either.
    std::_Exit(137);
  };
}

// A flag that overrides one field of the spec file: the flag and the field's path in the YAML.
struct Override {
  const char* flag;
  std::vector<const char*> path;
};
const Override kOverrides[] = {
    {"--replica-name", {"replica", "name"}},
    {"--replica-host", {"replica", "host"}},
    {"--listen", {"listen"}},
    {"--data-dir", {"dataDir"}},
};

// The spec file with the overrides applied, read by the same parser as the file (so a flag's value
// is checked exactly as the field's would be). The file is read and checked as it is first: its
// own errors name the file, a bad override names its flag.
std::expected<rtable::core::TableSpec, std::string> loadSpec(
    const std::string& config,
    const std::vector<std::pair<const Override*, std::string>>& overrides) {
  auto spec = rtable::core::TableSpec::load(config);
  if (!spec) return spec;
  if (overrides.empty()) return spec;
  YAML::Node root;
  try {
    root = YAML::LoadFile(config);
  } catch (const YAML::Exception& e) {
    return std::unexpected(fmt::format("{}: {}", config, e.what()));
  }
  for (const auto& [flag, value] : overrides) {
    if (value.empty()) return std::unexpected(fmt::format("{}: needs a value", flag->flag));
    // Fields that exist in every valid spec: replica is required, listen and dataDir top-level.
    if (flag->path.size() == 2) {
      root[flag->path[0]][flag->path[1]] = value;
    } else {
      root[flag->path[0]] = value;
    }
    auto checked = rtable::core::TableSpec::parseYaml(YAML::Dump(root));
    if (!checked)
      return std::unexpected(fmt::format("{} '{}': {}", flag->flag, value, checked.error()));
  }
  return rtable::core::TableSpec::parseYaml(YAML::Dump(root));
}

// Returns the signal if one is pending, after waiting up to `timeout`.
int waitForSignal(const sigset_t& signals, std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>(timeout.count() % 1000) * 1000000};
  const int signal = sigtimedwait(&signals, nullptr, &ts);
  return signal > 0 ? signal : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config;
  rtable::backup::ReplicaMounts mounts;
  std::vector<std::pair<const Override*, std::string>> overrides;  // in command-line order
  std::vector<rtable::core::Fault> stalls;                         // --test-stall
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (arg == "--version") {
      fmt::print("rtable-core {}\n", rtable::common::version());
      return 0;
    }
    const std::string name = arg.substr(0, arg.find('='));
    const Override* flag = nullptr;
    for (const auto& o : kOverrides) {
      if (name == o.flag) flag = &o;
    }
    const bool mount_flag = name == "--backup-credentials-dir" || name == "--backup-volumes-dir";
    if (name != "--config" && name != "--test-stall" && !mount_flag && !flag) {
      fmt::print(stderr, "rtable-core: unknown argument '{}' (see --help)\n", arg);
      return kExitUsage;
    }
    std::string value;
    if (name.size() < arg.size()) {
      value = arg.substr(name.size() + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      fmt::print(stderr, "rtable-core: {} needs a value\n", name);
      return kExitUsage;
    }
    if (flag) {
      overrides.emplace_back(flag, value);
    } else if (name == "--test-stall") {
      auto stall = rtable::core::parseStall(value);
      if (!stall) {
        fmt::print(stderr, "rtable-core: --test-stall: {}\n", stall.error());
        return kExitUsage;
      }
      stalls.push_back(std::move(*stall));
    } else if (mount_flag) {
      if (value.empty()) {
        fmt::print(stderr, "rtable-core: {} needs a value\n", name);
        return kExitUsage;
      }
      (name == "--backup-volumes-dir" ? mounts.volumes_dir : mounts.credentials_dir) = value;
    } else {
      config = value;
    }
  }
  if (config.empty()) {
    fmt::print(stderr, "rtable-core: --config SPEC.yaml is required\n");
    return kExitUsage;
  }
  auto spec = loadSpec(config, overrides);
  if (!spec) {
    fmt::print(stderr, "rtable-core: {}\n", spec.error());
    return kExitUsage;
  }
  auto fail_point = backupFailPoint(spec->replica, spec->data_dir);
  if (!fail_point) {
    fmt::print(stderr, "rtable-core: {}\n", fail_point.error());
    return kExitUsage;
  }

  // Signals are taken by sigtimedwait on this thread; every thread started later inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  rtable::core::ZooKeeperClient::silenceLibraryLog();
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  for (const auto& stall : stalls) {
    spdlog::warn("test stall armed: every {} on a path containing '{}' waits {} ms",
                 rtable::core::failPointName(stall.op), stall.path_contains, stall.stall.count());
    rtable::core::injectFaultForTest(stall);
  }

  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  const std::string metrics_address =
      fmt::format("{}:{}", spec->listen_address, spec->metrics_port);
  try {
    exposer = std::make_unique<prometheus::Exposer>(metrics_address);
  } catch (const std::exception& e) {
    spdlog::error("cannot serve metrics on {}: {}", metrics_address, e.what());
    return 1;
  }
  exposer->RegisterCollectable(registry);

  // Its nodes of a cluster backup take the operation's ACL, which names every table it covers
  // (backup_operation.h; docs/security.md).
  const rtable::core::ZooKeeperConfig zk_config{
      spec->zookeeper_connect,
      spec->zookeeper_session_timeout,
      std::chrono::seconds(10),
      spec->zookeeperDigests(),
      {},
      {rtable::backup::BackupPaths::rootFor(spec->zookeeper_root)}};
  auto factory =
      [zk_config]() -> rtable::core::KeeperResult<std::unique_ptr<rtable::core::Keeper>> {
    auto client = rtable::core::ZooKeeperClient::connect(zk_config);
    if (!client) return std::unexpected(client.error());
    return std::unique_ptr<rtable::core::Keeper>(std::move(*client));
  };

  // ZooKeeper may come up after us (a pod starting beside its ensemble): keep trying.
  std::unique_ptr<rtable::core::TableHost> table;
  auto backoff = std::chrono::milliseconds(500);
  for (;;) {
    auto opened = rtable::core::TableHost::open(*spec, factory, *registry);
    if (opened) {
      table = std::move(*opened);
      break;
    }
    spdlog::warn("table {} replica {}: {}; retrying in {} ms", spec->table, spec->replica,
                 opened.error(), backoff.count());
    if (int signal = waitForSignal(signals, backoff)) {
      spdlog::info("signal {} before start: exiting", signal);
      return 0;
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(10000));
  }
  auto state = table->serving()->state();
  spdlog::info(
      "table {} replica {} generation {}: {} active parts, {} rows; {} broken, {} unexpected, {} "
      "lost parts",
      spec->table, spec->replica, state.generation, state.active_parts, state.rows,
      state.broken_parts.size(), state.unexpected_parts.size(), state.lost_parts.size());

  // A table being restored takes no insert from the first request on (backup/restore.h); the
  // backup agent below keeps this up to date.
  if (auto keeper = factory(); keeper) {
    if (auto stored = rtable::backup::readRestoreRequest(**keeper, spec->tableRoot());
        stored && *stored) {
      table->setInsertRefusal(rtable::backup::restoreRefusal((*stored)->request));
    }
  }
  auto server =
      rtable::core::ReplicaHttpServer::start(*table, spec->listen_address, spec->http_port);
  if (!server) {
    spdlog::error("{}", server.error());
    return 1;
  }
  spdlog::info("serving http://{}:{} and metrics on http://{}/metrics", spec->listen_address,
               spec->http_port, metrics_address);

  // Cluster backups that name this replica, and the table's restore (backup/, DESIGN.md 2.7).
  const rtable::backup::DestinationOpener open_destination =
      [mounts](const rtable::backup::DestinationRef& destination) {
        return rtable::backup::openDestination(destination, mounts);
      };
  rtable::backup::ReplicaBackupSource backup_source([&table] { return table->serving(); });
  rtable::backup::BackupAgentOptions backup_options;
  backup_options.host.test_point = std::move(*fail_point);
  rtable::backup::BackupAgent backups(
      factory, rtable::backup::BackupPaths::rootFor(spec->zookeeper_root), spec->tableRoot(),
      spec->replica, backup_source,
      [&](const rtable::backup::BackupOperation& operation) {
        return open_destination(operation.destination);
      },
      std::move(backup_options));
  rtable::backup::ReplicaRestoreTarget restore_target([&table] { return table->serving(); });
  backups.restoreInto(
      restore_target, open_destination,
      [&table](std::optional<std::string> reason) { table->setInsertRefusal(std::move(reason)); });
  backups.start();

  int signal = 0;
  while ((signal = waitForSignal(signals, std::chrono::seconds(60))) == 0) {
  }
  spdlog::info("signal {}: finishing requests in flight", signal);
  backups.stop();
  (*server)->drain(kDrainGrace, [&] { (void)table->handOff(kHandOffTimeout); });
  table->shutdown();
  spdlog::info("stopped");
  return 0;
}
