// EventRecorder: Events about the objects the operator manages ("Created StatefulSet events-r",
// "Warning HeadroomLow ..."), what `kubectl describe` and `kubectl get events` show.
//
// record() never blocks on the API and never fails: a reconcile calls it and goes on. The real side
// (KubeEventRecorder) posts core/v1 Events through a KubeClient from its own thread, the way
// client-go's tools/record recorder and EventCorrelator do:
//   - a repeat of the same event (same object, type, reason and message, from this component)
//     within `aggregation_window` (10 min) of its last occurrence patches count and
//     lastTimestamp of the Event already posted instead of creating another; later, or once the
//     LRU cache of `cache_size` events forgot it, it is a new Event;
//   - a token bucket per object (client-go's spam filter: burst 25, one token per 5 min) drops
//     what exceeds it; the occurrence is still counted, so a later patch carries the full count;
//   - a queue of `queue_capacity` events (client-go: 1000) between record() and the poster; when it
//     is full, record() drops the event (and logs);
//   - a post that got no answer (outcomeUnknown) is retried up to `max_tries` times,
//     `retry_delay` apart; an answer (Forbidden, a terminating namespace) is logged and dropped; a
//     patch of an Event that is gone (they expire after an hour) creates it again.
// Not modelled: client-go's aggregation of *similar* events (same reason, different messages)
// into one "(combined from similar events)" Event.
//
// Thread safety: record() from any thread; the recorder must outlive its callers and the client
// must outlive the recorder. shutdown() (or the destructor) stops the poster thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "rtable/common/clock.h"
#include "rtable/operator/kube_client.h"

namespace rtable::op {

enum class EventType { kNormal, kWarning };
std::string_view eventTypeName(EventType type);  // "Normal", "Warning"

// corev1.ObjectReference: the object an Event is about.
struct ObjectReference {
  std::string api_version;
  std::string kind;
  std::string ns;
  std::string name;
  std::string uid;
  std::string resource_version;

  // From an object's apiVersion, kind and metadata (as read from the API).
  static ObjectReference of(const nlohmann::json& object);
  nlohmann::json toJson() const;
  friend bool operator==(const ObjectReference&, const ObjectReference&) = default;
};

class EventRecorder {
 public:
  virtual ~EventRecorder() = default;
  // `reason` is short and UpperCamelCase ("Created", "ScaleDown"); `message` is for people.
  virtual void record(const ObjectReference& object, EventType type, std::string_view reason,
                      std::string_view message) = 0;
};

struct KubeEventRecorderOptions {
  std::string component = "rtable-operator";  // source.component and reportingComponent
  std::string instance;  // reportingInstance (e.g. the leader identity); "" leaves it out
  std::size_t queue_capacity = 1000;
  common::Clock::Duration aggregation_window = std::chrono::minutes(10);
  std::size_t cache_size = 4096;  // client-go's maxLruCacheEntries
  int spam_burst = 25;
  common::Clock::Duration spam_refill = std::chrono::minutes(5);  // one token per this
  int max_tries = 12;                                             // client-go's maxTriesPerEvent
  common::Clock::Duration retry_delay = std::chrono::seconds(10);
  const common::Clock* clock = nullptr;  // windows, tokens and retries; null: SteadyClock
  // firstTimestamp/lastTimestamp and the Event's name; null: system_clock.
  std::function<std::chrono::system_clock::time_point()> wall_clock;
};

struct EventRecorderStats {
  int64_t created = 0;   // Events created
  int64_t patched = 0;   // repeats that patched count and lastTimestamp
  int64_t filtered = 0;  // dropped by the per-object spam filter
  int64_t dropped = 0;   // dropped because the queue was full or the recorder stopped
  int64_t failed = 0;    // could not be posted (logged)
};

class KubeEventRecorder final : public EventRecorder {
 public:
  KubeEventRecorder(KubeClient& client, KubeEventRecorderOptions options = {});
  ~KubeEventRecorder() override;  // shutdown(0)
  KubeEventRecorder(const KubeEventRecorder&) = delete;
  KubeEventRecorder& operator=(const KubeEventRecorder&) = delete;

  void record(const ObjectReference& object, EventType type, std::string_view reason,
              std::string_view message) override;

  // Posts what is queued for at most `grace` (by the clock), then stops; what is left and what
  // comes later is dropped. A request in flight ends first (the client's timeout bounds it).
  // Idempotent.
  void shutdown(common::Clock::Duration grace);
  // Waits (real time) until everything recorded so far was handled; false on timeout.
  bool flush(std::chrono::milliseconds timeout);

  EventRecorderStats stats() const;
  std::size_t queuedForTest() const;

 private:
  struct Pending {
    ObjectReference object;
    EventType type;
    std::string reason;
    std::string message;
    common::Clock::TimePoint when;
    std::chrono::system_clock::time_point wall;
  };
  struct Seen {  // one posted (or counted) event, by its key
    std::string name;
    std::string ns;
    int64_t count = 0;
    std::string first_timestamp;
    common::Clock::TimePoint last_seen;
    std::list<std::string>::iterator lru;
  };
  struct Bucket {
    double tokens;
    common::Clock::TimePoint refilled;
    std::list<std::string>::iterator lru;
  };

  void run();
  void process(const Pending& pending);
  bool allowedBySpamFilter(const Pending& pending);
  // Sends with retries; false when it could not be posted (logged, unless it was a NotFound and
  // `not_found_is_an_answer`: a patch of an Event that is gone).
  bool post(const std::function<KubeResult<nlohmann::json>()>& send, const std::string& what,
            KubeError* last_error, bool not_found_is_an_answer = false);
  bool sleepForRetry(common::Clock::TimePoint until);
  std::string uniqueName(const Pending& pending);

  KubeClient& client_;
  KubeEventRecorderOptions options_;
  const common::Clock& clock_;

  // Used by the poster thread only.
  std::unordered_map<std::string, Seen> seen_;
  std::list<std::string> seen_lru_;  // most recent first
  std::unordered_map<std::string, Bucket> buckets_;
  std::list<std::string> buckets_lru_;
  int64_t last_name_nanos_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  common::Clock::TimePoint drain_deadline_{};
  EventRecorderStats stats_;
  std::mutex lifecycle_mu_;
  std::thread thread_;
};

}  // namespace rtable::op
