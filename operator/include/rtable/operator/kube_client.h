// KubeClient: the one seam between the operator and the Kubernetes API.
//
// It has a real side (HttpKubeClient, cpprestsdk) and an in-memory side (testing::FakeKubeClient)
// that honours the apiserver's semantics (resourceVersion conflicts, generation, the status
// subresource, finalizers, watch history and 410 Gone). Objects are nlohmann::json as on the wire.
// Errors are values (KubeError). Modifying methods never retry: a Connection or Timeout error
// leaves the outcome unknown, and the level-based caller (a reconcile) reads again and decides.
//
// Thread safety: every implementation may be called from several threads at once. Watch callbacks
// run on a reader thread owned by the Watch; they may call the client, and must not block on the
// Watch's own stop().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/operator/kube_error.h"
#include "rtable/operator/resource.h"
#include "rtable/operator/watch_stream.h"

namespace rtable::op {

// One page of a LIST.
struct ObjectList {
  std::vector<nlohmann::json> items;
  std::string resource_version;  // of the list: start a watch here
  std::string continue_token;    // empty on the last page
  std::optional<int64_t> remaining_item_count;
};

struct DeleteResult {
  // False when the object still exists marked for deletion (finalizers, foreground deletion,
  // graceful pod deletion): `object` is then the object with metadata.deletionTimestamp.
  bool deleted = true;
  nlohmann::json object;  // what the server answered: the object, or a Status
};

enum class WatchEndReason {
  kServerClosed,  // the server ended the stream: timeoutSeconds elapsed, or after an ERROR event
  kStopped,       // Watch::stop() or the Watch was destroyed
  kError,         // the connection broke or a line was not a watch event
};
std::string_view watchEndReasonName(WatchEndReason reason);

struct WatchEnd {
  WatchEndReason reason = WatchEndReason::kServerClosed;
  std::optional<KubeError> error;  // kError only
};

using WatchEventHandler = std::function<void(const WatchEvent&)>;
using WatchEndHandler = std::function<void(const WatchEnd&)>;

// A running watch. Events reach the handler in order from one reader thread; the end handler runs
// once, last, on the same thread. Destroying the Watch stops it and waits for the reader thread
// (unless called from that thread).
class Watch {
 public:
  virtual ~Watch() = default;
  // Idempotent. When it returns (from another thread) no handler is running or will run again.
  virtual void stop() = 0;
  // Waits until the end handler has run; false on timeout.
  virtual bool waitEnded(std::chrono::milliseconds timeout) = 0;
};

class KubeClient {
 public:
  virtual ~KubeClient() = default;

  virtual KubeResult<nlohmann::json> get(const ResourceType& type, const ObjectKey& key) = 0;

  // One page. `ns` empty: all namespaces (or a cluster-scoped type).
  virtual KubeResult<ObjectList> list(const ResourceType& type, std::string_view ns,
                                      const ListOptions& options = {}) = 0;

  // Every page, following `continue` with options.limit items per page. A 410 on a continue token
  // (the snapshot was compacted away) restarts the whole list, at most `max_restarts` times.
  // The result's resource_version is that of the snapshot the pages came from.
  KubeResult<ObjectList> listAll(const ResourceType& type, std::string_view ns,
                                 ListOptions options = {}, int max_restarts = 3);

  // The namespace is the object's metadata.namespace. Returns the object as stored.
  virtual KubeResult<nlohmann::json> create(const ResourceType& type, const nlohmann::json& object,
                                            const WriteOptions& options = {}) = 0;
  // PUT. With metadata.resourceVersion set, a stale version is a kConflict.
  virtual KubeResult<nlohmann::json> update(const ResourceType& type, const nlohmann::json& object,
                                            const WriteOptions& options = {}) = 0;
  // PUT to the status subresource: only .status changes.
  virtual KubeResult<nlohmann::json> updateStatus(const ResourceType& type,
                                                  const nlohmann::json& object,
                                                  const WriteOptions& options = {}) = 0;
  virtual KubeResult<nlohmann::json> patch(const ResourceType& type, const ObjectKey& key,
                                           PatchType patch_type, const nlohmann::json& patch,
                                           const PatchOptions& options = {}) = 0;
  virtual KubeResult<DeleteResult> remove(const ResourceType& type, const ObjectKey& key,
                                          const DeleteOptions& options = {}) = 0;

  // Starts a watch. An error answer before the stream starts is returned here; a 410 for a too old
  // resourceVersion normally arrives as an ERROR event followed by the end of the stream.
  virtual KubeResult<std::unique_ptr<Watch>> watch(const ResourceType& type, std::string_view ns,
                                                   const WatchOptions& options,
                                                   WatchEventHandler on_event,
                                                   WatchEndHandler on_end) = 0;
};

// metadata.namespace / metadata.name of an object.
ObjectKey objectKeyOf(const nlohmann::json& object);
// metadata.resourceVersion, "" when absent.
std::string resourceVersionOf(const nlohmann::json& object);

}  // namespace rtable::op
