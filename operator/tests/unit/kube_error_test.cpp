#include "rtable/operator/kube_error.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rtable/operator/watch_stream.h"

namespace rtable::op {
namespace {

// Bodies as kube-apiserver 1.34 sends them.
TEST(KubeErrorTest, NotFound) {
  auto e = kubeErrorFromResponse(404, R"({"kind":"Status","apiVersion":"v1","metadata":{},
    "status":"Failure","message":"configmaps \"x\" not found","reason":"NotFound",
    "details":{"name":"x","kind":"configmaps"},"code":404})");
  EXPECT_EQ(e.kind, KubeErrorKind::kNotFound);
  EXPECT_EQ(e.http_code, 404);
  EXPECT_EQ(e.reason, "NotFound");
  EXPECT_EQ(e.message, "configmaps \"x\" not found");
  EXPECT_FALSE(e.outcomeUnknown());
}

TEST(KubeErrorTest, AlreadyExistsVersusConflict) {
  EXPECT_EQ(
      kubeErrorFromResponse(409, R"({"kind":"Status","reason":"AlreadyExists","code":409})").kind,
      KubeErrorKind::kAlreadyExists);
  EXPECT_EQ(kubeErrorFromResponse(409, R"({"kind":"Status","reason":"Conflict","code":409})").kind,
            KubeErrorKind::kConflict);
  EXPECT_EQ(kubeErrorFromResponse(409, "").kind, KubeErrorKind::kConflict);
}

TEST(KubeErrorTest, InvalidWithCauses) {
  auto e = kubeErrorFromResponse(422, R"({"kind":"Status","apiVersion":"v1","metadata":{},
    "status":"Failure","message":"ReplicatedTable.rtable.io \"t\" is invalid: spec.replicas: Invalid value: -1: must be >= 1",
    "reason":"Invalid","details":{"name":"t","group":"rtable.io","kind":"ReplicatedTable",
    "causes":[{"reason":"FieldValueInvalid","message":"Invalid value: -1: must be >= 1","field":"spec.replicas"},
              {"reason":"FieldValueRequired","message":"Required value","field":"spec.schema"}]},
    "code":422})");
  EXPECT_EQ(e.kind, KubeErrorKind::kInvalid);
  ASSERT_EQ(e.causes.size(), 2u);
  EXPECT_EQ(e.causes[0],
            (StatusCause{"FieldValueInvalid", "Invalid value: -1: must be >= 1", "spec.replicas"}));
  EXPECT_EQ(e.causes[1].field, "spec.schema");
  const std::string text = e.toString();
  EXPECT_NE(text.find("Invalid (422)"), std::string::npos) << text;
  EXPECT_NE(text.find("spec.schema: Required value"), std::string::npos) << text;
}

TEST(KubeErrorTest, GoneAndExpired) {
  EXPECT_EQ(kubeErrorFromResponse(410, R"({"kind":"Status","reason":"Expired","code":410})").kind,
            KubeErrorKind::kGone);
  EXPECT_EQ(kubeErrorFromResponse(410, "").kind, KubeErrorKind::kGone);
  // An expired continue token comes as 410 Expired.
  EXPECT_EQ(kubeErrorFromResponse(410, R"({"kind":"Status","reason":"Gone","code":410})").kind,
            KubeErrorKind::kGone);
}

TEST(KubeErrorTest, TimeoutsAndThrottling) {
  EXPECT_EQ(kubeErrorFromResponse(504, "").kind, KubeErrorKind::kTimeout);
  EXPECT_EQ(kubeErrorFromResponse(500, R"({"kind":"Status","reason":"Timeout","code":500})").kind,
            KubeErrorKind::kTimeout);
  auto e = kubeErrorFromResponse(429, R"({"kind":"Status","reason":"TooManyRequests",
    "message":"too many requests","details":{"retryAfterSeconds":3},"code":429})",
                                 "7");
  EXPECT_EQ(e.kind, KubeErrorKind::kTooManyRequests);
  EXPECT_EQ(e.retry_after, std::chrono::seconds(3));  // the Status wins over the header
  auto header_only = kubeErrorFromResponse(429, "Too many requests, please try again later.", "5");
  EXPECT_EQ(header_only.retry_after, std::chrono::seconds(5));
  EXPECT_EQ(header_only.message, "Too many requests, please try again later.");
  EXPECT_FALSE(kubeErrorFromResponse(429, "", "soon").retry_after);
}

TEST(KubeErrorTest, CodesWithoutStatus) {
  EXPECT_EQ(kubeErrorFromResponse(400, "bad").kind, KubeErrorKind::kBadRequest);
  EXPECT_EQ(kubeErrorFromResponse(401, "").kind, KubeErrorKind::kUnauthorized);
  EXPECT_EQ(kubeErrorFromResponse(403, "").kind, KubeErrorKind::kForbidden);
  EXPECT_EQ(kubeErrorFromResponse(405, "").kind, KubeErrorKind::kBadRequest);
  EXPECT_EQ(kubeErrorFromResponse(503, "").kind, KubeErrorKind::kServerError);
  EXPECT_TRUE(kubeErrorFromResponse(503, "").outcomeUnknown());
  EXPECT_EQ(kubeErrorFromResponse(502, "").message, "HTTP 502");
  // A long non-Status body is cut.
  EXPECT_LE(kubeErrorFromResponse(500, std::string(10000, 'x')).message.size(), 512u);
}

TEST(KubeErrorTest, ClientSideKinds) {
  EXPECT_TRUE(KubeError::connection("refused").outcomeUnknown());
  EXPECT_EQ(KubeError::timeout("t").kind, KubeErrorKind::kTimeout);
  EXPECT_EQ(KubeError::connection("refused").toString(), "Connection: refused");
}

TEST(KubeErrorTest, GoneInAWatchErrorEvent) {
  auto event = parseWatchEvent(
      R"({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)"
      R"json("message":"too old resource version: 5 (10)","reason":"Expired","code":410}})json");
  ASSERT_TRUE(event) << event.error().toString();
  EXPECT_EQ(event->type, WatchEventType::kError);
  EXPECT_EQ(event->error.kind, KubeErrorKind::kGone);
  EXPECT_EQ(event->error.http_code, 410);
  EXPECT_EQ(event->error.message, "too old resource version: 5 (10)");
}

}  // namespace
}  // namespace rtable::op
