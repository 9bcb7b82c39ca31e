#include "rtable/replication_core/http_api.h"

#include <cpprest/containerstream.h>
#include <cpprest/http_listener.h>
#include <cpprest/producerconsumerstream.h>
#include <cpprest/uri.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <condition_variable>
#include <deque>
#include <nlohmann/json.hpp>
#include <thread>

#include "rtable/replication_core/part_exchange.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/row_filter.h"
#include "rtable/replication_core/row_format.h"
#include "worker_pool.h"

namespace rtable::core {
namespace {

namespace http = web::http;
using nlohmann::json;

constexpr std::size_t kBodyChunk = 256 * 1024;
constexpr std::size_t kMaxQueuedRequests = 1024;

// cpprestsdk's set_body(std::string) reads a char buffer through an unsigned-char stream (a type
// pun UBSan reports); a byte buffer of the stream's own type avoids it.
void setBody(http::http_response& response, const std::string& body, const std::string& content_type) {
  std::vector<uint8_t> bytes(body.begin(), body.end());
  const auto size = bytes.size();
  response.set_body(concurrency::streams::bytestream::open_istream(std::move(bytes)), size, content_type);
}

void send(const http::http_request& request, http::http_response& response) {
  request.reply(response).then([](pplx::task<void> sent) {
    try {
      sent.get();
    } catch (...) {  // the client went away: nothing to tell it
    }
  });
}

void replyJson(const http::http_request& request, http::status_code status, const json& body,
               const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  http::http_response response(status);
  for (const auto& [name, value] : headers) response.headers().add(name, value);
  setBody(response, body.dump() + "\n", "application/json; charset=utf-8");
  send(request, response);
}

void replyError(const http::http_request& request, http::status_code status, const std::string& code,
                const std::string& message, json extra = json::object(),
                const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  extra["error"] = code;
  extra["message"] = message;
  replyJson(request, status, extra, headers);
}

std::string contentType(RowFormat format) {
  switch (format) {
    case RowFormat::kJSONEachRow: return "application/x-ndjson; charset=utf-8";
    case RowFormat::kTabSeparated: return "text/tab-separated-values; charset=utf-8";
    case RowFormat::kCSV: return "text/csv; charset=utf-8";
  }
  return "text/plain";
}

// --- GET /replication/part: the body's flow control --------------------------------------------

// A part transfer streams through a producer_consumer_buffer that our worker fills from the part's
// files. The stock buffer grows without bound (a 1 GB part would end up in memory when the network
// is slower than the disk) and its in_avail() is read without its lock, so the worker counts what
// cpprestsdk has taken out of the buffer instead, and stays at most kMaxUnsentPartBytes ahead.
constexpr std::size_t kMaxUnsentPartBytes = 4 << 20;
// A peer that takes nothing for this long has stopped reading: the worker gives up on it.
constexpr std::chrono::seconds kPartTransferStall{60};

class PartTransferProgress {
 public:
  void taken(std::size_t bytes) {
    {
      std::lock_guard lock(mu_);
      taken_ += bytes;
    }
    changed_.notify_all();
  }
  // The response was sent, or failed (the peer went away, the listener closed).
  void finished() {
    {
      std::lock_guard lock(mu_);
      finished_ = true;
    }
    changed_.notify_all();
  }
  // Waits until at most `limit` of the `put` bytes are still in the buffer. False if the response
  // finished first, or nothing was taken for `stall`.
  bool waitForRoom(uint64_t put, uint64_t limit, std::chrono::milliseconds stall) {
    std::unique_lock lock(mu_);
    for (;;) {
      if (finished_) return false;
      if (put - taken_ <= limit) return true;
      const uint64_t before = taken_;
      changed_.wait_for(lock, stall, [&] { return finished_ || taken_ != before; });
      if (!finished_ && taken_ == before) return false;
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  uint64_t taken_ = 0;
  bool finished_ = false;
};

class CountedPartBuffer
    : public concurrency::streams::details::basic_producer_consumer_buffer<uint8_t> {
 public:
  explicit CountedPartBuffer(std::shared_ptr<PartTransferProgress> progress)
      : basic_producer_consumer_buffer(kBodyChunk), progress_(std::move(progress)) {}

 protected:
  // cpprestsdk's server reads a response body with getn only.
  pplx::task<size_t> _getn(uint8_t* ptr, size_t count) override {
    auto progress = progress_;
    return basic_producer_consumer_buffer::_getn(ptr, count).then([progress](size_t n) {
      progress->taken(n);
      return n;
    });
  }

 private:
  std::shared_ptr<PartTransferProgress> progress_;
};

}  // namespace

class ReplicaHttpServer::Impl {
 public:
  Impl(TableReplica& table, const std::string& uri, std::size_t workers)
      : table_(table), listener_(web::uri(uri)), workers_(workers, kMaxQueuedRequests) {}

  std::expected<void, std::string> open() {
    listener_.support([this](http::http_request request) {
      // Other replicas may still fetch this one's parts while it hands them off (drain).
      if (draining_ && request.relative_uri().path() != kPartTransferPath) {
        replyError(request, http::status_codes::ServiceUnavailable, "SHUTTING_DOWN",
                   "this replica is shutting down; retry on another replica",
                   json::object(), {{"Retry-After", "1"}});
        return;
      }
      if (!workers_.submit([this, request] { serve(request); })) {
        replyError(request, http::status_codes::ServiceUnavailable, "OVERLOADED",
                   "too many requests queued", json::object(), {{"Retry-After", "1"}});
      }
    });
    try {
      listener_.open().wait();
    } catch (const std::exception& e) {
      return std::unexpected(fmt::format("cannot listen on {}: {}", listener_.uri().to_string(), e.what()));
    }
    return {};
  }

  void drain(std::chrono::milliseconds grace, const std::function<void()>& while_serving_parts) {
    draining_ = true;
    workers_.waitIdle(grace);
    if (while_serving_parts) while_serving_parts();
    workers_.waitIdle(grace);
    try {
      listener_.close().wait();
    } catch (...) {  // closing a listener that failed: nothing left to do
    }
  }

 private:
  void serve(const http::http_request& request) {
    try {
      route(request);
    } catch (const std::exception& e) {
      // cpprestsdk reports a broken connection or bad request line by exception.
      replyError(request, http::status_codes::InternalError, "INTERNAL", e.what());
    }
  }

  void route(const http::http_request& request) {
    const std::string path = request.relative_uri().path();
    const auto query = web::uri::split_query(web::uri::decode(request.relative_uri().query()));
    const auto method = request.method();
    auto param = [&](const std::string& name) -> std::string {
      auto it = query.find(name);
      return it == query.end() ? std::string() : it->second;
    };
    const std::string table = param("table");
    if (!table.empty() && table != table_.spec().table) {
      replyError(request, http::status_codes::NotFound, "UNKNOWN_TABLE",
                 fmt::format("this replica serves table '{}', not '{}'", table_.spec().table, table));
      return;
    }
    if (path == "/insert") {
      if (method != http::methods::POST) return methodNotAllowed(request, "POST");
      return insert(request, param("format"), param("insert_deduplication_token"), param("insert_quorum"),
                    param("insert_quorum_timeout"));
    }
    if (path == "/drop_partition") {
      if (method != http::methods::POST) return methodNotAllowed(request, "POST");
      return dropPartition(request, param("partition"));
    }
    if (path == "/drop_replica") {
      if (method != http::methods::POST) return methodNotAllowed(request, "POST");
      return dropReplica(request, param("name"));
    }
    if (path == "/sync") {
      if (method != http::methods::POST) return methodNotAllowed(request, "POST");
      return sync(request, param("timeout_seconds"));
    }
    if (method != http::methods::GET) return methodNotAllowed(request, "GET");
    if (path == "/select") return select(request, param("format"), param("where"), param("partition"), param("limit"), false);
    if (path == "/count") return select(request, "", param("where"), param("partition"), "", true);
    if (path == "/parts") return parts(request);
    if (path == "/replica") return replica(request);
    if (path == kPartTransferPath) return sendPart(request, param("name"));
    if (path == "/healthz") return replyJson(request, http::status_codes::OK, {{"status", "ok"}});
    if (path == "/readyz") {
      const bool ready = !draining_ && table_.writable();
      return replyJson(request, ready ? http::status_codes::OK : http::status_codes::ServiceUnavailable,
                       {{"status", ready ? "ready" : "not ready"}});
    }
    replyError(request, http::status_codes::NotFound, "NOT_FOUND", fmt::format("no endpoint {}", path));
  }

  static void methodNotAllowed(const http::http_request& request, const std::string& allowed) {
    replyError(request, http::status_codes::MethodNotAllowed, "METHOD_NOT_ALLOWED",
               fmt::format("{} {} is not served; use {}", request.method(),
                           request.relative_uri().path(), allowed),
               json::object(), {{"Allow", allowed}});
  }

  void insert(const http::http_request& request, const std::string& format_name,
              const std::string& token, const std::string& quorum, const std::string& quorum_timeout) {
    auto format = parseRowFormat(format_name.empty() ? "JSONEachRow" : format_name);
    if (!format) return replyError(request, http::status_codes::BadRequest, "BAD_FORMAT", "format: " + format.error());
    InsertOptions options;
    options.deduplication_token = token;
    // The table's defaults (spec `inserts:`); a request's own insert_quorum, even 0, wins.
    options.quorum = table_.spec().insert_quorum;
    options.quorum_auto = table_.spec().insert_quorum_auto;
    options.quorum_timeout = table_.spec().insert_quorum_timeout;
    auto number = [](const std::string& text, uint64_t max) -> std::optional<uint64_t> {
      uint64_t value = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || value > max) return std::nullopt;
      return value;
    };
    if (quorum == "auto") {
      options.quorum_auto = true;
    } else if (!quorum.empty()) {
      options.quorum_auto = false;
      auto value = number(quorum, 1000);
      if (!value) {
        return replyError(request, http::status_codes::BadRequest, "BAD_QUORUM",
                          fmt::format("insert_quorum '{}': expected a number of replicas (0 or 1: no quorum) or 'auto' (a majority)", quorum));
      }
      options.quorum = *value;
    }
    if (!quorum_timeout.empty()) {
      auto value = number(quorum_timeout, 86'400'000);
      if (!value) {
        return replyError(request, http::status_codes::BadRequest, "BAD_QUORUM_TIMEOUT",
                          fmt::format("insert_quorum_timeout '{}': expected milliseconds (at most a day)", quorum_timeout));
      }
      options.quorum_timeout = std::chrono::milliseconds(*value);
    }
    auto pending = table_.beginInsert(std::move(options));
    // Large bodies are parsed on every core (a body under a segment stays in this thread).
    ParallelRowParser parser(table_.spec().schema, *format,
                             std::max(1u, std::thread::hardware_concurrency()));
    std::string add_error;
    auto sink = [&](Block&& block) {
      if (!add_error.empty()) return;
      if (auto added = pending->add(std::move(block)); !added) add_error = added.error();
    };
    // The body streams in; nothing is committed before all of it parsed.
    auto body = request.body().streambuf();
    std::string chunk(kBodyChunk, '\0');
    for (;;) {
      const std::size_t n = body.getn(reinterpret_cast<uint8_t*>(chunk.data()), chunk.size()).get();
      if (n == 0) break;
      if (auto fed = parser.feed(std::string_view(chunk.data(), n), sink); !fed) {
        return badInput(request, fed.error());
      }
      if (!add_error.empty()) break;
    }
    if (auto finished = parser.finish(sink); !finished) return badInput(request, finished.error());
    if (!add_error.empty()) {
      return replyError(request, http::status_codes::InternalError, "INTERNAL", "staging the insert: " + add_error);
    }
    auto result = table_.commit(*pending);
    if (!result) {
      const InsertError& error = result.error();
      switch (error.kind) {
        case InsertError::Kind::kUnavailable:
          return replyError(request, http::status_codes::ServiceUnavailable, "UNAVAILABLE", error.message,
                            json::object(), {{"Retry-After", "1"}});
        case InsertError::Kind::kLogExhausted:
          return replyError(request, http::status_codes::ServiceUnavailable, "LOG_COUNTER_EXHAUSTED",
                            error.message, json::object(), {{"Retry-After", "60"}});
        case InsertError::Kind::kUnknownOutcome:
          return replyError(request, http::status_codes::InternalError, "UNKNOWN_STATUS_OF_INSERT",
                            error.message + "; retrying the same insert is safe");
        case InsertError::Kind::kTooFewReplicas:
          return replyError(request, http::status_codes::ServiceUnavailable, "TOO_FEW_LIVE_REPLICAS",
                            error.message, json::object(), {{"Retry-After", "5"}});
        case InsertError::Kind::kQuorumTimeout:
          return replyError(request, http::status_codes::InternalError, "QUORUM_TIMEOUT", error.message);
        case InsertError::Kind::kBadRequest:
          return replyError(request, http::status_codes::BadRequest, "BAD_REQUEST", error.message);
        case InsertError::Kind::kNotFound:
          return replyError(request, http::status_codes::NotFound, "NOT_FOUND", error.message);
        case InsertError::Kind::kInternal:
          return replyError(request, http::status_codes::InternalError, "INTERNAL", error.message);
      }
    }
    replyJson(request, http::status_codes::OK,
              {{"rows", result->rows},
               {"blocks", result->blocks},
               {"deduplicated_blocks", result->deduplicated_blocks},
               {"parts", result->parts}});
  }

  static void badInput(const http::http_request& request, const ParseError& error) {
    json extra = {{"row", error.row}};
    if (!error.column.empty()) extra["column"] = error.column;
    replyError(request, http::status_codes::BadRequest, "BAD_INPUT", error.toString() + "; nothing was inserted", extra);
  }

  void select(const http::http_request& request, const std::string& format_name, const std::string& where,
              const std::string& partition, const std::string& limit_text, bool count_only) {
    auto format = parseRowFormat(format_name.empty() ? "JSONEachRow" : format_name);
    if (!format) return replyError(request, http::status_codes::BadRequest, "BAD_FORMAT", "format: " + format.error());
    auto filter = RowFilter::parse(where, table_.spec().schema);
    if (!filter) return replyError(request, http::status_codes::BadRequest, "BAD_WHERE", filter.error());
    std::size_t limit = SIZE_MAX;
    if (!limit_text.empty()) {
      auto [ptr, ec] = std::from_chars(limit_text.data(), limit_text.data() + limit_text.size(), limit);
      if (ec != std::errc() || ptr != limit_text.data() + limit_text.size()) {
        return replyError(request, http::status_codes::BadRequest, "BAD_LIMIT",
                          fmt::format("limit: '{}' is not a whole number", limit_text));
      }
    }
    std::string out;
    std::size_t rows = 0;
    for (const auto& part : table_.activeParts()) {
      if (rows >= limit) break;
      if (!partition.empty() && part->name.partition_id != partition) continue;
      if (count_only && filter->empty()) {
        rows += part->rows;
        continue;
      }
      auto block = readPart(part->dir, table_.spec().schema);
      if (!block) return replyError(request, http::status_codes::InternalError, "BROKEN_PART", block.error());
      auto matching = filter->matchingRows(*block);
      if (matching.size() > limit - rows) matching.resize(limit - rows);
      rows += matching.size();
      if (!count_only) writeRows(block->select(matching), *format, out);
    }
    if (count_only) return replyJson(request, http::status_codes::OK, {{"rows", rows}});
    http::http_response response(http::status_codes::OK);
    setBody(response, out, contentType(*format));
    send(request, response);
  }

  void parts(const http::http_request& request) {
    json list = json::array();
    for (const auto& part : table_.activeParts()) {
      list.push_back({{"name", part->name.format()},
                      {"partition", part->name.partition_id},
                      {"min_block", part->name.min_block},
                      {"max_block", part->name.max_block},
                      {"level", part->name.level},
                      {"rows", part->rows},
                      {"bytes", part->bytes},
                      {"checksum", part->checksums.total.hex()}});
    }
    replyJson(request, http::status_codes::OK, list);
  }

  // GET /replication/part?name=: the part's files in the transfer format (docs/formats.md), for
  // another replica's fetchPart. This worker reads the files and feeds the response's buffer; the
  // part is held (its directory stays) until the last byte is in the buffer.
  void sendPart(const http::http_request& request, const std::string& name) {
    const std::string& secret = table_.spec().interserver_secret;
    if (secret.empty()) {
      return replyError(request, http::status_codes::Unauthorized, "UNAUTHORIZED",
                        "this replica has no interserver secret (spec replication.secretFile), "
                        "so it serves no parts");
    }
    std::string presented;
    if (!request.headers().match(std::string(kInterserverSecretHeader), presented)) {
      return replyError(request, http::status_codes::Unauthorized, "UNAUTHORIZED",
                        fmt::format("the {} header is missing", kInterserverSecretHeader));
    }
    if (!interserverSecretMatches(secret, presented)) {
      return replyError(request, http::status_codes::Unauthorized, "UNAUTHORIZED",
                        fmt::format("wrong {}", kInterserverSecretHeader));
    }
    auto part_name = PartName::parse(name);
    if (!part_name || part_name->format() != name) {
      return replyError(request, http::status_codes::BadRequest, "BAD_PART_NAME",
                        part_name ? fmt::format("'{}' is not a part name as written (that would "
                                                "be '{}')", name, part_name->format())
                                  : part_name.error());
    }
    DataPartPtr part;
    for (auto& active : table_.activeParts()) {
      if (active->name == *part_name) part = std::move(active);
    }
    if (!part) {
      return replyError(request, http::status_codes::NotFound, "NOT_FOUND",
                        fmt::format("part {} is not active on replica {}", name,
                                    table_.spec().replica));
    }
    auto reader = PartTransferReader::open(part->dir, part->checksums);
    if (!reader) {
      return replyError(request, http::status_codes::InternalError, "BROKEN_PART", reader.error());
    }

    auto progress = std::make_shared<PartTransferProgress>();
    concurrency::streams::streambuf<uint8_t> buffer(std::make_shared<CountedPartBuffer>(progress));
    http::http_response response(http::status_codes::OK);
    response.set_body(concurrency::streams::istream(buffer), reader->contentLength(),
                      "application/octet-stream");
    request.reply(response).then([progress](pplx::task<void> sent) {
      try {
        sent.get();
      } catch (...) {  // the peer went away: the worker stops feeding
      }
      progress->finished();
    });
    // A failure here closes the buffer early: the body ends short of its Content-Length, which
    // the fetching replica reports as a failed transfer and retries elsewhere.
    std::vector<uint8_t> chunk(kBodyChunk);
    uint64_t put = 0;
    for (;;) {
      auto n = reader->read(chunk.data(), chunk.size());
      if (!n) {
        spdlog::error("sending part {}: {}", name, n.error());
        break;
      }
      if (*n == 0) break;
      if (!progress->waitForRoom(put, kMaxUnsentPartBytes - *n, kPartTransferStall)) break;
      buffer.putn_nocopy(chunk.data(), *n).wait();
      put += *n;
    }
    buffer.close(std::ios_base::out).wait();
  }

  // DROP PARTITION, replicated; answers once this replica has executed it.
  void dropPartition(const http::http_request& request, const std::string& partition) {
    if (partition.empty()) {
      return replyError(request, http::status_codes::BadRequest, "BAD_PARTITION", "partition: required");
    }
    auto dropped = table_.dropPartition(partition);
    if (!dropped) {
      const InsertError& error = dropped.error();
      if (error.kind == InsertError::Kind::kBadRequest) {
        return replyError(request, http::status_codes::BadRequest, "BAD_PARTITION", error.message);
      }
      return replyError(request, http::status_codes::ServiceUnavailable, "UNAVAILABLE", error.message,
                        json::object(), {{"Retry-After", "1"}});
    }
    const bool here = table_.syncQueue(std::chrono::seconds(30));
    replyJson(request, http::status_codes::OK, {{"dropped_range", *dropped}, {"executed_here", here}});
  }

  // SYSTEM DROP REPLICA: removes a stopped replica's nodes from ZooKeeper.
  void dropReplica(const http::http_request& request, const std::string& name) {
    if (name.empty() || name.find('/') != std::string::npos) {
      return replyError(request, http::status_codes::BadRequest, "BAD_REPLICA",
                        name.empty() ? "name: required" : fmt::format("name '{}': not a replica name", name));
    }
    auto dropped = table_.dropReplica(name);
    if (!dropped) {
      const InsertError& error = dropped.error();
      if (error.kind == InsertError::Kind::kBadRequest) {
        return replyError(request, http::status_codes::Conflict, "REPLICA_NOT_REMOVABLE", error.message);
      }
      if (error.kind == InsertError::Kind::kNotFound) {
        return replyError(request, http::status_codes::NotFound, "UNKNOWN_REPLICA", error.message);
      }
      return replyError(request, http::status_codes::ServiceUnavailable, "UNAVAILABLE", error.message,
                        json::object(), {{"Retry-After", "1"}});
    }
    replyJson(request, http::status_codes::OK, {{"removed_replica", name}});
  }

  // Waits until this replica has executed every log entry that existed when asked.
  void sync(const http::http_request& request, const std::string& timeout_text) {
    int64_t seconds = 60;
    if (!timeout_text.empty()) {
      auto [end, ec] = std::from_chars(timeout_text.data(), timeout_text.data() + timeout_text.size(), seconds);
      if (ec != std::errc() || end != timeout_text.data() + timeout_text.size() || seconds < 0 || seconds > 3600) {
        replyError(request, http::status_codes::BadRequest, "BAD_TIMEOUT",
                   fmt::format("timeout_seconds '{}': expected a whole number from 0 to 3600", timeout_text));
        return;
      }
    }
    if (!table_.syncQueue(std::chrono::seconds(seconds))) {
      replyError(request, http::status_codes::GatewayTimeout, "SYNC_TIMEOUT",
                 fmt::format("the replication queue did not drain within {} s (see GET /replica)", seconds));
      return;
    }
    replyJson(request, http::status_codes::OK, {{"status", "synced"}});
  }

  void replica(const http::http_request& request) {
    ReplicaState state = table_.state();
    json body = {{"table", state.table},
                 {"replica", state.replica},
                 {"generation", state.generation},
                 {"readonly", state.readonly},
                 {"active_parts", state.active_parts},
                 {"rows", state.rows},
                 {"broken_parts", state.broken_parts},
                 {"unexpected_parts", state.unexpected_parts},
                 {"lost_parts", state.lost_parts},
                 {"uncertain_parts", state.uncertain_parts},
                 {"lost", state.lost},
                 {"postponed", state.postponed}};
    // Like ClickHouse's system.replication_queue.
    json queue = json::array();
    const auto now = std::chrono::steady_clock::now();
    auto ago = [&](std::chrono::steady_clock::time_point t) -> json {
      if (t == std::chrono::steady_clock::time_point{}) return nullptr;
      return std::chrono::duration<double>(now - t).count();
    };
    for (std::size_t i = 0; i < state.queue.size(); ++i) {
      const QueueEntry& e = state.queue[i];
      json entry = {{"position", i},
                    {"node_name", e.node_name},
                    {"type", e.entry.type == LogEntry::Type::kGetPart      ? "GET_PART"
                             : e.entry.type == LogEntry::Type::kMergeParts ? "MERGE_PARTS"
                             : e.entry.type == LogEntry::Type::kDropRange  ? "DROP_RANGE"
                                                                           : "ATTACH_PART"},
                    {"new_part_name", e.entry.new_part_name},
                    {"source_replica", e.entry.source_replica},
                    {"parts_to_merge", e.entry.source_parts},
                    {"create_time", e.entry.create_time},
                    {"is_currently_executing", e.currently_executing},
                    {"num_tries", e.num_tries},
                    {"last_exception", e.last_exception},
                    {"last_attempt_seconds_ago", ago(e.last_attempt_time)},
                    {"num_postponed", e.num_postponed},
                    {"postpone_reason", e.postpone_reason
                                            ? json(std::string(postponeReasonName(*e.postpone_reason)))
                                            : json(nullptr)},
                    {"postpone_message", e.postpone_message},
                    {"last_postpone_seconds_ago", ago(e.last_postpone_time)}};
      queue.push_back(std::move(entry));
    }
    body["queue"] = std::move(queue);
    if (state.log) {
      body["log_max_index"] = state.log->maxIndex();
      body["log_counter"] = state.log->counter();
      body["log_creates_left"] = state.log->createsLeft();
      body["log_headroom_ratio"] = state.log->headroomRatio();
      body["log_exhausted"] = state.log->exhausted();
    }
    replyJson(request, http::status_codes::OK, body);
  }

  TableReplica& table_;
  http::experimental::listener::http_listener listener_;
  std::atomic<bool> draining_{false};
  WorkerPool workers_;
};

ReplicaHttpServer::ReplicaHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ReplicaHttpServer::~ReplicaHttpServer() {
  if (impl_) impl_->drain(std::chrono::milliseconds(0), {});
}

std::expected<std::unique_ptr<ReplicaHttpServer>, std::string> ReplicaHttpServer::start(
    TableReplica& table, const std::string& listen_address, uint16_t port, std::size_t workers) {
  auto impl = std::make_unique<Impl>(table, fmt::format("http://{}:{}", listen_address, port), workers);
  if (auto opened = impl->open(); !opened) return std::unexpected(opened.error());
  return std::unique_ptr<ReplicaHttpServer>(new ReplicaHttpServer(std::move(impl)));
}

void ReplicaHttpServer::drain(std::chrono::milliseconds grace, const std::function<void()>& while_serving_parts) {
  impl_->drain(grace, while_serving_parts);
}

}  // namespace rtable::core
