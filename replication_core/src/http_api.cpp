#include "rtable/replication_core/http_api.h"

#include <cpprest/uri.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "posix_file.h"
#include "rtable/common/secret_file.h"
#include "rtable/replication_core/http_server.h"
#include "rtable/replication_core/part_exchange.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/row_filter.h"
#include "rtable/replication_core/row_format.h"
#include "rtable/replication_core/table_host.h"

namespace rtable::core {
namespace {

using nlohmann::json;

constexpr std::size_t kBodyChunk = 256 * 1024;

void replyJson(HttpExchange& request, int status, const json& body,
               const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  HttpHeaders all = headers;
  all.emplace_back("Content-Type", "application/json; charset=utf-8");
  request.respond(status, all,
                  body.dump() + "\n");  // false: the client went away, nothing to tell it
}

void replyError(HttpExchange& request, int status, const std::string& code,
                const std::string& message, json extra = json::object(),
                const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  extra["error"] = code;
  extra["message"] = message;
  replyJson(request, status, extra, headers);
}

std::string contentType(RowFormat format) {
  switch (format) {
    case RowFormat::kJSONEachRow:
      return "application/x-ndjson; charset=utf-8";
    case RowFormat::kTabSeparated:
      return "text/tab-separated-values; charset=utf-8";
    case RowFormat::kCSV:
      return "text/csv; charset=utf-8";
  }
  return "text/plain";
}

// A peer that takes nothing of a part for this long has stopped reading: the send gives up.
constexpr std::chrono::seconds kSocketTimeout{60};

}  // namespace

// What the API serves: one replica's generation(s) of its table.
struct ServedTables {
  const TableSpec& spec;
  // The generation that answers reads and takes inserts now.
  std::function<std::shared_ptr<TableReplica>()> serving;
  // An open generation (part transfers), or null.
  std::function<std::shared_ptr<TableReplica>(int64_t)> generation;
  // An insert's admission: the generation it goes to and a lease held while it runs, or why
  // inserts are paused (a table swap, TABLE_SWAP_IN_PROGRESS; a restore, TABLE_RESTORING).
  struct Admitted {
    std::shared_ptr<void> lease;
    std::shared_ptr<TableReplica> table;
  };
  struct Refused {
    std::string code;
    std::string message;
  };
  std::function<std::expected<Admitted, Refused>()> admit_insert;
  std::function<std::string()> swap_state;
};

class ReplicaHttpServer::Impl {
 public:
  Impl(ServedTables tables, std::size_t workers, std::size_t max_queued)
      : tables_(std::move(tables)),
        spec_(tables_.spec),
        workers_(std::max<std::size_t>(1, workers)),
        max_queued_(max_queued) {}

  std::expected<void, std::string> open(const std::string& address, uint16_t port) {
    HttpServerOptions options;
    options.socket_timeout = kSocketTimeout;
    if (!spec_.tls_dir.empty()) {
      auto tls = common::TlsContext::load(common::TlsContext::Side::kServer,
                                          common::TlsFiles::inDirectory(spec_.tls_dir));
      if (!tls) return std::unexpected("tls.dir: " + tls.error());
      options.tls = std::move(*tls);
    }
    auto started = HttpServer::start(
        address, port, [this](HttpExchange& exchange) { handle(exchange); }, options);
    if (!started) return std::unexpected(started.error());
    server_ = std::move(*started);
    return {};
  }

  void drain(std::chrono::milliseconds grace, const std::function<void()>& while_serving_parts) {
    draining_ = true;
    // Async inserts waiting for their flush are answered now, not at their busy timeout.
    if (auto serving = tables_.serving()) serving->flushAsyncInserts();
    waitIdle(grace);
    if (while_serving_parts) while_serving_parts();
    waitIdle(grace);
    if (server_) server_->stop();
  }

 private:
  // At most `workers_` requests run at once; the rest wait their turn, up to max_queued_.
  // Part transfers never wait: a quorum insert running here waits for other replicas to fetch.
  void handle(HttpExchange& request) {
    const bool part_transfer = request.request().path == kPartTransferPath;
    // Other replicas may still fetch this one's parts while it hands them off (drain).
    if (draining_ && !part_transfer) {
      return replyError(request, 503, "SHUTTING_DOWN",
                        "this replica is shutting down; retry on another replica", json::object(),
                        {{"Retry-After", "1"}});
    }
    Turn turn{*this, false};
    {
      std::unique_lock lock(mu_);
      if (in_flight_ >= workers_ + max_queued_) {
        lock.unlock();
        return replyError(request, 503, "OVERLOADED", "too many requests queued", json::object(),
                          {{"Retry-After", "1"}});
      }
      ++in_flight_;
      if (!part_transfer) {
        turn_.wait(lock, [this] { return running_ < workers_; });
        ++running_;
        turn.held = true;
      }
    }
    serve(request, turn);
    turn.release();
    {
      std::lock_guard lock(mu_);
      --in_flight_;
    }
    idle_.notify_all();
  }

  // A request's worker slot, given back early by an async insert that waits for its flush (the
  // slots are for work: 64 waiting clients must not keep the 65th from joining their batch).
  struct Turn {
    Impl& impl;
    bool held;
    void release() {
      if (!held) return;
      held = false;
      {
        std::lock_guard lock(impl.mu_);
        --impl.running_;
      }
      impl.turn_.notify_one();
    }
  };

  void waitIdle(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    idle_.wait_for(lock, timeout, [this] { return in_flight_ == 0; });
  }

  void serve(HttpExchange& request, Turn& turn) {
    try {
      route(request, turn);
    } catch (const std::exception& e) {
      replyError(request, 500, "INTERNAL", e.what());
    }
  }

  void route(HttpExchange& request, Turn& turn) {
    const std::string path = request.request().path;
    std::map<std::string, std::string> query;
    try {
      query = web::uri::split_query(web::uri::decode(request.request().query));
    } catch (const web::uri_exception& e) {
      return replyError(request, 400, "BAD_QUERY",
                        fmt::format("query string '{}': {}", request.request().query, e.what()));
    }
    const auto method = request.request().method;
    auto param = [&](const std::string& name) -> std::string {
      auto it = query.find(name);
      return it == query.end() ? std::string() : it->second;
    };
    const std::string table = param("table");
    if (!table.empty() && table != spec_.table) {
      replyError(request, 404, "UNKNOWN_TABLE",
                 fmt::format("this replica serves table '{}', not '{}'", spec_.table, table));
      return;
    }
    if (!authorized(request, path)) return;
    if (path == "/insert") {
      if (method != "POST") return methodNotAllowed(request, "POST");
      return insert(request, turn, param("format"), param("insert_deduplication_token"),
                    param("insert_quorum"), param("insert_quorum_timeout"), param("async_insert"),
                    param("wait_for_async_insert"));
    }
    if (path == "/drop_partition") {
      if (method != "POST") return methodNotAllowed(request, "POST");
      return dropPartition(request, param("partition"));
    }
    if (path == "/drop_replica") {
      if (method != "POST") return methodNotAllowed(request, "POST");
      return dropReplica(request, param("name"));
    }
    if (path == "/sync") {
      if (method != "POST") return methodNotAllowed(request, "POST");
      return sync(request, param("timeout_seconds"));
    }
    static const std::set<std::string> kReadPaths = {
        "/select",  "/count", "/parts", "/replica", std::string(kPartTransferPath),
        "/healthz", "/readyz"};
    // An unknown path is not found whatever the method (not "use GET").
    if (!kReadPaths.contains(path)) {
      return replyError(request, 404, "NOT_FOUND", fmt::format("no endpoint {}", path));
    }
    if (method != "GET") return methodNotAllowed(request, "GET");
    if (path == "/select")
      return select(request, param("format"), param("where"), param("partition"), param("limit"),
                    false);
    if (path == "/count") return select(request, "", param("where"), param("partition"), "", true);
    if (path == "/parts") return parts(request);
    if (path == "/replica") return replica(request);
    if (path == kPartTransferPath) return sendPart(request, param("name"), param("generation"));
    if (path == "/healthz") return replyJson(request, 200, {{"status", "ok"}});
    if (path == "/readyz") {
      const bool ready = !draining_ && tables_.serving()->writable();
      return replyJson(request, ready ? 200 : 503, {{"status", ready ? "ready" : "not ready"}});
    }
    replyError(request, 404, "NOT_FOUND", fmt::format("no endpoint {}", path));
  }

  // The replica API's bearer tokens (spec api.tokensFile): writes and admin calls need one, reads
  // when api.readsNeedToken; health, readiness and part transfers (their own interserver secret)
  // never. False when refused, with the answer sent: 401 and nothing done.
  bool authorized(HttpExchange& request, const std::string& path) const {
    if (spec_.api_tokens.empty()) return true;
    static const std::set<std::string> kWrites = {"/insert", "/drop_partition", "/drop_replica",
                                                  "/sync"};
    static const std::set<std::string> kReads = {"/select", "/count", "/parts", "/replica"};
    if (!kWrites.contains(path) && !(spec_.api_reads_need_token && kReads.contains(path)))
      return true;
    auto refuse = [&](const std::string& message) {
      replyError(request, 401, "UNAUTHORIZED", message, json::object(),
                 {{"WWW-Authenticate", "Bearer realm=\"rtable\""}});
      return false;
    };
    const auto header = request.request().header("authorization");
    constexpr std::string_view kBearer = "bearer ";
    if (!header || header->size() <= kBearer.size() ||
        !std::equal(kBearer.begin(), kBearer.end(), header->begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        })) {
      return refuse(
          fmt::format("{} needs a bearer token (Authorization: Bearer <token>; the "
                      "table's api.tokensFile); nothing was done",
                      path));
    }
    const std::string_view presented = std::string_view(*header).substr(kBearer.size());
    bool known = false;
    // Every token compared, in constant time each: the answer's timing says nothing of which.
    for (const auto& token : spec_.api_tokens) known |= common::secretsEqual(token, presented);
    if (!known) {
      return refuse(fmt::format(
          "the bearer token is not one of this table's (api.tokensFile); {} was not done", path));
    }
    return true;
  }

  static void methodNotAllowed(HttpExchange& request, const std::string& allowed) {
    replyError(request, 405, "METHOD_NOT_ALLOWED",
               fmt::format("{} {} is not served; use {}", request.request().method,
                           request.request().path, allowed),
               json::object(), {{"Allow", allowed}});
  }

  void insert(HttpExchange& request, Turn& turn, const std::string& format_name,
              const std::string& token, const std::string& quorum,
              const std::string& quorum_timeout, const std::string& async_text,
              const std::string& wait_text) {
    auto format = parseRowFormat(format_name.empty() ? "JSONEachRow" : format_name);
    if (!format) return replyError(request, 400, "BAD_FORMAT", "format: " + format.error());
    InsertOptions options;
    options.deduplication_token = token;
    // The table's defaults (spec `inserts:`); a request's own insert_quorum, even 0, wins.
    options.quorum = spec_.insert_quorum;
    options.quorum_auto = spec_.insert_quorum_auto;
    options.quorum_timeout = spec_.insert_quorum_timeout;
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
        return replyError(request, 400, "BAD_QUORUM",
                          fmt::format("insert_quorum '{}': expected a number of replicas (0 or 1: "
                                      "no quorum) or 'auto' (a majority)",
                                      quorum));
      }
      options.quorum = *value;
    }
    if (!quorum_timeout.empty()) {
      auto value = number(quorum_timeout, 86'400'000);
      if (!value) {
        return replyError(
            request, 400, "BAD_QUORUM_TIMEOUT",
            fmt::format("insert_quorum_timeout '{}': expected milliseconds (at most a day)",
                        quorum_timeout));
      }
      options.quorum_timeout = std::chrono::milliseconds(*value);
    }
    // ClickHouse's settings, 0 or 1; the table's defaults (spec inserts.async) otherwise.
    auto flag = [](const std::string& text, bool fallback) -> std::optional<bool> {
      if (text.empty()) return fallback;
      if (text == "1" || text == "true") return true;
      if (text == "0" || text == "false") return false;
      return std::nullopt;
    };
    const AsyncInsertSettings& async_settings = spec_.async_inserts;
    const auto async = flag(async_text, async_settings.enabled);
    if (!async) {
      return replyError(request, 400, "BAD_ASYNC_INSERT",
                        fmt::format("async_insert '{}': expected 0 or 1", async_text));
    }
    const auto wait = flag(wait_text, async_settings.wait);
    if (!wait) {
      return replyError(request, 400, "BAD_WAIT_FOR_ASYNC_INSERT",
                        fmt::format("wait_for_async_insert '{}': expected 0 or 1", wait_text));
    }
    auto admitted = tables_.admit_insert();
    if (!admitted) {
      return replyError(request, 503, admitted.error().code, admitted.error().message + "; retry",
                        json::object(), {{"Retry-After", "1"}});
    }
    TableReplica& table = *admitted->table;
    auto pending = table.beginInsert(std::move(options));
    // Large bodies are parsed on every core (a body under a segment stays in this thread). The
    // count is read once: each call reads /sys/devices/system/cpu/online (three system calls).
    static const unsigned kCores = std::max(1u, std::thread::hardware_concurrency());
    ParallelRowParser parser(spec_.schema, *format, kCores);
    std::string add_error;
    auto sink = [&](Block&& block) {
      if (!add_error.empty()) return;
      if (auto added = pending->add(std::move(block)); !added) add_error = added.error();
    };
    // The body streams in; nothing is committed before all of it parsed.
    std::string chunk(kBodyChunk, '\0');
    for (bool end = false; !end && add_error.empty();) {
      // Whole chunks: the parser splits what it is fed into segments for its threads.
      std::size_t filled = 0;
      while (filled < chunk.size()) {
        auto n = request.readBody(chunk.data() + filled, chunk.size() - filled);
        if (!n) return replyError(request, 400, "BAD_BODY", n.error() + "; nothing was inserted");
        if (*n == 0) {
          end = true;
          break;
        }
        filled += *n;
      }
      if (filled == 0) break;
      if (auto fed = parser.feed(std::string_view(chunk.data(), filled), sink); !fed) {
        return badInput(request, fed.error());
      }
    }
    if (auto finished = parser.finish(sink); !finished) return badInput(request, finished.error());
    if (!add_error.empty()) {
      if (isOutOfSpace(add_error)) {
        table.noteOutOfSpace(add_error);
        return replyError(request, 507, "INSUFFICIENT_STORAGE",
                          "staging the insert: " + add_error +
                              "; this replica's data volume is full, "
                              "nothing was committed",
                          json::object(), {{"Retry-After", "10"}});
      }
      return replyError(request, 500, "INTERNAL", "staging the insert: " + add_error);
    }
    // An async insert too big for one flush goes the synchronous way, as in ClickHouse.
    if (*async && pending->rows() > 0 &&
        pending->bufferedValueBytes() <= async_settings.max_data_size) {
      if (auto pieces = pending->takePieces()) {
        return asyncInsert(request, turn, table, std::move(*pieces), pending->options(),
                           std::move(admitted->lease), *wait);
      }
    }
    auto result = table.commit(*pending);
    if (!result) return insertFailed(request, result.error());
    replyJson(request, 200,
              {{"rows", result->rows},
               {"blocks", result->blocks},
               {"deduplicated_blocks", result->deduplicated_blocks},
               {"parts", result->parts}});
  }

  void asyncInsert(HttpExchange& request, Turn& turn, TableReplica& table,
                   std::vector<InsertPiece> pieces, const InsertOptions& options,
                   std::shared_ptr<void> lease, bool wait) {
    std::size_t rows = 0;
    for (const auto& piece : pieces) rows += piece.rows.rows();
    auto ticket = table.enqueueAsync(std::move(pieces), options, std::move(lease));
    if (!ticket) return insertFailed(request, ticket.error());
    if (!wait) {
      // Queued only: a crash or a failed commit before the flush loses these rows.
      return replyJson(request, 202, {{"status", "queued"}, {"rows", rows}});
    }
    turn.release();
    const AsyncInsertTicket::Outcome& outcome = (*ticket)->wait();
    if (!outcome.result) return insertFailed(request, outcome.result.error());
    const InsertResult& result = *outcome.result;
    replyJson(request, 200,
              {{"rows", result.rows},
               {"blocks", result.blocks},
               {"deduplicated_blocks", result.deduplicated_blocks},
               {"parts", result.parts},
               {"async_insert",
                {{"inserts_in_flush", outcome.inserts_in_flush},
                 {"flush_reason", flushReasonName(outcome.reason)}}}});
  }

  static void insertFailed(HttpExchange& request, const InsertError& error) {
    switch (error.kind) {
      case InsertError::Kind::kUnavailable:
        return replyError(request, 503, "UNAVAILABLE", error.message, json::object(),
                          {{"Retry-After", "1"}});
      case InsertError::Kind::kLogExhausted:
        return replyError(request, 503, "LOG_COUNTER_EXHAUSTED", error.message, json::object(),
                          {{"Retry-After", "60"}});
      case InsertError::Kind::kUnknownOutcome:
        return replyError(request, 500, "UNKNOWN_STATUS_OF_INSERT",
                          error.message + "; retrying the same insert is safe");
      case InsertError::Kind::kTooFewReplicas:
        return replyError(request, 503, "TOO_FEW_LIVE_REPLICAS", error.message, json::object(),
                          {{"Retry-After", "5"}});
      case InsertError::Kind::kQuorumTimeout:
        return replyError(request, 500, "QUORUM_TIMEOUT", error.message);
      case InsertError::Kind::kBadRequest:
        return replyError(request, 400, "BAD_REQUEST", error.message);
      case InsertError::Kind::kNotFound:
        return replyError(request, 404, "NOT_FOUND", error.message);
      case InsertError::Kind::kStorageFull:
        return replyError(request, 507, "INSUFFICIENT_STORAGE", error.message, json::object(),
                          {{"Retry-After", "10"}});
      case InsertError::Kind::kOverloaded:
        return replyError(request, 503, "OVERLOADED", error.message, json::object(),
                          {{"Retry-After", "1"}});
      case InsertError::Kind::kInternal:
        return replyError(request, 500, "INTERNAL", error.message);
    }
  }

  static void badInput(HttpExchange& request, const ParseError& error) {
    json extra = {{"row", error.row}};
    if (!error.column.empty()) extra["column"] = error.column;
    replyError(request, 400, "BAD_INPUT", error.toString() + "; nothing was inserted", extra);
  }

  void select(HttpExchange& request, const std::string& format_name, const std::string& where,
              const std::string& partition, const std::string& limit_text, bool count_only) {
    const std::shared_ptr<TableReplica> table = tables_.serving();
    auto format = parseRowFormat(format_name.empty() ? "JSONEachRow" : format_name);
    if (!format) return replyError(request, 400, "BAD_FORMAT", "format: " + format.error());
    auto filter = RowFilter::parse(where, spec_.schema);
    if (!filter) return replyError(request, 400, "BAD_WHERE", filter.error());
    std::size_t limit = SIZE_MAX;
    if (!limit_text.empty()) {
      auto [ptr, ec] =
          std::from_chars(limit_text.data(), limit_text.data() + limit_text.size(), limit);
      if (ec != std::errc() || ptr != limit_text.data() + limit_text.size()) {
        return replyError(request, 400, "BAD_LIMIT",
                          fmt::format("limit: '{}' is not a whole number", limit_text));
      }
    }
    std::string out;
    std::size_t rows = 0;
    for (const auto& part : table->activeParts()) {
      if (rows >= limit) break;
      if (!partition.empty() && part->name.partition_id != partition) continue;
      if (count_only && filter->empty()) {
        rows += part->rows;
        continue;
      }
      auto block = readDataPart(*part, spec_.schema);
      if (!block) return replyError(request, 500, "BROKEN_PART", block.error());
      auto matching = filter->matchingRows(*block);
      if (matching.size() > limit - rows) matching.resize(limit - rows);
      rows += matching.size();
      if (!count_only) writeRows(block->select(matching), *format, out);
    }
    if (count_only) return replyJson(request, 200, {{"rows", rows}});
    request.respond(200, {{"Content-Type", contentType(*format)}}, out);
  }

  void parts(HttpExchange& request) {
    const std::shared_ptr<TableReplica> table = tables_.serving();
    json list = json::array();
    for (const auto& part : table->activeParts()) {
      list.push_back({{"name", part->name.format()},
                      {"partition", part->name.partition_id},
                      {"min_block", part->name.min_block},
                      {"max_block", part->name.max_block},
                      {"level", part->name.level},
                      {"rows", part->rows},
                      {"bytes", part->bytes},
                      {"checksum", part->checksums.total.hex()},
                      // Held in memory and the part journal, not yet written out.
                      {"in_memory", part->image != nullptr}});
    }
    replyJson(request, 200, list);
  }

  // GET /replication/part?name=: the part's files in the transfer format (docs/formats.md), for
  // another replica's fetchPart. This worker reads the files and feeds the response's buffer; the
  // part is held (its directory stays) until the last byte is in the buffer.
  void sendPart(HttpExchange& request, const std::string& name,
                const std::string& generation_text) {
    const std::string& secret = spec_.interserver_secret;
    if (secret.empty()) {
      return replyError(request, 401, "UNAUTHORIZED",
                        "this replica has no interserver secret (spec replication.secretFile), "
                        "so it serves no parts");
    }
    if (auto proof = request.request().header(kFetchAuthHeader)) {
      // Checked against this replica's own address, not the Host header: a proof made for
      // another replica fails here.
      const std::string target = request.request().path + "?" + request.request().query;
      const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
      const std::string source = fmt::format("{}:{}", spec_.replica_host, server_->port());
      std::string refused = checkFetchAuth(secret, source, target, *proof, now);
      // During a rotation: a replica still signing with a secret this one keeps accepting.
      for (const auto& previous : spec_.interserver_previous_secrets) {
        if (refused.empty()) break;
        if (checkFetchAuth(previous, source, target, *proof, now).empty()) refused.clear();
      }
      if (!refused.empty()) return replyError(request, 401, "UNAUTHORIZED", refused);
    } else if (auto plain = request.request().header(kInterserverSecretHeader)) {
      // A replica not yet upgraded (rtable-core before 2026-12-07) sends the secret itself.
      const auto& previous = spec_.interserver_previous_secrets;
      if (!interserverSecretMatches(secret, *plain) &&
          std::none_of(previous.begin(), previous.end(), [&](const std::string& accepted) {
            return interserverSecretMatches(accepted, *plain);
          })) {
        return replyError(request, 401, "UNAUTHORIZED",
                          fmt::format("wrong {}", kInterserverSecretHeader));
      }
      static std::once_flag warned;
      std::call_once(warned, [] {
        spdlog::warn(
            "a replica fetched with the plain interserver secret: it runs an older "
            "rtable-core, which sends the secret itself; upgrade it");
      });
    } else {
      return replyError(request, 401, "UNAUTHORIZED",
                        fmt::format("the {} header is missing", kFetchAuthHeader));
    }
    auto part_name = PartName::parse(name);
    if (!part_name || part_name->format() != name) {
      return replyError(request, 400, "BAD_PART_NAME",
                        part_name ? fmt::format("'{}' is not a part name as written (that would "
                                                "be '{}')",
                                                name, part_name->format())
                                  : part_name.error());
    }
    std::shared_ptr<TableReplica> table = tables_.serving();
    if (!generation_text.empty()) {
      int64_t generation = 0;
      auto [end, ec] = std::from_chars(generation_text.data(),
                                       generation_text.data() + generation_text.size(), generation);
      if (ec != std::errc() || end != generation_text.data() + generation_text.size()) {
        return replyError(request, 400, "BAD_GENERATION",
                          fmt::format("generation '{}': not a number", generation_text));
      }
      table = tables_.generation(generation);
      if (!table) {
        return replyError(request, 404, "NOT_FOUND",
                          fmt::format("generation {} of the table is not open on replica {}",
                                      generation, spec_.replica));
      }
    }
    DataPartPtr part = table->activePart(*part_name);
    if (!part) {
      return replyError(request, 404, "NOT_FOUND",
                        fmt::format("part {} is not active on replica {}", name, spec_.replica));
    }
    auto reader = part->image ? PartTransferReader::open(part->image, part->checksums)
                              : PartTransferReader::open(part->dir, part->checksums);
    if (!reader) {
      return replyError(request, 500, "BROKEN_PART", reader.error());
    }

    if (!request.beginResponse(200, {{"Content-Type", "application/octet-stream"}},
                               reader->contentLength()))
      return;
    // A failure here ends the body short of its Content-Length (and the connection), which the
    // fetching replica reports as a failed transfer and retries elsewhere.
    std::vector<uint8_t> chunk(kBodyChunk);
    for (;;) {
      auto n = reader->read(chunk.data(), chunk.size());
      if (!n) {
        spdlog::error("sending part {}: {}", name, n.error());
        break;
      }
      if (*n == 0) break;
      // Blocks while the peer is slower than the disk; fails once it took nothing for
      // kSocketTimeout.
      if (!request.writeBody(reinterpret_cast<const char*>(chunk.data()), *n)) break;
    }
  }

  // DROP PARTITION, replicated; answers once this replica has executed it.
  void dropPartition(HttpExchange& request, const std::string& partition) {
    const std::shared_ptr<TableReplica> table = tables_.serving();
    if (partition.empty()) {
      return replyError(request, 400, "BAD_PARTITION", "partition: required");
    }
    auto dropped = table->dropPartition(partition);
    if (!dropped) {
      const InsertError& error = dropped.error();
      if (error.kind == InsertError::Kind::kBadRequest) {
        return replyError(request, 400, "BAD_PARTITION", error.message);
      }
      return replyError(request, 503, "UNAVAILABLE", error.message, json::object(),
                        {{"Retry-After", "1"}});
    }
    const bool here = table->syncQueue(std::chrono::seconds(30));
    replyJson(request, 200, {{"dropped_range", *dropped}, {"executed_here", here}});
  }

  // SYSTEM DROP REPLICA: removes a stopped replica's nodes from ZooKeeper.
  void dropReplica(HttpExchange& request, const std::string& name) {
    const std::shared_ptr<TableReplica> table = tables_.serving();
    if (name.empty() || name.find('/') != std::string::npos) {
      return replyError(
          request, 400, "BAD_REPLICA",
          name.empty() ? "name: required" : fmt::format("name '{}': not a replica name", name));
    }
    auto dropped = table->dropReplica(name);
    if (!dropped) {
      const InsertError& error = dropped.error();
      if (error.kind == InsertError::Kind::kBadRequest) {
        return replyError(request, 409, "REPLICA_NOT_REMOVABLE", error.message);
      }
      if (error.kind == InsertError::Kind::kNotFound) {
        return replyError(request, 404, "UNKNOWN_REPLICA", error.message);
      }
      return replyError(request, 503, "UNAVAILABLE", error.message, json::object(),
                        {{"Retry-After", "1"}});
    }
    replyJson(request, 200, {{"removed_replica", name}});
  }

  // Waits until this replica has executed every log entry that existed when asked.
  void sync(HttpExchange& request, const std::string& timeout_text) {
    const std::shared_ptr<TableReplica> table = tables_.serving();
    int64_t seconds = 60;
    if (!timeout_text.empty()) {
      auto [end, ec] =
          std::from_chars(timeout_text.data(), timeout_text.data() + timeout_text.size(), seconds);
      if (ec != std::errc() || end != timeout_text.data() + timeout_text.size() || seconds < 0 ||
          seconds > 3600) {
        replyError(request, 400, "BAD_TIMEOUT",
                   fmt::format("timeout_seconds '{}': expected a whole number from 0 to 3600",
                               timeout_text));
        return;
      }
    }
    if (!table->syncQueue(std::chrono::seconds(seconds))) {
      replyError(request, 504, "SYNC_TIMEOUT",
                 fmt::format("the replication queue did not drain within {} s (see GET /replica)",
                             seconds));
      return;
    }
    replyJson(request, 200, {{"status", "synced"}});
  }

  void replica(HttpExchange& request) {
    const std::shared_ptr<TableReplica> table = tables_.serving();
    ReplicaState state = table->state();
    json body = {{"table", state.table},
                 {"replica", state.replica},
                 {"generation", state.generation},
                 {"swap", tables_.swap_state()},
                 {"readonly", state.readonly},
                 {"active_parts", state.active_parts},
                 {"rows", state.rows},
                 {"broken_parts", state.broken_parts},
                 {"unexpected_parts", state.unexpected_parts},
                 {"lost_parts", state.lost_parts},
                 {"uncertain_parts", state.uncertain_parts},
                 {"lost", state.lost},
                 {"postponed", state.postponed},
                 {"executing", state.executing}};
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
                    {"type", std::string(logEntryTypeName(e.entry.type))},
                    {"new_part_name", e.entry.new_part_name},
                    {"source_replica", e.entry.source_replica},
                    {"parts_to_merge", e.entry.source_parts},
                    {"create_time", e.entry.create_time},
                    {"is_currently_executing", e.currently_executing},
                    {"num_tries", e.num_tries},
                    {"last_exception", e.last_exception},
                    {"last_attempt_seconds_ago", ago(e.last_attempt_time)},
                    {"num_postponed", e.num_postponed},
                    {"postpone_reason",
                     e.postpone_reason ? json(std::string(postponeReasonName(*e.postpone_reason)))
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
    replyJson(request, 200, body);
  }

  const ServedTables tables_;
  const TableSpec& spec_;
  const std::size_t workers_;
  const std::size_t max_queued_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<bool> draining_{false};
  std::mutex mu_;
  std::condition_variable turn_;
  std::condition_variable idle_;
  std::size_t in_flight_ = 0;  // in handle(), waiting or running
  std::size_t running_ = 0;    // past the turn, part transfers not counted
};

ReplicaHttpServer::ReplicaHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ReplicaHttpServer::~ReplicaHttpServer() {
  if (impl_) impl_->drain(std::chrono::milliseconds(0), {});
}

namespace {

std::expected<std::unique_ptr<ReplicaHttpServer::Impl>, std::string> openImpl(
    ServedTables tables, const std::string& listen_address, uint16_t port, std::size_t workers,
    std::size_t max_queued) {
  auto impl = std::make_unique<ReplicaHttpServer::Impl>(std::move(tables), workers, max_queued);
  if (auto opened = impl->open(listen_address, port); !opened)
    return std::unexpected(opened.error());
  return impl;
}

}  // namespace

std::expected<std::unique_ptr<ReplicaHttpServer>, std::string> ReplicaHttpServer::start(
    TableReplica& table, const std::string& listen_address, uint16_t port, std::size_t workers,
    std::size_t max_queued) {
  // Not owned: the caller keeps the replica alive longer than the server.
  std::shared_ptr<TableReplica> one(&table, [](TableReplica*) {});
  ServedTables tables{
      table.spec(), [one] { return one; },
      [one](int64_t generation) { return generation == one->paths().generation ? one : nullptr; },
      [one]() -> std::expected<ServedTables::Admitted, ServedTables::Refused> {
        return ServedTables::Admitted{nullptr, one};
      },
      [] { return std::string(); }};
  auto impl = openImpl(std::move(tables), listen_address, port, workers, max_queued);
  if (!impl) return std::unexpected(impl.error());
  return std::unique_ptr<ReplicaHttpServer>(new ReplicaHttpServer(std::move(*impl)));
}

std::expected<std::unique_ptr<ReplicaHttpServer>, std::string> ReplicaHttpServer::start(
    TableHost& host, const std::string& listen_address, uint16_t port, std::size_t workers,
    std::size_t max_queued) {
  ServedTables tables{
      host.spec(), [&host] { return host.serving(); },
      [&host](int64_t generation) { return host.generation(generation); },
      [&host]() -> std::expected<ServedTables::Admitted, ServedTables::Refused> {
        auto lease = host.admitInsert();
        if (!lease) {
          return std::unexpected(ServedTables::Refused{
              host.insertsRefused() ? "TABLE_RESTORING" : "TABLE_SWAP_IN_PROGRESS", lease.error()});
        }
        auto held = std::make_shared<TableHost::InsertLease>(std::move(*lease));
        return ServedTables::Admitted{held, held->shared()};
      },
      [&host] { return host.swapState(); }};
  auto impl = openImpl(std::move(tables), listen_address, port, workers, max_queued);
  if (!impl) return std::unexpected(impl.error());
  return std::unique_ptr<ReplicaHttpServer>(new ReplicaHttpServer(std::move(*impl)));
}

void ReplicaHttpServer::drain(std::chrono::milliseconds grace,
                              const std::function<void()>& while_serving_parts) {
  impl_->drain(grace, while_serving_parts);
}

}  // namespace rtable::core
