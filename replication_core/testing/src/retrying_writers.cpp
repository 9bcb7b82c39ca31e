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
    {
      std::lock_guard lock(mu_);
      for (uint64_t id = first; id < first + block; ++id) acknowledged_.insert(id);
      ++acknowledged_blocks_;
    }
    std::this_thread::sleep_for(options_.pause_between_blocks);
  }
}

bool RetryingWriters::insertUntilAcknowledged(std::size_t& next_replica, const std::string& token,
                                              const std::string& body) {
  const std::string target = "/insert?format=JSONEachRow&insert_deduplication_token=" + token;
  for (bool first_attempt = true;; first_attempt = false) {
    if (!first_attempt) {
      ++retries_;
      if (stopping_ && std::chrono::steady_clock::now() > stop_deadline_) {
        given_up_ = true;
        return false;
      }
      std::this_thread::sleep_for(options_.retry_pause);
    }
    const ReplicaEndpoint& replica = options_.replicas[next_replica++ % options_.replicas.size()];
    auto answer = common::testing::httpRequest(replica.host, replica.port, "POST", target, body,
                                               options_.request_timeout);
    if (answer && answer->status == 200) return true;
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

}  // namespace rtable::core::testing
