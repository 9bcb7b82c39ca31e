// KubeError: a failed Kubernetes API request, as a value.
//
// Sorted by meaning, like the apiserver's own StatusReason: NotFound, AlreadyExists, Conflict and
// Invalid are answers (never retried blindly); Connection, Timeout, TooManyRequests and ServerError
// leave the outcome of a write unknown. Gone means the resourceVersion (or continue token) is too
// old: re-list, never retry the same resourceVersion.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::op {

enum class KubeErrorKind {
  kNotFound,         // 404
  kAlreadyExists,    // 409, reason AlreadyExists
  kConflict,         // 409: stale resourceVersion, failed precondition
  kGone,             // 410 (reasons Gone, Expired): resourceVersion or continue token too old
  kForbidden,        // 403
  kUnauthorized,     // 401
  kInvalid,          // 422, with causes
  kBadRequest,       // 400 and every other 4xx without a kind of its own
  kTimeout,          // 504, 408, reason Timeout, or the client's own timeout
  kTooManyRequests,  // 429, with Retry-After
  kServerError,      // 5xx
  kConnection,       // no HTTP answer: refused, reset, TLS failure
  kDecode,           // an answer that is not what the protocol promises
};

std::string_view kubeErrorKindName(KubeErrorKind kind);

// One entry of a Status's details.causes (metav1.StatusCause).
struct StatusCause {
  std::string reason;  // e.g. "FieldValueRequired"
  std::string message;
  std::string field;  // e.g. "spec.replicas"

  friend bool operator==(const StatusCause&, const StatusCause&) = default;
};

struct KubeError {
  KubeErrorKind kind = KubeErrorKind::kServerError;
  int http_code = 0;   // 0 when there was no HTTP answer
  std::string reason;  // metav1.Status reason, e.g. "AlreadyExists", "Expired"
  std::string message;
  std::vector<StatusCause> causes;
  std::optional<std::chrono::seconds> retry_after;

  // e.g. "Conflict (409): Operation cannot be fulfilled on ..."; Invalid lists its causes.
  std::string toString() const;

  // True when a write may or may not have been applied (no decisive answer from the server).
  bool outcomeUnknown() const;

  // An error made by the client itself (no HTTP answer): http_code 0, no reason.
  static KubeError of(KubeErrorKind kind, std::string message);
  static KubeError connection(std::string message);
  static KubeError decode(std::string message);
  static KubeError timeout(std::string message);
};

template <class T>
using KubeResult = std::expected<T, KubeError>;
using KubeStatus = std::expected<void, KubeError>;

// The kind for an HTTP status code and a Status reason (the reason wins where it is more precise:
// 409 AlreadyExists vs Conflict, 500 Timeout).
KubeErrorKind kubeErrorKindFor(int http_code, std::string_view reason);

// An error answer: `body` is normally a metav1.Status; anything else becomes the message (cut to a
// readable length). `retry_after_header` is the Retry-After header's value, if any.
KubeError kubeErrorFromResponse(int http_code, std::string_view body,
                                std::string_view retry_after_header = {});

// A metav1.Status object, as in a watch ERROR event. Its `code` field gives the HTTP code.
KubeError kubeErrorFromStatus(const nlohmann::json& status);

}  // namespace rtable::op
