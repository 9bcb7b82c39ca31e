#include "rtable/operator/testing/fake_event_recorder.h"

#include <fmt/format.h>

namespace rtable::op::testing {

std::string RecordedEvent::toString() const {
  return fmt::format("{} {} {}/{}: {}", eventTypeName(type), reason, object.ns, object.name,
                     message);
}

void FakeEventRecorder::record(const ObjectReference& object, EventType type,
                               std::string_view reason, std::string_view message) {
  std::lock_guard lock(mu_);
  events_.push_back({object, type, std::string(reason), std::string(message)});
}

std::vector<RecordedEvent> FakeEventRecorder::events() const {
  std::lock_guard lock(mu_);
  return events_;
}

std::vector<RecordedEvent> FakeEventRecorder::withReason(std::string_view reason) const {
  std::lock_guard lock(mu_);
  std::vector<RecordedEvent> out;
  for (const auto& e : events_) {
    if (e.reason == reason) out.push_back(e);
  }
  return out;
}

void FakeEventRecorder::clear() {
  std::lock_guard lock(mu_);
  events_.clear();
}

}  // namespace rtable::op::testing
