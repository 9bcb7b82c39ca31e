// Informer: keeps a local cache (Store) of one resource type in step with the apiserver and tells
// handlers what changed (client-go's reflector + shared informer, for one set of handlers).
//
// Protocol (docs: operator-conventions "API-server protocol facts"): LIST every page, then WATCH
// from the list's resourceVersion with bookmarks and a jittered server timeout; the
// resourceVersion of every event (bookmarks too) is remembered. A watch the server ends normally
// is resumed from there without a new list. A 410 Gone (as an ERROR event or as the answer), any
// other ERROR event or a broken stream lead to a fresh LIST, whose differences against the cache
// reach the handlers as adds, updates (new resourceVersion) and deletes, so the cache and what the
// handlers were told stay the same. Failures back off exponentially up to a cap; the first retry
// after a quiet period is immediate. A failed watch start that the server did not answer (no
// connection, 429, 5xx) is retried as a watch from the same resourceVersion. A watch that ends
// within a second without an event counts as a failure (client-go's "very short watch").
//
// Events are handed from the watch's reader thread to the informer's thread through an unbounded
// buffer (as client-go's DeltaFIFO): slow handlers delay, never drop.
//
// Handlers run on the informer's own thread, one at a time, after the cache was updated; they must
// not call stop(). Errors are recorded (lastError()) and passed to InformerOptions::on_error, and
// retried: a Forbidden informer keeps trying (RBAC may be fixed) and never syncs.
//
// Thread safety: everything but addHandlers/addIndex (before start()) may be called from any
// thread. stop() (or the destructor) waits for the thread; a LIST in flight ends first.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rtable/common/clock.h"
#include "rtable/operator/kube_client.h"
#include "rtable/operator/store.h"

namespace rtable::op {

struct ResourceEventHandlers {
  std::function<void(const nlohmann::json& object)> on_add;
  std::function<void(const nlohmann::json& old_object, const nlohmann::json& new_object)> on_update;
  // The object's last state: from the DELETED event, or, when a relist found it gone, the last
  // state the cache held.
  std::function<void(const nlohmann::json& object)> on_delete;
};

struct InformerOptions {
  ResourceType type;
  std::string ns;  // "": all namespaces (or a cluster-scoped type)
  std::string label_selector;
  std::string field_selector;
  // Items per LIST page; client-go's pager uses 500.
  int64_t page_size = 500;
  const common::Clock* clock = nullptr;  // null: SteadyClock; must outlive the informer
  // The watch's timeoutSeconds, asked before every watch. Null: uniform in [5, 10) min, as
  // client-go's reflector, so that many watches do not restart at once.
  std::function<std::chrono::seconds()> watch_timeout;
  // Retry delays: immediate after a quiet period, then initial doubling up to max (client-go's
  // reflector: 800 ms .. 30 s, reset after 2 min without a failure).
  common::Clock::Duration backoff_initial = std::chrono::milliseconds(800);
  common::Clock::Duration backoff_max = std::chrono::seconds(30);
  common::Clock::Duration backoff_reset = std::chrono::minutes(2);
  // Called on the informer's thread for every failed list or watch, including a 410.
  std::function<void(const KubeError& error)> on_error;
  std::string name;  // for logs; default the type's groupResource
  // Applied to every object before it is stored and handed to the handlers (client-go's
  // TransformFunc), e.g. stripManagedFields: what the cache does not need costs memory per object.
  std::function<void(nlohmann::json& object)> transform;
};

// For InformerOptions::transform: drops metadata.managedFields (server-side apply's bookkeeping,
// often the larger part of a small object), which readers of the cache never look at.
void stripManagedFields(nlohmann::json& object);

class Informer {
 public:
  Informer(KubeClient& client, InformerOptions options);
  ~Informer();  // stops
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Before start(): handlers see every object from the first list on.
  void addHandlers(ResourceEventHandlers handlers);
  // Before start(). False if the name is taken.
  bool addIndex(const std::string& name, IndexFunc func);

  const Store& store() const { return store_; }
  // InformerOptions::name, or the type's groupResource.
  const std::string& name() const { return options_.name; }
  const ResourceType& type() const { return options_.type; }
  // The namespace it watches ("": every namespace).
  const std::string& watchNamespace() const { return options_.ns; }

  void start();
  // Idempotent. When it returns no handler runs or will run again.
  void stop();

  // True once the first list is in the cache and its adds were handled.
  bool hasSynced() const { return synced_.load(); }
  // Waits in real time (the list is real I/O); false on timeout or stop.
  bool waitForSync(std::chrono::milliseconds timeout) const;

  // The resourceVersion the next watch starts from ("" before the first list).
  std::string lastSyncResourceVersion() const;
  // The most recent failure (kept after recovery: see consecutiveFailures()).
  std::optional<KubeError> lastError() const;
  // Failures since the last success that reset the backoff.
  int consecutiveFailures() const;
  int64_t listCount() const { return lists_.load(); }
  int64_t watchCount() const { return watches_.load(); }

 private:
  enum class WatchOutcome { kServerClosed, kGone, kFailed, kStopped };
  struct Pending {
    uint64_t generation;
    std::optional<WatchEvent> event;
    std::optional<WatchEnd> end;
  };

  void run();
  bool list();
  WatchOutcome watchOnce(bool& retry_watch);
  WatchOutcome consume(uint64_t generation, common::Clock::TimePoint started);
  void handleEvent(WatchEvent event);
  void recordFailure(const KubeError& error);
  bool sleepBackoff();
  bool stopping() const;
  std::chrono::seconds nextWatchTimeout();

  void notifyAdd(const nlohmann::json& object);
  void notifyUpdate(const nlohmann::json& old_object, const nlohmann::json& new_object);
  void notifyDelete(const nlohmann::json& object);

  KubeClient& client_;
  InformerOptions options_;
  const common::Clock& clock_;
  Store store_;
  std::vector<ResourceEventHandlers> handlers_;
  std::mt19937_64 random_;

  std::mutex lifecycle_mu_;  // serializes start() and stop()
  bool started_ = false;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t generation_ = 0;  // of the current watch: events of older watches are dropped
  std::deque<Pending> pending_;
  std::string resource_version_;
  std::optional<KubeError> last_error_;
  int failures_ = 0;
  common::Clock::TimePoint last_failure_{};

  std::atomic<bool> synced_{false};
  std::atomic<int64_t> lists_{0};
  std::atomic<int64_t> watches_{0};
  std::thread thread_;
};

}  // namespace rtable::op
