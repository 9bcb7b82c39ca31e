#include "rtable/operator/operator_process.h"

#include <fmt/format.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include "rtable/operator/controller.h"
#include "rtable/operator/informer.h"

namespace rtable::op {

LeaderTask controllerTask(Controller& controller) {
  return {controller.name(), [&controller] { controller.start(); },
          [&controller] { controller.stop(); }};
}

// Leader tasks being stopped, each on a thread of its own (so that one slow stop does not hold
// up the others, as controller-runtime stops its runnables). Shared with those threads: when the
// stop is abandoned they outlive the wait.
struct OperatorProcess::StopGroup {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t remaining = 0;
  std::vector<std::thread> threads;
};

OperatorProcess::OperatorProcess(KubeClient& client, OperatorProcessOptions options)
    : client_(client), options_(std::move(options)) {
  registry_ = options_.registry ? options_.registry : std::make_shared<prometheus::Registry>();
  if (options_.leader_election.identity.empty()) {
    options_.leader_election.identity = defaultLeaderIdentity();
  }
  identity_ = options_.leader_election.identity;
  KubeEventRecorderOptions events = options_.events;
  events.component = options_.component;
  if (events.instance.empty()) events.instance = identity_;
  events_ = std::make_unique<KubeEventRecorder>(client_, std::move(events));
  if (options_.leader_elect) {
    // client-go's leader metrics, as controller-runtime registers them.
    leader_gauge_ = &prometheus::BuildGauge()
                         .Name("leader_election_master_status")
                         .Help(
                             "Gauge of if the reporting system is master of the relevant lease, "
                             "0 indicates backup, 1 indicates master. 'name' is the string "
                             "used to identify the lease. Please make sure to group by name.")
                         .Register(*registry_)
                         .Add({{"name", options_.leader_election.lease.name}});
    leader_gauge_->Set(0);
  }
}

OperatorProcess::~OperatorProcess() {
  {
    std::lock_guard lock(mu_);
    shutting_down_ = true;
    shutdown_requested_ = true;
  }
  cv_.notify_all();
  // Whatever the grace was, nothing may use the tasks once this returns: wait for them.
  stopLeaderTasks(common::Clock::Duration::max());
  stopCommon();
  while (!adopted_.empty()) adopted_.pop_back();
}

void OperatorProcess::addInformer(Informer& informer) {
  informers_.push_back(&informer);
}

void OperatorProcess::addController(Controller& controller) {
  tasks_.push_back(controllerTask(controller));
}

void OperatorProcess::addLeaderTask(LeaderTask task) {
  tasks_.push_back(std::move(task));
}

void OperatorProcess::addReadinessCheck(NamedCheck check) {
  readiness_checks_.push_back(std::move(check));
}

void OperatorProcess::addHealthCheck(NamedCheck check) {
  health_checks_.push_back(std::move(check));
}

void OperatorProcess::adopt(std::shared_ptr<void> object) {
  adopted_.push_back(std::move(object));
}

std::expected<void, std::string> OperatorProcess::start() {
  {
    std::lock_guard lock(mu_);
    if (started_) return std::unexpected(std::string("already started"));
    started_ = true;
  }
  auto probe_address = parseBindAddress(options_.health_probe_bind_address);
  if (!probe_address) return std::unexpected("health probe bind address " + probe_address.error());
  auto metrics_address = parseBindAddress(options_.metrics_bind_address);
  if (!metrics_address) return std::unexpected("metrics bind address " + metrics_address.error());

  if (!probe_address->disabled) {
    std::vector<NamedCheck> healthz{{"ping", [] { return std::expected<void, std::string>(); }}};
    healthz.insert(healthz.end(), health_checks_.begin(), health_checks_.end());
    std::vector<NamedCheck> readyz{
        {"apiserver",
         [this]() -> std::expected<void, std::string> {
           std::lock_guard lock(mu_);
           if (api_reached_) return {};
           return std::unexpected(std::string("the apiserver has not answered yet"));
         }},
        {"informers",
         [this]() -> std::expected<void, std::string> {
           std::vector<std::string> waiting;
           for (const Informer* informer : informers_) {
             if (!informer->hasSynced()) waiting.push_back(informer->name());
           }
           if (waiting.empty()) return {};
           return std::unexpected(fmt::format("not synced: {}", fmt::join(waiting, ", ")));
         }},
        {"shutdown", [this]() -> std::expected<void, std::string> {
           std::lock_guard lock(mu_);
           if (!shutting_down_) return {};
           return std::unexpected(std::string("shutting down"));
         }}};
    readyz.insert(readyz.end(), readiness_checks_.begin(), readiness_checks_.end());
    auto server = ProbeServer::start(*probe_address, std::move(healthz), std::move(readyz));
    if (!server) return std::unexpected(server.error());
    probe_server_ = std::move(*server);
    probe_port_ = probe_server_->port();
  }
  if (!metrics_address->disabled) {
    // prometheus-cpp's own server for /metrics: the text format with content negotiation and
    // gzip, and the port it really bound (port 0 works).
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(metrics_address->toString());
      exposer_->RegisterCollectable(registry_);
      const auto ports = exposer_->GetListeningPorts();
      metrics_port_ = ports.empty() ? 0 : ports.front();
    } catch (const std::exception& e) {
      probe_server_.reset();
      return std::unexpected(
          fmt::format("cannot serve metrics on {}: {}", metrics_address->toString(), e.what()));
    }
  }
  spdlog::info(
      "{}: health probes {}; metrics {}", options_.component,
      probe_server_
          ? fmt::format("listening on http://{}/healthz, /readyz", probe_server_->address())
          : std::string("off"),
      exposer_
          ? fmt::format("listening on http://{}:{}/metrics", metrics_address->host, metrics_port_)
          : std::string("off"));

  for (Informer* informer : informers_) informer->start();
  api_probe_thread_ = std::thread([this] { probeApiServer(); });

  if (options_.leader_elect) {
    LeaderElectionOptions election = options_.leader_election;
    election.release_on_cancel = true;
    election.on_started_leading = [this] {
      if (leader_gauge_ != nullptr) leader_gauge_->Set(1);
      {
        std::lock_guard lock(mu_);
        led_ = true;
        start_tasks_ = true;
      }
      cv_.notify_all();
    };
    election.on_stopped_leading = [this] {
      if (leader_gauge_ != nullptr) leader_gauge_->Set(0);
      {
        std::lock_guard lock(mu_);
        if (!shutting_down_ && led_) lost_ = true;
      }
      cv_.notify_all();
    };
    election.on_new_leader = [this](const std::string& holder) {
      if (holder != identity_) {
        spdlog::info("leader election {}: the leader is '{}'",
                     options_.leader_election.lease.toString(), holder);
      }
    };
    try {
      elector_ = std::make_unique<LeaderElector>(
          options_.election_client ? *options_.election_client : client_, std::move(election));
    } catch (const std::invalid_argument& e) {
      return std::unexpected(std::string(e.what()));
    }
    spdlog::info("leader election {}: {} is a candidate", options_.leader_election.lease.toString(),
                 identity_);
    elector_->start();
  } else {
    std::lock_guard lock(mu_);
    start_tasks_ = true;
  }
  return {};
}

void OperatorProcess::requestShutdown() {
  {
    std::lock_guard lock(mu_);
    shutdown_requested_ = true;
    shutting_down_ = true;  // /readyz fails from now on
  }
  cv_.notify_all();
}

ProcessExit OperatorProcess::wait() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock,
             [&] { return shutdown_requested_ || lost_ || (start_tasks_ && !tasks_running_); });
    if (shutdown_requested_ || lost_) break;
    tasks_running_ = true;
    lock.unlock();
    spdlog::info("{}: starting {} leader task(s)", options_.component, tasks_.size());
    for (auto& task : tasks_) {
      if (task.start) task.start();
    }
    lock.lock();
  }
  shutting_down_ = true;
  const bool lost = lost_ && !shutdown_requested_;
  lock.unlock();

  if (lost) {
    spdlog::error("{}: leader election lost", options_.component);
    const bool stopped = stopLeaderTasks(options_.leadership_lost_grace);
    if (stopped) stopCommon();
    return {1, "leader election lost", !stopped};
  }
  spdlog::info(
      "{}: shutting down (leader tasks have {} s to stop)", options_.component,
      std::chrono::duration_cast<std::chrono::seconds>(options_.graceful_shutdown_timeout).count());
  if (!stopLeaderTasks(options_.graceful_shutdown_timeout)) {
    // A reconcile may still be running: keep the Lease, so that no other leader starts until it
    // has expired (by then this process has exited).
    if (elector_) elector_->keepLeaseOnStop();
    spdlog::error("{}: leader tasks did not stop within the graceful shutdown timeout",
                  options_.component);
    return {1, "graceful shutdown timed out", true};
  }
  stopCommon();
  spdlog::info("{}: stopped", options_.component);
  return {0, "shutdown requested", false};
}

bool OperatorProcess::stopLeaderTasks(common::Clock::Duration grace) {
  std::shared_ptr<StopGroup> group;
  {
    std::lock_guard lock(mu_);
    if (!tasks_running_) return true;
    group = stopping_tasks_;
    if (!group) {
      group = std::make_shared<StopGroup>();
      group->remaining = tasks_.size();
      stopping_tasks_ = group;
      for (const auto& task : tasks_) {
        group->threads.emplace_back([group, stop = task.stop, name = task.name] {
          if (stop) stop();
          spdlog::debug("leader task {} stopped", name);
          {
            std::lock_guard lock(group->mu);
            --group->remaining;
          }
          group->cv.notify_all();
        });
      }
    }
  }
  std::unique_lock group_lock(group->mu);
  const auto done = [&] { return group->remaining == 0; };
  const auto now = std::chrono::steady_clock::now();
  if (grace >= std::chrono::steady_clock::time_point::max() - now) {
    group->cv.wait(group_lock, done);
  } else if (!group->cv.wait_until(group_lock, now + grace, done)) {
    return false;  // the threads go on; stopping_tasks_ lets a later call wait for them
  }
  auto threads = std::move(group->threads);
  group_lock.unlock();
  for (auto& thread : threads) {
    if (thread.joinable()) thread.join();
  }
  std::lock_guard lock(mu_);
  tasks_running_ = false;
  stopping_tasks_.reset();
  return true;
}

void OperatorProcess::stopCommon() {
  {
    std::lock_guard lock(mu_);
    if (stopped_ || !started_) {
      stopped_ = true;
      return;
    }
    stopped_ = true;
  }
  cv_.notify_all();
  // The Lease first: the next leader need not wait for the rest.
  if (elector_) elector_->stop();
  for (Informer* informer : informers_) informer->stop();
  if (api_probe_thread_.joinable()) api_probe_thread_.join();
  events_->shutdown(options_.event_flush_timeout);
  exposer_.reset();
  probe_server_.reset();
}

void OperatorProcess::probeApiServer() {
  bool warned = false;
  for (;;) {
    ListOptions options;
    options.limit = 1;
    auto answer = client_.list(resources::namespaces(), "", options);
    // Any HTTP answer will do (a Forbidden too): the server is there and speaks to us.
    if (answer || answer.error().http_code != 0) {
      spdlog::info("{}: the apiserver answered", options_.component);
      std::lock_guard lock(mu_);
      api_reached_ = true;
      return;
    }
    if (!warned) {
      spdlog::warn("{}: the apiserver does not answer yet: {}", options_.component,
                   answer.error().toString());
      warned = true;
    }
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, options_.api_probe_interval, [&] { return stopped_; })) return;
  }
}

int OperatorProcess::healthProbePort() const {
  return probe_port_;
}

int OperatorProcess::metricsPort() const {
  return metrics_port_;
}

bool OperatorProcess::leading() const {
  if (elector_) return elector_->isLeader();
  std::lock_guard lock(mu_);
  return tasks_running_;
}

}  // namespace rtable::op
