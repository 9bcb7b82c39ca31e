// The replica's HTTP API on port 8123 (DESIGN.md 2.8), on HttpServer (http_server.h).
//
//   POST /insert?format=&insert_deduplication_token=&insert_quorum=&table=   rows in the body
//        &async_insert=0|1&wait_for_async_insert=0|1   async inserts (async_insert.h): batched
//        with other clients' rows; defaults from the spec (inserts.async)
//   GET  /select?format=&where=&partition=&limit=    GET /count?where=&partition=
//   GET  /parts    GET /replica    GET /healthz    GET /readyz
//   POST /sync?timeout_seconds=    wait for the replication queue to drain
//   GET  /replication/part?name=&generation=   a part for another replica (interserver secret
//        header); the generation defaults to the one served
//
// A replica that serves one generation gives its TableReplica; rtable-core gives its TableHost,
// whose serving generation may change under a table swap (each request asks for it anew).
//
// Errors are JSON {"error": CODE, "message": ...} with the fitting status. At most `workers`
// requests are served at once (others wait their turn; past `max_queued` waiting: 503 OVERLOADED
// with Retry-After, the request not run); other replicas' part fetches never wait, as a quorum
// insert being served waits for them.
//
// Thread safety: start() and drain() from one thread; requests are served concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <string>

#include "rtable/replication_core/table_replica.h"

namespace rtable::core {

class TableHost;

inline constexpr std::size_t kDefaultMaxQueuedRequests = 1024;

class ReplicaHttpServer {
 public:
  static std::expected<std::unique_ptr<ReplicaHttpServer>, std::string> start(
      TableReplica& table, const std::string& listen_address, uint16_t port,
      std::size_t workers = 8, std::size_t max_queued = kDefaultMaxQueuedRequests);
  static std::expected<std::unique_ptr<ReplicaHttpServer>, std::string> start(
      TableHost& host, const std::string& listen_address, uint16_t port, std::size_t workers = 8,
      std::size_t max_queued = kDefaultMaxQueuedRequests);
  ~ReplicaHttpServer();

  // Graceful stop: /readyz turns 503 and new requests get 503, except other replicas' part
  // fetches; requests already being served finish (up to `grace`); then `while_serving_parts`
  // runs (TableReplica::handOff), part fetches still served; then the listener closes.
  void drain(std::chrono::milliseconds grace,
             const std::function<void()>& while_serving_parts = {});

  class Impl;

 private:
  explicit ReplicaHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rtable::core
