// rtable-operator's flags: controller-runtime's names and defaults, both value forms, Go
// durations, and errors that name the flag.
#include <gtest/gtest.h>

#include "rtable/operator/operator_main.h"

namespace rtable::op {
namespace {

using namespace std::chrono_literals;

TEST(OperatorFlagsTest, DefaultsAreControllerRuntimes) {
  auto flags = parseOperatorFlags({});
  ASSERT_TRUE(flags) << flags.error().toString();
  EXPECT_TRUE(flags->leader_elect);
  EXPECT_EQ(flags->leader_election_id, "rtable-operator-lock");
  EXPECT_EQ(flags->lease_duration, 15s);
  EXPECT_EQ(flags->renew_deadline, 10s);
  EXPECT_EQ(flags->retry_period, 2s);
  EXPECT_EQ(flags->health_probe_bind_address, ":8081");
  EXPECT_EQ(flags->metrics_bind_address, ":8080");
  EXPECT_EQ(flags->graceful_shutdown_timeout, 30s);
  EXPECT_EQ(flags->log_level, "info");
  EXPECT_TRUE(flags->kubeconfig.empty());
}

TEST(OperatorFlagsTest, BothValueFormsAndBareBooleans) {
  auto flags = parseOperatorFlags(
      {"--kubeconfig", "/tmp/kc", "--leader-elect=false", "--leader-election-namespace=ops",
       "-leader-election-id=x", "--leader-election-lease-duration=4s",
       "--leader-election-renew-deadline", "3s", "--leader-election-retry-period=1s",
       "--health-probe-bind-address=127.0.0.1:0", "--metrics-bind-address", ":0",
       "--log-level=debug"});
  ASSERT_TRUE(flags) << flags.error().toString();
  EXPECT_EQ(flags->kubeconfig, "/tmp/kc");
  EXPECT_FALSE(flags->leader_elect);
  EXPECT_EQ(flags->leader_election_namespace, "ops");
  EXPECT_EQ(flags->leader_election_id, "x");
  EXPECT_EQ(flags->lease_duration, 4s);
  EXPECT_EQ(flags->renew_deadline, 3s);
  EXPECT_EQ(flags->retry_period, 1s);
  EXPECT_EQ(flags->health_probe_bind_address, "127.0.0.1:0");
  EXPECT_EQ(flags->metrics_bind_address, ":0");
  EXPECT_EQ(flags->log_level, "debug");
  EXPECT_TRUE(parseOperatorFlags({"--leader-elect=false", "--leader-elect"})->leader_elect);
  EXPECT_TRUE(parseOperatorFlags({"--help"})->help);
  EXPECT_TRUE(parseOperatorFlags({"--version"})->version);
  EXPECT_FALSE(parseOperatorFlags({"--help"})->version);
}

TEST(OperatorFlagsTest, ErrorsNameTheFlag) {
  auto expectError = [](std::vector<std::string> args, const std::string& flag) {
    auto flags = parseOperatorFlags(args);
    ASSERT_FALSE(flags) << "accepted: " << ::testing::PrintToString(args);
    EXPECT_EQ(flags.error().flag, flag) << flags.error().toString();
    EXPECT_TRUE(flags.error().toString().starts_with(flag)) << flags.error().toString();
  };
  expectError({"--no-such-flag=1"}, "--no-such-flag");
  expectError({"stray"}, "stray");
  expectError({"--leader-elect=maybe"}, "--leader-elect");
  expectError({"--leader-election-lease-duration=soon"}, "--leader-election-lease-duration");
  expectError({"--kubeconfig"}, "--kubeconfig");
  expectError({"--metrics-bind-address=8080"}, "--metrics-bind-address");
  expectError({"--health-probe-bind-address=host:x"}, "--health-probe-bind-address");
  expectError({"--log-level=loud"}, "--log-level");
  expectError({"--leader-election-renew-deadline=20s"}, "--leader-election-renew-deadline");
  expectError({"--leader-election-retry-period=10s"}, "--leader-election-retry-period");
  expectError({"--leader-election-lease-duration=500ms", "--leader-election-renew-deadline=400ms",
               "--leader-election-retry-period=100ms"},
              "--leader-election-lease-duration");
}

TEST(OperatorFlagsTest, GoDurations) {
  EXPECT_EQ(*parseGoDuration("15s"), 15s);
  EXPECT_EQ(*parseGoDuration("500ms"), 500ms);
  EXPECT_EQ(*parseGoDuration("1m30s"), 90s);
  EXPECT_EQ(*parseGoDuration("2h"), 2h);
  EXPECT_EQ(*parseGoDuration("1.5s"), 1500ms);
  EXPECT_EQ(*parseGoDuration("0"), 0s);
  EXPECT_FALSE(parseGoDuration(""));
  EXPECT_FALSE(parseGoDuration("15"));
  EXPECT_FALSE(parseGoDuration("s"));
  EXPECT_FALSE(parseGoDuration("-1s"));
  EXPECT_FALSE(parseGoDuration("1d"));
}

TEST(OperatorFlagsTest, UsageListsEveryFlag) {
  const std::string usage = operatorUsage();
  for (const char* flag :
       {"--kubeconfig", "--leader-elect", "--leader-election-namespace", "--leader-election-id",
        "--leader-election-lease-duration", "--leader-election-renew-deadline",
        "--leader-election-retry-period", "--health-probe-bind-address", "--metrics-bind-address",
        "--log-level", "--graceful-shutdown-timeout"}) {
    EXPECT_NE(usage.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace rtable::op
