// The wire format of a watch: a chunked HTTP body holding one JSON watch event per line
// (`{"type":"ADDED","object":{...}}`). The transport delivers arbitrary byte chunks; LineSplitter
// turns them back into lines and parseWatchEvent into events.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "rtable/operator/kube_error.h"

namespace rtable::op {

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };
std::string_view watchEventTypeName(WatchEventType type);

struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  // The object; for kBookmark only kind, apiVersion and metadata.resourceVersion; for kError the
  // metav1.Status.
  nlohmann::json object;
  KubeError error;  // kError only: the Status as an error (410 Expired: re-list)

  // metadata.resourceVersion of the object (what an informer records after each event).
  std::string resourceVersion() const;
};

// Parses one line of a watch stream. A line that is not a watch event is a kDecode error.
KubeResult<WatchEvent> parseWatchEvent(std::string_view line);

// Splits a byte stream into '\n'-terminated lines, whatever the chunk boundaries. A trailing
// '\r' is dropped and empty lines are skipped. Not thread-safe: one reader feeds it.
class LineSplitter {
 public:
  // A line longer than this is an error (a broken stream, not a big object: the apiserver's own
  // request limit is 3 MiB, objects in etcd 1.5 MiB).
  static constexpr std::size_t kDefaultMaxLine = 64u << 20;

  explicit LineSplitter(std::size_t max_line = kDefaultMaxLine) : max_line_(max_line) {}

  using LineHandler = std::function<void(std::string_view line)>;

  // Calls on_line for every line completed by this chunk. False once a line exceeded the limit
  // (the splitter then stays failed).
  bool feed(std::string_view chunk, const LineHandler& on_line);
  // At the end of the stream: the unterminated rest, if any, as a last line.
  void finish(const LineHandler& on_line);

  std::size_t pendingBytes() const { return partial_.size(); }
  bool failed() const { return failed_; }

 private:
  void emit(std::string_view line, const LineHandler& on_line);

  std::size_t max_line_;
  std::string partial_;
  bool failed_ = false;
};

}  // namespace rtable::op
