// FakeEventRecorder: keeps what was recorded, for unit tests of reconcilers ("a scale-down records
// a ScaleDown event"). No correlation, no spam filter, nothing dropped: the KubeEventRecorder's
// own tests cover those.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/operator/event_recorder.h"

namespace rtable::op::testing {

struct RecordedEvent {
  ObjectReference object;
  EventType type = EventType::kNormal;
  std::string reason;
  std::string message;

  // "Normal Created ns/name: message", for readable test failures.
  std::string toString() const;
  friend bool operator==(const RecordedEvent&, const RecordedEvent&) = default;
};

class FakeEventRecorder final : public EventRecorder {
 public:
  void record(const ObjectReference& object, EventType type, std::string_view reason,
              std::string_view message) override;

  std::vector<RecordedEvent> events() const;
  // Events with this reason (all types).
  std::vector<RecordedEvent> withReason(std::string_view reason) const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::vector<RecordedEvent> events_;
};

}  // namespace rtable::op::testing
