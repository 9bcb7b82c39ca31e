#include "rtable/operator/watch_stream.h"

#include <fmt/format.h>

namespace rtable::op {

std::string_view watchEventTypeName(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
    case WatchEventType::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

std::string WatchEvent::resourceVersion() const {
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return {};
  auto rv = metadata->find("resourceVersion");
  return rv != metadata->end() && rv->is_string() ? rv->get<std::string>() : std::string();
}

KubeResult<WatchEvent> parseWatchEvent(std::string_view line) {
  nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  auto excerpt = [&] {
    return std::string(line.substr(0, std::min<std::size_t>(line.size(), 200)));
  };
  if (!parsed.is_object()) {
    return std::unexpected(KubeError::decode(fmt::format("watch line is not JSON: {}", excerpt())));
  }
  auto type = parsed.find("type");
  auto object = parsed.find("object");
  if (type == parsed.end() || !type->is_string() || object == parsed.end() ||
      !object->is_object()) {
    return std::unexpected(
        KubeError::decode(fmt::format("watch line is not a watch event: {}", excerpt())));
  }
  WatchEvent event;
  const std::string& name = type->get_ref<const std::string&>();
  if (name == "ADDED") {
    event.type = WatchEventType::kAdded;
  } else if (name == "MODIFIED") {
    event.type = WatchEventType::kModified;
  } else if (name == "DELETED") {
    event.type = WatchEventType::kDeleted;
  } else if (name == "BOOKMARK") {
    event.type = WatchEventType::kBookmark;
  } else if (name == "ERROR") {
    event.type = WatchEventType::kError;
  } else {
    return std::unexpected(KubeError::decode(fmt::format("unknown watch event type '{}'", name)));
  }
  event.object = std::move(*object);
  if (event.type == WatchEventType::kError) event.error = kubeErrorFromStatus(event.object);
  return event;
}

bool LineSplitter::feed(std::string_view chunk, const LineHandler& on_line) {
  if (failed_) return false;
  while (!chunk.empty()) {
    const std::size_t newline = chunk.find('\n');
    if (newline == std::string_view::npos) {
      if (partial_.size() + chunk.size() > max_line_) {
        failed_ = true;
        partial_.clear();
        return false;
      }
      partial_.append(chunk);
      return true;
    }
    if (partial_.size() + newline > max_line_) {
      failed_ = true;
      partial_.clear();
      return false;
    }
    if (partial_.empty()) {
      // The common case: a whole line inside one chunk, no copy.
      emit(chunk.substr(0, newline), on_line);
    } else {
      partial_.append(chunk.substr(0, newline));
      std::string line = std::move(partial_);
      partial_.clear();
      emit(line, on_line);
    }
    chunk.remove_prefix(newline + 1);
  }
  return true;
}

void LineSplitter::finish(const LineHandler& on_line) {
  if (failed_ || partial_.empty()) return;
  std::string line = std::move(partial_);
  partial_.clear();
  emit(line, on_line);
}

void LineSplitter::emit(std::string_view line, const LineHandler& on_line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) return;
  on_line(line);
}

}  // namespace rtable::op
