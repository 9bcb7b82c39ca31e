// HttpKubeClient: KubeClient over HTTPS with cpprestsdk.
//
// TLS trusts the kubeconfig's CA (or the system store) and presents its client certificate, all
// from memory; bearer tokens go in the Authorization header (a token file is re-read every
// minute, as client-go does). Every cpprestsdk and Boost exception is caught here and becomes a
// KubeError{kConnection} (kTimeout for the client's own timeout).
//
// Retries (the rule Go's http.Transport follows for client-go): requests share a pool of
// keep-alive connections, and a pooled connection can be dead when it is taken (the apiserver
// restarted, a proxy dropped it). After a connection error the whole pool is replaced, and the
// request is sent once more on a fresh connection when that cannot apply it twice:
//   - GET (get, list, rawRequest GET) is always retried once;
//   - any other method only when it provably never reached the server complete: the failure
//     came while resolving, connecting, in the TLS handshake, or while writing the headers or the
//     body. A request that was sent in full and then got no answer may have been applied: the
//     connection error is returned (outcomeUnknown()), never retried here; the level-based caller
//     (a reconcile) reads again and retries with backoff.
// Timeouts are never retried (they would double the wait), nor are watches (each has its own
// fresh connection). cpprestsdk's own resend of a request whose pooled connection was found
// closed is disabled for bodies (see setBody in the .cpp): it would resend writes blindly.
//
// Known costs: cpprestsdk writes request headers and body in separate writes, so each request with
// a body may stall ~20 ms on Nagle + delayed ACK on loopback. Acceptable for a controller (a
// handful of writes per reconcile), not for bulk traffic.
//
// Thread safety: all methods may be called from any thread except from inside cpprestsdk's own
// thread-pool callbacks (they block on cpprestsdk tasks). Watch readers are our own threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "rtable/operator/kube_client.h"
#include "rtable/operator/kube_config.h"

namespace prometheus {
class Registry;
}

namespace rtable::op {

// One finished request, for metrics hooks and logs.
struct RequestRecord {
  std::string verb;  // HTTP method: GET, POST, PUT, PATCH, DELETE (a watch is a GET)
  std::string host;  // "host:port"
  std::string path;  // without the query
  int code = 0;      // HTTP status; 0 when there was no answer
  std::chrono::duration<double> duration{};  // until the response headers (the whole stream
                                             // is not timed for a watch)
};

struct HttpKubeClientOptions {
  std::chrono::milliseconds request_timeout{30'000};
  std::string user_agent;  // default "rtable-operator/<version>"
  // Optional: rest_client_request_duration_seconds{verb,host} and
  // rest_client_requests_total{code,method,host}, as client-go/controller-runtime name them.
  prometheus::Registry* registry = nullptr;
  // Optional: called once per request from the calling thread.
  std::function<void(const RequestRecord&)> on_request;
};

class HttpKubeClient : public KubeClient {
 public:
  // Checks the PEM material up front, so a broken kubeconfig fails at start-up, not at the first
  // TLS handshake.
  static KubeResult<std::unique_ptr<HttpKubeClient>> create(const ClusterConfig& config,
                                                            HttpKubeClientOptions options = {});
  ~HttpKubeClient() override;

  KubeResult<nlohmann::json> get(const ResourceType& type, const ObjectKey& key) override;
  KubeResult<ObjectList> list(const ResourceType& type, std::string_view ns,
                              const ListOptions& options = {}) override;
  KubeResult<nlohmann::json> create(const ResourceType& type, const nlohmann::json& object,
                                    const WriteOptions& options = {}) override;
  KubeResult<nlohmann::json> update(const ResourceType& type, const nlohmann::json& object,
                                    const WriteOptions& options = {}) override;
  KubeResult<nlohmann::json> updateStatus(const ResourceType& type, const nlohmann::json& object,
                                          const WriteOptions& options = {}) override;
  KubeResult<nlohmann::json> patch(const ResourceType& type, const ObjectKey& key,
                                   PatchType patch_type, const nlohmann::json& patch,
                                   const PatchOptions& options = {}) override;
  KubeResult<DeleteResult> remove(const ResourceType& type, const ObjectKey& key,
                                  const DeleteOptions& options = {}) override;
  KubeResult<std::unique_ptr<Watch>> watch(const ResourceType& type, std::string_view ns,
                                           const WatchOptions& options, WatchEventHandler on_event,
                                           WatchEndHandler on_end) override;

  // A raw request, for paths the typed methods do not cover (/version, /healthz, discovery).
  // `path_and_query` is already encoded. Returns the body of a 2xx answer.
  KubeResult<std::string> rawRequest(const std::string& method, const std::string& path_and_query,
                                     const std::string& body = {},
                                     const std::string& content_type = {});

  // How many requests were sent a second time on a fresh connection (see the retry rule above).
  int64_t retriesOnFreshConnection() const;

  class Impl;

 private:
  explicit HttpKubeClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// "rtable-operator/<project version>".
std::string defaultUserAgent();

}  // namespace rtable::op
