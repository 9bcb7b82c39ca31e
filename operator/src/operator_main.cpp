#include "rtable/operator/operator_main.h"

#include <fmt/format.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include "rtable/common/version.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/operator_process.h"
#include "rtable/operator/probe_server.h"

namespace rtable::op {

namespace {

enum class FlagKind { kString, kBool, kDuration };

struct FlagSpec {
  FlagKind kind;
  std::string help;
};

const std::map<std::string, FlagSpec>& flagSpecs() {
  static const std::map<std::string, FlagSpec> specs = {
      {"kubeconfig",
       {FlagKind::kString,
        "Path to a kubeconfig. Without it: $KUBECONFIG, else the in-cluster service account, "
        "else ~/.kube/config."}},
      {"leader-elect",
       {FlagKind::kBool,
        "Enable leader election: only the holder of the Lease runs controllers. (default "
        "true)"}},
      {"leader-election-namespace",
       {FlagKind::kString,
        "Namespace of the Lease. (default: the kubeconfig context's or the pod's namespace)"}},
      {"leader-election-id",
       {FlagKind::kString, "Name of the Lease. (default \"rtable-operator-lock\")"}},
      {"leader-election-lease-duration",
       {FlagKind::kDuration, "How long a Lease stays valid without renewal. (default 15s)"}},
      {"leader-election-renew-deadline",
       {FlagKind::kDuration,
        "How long the leader keeps trying to renew before it gives up. "
        "(default 10s)"}},
      {"leader-election-retry-period",
       {FlagKind::kDuration, "How often candidates try and the leader renews. (default 2s)"}},
      {"health-probe-bind-address",
       {FlagKind::kString,
        "Address of /healthz and /readyz; \"0\" disables, port 0 picks one. (default \":8081\")"}},
      {"metrics-bind-address",
       {FlagKind::kString,
        "Address of /metrics; \"0\" disables, port 0 picks one. (default \":8080\")"}},
      {"graceful-shutdown-timeout",
       {FlagKind::kDuration,
        "How long running reconciles may take to finish after SIGTERM. (default 30s)"}},
      {"log-level", {FlagKind::kString, "trace, debug, info, warn or error. (default info)"}},
  };
  return specs;
}

std::expected<bool, std::string> parseBool(const std::string& value) {
  if (value == "true" || value == "1" || value == "t" || value == "T" || value == "TRUE" ||
      value == "True") {
    return true;
  }
  if (value == "false" || value == "0" || value == "f" || value == "F" || value == "FALSE" ||
      value == "False") {
    return false;
  }
  return std::unexpected(fmt::format("'{}' is not a boolean (true or false)", value));
}

std::optional<spdlog::level::level_enum> logLevel(const std::string& name) {
  static const std::map<std::string, spdlog::level::level_enum> levels = {
      {"trace", spdlog::level::trace},  {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},    {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn}, {"error", spdlog::level::err}};
  auto it = levels.find(name);
  if (it == levels.end()) return std::nullopt;
  return it->second;
}

std::expected<ClusterConfig, std::string> clusterConfigFor(const OperatorFlags& flags) {
  if (!flags.kubeconfig.empty()) {
    auto config = KubeConfig::load(flags.kubeconfig);
    if (!config) return std::unexpected(config.error().toString());
    auto cluster = config->clusterConfig();
    if (!cluster) return std::unexpected(cluster.error().toString());
    return *cluster;
  }
  auto cluster = loadDefaultConfig();
  if (!cluster) return std::unexpected(cluster.error().toString());
  return *cluster;
}

}  // namespace

std::string FlagError::toString() const {
  return flag.empty() ? message : fmt::format("{}: {}", flag, message);
}

std::expected<common::Clock::Duration, std::string> parseGoDuration(std::string_view text) {
  const std::string original(text);
  auto bad = [&] {
    return std::unexpected(
        fmt::format("'{}' is not a duration (e.g. 15s, 500ms, 1m30s)", original));
  };
  if (text == "0") return common::Clock::Duration::zero();
  if (text.empty()) return bad();
  static const std::pair<std::string_view, double> kUnits[] = {
      {"ns", 1e-9}, {"us", 1e-6}, {"µs", 1e-6}, {"ms", 1e-3}, {"s", 1}, {"m", 60}, {"h", 3600}};
  double seconds = 0;
  while (!text.empty()) {
    std::size_t digits = 0;
    while (digits < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) {
      ++digits;
    }
    if (digits == 0) return bad();
    double value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + digits, value);
    if (ec != std::errc() || end != text.data() + digits) return bad();
    text.remove_prefix(digits);
    // The longest unit that matches ("ms" before "m").
    std::size_t unit_length = 0;
    double scale = 0;
    for (const auto& [unit, factor] : kUnits) {
      if (text.starts_with(unit) && unit.size() > unit_length) {
        unit_length = unit.size();
        scale = factor;
      }
    }
    if (unit_length == 0) return bad();
    text.remove_prefix(unit_length);
    seconds += value * scale;
  }
  return std::chrono::duration_cast<common::Clock::Duration>(
      std::chrono::duration<double>(seconds));
}

std::expected<OperatorFlags, FlagError> parseOperatorFlags(const std::vector<std::string>& args) {
  OperatorFlags flags;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      flags.help = true;
      continue;
    }
    if (arg == "--version") {
      flags.version = true;
      continue;
    }
    if (!arg.starts_with("-") || arg == "-" || arg == "--") {
      return std::unexpected(FlagError{arg, "unexpected argument (flags start with --)"});
    }
    std::string body = arg.substr(arg.starts_with("--") ? 2 : 1);
    std::optional<std::string> value;
    if (auto eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    const std::string flag = "--" + body;
    auto spec = flagSpecs().find(body);
    if (spec == flagSpecs().end()) return std::unexpected(FlagError{flag, "unknown flag"});
    if (spec->second.kind == FlagKind::kBool) {
      if (!value) {
        flags.leader_elect = true;  // the only boolean flag
        continue;
      }
      auto b = parseBool(*value);
      if (!b) return std::unexpected(FlagError{flag, b.error()});
      flags.leader_elect = *b;
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) return std::unexpected(FlagError{flag, "needs a value"});
      value = args[++i];
    }
    if (spec->second.kind == FlagKind::kDuration) {
      auto d = parseGoDuration(*value);
      if (!d) return std::unexpected(FlagError{flag, d.error()});
      if (body == "leader-election-lease-duration") flags.lease_duration = *d;
      if (body == "leader-election-renew-deadline") flags.renew_deadline = *d;
      if (body == "leader-election-retry-period") flags.retry_period = *d;
      if (body == "graceful-shutdown-timeout") flags.graceful_shutdown_timeout = *d;
      continue;
    }
    if (body == "kubeconfig") flags.kubeconfig = *value;
    if (body == "leader-election-namespace") flags.leader_election_namespace = *value;
    if (body == "leader-election-id") flags.leader_election_id = *value;
    if (body == "health-probe-bind-address") flags.health_probe_bind_address = *value;
    if (body == "metrics-bind-address") flags.metrics_bind_address = *value;
    if (body == "log-level") flags.log_level = *value;
  }
  if (auto a = parseBindAddress(flags.health_probe_bind_address); !a) {
    return std::unexpected(FlagError{"--health-probe-bind-address", a.error()});
  }
  if (auto a = parseBindAddress(flags.metrics_bind_address); !a) {
    return std::unexpected(FlagError{"--metrics-bind-address", a.error()});
  }
  if (!logLevel(flags.log_level)) {
    return std::unexpected(FlagError{
        "--log-level",
        fmt::format("'{}': expected trace, debug, info, warn or error", flags.log_level)});
  }
  if (flags.leader_election_id.empty()) {
    return std::unexpected(FlagError{"--leader-election-id", "must not be empty"});
  }
  // client-go's checks (leaderelection.NewLeaderElector).
  if (flags.lease_duration < std::chrono::seconds(1)) {
    return std::unexpected(FlagError{"--leader-election-lease-duration", "must be at least 1s"});
  }
  if (flags.renew_deadline >= flags.lease_duration) {
    return std::unexpected(FlagError{"--leader-election-renew-deadline",
                                     "must be shorter than --leader-election-lease-duration"});
  }
  if (flags.retry_period <= common::Clock::Duration::zero() ||
      flags.retry_period >= flags.renew_deadline) {
    return std::unexpected(FlagError{"--leader-election-retry-period",
                                     "must be positive and shorter than "
                                     "--leader-election-renew-deadline"});
  }
  return flags;
}

std::string operatorUsage() {
  std::string out =
      "Usage: rtable-operator [flags]\n\nFlags:\n  --version\n      print the version and exit\n";
  for (const auto& [name, spec] : flagSpecs()) {
    const char* type = spec.kind == FlagKind::kBool       ? ""
                       : spec.kind == FlagKind::kDuration ? " duration"
                                                          : " string";
    out += fmt::format("  --{}{}\n      {}\n", name, type, spec.help);
  }
  return out;
}

int runOperatorMain(int argc, char** argv, const OperatorSetup& setup) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto flags = parseOperatorFlags(args);
  if (!flags) {
    fmt::print(stderr, "rtable-operator: {}\nRun 'rtable-operator --help' for usage.\n",
               flags.error().toString());
    return 2;
  }
  if (flags->help) {
    fmt::print("{}", operatorUsage());
    return 0;
  }
  if (flags->version) {
    fmt::print("rtable-operator {}\n", common::version());
    return 0;
  }

  // Signals are taken by sigtimedwait on one thread; every thread started later inherits the
  // mask, so none of them is interrupted by SIGTERM.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Logs go to stderr, unbuffered by line, as controller-runtime's do.
  auto logger = spdlog::stderr_color_mt("rtable-operator");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(*logLevel(flags->log_level));
  spdlog::flush_on(spdlog::level::trace);

  auto cluster = clusterConfigFor(*flags);
  if (!cluster) {
    spdlog::error("no cluster configuration: {}", cluster.error());
    return 1;
  }
  auto registry = std::make_shared<prometheus::Registry>();
  HttpKubeClientOptions client_options;
  client_options.registry = registry.get();
  auto client = HttpKubeClient::create(*cluster, std::move(client_options));
  if (!client) {
    spdlog::error("{}: {}", cluster->source, client.error().toString());
    return 1;
  }
  spdlog::info("rtable-operator {}: apiserver {} ({})", defaultUserAgent(), cluster->server,
               cluster->source);

  // The Lease's own client: a renewal that gets no answer gives up in time for the elector to
  // stop leading at the renew deadline (client-go bounds it by the same deadline).
  HttpKubeClientOptions election_options;
  election_options.request_timeout =
      electionRequestTimeout(flags->renew_deadline, flags->retry_period);
  auto election_client = HttpKubeClient::create(*cluster, std::move(election_options));
  if (!election_client) {
    spdlog::error("{}: {}", cluster->source, election_client.error().toString());
    return 1;
  }

  OperatorProcessOptions options;
  options.leader_elect = flags->leader_elect;
  options.election_client = election_client->get();
  options.leader_election.lease = {
      flags->leader_election_namespace.empty() ? cluster->ns : flags->leader_election_namespace,
      flags->leader_election_id};
  options.leader_election.lease_duration = flags->lease_duration;
  options.leader_election.renew_deadline = flags->renew_deadline;
  options.leader_election.retry_period = flags->retry_period;
  options.health_probe_bind_address = flags->health_probe_bind_address;
  options.metrics_bind_address = flags->metrics_bind_address;
  options.graceful_shutdown_timeout = flags->graceful_shutdown_timeout;
  options.registry = registry;
  OperatorProcess process(**client, std::move(options));
  if (setup) {
    if (auto ok = setup(process); !ok) {
      spdlog::error("setting up controllers: {}", ok.error());
      return 1;
    }
  }
  if (auto started = process.start(); !started) {
    spdlog::error("cannot start: {}", started.error());
    return 1;
  }

  std::atomic<bool> finished{false};
  std::thread signal_thread([&] {
    int received = 0;
    while (!finished.load()) {
      const timespec poll{0, 200'000'000};
      const int signal = sigtimedwait(&signals, nullptr, &poll);
      if (signal <= 0) continue;
      if (++received == 1) {
        spdlog::info("signal {}: shutting down", signal);
        process.requestShutdown();
      } else {
        spdlog::error("signal {} again: exiting now", signal);
        spdlog::default_logger()->flush();
        std::_Exit(1);
      }
    }
  });
  const ProcessExit exit = process.wait();
  finished.store(true);
  signal_thread.join();
  if (exit.code == 0) {
    spdlog::info("exiting: {}", exit.reason);
  } else {
    spdlog::error("exiting: {}", exit.reason);
  }
  if (exit.tasks_abandoned) {
    // Leader tasks still run and use objects that destructors would free.
    spdlog::default_logger()->flush();
    std::_Exit(exit.code);
  }
  return exit.code;
}

}  // namespace rtable::op
