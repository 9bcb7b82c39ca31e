// OperatorProcess: the operator as a process, wired the way controller-runtime's manager runs
// one: one KubeClient, informers on every replica, controllers only on the leader, /healthz and
// /readyz on the probe port, /metrics on the metrics port, Events, and the exit rules.
//
// Life of a process:
//   start()   binds the probe and metrics servers (a port in use is a start-up error), starts
//             every informer and the leader elector (or, without leader election, asks for the
//             leader tasks at once), and probes the apiserver until it answers.
//   wait()    runs on the caller's thread until the process should end: it starts the leader
//             tasks (controllers) when this process becomes the leader, then
//               - after requestShutdown() (SIGTERM): /readyz fails at once, every leader task is
//                 stopped (no new work; running reconciles finish) within
//                 graceful_shutdown_timeout, the Lease is released so that another replica takes
//                 over at its next retry, informers and the event recorder stop: exit 0. If the
//                 tasks do not stop in time the Lease is kept (it expires on its own, so no other
//                 leader runs beside a reconcile still in flight): exit 1, tasks abandoned.
//               - after losing the Lease having led: "leader election lost", exit 1 without
//                 waiting for running reconciles (controller-runtime skips the graceful shutdown
//                 then: another leader may already be starting), so the pod restarts clean.
//   Not leading: the leader tasks are not started; /healthz is 200 and /readyz depends only on
//   the apiserver and the informers, as on the leader.
//
// /readyz checks: "apiserver" (an answer, any answer, was received once), "informers" (every
// added informer has synced), "shutdown" (not shutting down), plus addReadinessCheck(). /healthz:
// "ping", plus addHealthCheck(). /metrics: the registry (give it to controllers, work queues and
// HttpKubeClient), including leader_election_master_status{name=<lease name>} (1 leading, 0 not).
//
// Thread safety: add*() before start(); start() and wait() from one owner thread;
// requestShutdown() from any thread (e.g. the one that waits for signals). Objects given to
// add*() must outlive the process, or be adopted by it (adopt()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <expected>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rtable/common/clock.h"
#include "rtable/operator/event_recorder.h"
#include "rtable/operator/kube_client.h"
#include "rtable/operator/leader_election.h"
#include "rtable/operator/probe_server.h"

namespace prometheus {
class Registry;
class Exposer;
class Gauge;
}  // namespace prometheus

namespace rtable::op {

class Controller;
class Informer;

// Work that runs only on the leader. start() returns quickly (it starts threads); stop() stops
// taking work and returns once what is in flight has finished.
struct LeaderTask {
  std::string name;
  std::function<void()> start;
  std::function<void()> stop;
};

// A Controller as a leader task.
LeaderTask controllerTask(Controller& controller);

struct OperatorProcessOptions {
  std::string component = "rtable-operator";  // Events' source, logs
  bool leader_elect = true;
  // The Lease (namespace and name), identity and timings. release_on_cancel is always on; the
  // callbacks belong to the process.
  LeaderElectionOptions leader_election;
  // The client the Lease is renewed through; null: the process's own. Its requests must time out
  // within renew deadline - retry period (electionRequestTimeout): a renewal that hangs on a
  // silent apiserver (a partition) would otherwise keep the process leading past the renew
  // deadline, after the Lease has expired for the standby.
  KubeClient* election_client = nullptr;
  std::string health_probe_bind_address = ":8081";  // "0": no probe server
  std::string metrics_bind_address = ":8080";       // "0": no metrics server
  // How long stopping the leader tasks may take on a requested shutdown (controller-runtime's
  // GracefulShutdownTimeout default).
  common::Clock::Duration graceful_shutdown_timeout = std::chrono::seconds(30);
  // How long they may take after the Lease was lost: 0, as controller-runtime (tests raise it to
  // check that a clean stop is possible).
  common::Clock::Duration leadership_lost_grace = common::Clock::Duration::zero();
  // Retry period of the apiserver probe behind the "apiserver" readiness check.
  common::Clock::Duration api_probe_interval = std::chrono::seconds(1);
  // How long queued Events may still be posted at shutdown.
  common::Clock::Duration event_flush_timeout = std::chrono::seconds(5);
  KubeEventRecorderOptions events;                 // component and instance are filled in
  std::shared_ptr<prometheus::Registry> registry;  // null: a new one
};

// How the process should end.
struct ProcessExit {
  int code = 0;        // 0: shut down on request; 1: leader election lost, or a stop timed out
  std::string reason;  // "shutdown requested", "leader election lost", ...
  // A leader task was still stopping: the caller must end the process without destroying what
  // the tasks use (std::_Exit after flushing logs).
  bool tasks_abandoned = false;
};

class OperatorProcess {
 public:
  OperatorProcess(KubeClient& client, OperatorProcessOptions options);
  // Stops whatever still runs (as a shutdown would), then drops adopted objects, newest first.
  ~OperatorProcess();
  OperatorProcess(const OperatorProcess&) = delete;
  OperatorProcess& operator=(const OperatorProcess&) = delete;

  prometheus::Registry& registry() { return *registry_; }
  KubeClient& client() { return client_; }
  EventRecorder& eventRecorder() { return *events_; }
  const std::string& identity() const { return identity_; }

  // --- before start() ---
  // Started by start() on every replica (a warm cache for a new leader); /readyz waits for it.
  void addInformer(Informer& informer);
  // Started when leading, stopped at shutdown.
  void addController(Controller& controller);
  void addLeaderTask(LeaderTask task);
  void addReadinessCheck(NamedCheck check);
  void addHealthCheck(NamedCheck check);
  // Keeps `object` alive until the process is destroyed (after everything was stopped), e.g. the
  // controllers and informers a main creates.
  void adopt(std::shared_ptr<void> object);

  std::expected<void, std::string> start();
  // Idempotent, from any thread.
  void requestShutdown();
  // See the header comment. Call once, after a successful start().
  ProcessExit wait();

  // The bound ports (port 0 resolved), 0 when that server is off.
  int healthProbePort() const;
  int metricsPort() const;
  bool leading() const;

 private:
  struct StopGroup;  // leader tasks being stopped, shared with the threads that stop them
  void probeApiServer();
  // Stops the leader tasks; true when all stopped within `grace`.
  bool stopLeaderTasks(common::Clock::Duration grace);
  void stopCommon();

  KubeClient& client_;
  OperatorProcessOptions options_;
  std::string identity_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<KubeEventRecorder> events_;
  prometheus::Gauge* leader_gauge_ = nullptr;

  std::vector<Informer*> informers_;
  std::vector<LeaderTask> tasks_;
  std::vector<NamedCheck> readiness_checks_;
  std::vector<NamedCheck> health_checks_;
  std::vector<std::shared_ptr<void>> adopted_;

  std::unique_ptr<ProbeServer> probe_server_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int probe_port_ = 0;  // set by start(), kept after the servers stop
  int metrics_port_ = 0;
  std::unique_ptr<LeaderElector> elector_;
  std::thread api_probe_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool start_tasks_ = false;  // leadership gained (or no election): wait() starts the tasks
  bool tasks_running_ = false;
  bool led_ = false;
  bool lost_ = false;
  bool shutdown_requested_ = false;
  bool shutting_down_ = false;  // readiness fails from here on
  bool api_reached_ = false;
  bool stopped_ = false;
  std::shared_ptr<StopGroup> stopping_tasks_;
};

}  // namespace rtable::op
