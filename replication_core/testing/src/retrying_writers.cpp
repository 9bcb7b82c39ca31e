#include "rtable/replication_core/testing/retrying_writers.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "rtable/common/testing/http_client.h"

namespace rtable::core::testing {

RetryingWriters::RetryingWriters(RetryingWritersOptions options)
    : options_(std::move(options)), next_id_(options_.first_id) {}

RetryingWriters::~RetryingWriters() {
  stop();
}

void RetryingWriters::start() {
  for (int w = 0; w < options_.writers; ++w) threads_.emplace_back([this, w] { write(w); });
}

bool RetryingWriters::stop(std::chrono::milliseconds timeout) {
  if (threads_.empty()) return !given_up_;
  stop_deadline_ = std::chrono::steady_clock::now() + timeout;
  stopping_ = true;
  for (auto& thread : threads_) thread.join();
  threads_.clear();
  return !given_up_;
}

void RetryingWriters::write(int writer) {
  const std::size_t block =
      std::max<std::size_t>(1, options_.block_sizes[writer % options_.block_sizes.size()]);
  std::size_t next_replica = static_cast<std::size_t>(writer);
  while (!stopping_) {
    const uint64_t first = next_id_.fetch_add(block);
    std::string body;
    for (uint64_t id = first; id < first + block; ++id) body += options_.row(id);
    const std::string token = fmt::format("w{}-b{}", writer, first);
    if (!insertUntilAcknowledged(next_replica, token, body)) return;
    std::size_t acknowledged_blocks;
    {
      std::lock_guard lock(mu_);
      for (uint64_t id = first; id < first + block; ++id) acknowledged_.insert(id);
      acknowledged_blocks = ++acknowledged_blocks_;
    }
    if (options_.resend_every > 0 && acknowledged_blocks % options_.resend_every == 0) {
      auto rows = insertUntilAcknowledged(next_replica, token, body);
      if (!rows) return;
      ++resent_;
      if (*rows > 0) ++resent_and_added_;
    }
    std::this_thread::sleep_for(options_.pause_between_blocks);
  }
}

std::optional<uint64_t> RetryingWriters::insertUntilAcknowledged(std::size_t& next_replica,
                                                                 const std::string& token,
                                                                 const std::string& body) {
  const std::string target =
      "/insert?format=JSONEachRow&insert_deduplication_token=" + token + options_.insert_settings;
  for (bool first_attempt = true;; first_attempt = false) {
    if (!first_attempt) {
      ++retries_;
      if (stopping_ && std::chrono::steady_clock::now() > stop_deadline_) {
        given_up_ = true;
        return std::nullopt;
      }
      std::this_thread::sleep_for(options_.retry_pause);
    }
    const ReplicaEndpoint& replica = options_.replicas[next_replica++ % options_.replicas.size()];
    auto answer = common::testing::httpRequest(replica.host, replica.port, "POST", target, body,
                                               options_.request_timeout, replica.headers);
    if (answer && answer->status == 200) {
      auto parsed = nlohmann::json::parse(answer->body, nullptr, /*allow_exceptions=*/false);
      return parsed.is_object() ? parsed.value("rows", uint64_t{0}) : uint64_t{0};
    }
    std::string code;
    if (!answer) {
      code = answer.error().find("timed out") != std::string::npos ? "timeout" : "connection";
    } else {
      auto parsed = nlohmann::json::parse(answer->body, nullptr, /*allow_exceptions=*/false);
      code = parsed.is_object() ? parsed.value("error", "") : "";
      if (code.empty()) code = fmt::format("HTTP {}", answer->status);
    }
    std::lock_guard lock(mu_);
    codes_.insert(code);
  }
}

std::size_t RetryingWriters::resent() const {
  return resent_;
}
std::size_t RetryingWriters::resentAndAdded() const {
  return resent_and_added_;
}

std::set<uint64_t> RetryingWriters::acknowledged() const {
  std::lock_guard lock(mu_);
  return acknowledged_;
}

std::size_t RetryingWriters::acknowledgedBlocks() const {
  std::lock_guard lock(mu_);
  return acknowledged_blocks_;
}

std::set<std::string> RetryingWriters::errorCodes() const {
  std::lock_guard lock(mu_);
  return codes_;
}

std::size_t RetryingWriters::retries() const {
  return retries_;
}

std::string idRow(uint64_t id) {
  return fmt::format(R"({{"id":{},"d":"2026-{:02d}-0{}","user":"u{}"}})", id, 10 + id % 3,
                     1 + id % 9, id % 7) +
         "\n";
}

std::multiset<uint64_t> firstColumnIds(std::string_view tsv) {
  std::multiset<uint64_t> ids;
  for (std::size_t start = 0; start < tsv.size();) {
    std::size_t end = tsv.find('\n', start);
    if (end == std::string_view::npos) end = tsv.size();
    const std::string_view line = tsv.substr(start, end - start);
    if (!line.empty()) ids.insert(std::stoull(std::string(line.substr(0, line.find('\t')))));
    start = end + 1;
  }
  return ids;
}

common::testing::TestStatus checkReplicaHolds(const ReplicaEndpoint& replica, int generation,
                                              const std::multiset<uint64_t>& expected) {
  using nlohmann::json;
  const std::string where = fmt::format("{}:{}", replica.host, replica.port);
  auto ask = [&](const std::string& method,
                 const std::string& target) -> std::expected<std::string, std::string> {
    // /sync waits up to its own 60 s for the queue: the request's timeout is longer.
    auto answer = common::testing::httpRequest(replica.host, replica.port, method, target, "",
                                               std::chrono::seconds(70), replica.headers);
    if (!answer) return std::unexpected(fmt::format("{} {}: {}", where, target, answer.error()));
    if (answer->status != 200) {
      return std::unexpected(
          fmt::format("{} {}: HTTP {} {}", where, target, answer->status, answer->body));
    }
    return answer->body;
  };
  auto synced = ask("POST", "/sync?timeout_seconds=60");
  if (!synced) return std::unexpected(synced.error());
  auto state = ask("GET", "/replica");
  if (!state) return std::unexpected(state.error());
  const json served = json::parse(*state, nullptr, /*allow_exceptions=*/false);
  if (!served.is_object() || served.value("generation", 0) != generation) {
    return std::unexpected(fmt::format("{} serves generation {}, not {}", where,
                                       served.is_object() ? served.value("generation", 0) : 0,
                                       generation));
  }
  auto counted = ask("GET", "/count");
  if (!counted) return std::unexpected(counted.error());
  const json count = json::parse(*counted, nullptr, /*allow_exceptions=*/false);
  if (!count.is_object() || count.value("rows", uint64_t{0}) != expected.size()) {
    return std::unexpected(
        fmt::format("{} counts {} rows, {} expected", where, *counted, expected.size()));
  }
  auto selected = ask("GET", "/select?format=TSV");
  if (!selected) return std::unexpected(selected.error());
  const std::multiset<uint64_t> ids = firstColumnIds(*selected);
  if (ids == expected) return {};
  std::size_t twice = 0, missing = 0, extra = 0;
  for (auto id = ids.begin(); id != ids.end(); id = ids.upper_bound(*id)) {
    if (ids.count(*id) > 1) ++twice;
    if (!expected.contains(*id)) ++extra;
  }
  for (uint64_t id : expected) missing += ids.contains(id) ? 0 : 1;
  return std::unexpected(fmt::format(
      "{} selects {} rows, {} expected: {} missing, {} not acknowledged, {} held more than once",
      where, ids.size(), expected.size(), missing, extra, twice));
}

}  // namespace rtable::core::testing
