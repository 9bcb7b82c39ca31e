#include "rtable/operator/kube_error.h"

#include <fmt/format.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "string_field.h"

namespace rtable::op {
using detail::stringField;

namespace {

using nlohmann::json;

// An error body that is not a Status (a proxy's HTML page) is cut to keep messages readable.
constexpr std::size_t kMaxRawMessage = 512;

std::optional<std::chrono::seconds> parseSeconds(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return std::chrono::seconds(value);
}

// Fills reason, message, causes and retry-after from a metav1.Status.
void fillFromStatus(KubeError& error, const json& status) {
  error.reason = stringField(status, "reason");
  error.message = stringField(status, "message");
  auto details = status.find("details");
  if (details == status.end() || !details->is_object()) return;
  if (auto causes = details->find("causes"); causes != details->end() && causes->is_array()) {
    for (const auto& cause : *causes) {
      if (!cause.is_object()) continue;
      error.causes.push_back({stringField(cause, "reason"), stringField(cause, "message"),
                              stringField(cause, "field")});
    }
  }
  if (auto retry = details->find("retryAfterSeconds");
      retry != details->end() && retry->is_number_integer()) {
    error.retry_after = std::chrono::seconds(retry->get<int64_t>());
  }
}

bool isStatus(const json& body) {
  return body.is_object() && stringField(body, "kind") == "Status";
}

}  // namespace

std::string_view kubeErrorKindName(KubeErrorKind kind) {
  switch (kind) {
    case KubeErrorKind::kNotFound:
      return "NotFound";
    case KubeErrorKind::kAlreadyExists:
      return "AlreadyExists";
    case KubeErrorKind::kConflict:
      return "Conflict";
    case KubeErrorKind::kGone:
      return "Gone";
    case KubeErrorKind::kForbidden:
      return "Forbidden";
    case KubeErrorKind::kUnauthorized:
      return "Unauthorized";
    case KubeErrorKind::kInvalid:
      return "Invalid";
    case KubeErrorKind::kBadRequest:
      return "BadRequest";
    case KubeErrorKind::kTimeout:
      return "Timeout";
    case KubeErrorKind::kTooManyRequests:
      return "TooManyRequests";
    case KubeErrorKind::kServerError:
      return "ServerError";
    case KubeErrorKind::kConnection:
      return "Connection";
    case KubeErrorKind::kDecode:
      return "Decode";
  }
  return "Unknown";
}

std::string KubeError::toString() const {
  std::string out(kubeErrorKindName(kind));
  if (http_code != 0) out += fmt::format(" ({})", http_code);
  if (!reason.empty() && reason != kubeErrorKindName(kind)) out += fmt::format(" [{}]", reason);
  out += ": ";
  out += message;
  for (const auto& cause : causes) {
    out += fmt::format("; {}: {}", cause.field.empty() ? cause.reason : cause.field, cause.message);
  }
  if (retry_after) out += fmt::format(" (retry after {}s)", retry_after->count());
  return out;
}

bool KubeError::outcomeUnknown() const {
  switch (kind) {
    case KubeErrorKind::kConnection:
    case KubeErrorKind::kTimeout:
    case KubeErrorKind::kServerError:
    case KubeErrorKind::kDecode:
      return true;
    default:
      return false;
  }
}

KubeError KubeError::of(KubeErrorKind kind, std::string message) {
  KubeError error;
  error.kind = kind;
  error.message = std::move(message);
  return error;
}

KubeError KubeError::connection(std::string message) {
  return of(KubeErrorKind::kConnection, std::move(message));
}

KubeError KubeError::decode(std::string message) {
  return of(KubeErrorKind::kDecode, std::move(message));
}

KubeError KubeError::timeout(std::string message) {
  return of(KubeErrorKind::kTimeout, std::move(message));
}

KubeErrorKind kubeErrorKindFor(int http_code, std::string_view reason) {
  // Reasons first where they are more precise than the code (metav1.StatusReason).
  if (reason == "AlreadyExists") return KubeErrorKind::kAlreadyExists;
  if (reason == "Expired" || reason == "Gone") return KubeErrorKind::kGone;
  if (reason == "Timeout" || reason == "ServerTimeout") return KubeErrorKind::kTimeout;
  if (reason == "TooManyRequests") return KubeErrorKind::kTooManyRequests;
  switch (http_code) {
    case 400:
      return KubeErrorKind::kBadRequest;
    case 401:
      return KubeErrorKind::kUnauthorized;
    case 403:
      return KubeErrorKind::kForbidden;
    case 404:
      return KubeErrorKind::kNotFound;
    case 408:
      return KubeErrorKind::kTimeout;
    case 409:
      return KubeErrorKind::kConflict;
    case 410:
      return KubeErrorKind::kGone;
    case 422:
      return KubeErrorKind::kInvalid;
    case 429:
      return KubeErrorKind::kTooManyRequests;
    case 504:
      return KubeErrorKind::kTimeout;
    default:
      break;
  }
  if (reason == "NotFound") return KubeErrorKind::kNotFound;
  if (reason == "Conflict") return KubeErrorKind::kConflict;
  if (reason == "Invalid") return KubeErrorKind::kInvalid;
  if (reason == "Forbidden") return KubeErrorKind::kForbidden;
  if (reason == "Unauthorized") return KubeErrorKind::kUnauthorized;
  if (reason == "BadRequest") return KubeErrorKind::kBadRequest;
  if (http_code >= 400 && http_code < 500) return KubeErrorKind::kBadRequest;
  return KubeErrorKind::kServerError;
}

KubeError kubeErrorFromResponse(int http_code, std::string_view body,
                                std::string_view retry_after_header) {
  KubeError error;
  error.http_code = http_code;
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (isStatus(parsed)) {
    fillFromStatus(error, parsed);
  } else {
    std::string_view raw = body.substr(0, std::min(body.size(), kMaxRawMessage));
    error.message = raw.empty() ? fmt::format("HTTP {}", http_code) : std::string(raw);
  }
  if (!error.retry_after && !retry_after_header.empty()) {
    error.retry_after = parseSeconds(retry_after_header);
  }
  error.kind = kubeErrorKindFor(http_code, error.reason);
  return error;
}

KubeError kubeErrorFromStatus(const json& status) {
  KubeError error;
  if (!status.is_object()) {
    error.kind = KubeErrorKind::kDecode;
    error.message = "watch ERROR event without a Status object";
    return error;
  }
  if (auto code = status.find("code"); code != status.end() && code->is_number_integer()) {
    error.http_code = code->get<int>();
  }
  fillFromStatus(error, status);
  error.kind = kubeErrorKindFor(error.http_code, error.reason);
  return error;
}

}  // namespace rtable::op
