#include "rtable/operator/leader_election.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <stdexcept>

#include "rtable/common/rfc3339.h"
#include "string_field.h"

namespace rtable::op {

using detail::stringField;

namespace {

int64_t intField(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

LeaseRecord LeaseRecord::fromLease(const nlohmann::json& lease) {
  LeaseRecord record;
  auto spec = lease.find("spec");
  if (spec == lease.end() || !spec->is_object()) return record;
  record.holder_identity = stringField(*spec, "holderIdentity");
  record.lease_duration_seconds = intField(*spec, "leaseDurationSeconds");
  record.acquire_time = stringField(*spec, "acquireTime");
  record.renew_time = stringField(*spec, "renewTime");
  record.lease_transitions = intField(*spec, "leaseTransitions");
  return record;
}

void LeaseRecord::toLease(nlohmann::json& lease) const {
  nlohmann::json& spec = lease["spec"];
  spec["holderIdentity"] = holder_identity;
  spec["leaseDurationSeconds"] = lease_duration_seconds;
  spec["acquireTime"] = acquire_time;
  spec["renewTime"] = renew_time;
  spec["leaseTransitions"] = lease_transitions;
}

std::string defaultLeaderIdentity() {
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  return fmt::format("{}_{}", host.data(), static_cast<long>(getpid()));
}

LeaderElector::LeaderElector(KubeClient& client, LeaderElectionOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : common::SteadyClock::instance()),
      random_(std::random_device{}()),
      release_on_stop_(options_.release_on_cancel) {
  if (options_.lease.name.empty()) throw std::invalid_argument("leader election: no lease name");
  if (options_.identity.empty()) options_.identity = defaultLeaderIdentity();
  if (options_.lease_duration < std::chrono::seconds(1)) {
    throw std::invalid_argument("leader election: the lease duration is under a second");
  }
  if (!(options_.retry_period > common::Clock::Duration::zero() &&
        options_.retry_period < options_.renew_deadline &&
        options_.renew_deadline < options_.lease_duration)) {
    throw std::invalid_argument(
        "leader election: need 0 < retry period < renew deadline < lease duration");
  }
  if (!options_.wall_clock) options_.wall_clock = [] { return std::chrono::system_clock::now(); };
}

LeaderElector::~LeaderElector() {
  stop();
}

void LeaderElector::start() {
  std::lock_guard lifecycle(lifecycle_mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void LeaderElector::stop() {
  std::lock_guard lifecycle(lifecycle_mu_);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::chrono::milliseconds electionRequestTimeout(common::Clock::Duration renew_deadline,
                                                 common::Clock::Duration retry_period) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(renew_deadline - retry_period);
  return std::max(left, std::chrono::milliseconds(100));
}

bool LeaderElector::isLeader() const {
  std::lock_guard lock(mu_);
  return leading_ && clock_.now() - last_renew_ < options_.renew_deadline;
}

std::string LeaderElector::observedLeader() const {
  std::lock_guard lock(mu_);
  return observed_record_.holder_identity;
}

std::optional<KubeError> LeaderElector::lastError() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

std::optional<common::Clock::TimePoint> LeaderElector::sleepingUntilForTest() const {
  std::lock_guard lock(mu_);
  return sleeping_until_;
}

bool LeaderElector::tryAcquireOrRenewForTest() {
  return tryAcquireOrRenew();
}

std::chrono::system_clock::time_point LeaderElector::wallNow() const {
  return options_.wall_clock();
}

void LeaderElector::run() {
  const auto retry = options_.retry_period;
  for (;;) {
    const bool held = tryAcquireOrRenew();
    const auto now = clock_.now();
    bool started = false;
    bool lost = false;
    common::Clock::TimePoint next = now + retry;
    {
      std::lock_guard lock(mu_);
      if (held) {
        last_renew_ = now;
        started = !leading_;
        leading_ = true;
      } else if (leading_) {
        const std::string& holder = observed_record_.holder_identity;
        if ((!holder.empty() && holder != options_.identity) ||
            now - last_renew_ >= options_.renew_deadline) {
          leading_ = false;
          lost = true;
        }
      }
      if (!leading_ && options_.acquire_jitter > 0) {
        std::uniform_real_distribution<double> jitter(0, options_.acquire_jitter);
        next += std::chrono::duration_cast<common::Clock::Duration>(retry * jitter(random_));
      }
    }
    if (started) {
      spdlog::info("leader election {}: {} is now the leader", options_.lease.toString(),
                   options_.identity);
      if (options_.on_started_leading) options_.on_started_leading();
    }
    if (lost) {
      spdlog::warn("leader election {}: {} lost the lease (holder now '{}')",
                   options_.lease.toString(), options_.identity, observedLeader());
      if (options_.on_stopped_leading) options_.on_stopped_leading();
    }
    if (!sleepUntil(next)) break;
  }
  bool was_leading = false;
  {
    std::lock_guard lock(mu_);
    was_leading = leading_;
    leading_ = false;
  }
  if (was_leading) {
    if (release_on_stop_.load()) release();
    if (options_.on_stopped_leading) options_.on_stopped_leading();
  }
}

bool LeaderElector::sleepUntil(common::Clock::TimePoint deadline) {
  std::unique_lock lock(mu_);
  sleeping_until_ = deadline;
  while (!stopping_ && clock_.now() < deadline) clock_.waitUntil(cv_, lock, deadline);
  sleeping_until_.reset();
  return !stopping_;
}

bool LeaderElector::tryAcquireOrRenew() {
  const ResourceType leases = resources::leases();
  const auto now = clock_.now();
  const std::string wall = common::formatRfc3339Micros(wallNow());
  const int64_t duration_seconds =
      std::chrono::duration_cast<std::chrono::seconds>(options_.lease_duration).count();

  auto fail = [&](const KubeError& error) {
    {
      std::lock_guard lock(mu_);
      last_error_ = error;
    }
    // A Conflict or AlreadyExists is another candidate winning the round: an answer, not a fault.
    if (error.kind == KubeErrorKind::kConflict || error.kind == KubeErrorKind::kAlreadyExists) {
      spdlog::debug("leader election {}: {}", options_.lease.toString(), error.toString());
    } else {
      spdlog::warn("leader election {}: {}", options_.lease.toString(), error.toString());
    }
    return false;
  };
  // Records what this elector saw of the Lease and when (by its own clock).
  auto observe = [&](const LeaseRecord& record) {
    std::string new_holder;
    bool holder_changed = false;
    {
      std::lock_guard lock(mu_);
      if (record == observed_record_) return;
      holder_changed = record.holder_identity != observed_record_.holder_identity;
      observed_record_ = record;
      observed_time_ = now;
      new_holder = record.holder_identity;
    }
    if (holder_changed && options_.on_new_leader) options_.on_new_leader(new_holder);
  };

  auto got = client_.get(leases, options_.lease);
  if (!got) {
    if (got.error().kind != KubeErrorKind::kNotFound) return fail(got.error());
    const LeaseRecord mine{options_.identity, duration_seconds, wall, wall, 0};
    nlohmann::json lease = {
        {"apiVersion", leases.apiVersion()},
        {"kind", leases.kind},
        {"metadata", {{"name", options_.lease.name}, {"namespace", options_.lease.ns}}}};
    mine.toLease(lease);
    auto created = client_.create(leases, lease);
    if (!created) return fail(created.error());
    observe(mine);
    return true;
  }

  const LeaseRecord record = LeaseRecord::fromLease(*got);
  observe(record);
  {
    std::lock_guard lock(mu_);
    const bool held_by_other =
        !record.holder_identity.empty() && record.holder_identity != options_.identity;
    if (held_by_other &&
        observed_time_ + std::chrono::seconds(record.lease_duration_seconds) > now) {
      return false;  // valid: unchanged for less than its duration, as far as we have seen
    }
  }
  LeaseRecord mine{options_.identity, duration_seconds, wall, wall, record.lease_transitions};
  if (record.holder_identity == options_.identity) {
    mine.acquire_time = record.acquire_time;
  } else {
    ++mine.lease_transitions;
  }
  nlohmann::json lease = *got;  // keeps metadata.resourceVersion: the update is conditional
  mine.toLease(lease);
  auto updated = client_.update(leases, lease);
  if (!updated) return fail(updated.error());
  observe(mine);
  return true;
}

void LeaderElector::release() {
  const ResourceType leases = resources::leases();
  auto got = client_.get(leases, options_.lease);
  if (!got) {
    spdlog::warn("leader election {}: release: {}", options_.lease.toString(),
                 got.error().toString());
    return;
  }
  const LeaseRecord record = LeaseRecord::fromLease(*got);
  if (record.holder_identity != options_.identity) return;
  const std::string wall = common::formatRfc3339Micros(wallNow());
  // client-go's release: no holder, a 1 s duration, the transitions kept.
  const LeaseRecord released{"", 1, wall, wall, record.lease_transitions};
  nlohmann::json lease = *got;
  released.toLease(lease);
  if (auto updated = client_.update(leases, lease); !updated) {
    spdlog::warn("leader election {}: release: {}", options_.lease.toString(),
                 updated.error().toString());
    return;
  }
  spdlog::info("leader election {}: {} released the lease", options_.lease.toString(),
               options_.identity);
}

}  // namespace rtable::op
