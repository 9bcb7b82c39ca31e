#include "rtable/operator/testing/fake_kube_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <set>
#include <thread>

#include "rtable/common/base64.h"
#include "rtable/common/rfc3339.h"
#include "rtable/operator/label_selector.h"

namespace rtable::op::testing {

using nlohmann::json;

std::string_view verbName(Verb verb) {
  switch (verb) {
    case Verb::kGet:
      return "get";
    case Verb::kList:
      return "list";
    case Verb::kCreate:
      return "create";
    case Verb::kUpdate:
      return "update";
    case Verb::kUpdateStatus:
      return "updateStatus";
    case Verb::kPatch:
      return "patch";
    case Verb::kDelete:
      return "delete";
    case Verb::kWatch:
      return "watch";
  }
  return "unknown";
}

namespace {

// --- errors, built as metav1.Status and parsed like the real client's answers ---

json statusObject(int code, std::string_view reason, const std::string& message,
                  json details = nullptr) {
  json status = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
                 {"status", "Failure"}, {"message", message}, {"reason", reason},
                 {"code", code}};
  if (!details.is_null()) status["details"] = std::move(details);
  return status;
}

KubeError statusError(int code, std::string_view reason, const std::string& message,
                      json details = nullptr) {
  return kubeErrorFromStatus(statusObject(code, reason, message, std::move(details)));
}

json details(const ResourceType& type, const std::string& name) {
  return {{"name", name}, {"group", type.group}, {"kind", type.resource}};
}

KubeError notFound(const ResourceType& type, const std::string& name) {
  return statusError(404, "NotFound",
                     fmt::format("{} \"{}\" not found", type.groupResource(), name),
                     details(type, name));
}

KubeError alreadyExists(const ResourceType& type, const std::string& name) {
  return statusError(409, "AlreadyExists",
                     fmt::format("{} \"{}\" already exists", type.groupResource(), name),
                     details(type, name));
}

KubeError conflict(const ResourceType& type, const std::string& name, const std::string& what) {
  return statusError(409, "Conflict",
                     fmt::format("Operation cannot be fulfilled on {} \"{}\": {}",
                                 type.groupResource(), name, what),
                     details(type, name));
}

constexpr const char* kStaleMessage =
    "the object has been modified; please apply your changes to the latest version and try again";

KubeError invalid(const ResourceType& type, const std::string& name, const std::string& field,
                  const std::string& cause_reason, const std::string& message) {
  json d = details(type, name);
  d["kind"] = type.kind;
  d["causes"] = json::array({{{"reason", cause_reason}, {"message", message}, {"field", field}}});
  return statusError(422, "Invalid",
                     fmt::format("{} \"{}\" is invalid: {}: {}", type.kind, name, field, message),
                     std::move(d));
}

KubeError badRequest(const std::string& message) {
  return statusError(400, "BadRequest", message);
}

// --- object helpers ---

json& metadataOf(json& object) {
  json& metadata = object["metadata"];
  if (!metadata.is_object()) metadata = json::object();
  return metadata;
}

std::string metaString(const json& object, const char* field) {
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return {};
  auto it = metadata->find(field);
  return it != metadata->end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool hasMeta(const json& object, const char* field) {
  auto metadata = object.find("metadata");
  return metadata != object.end() && metadata->is_object() && metadata->contains(field) &&
         !(*metadata)[field].is_null();
}

std::vector<std::string> finalizersOf(const json& object) {
  std::vector<std::string> out;
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return out;
  auto it = metadata->find("finalizers");
  if (it == metadata->end() || !it->is_array()) return out;
  for (const auto& f : *it) {
    if (f.is_string()) out.push_back(f.get<std::string>());
  }
  return out;
}

bool isDeleting(const json& object) {
  return hasMeta(object, "deletionTimestamp");
}

// What generation tracks: everything but metadata (and status, when it is a subresource).
json specContent(const ResourceType& type, json object) {
  object.erase("metadata");
  if (type.status_subresource) object.erase("status");
  return object;
}

json withoutResourceVersion(json object) {
  if (object.contains("metadata") && object["metadata"].is_object()) {
    object["metadata"].erase("resourceVersion");
  }
  return object;
}

std::optional<int64_t> parseVersion(std::string_view text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

struct Revision {
  int64_t rv;
  std::optional<json> object;  // nullopt: deleted at rv
};

struct Store {
  ResourceType type;
  std::map<ObjectKey, std::vector<Revision>> objects;

  // The object as of `rv` (latest when rv < 0), or nullptr.
  const json* at(const ObjectKey& key, int64_t rv = -1) const {
    auto it = objects.find(key);
    if (it == objects.end()) return nullptr;
    for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) {
      if (rv >= 0 && r->rv > rv) continue;
      return r->object ? &*r->object : nullptr;
    }
    return nullptr;
  }
};

struct LogEntry {
  int64_t rv;
  std::string resource;
  WatchEventType type;  // kAdded, kModified or kDeleted
  json object;
  std::optional<json> previous;
};

struct Fault {
  KubeError error;
  FakeKubeClient::FaultTiming timing;
};

}  // namespace

// What a watch's reader thread shares with the client and with its handle.
struct WatchCore {
  std::string resource;
  std::string ns;
  LabelSelector labels;
  FieldSelector fields;
  bool bookmarks = false;
  std::string kind, api_version;
  WatchEventHandler on_event;
  WatchEndHandler on_end;
  std::optional<std::chrono::steady_clock::time_point> deadline;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<WatchEvent> pending;
  bool server_closed = false;
  bool stop_requested = false;
  bool ended = false;

  void push(WatchEvent event) {
    {
      std::lock_guard lock(mu);
      if (server_closed) return;
      pending.push_back(std::move(event));
    }
    cv.notify_all();
  }
  void closeFromServer() {
    {
      std::lock_guard lock(mu);
      server_closed = true;
    }
    cv.notify_all();
  }
  bool selects(const json& object) const {
    if (!ns.empty() && metaString(object, "namespace") != ns) return false;
    return labels.matchesObject(object) && fields.matchesObject(object);
  }
  // The event this watch sees for a write, after selector transitions (the watch cache's rules).
  std::optional<WatchEvent> eventFor(const LogEntry& entry) const {
    if (entry.resource != resource) return std::nullopt;
    const bool now_selected = selects(entry.object);
    const bool was_selected = entry.previous && selects(*entry.previous);
    WatchEvent event;
    event.object = entry.object;
    switch (entry.type) {
      case WatchEventType::kAdded:
        if (!now_selected) return std::nullopt;
        event.type = WatchEventType::kAdded;
        break;
      case WatchEventType::kModified:
        if (now_selected && was_selected) {
          event.type = WatchEventType::kModified;
        } else if (now_selected) {
          event.type = WatchEventType::kAdded;
        } else if (was_selected) {
          event.type = WatchEventType::kDeleted;
        } else {
          return std::nullopt;
        }
        break;
      default:
        if (!now_selected) return std::nullopt;
        event.type = WatchEventType::kDeleted;
        break;
    }
    return event;
  }
};

struct FakeKubeClient::State {
  std::mutex mu;
  int64_t rv = 0;
  int64_t compacted = 0;
  std::map<std::string, Store> stores;  // by groupResource
  std::deque<LogEntry> log;
  std::set<std::shared_ptr<WatchCore>> watches;
  std::map<Verb, std::deque<Fault>> faults;
  std::vector<Action> actions;
  std::mt19937_64 random{0x5eed};

  Store& store(const ResourceType& type) {
    auto [it, inserted] = stores.try_emplace(type.groupResource());
    if (inserted) it->second.type = type;
    return it->second;
  }

  std::string newUid() {
    const uint64_t hi = random();
    const uint64_t lo = random();
    // RFC 4122 version 4 layout.
    return fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}", hi >> 32, (hi >> 16) & 0xFFFF,
                       hi & 0xFFF, ((lo >> 48) & 0x3FFF) | 0x8000, lo & 0xFFFFFFFFFFFFull);
  }

  std::string generatedSuffix() {
    // apiserver's SimpleNameGenerator alphabet (no vowels, no confusable characters), 5 chars.
    static constexpr std::string_view kAlphabet = "bcdfghjklmnpqrstvwxz2456789";
    std::string out;
    for (int i = 0; i < 5; ++i) out += kAlphabet[random() % kAlphabet.size()];
    return out;
  }

  std::optional<Fault> takeFault(Verb verb) {
    auto it = faults.find(verb);
    if (it == faults.end() || it->second.empty()) return std::nullopt;
    Fault fault = std::move(it->second.front());
    it->second.pop_front();
    return fault;
  }

  // Stamps the next resourceVersion on `object`, stores the revision and tells the watches.
  json commit(Store& s, const ObjectKey& key, json object, WatchEventType type,
              std::optional<json> previous) {
    const int64_t version = ++rv;
    metadataOf(object)["resourceVersion"] = std::to_string(version);
    s.objects[key].push_back(
        {version, type == WatchEventType::kDeleted ? std::nullopt : std::optional<json>(object)});
    LogEntry entry{version, s.type.groupResource(), type, object, std::move(previous)};
    for (const auto& watch : watches) {
      if (auto event = watch->eventFor(entry)) watch->push(std::move(*event));
    }
    log.push_back(std::move(entry));
    return object;
  }
};

namespace {

void runWatch(const std::shared_ptr<WatchCore>& core,
              const std::weak_ptr<FakeKubeClient::State>& weak_state);

}  // namespace

class FakeKubeClient::WatchImpl final : public Watch {
 public:
  WatchImpl(std::shared_ptr<WatchCore> core, std::weak_ptr<State> state) : core_(std::move(core)) {
    thread_ = std::thread([core = core_, state = std::move(state)] { runWatch(core, state); });
  }
  ~WatchImpl() override {
    stop();
    if (thread_.joinable()) thread_.detach();  // only when destroyed from its own handler
  }
  void stop() override {
    {
      std::lock_guard lock(core_->mu);
      core_->stop_requested = true;
    }
    core_->cv.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }
  bool waitEnded(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(core_->mu);
    return core_->cv.wait_for(lock, timeout, [&] { return core_->ended; });
  }

 private:
  std::shared_ptr<WatchCore> core_;
  std::thread thread_;
};

namespace {

void runWatch(const std::shared_ptr<WatchCore>& core,
              const std::weak_ptr<FakeKubeClient::State>& weak_state) {
  WatchEnd end;
  std::unique_lock lock(core->mu);
  for (;;) {
    auto ready = [&] {
      return core->stop_requested || !core->pending.empty() || core->server_closed;
    };
    if (core->deadline) {
      if (!core->cv.wait_until(lock, *core->deadline, ready)) core->server_closed = true;
    } else {
      core->cv.wait(lock, ready);
    }
    if (core->stop_requested) {
      end.reason = WatchEndReason::kStopped;
      break;
    }
    if (!core->pending.empty()) {
      WatchEvent event = std::move(core->pending.front());
      core->pending.pop_front();
      lock.unlock();
      if (core->on_event) core->on_event(event);
      lock.lock();
      continue;
    }
    end.reason = WatchEndReason::kServerClosed;
    break;
  }
  core->server_closed = true;
  lock.unlock();
  if (auto state = weak_state.lock()) {
    std::lock_guard state_lock(state->mu);
    state->watches.erase(core);
  }
  if (core->on_end) core->on_end(end);
  {
    std::lock_guard done(core->mu);
    core->ended = true;
  }
  core->cv.notify_all();
}

}  // namespace

FakeKubeClient::FakeKubeClient() : state_(std::make_shared<State>()) {
  // The namespaces every apiserver starts with.
  for (const char* name : {"default", "kube-node-lease", "kube-public", "kube-system"}) {
    json ns = {{"apiVersion", "v1"},
               {"kind", "Namespace"},
               {"metadata", {{"name", name}, {"labels", {{"kubernetes.io/metadata.name", name}}}}},
               {"spec", {{"finalizers", json::array({"kubernetes"})}}},
               {"status", {{"phase", "Active"}}}};
    auto created = create(resources::namespaces(), ns);
    (void)created;
  }
  state_->actions.clear();
}

FakeKubeClient::~FakeKubeClient() {
  closeWatchesForTest();
}

namespace {

KubeStatus checkKindAndVersion(const ResourceType& type, json& object) {
  if (!object.is_object()) return std::unexpected(badRequest("the body is not a JSON object"));
  if (auto it = object.find("apiVersion"); it != object.end() && *it != type.apiVersion()) {
    return std::unexpected(badRequest(
        fmt::format("the API version in the data ({}) does not match the expected API version ({})",
                    it->is_string() ? it->get<std::string>() : it->dump(), type.apiVersion())));
  }
  if (auto it = object.find("kind"); it != object.end() && *it != type.kind) {
    return std::unexpected(
        badRequest(fmt::format("the kind in the data ({}) does not match the expected kind ({})",
                               it->is_string() ? it->get<std::string>() : it->dump(), type.kind)));
  }
  object["apiVersion"] = type.apiVersion();
  object["kind"] = type.kind;
  return {};
}

}  // namespace

struct FakeOps {
  using State = FakeKubeClient::State;

  static KubeStatus checkNamespace(State& st, const ResourceType& type, const std::string& ns,
                                   bool creating) {
    if (!type.namespaced) return {};
    if (ns.empty())
      return std::unexpected(badRequest("an empty namespace may not be set during a request"));
    const json* namespace_object = st.store(resources::namespaces()).at({"", ns});
    if (namespace_object == nullptr) return std::unexpected(notFound(resources::namespaces(), ns));
    if (creating && isDeleting(*namespace_object)) {
      return std::unexpected(statusError(
          403, "Forbidden",
          fmt::format("{} \"{}\" is forbidden: unable to create new content in namespace {} "
                      "because it is being terminated",
                      type.groupResource(), metaString(*namespace_object, "name"), ns)));
    }
    return {};
  }

  static KubeResult<json> create(State& st, const ResourceType& type, json object, bool dry_run) {
    if (auto ok = checkKindAndVersion(type, object); !ok) return std::unexpected(ok.error());
    json& metadata = metadataOf(object);
    if (!type.namespaced) metadata.erase("namespace");
    const std::string ns = metaString(object, "namespace");
    if (auto ok = checkNamespace(st, type, ns, true); !ok) return std::unexpected(ok.error());
    std::string name = metaString(object, "name");
    if (name.empty()) {
      const std::string prefix = metaString(object, "generateName");
      if (prefix.empty()) {
        return std::unexpected(invalid(type, "", "metadata.name", "FieldValueRequired",
                                       "Required value: name or generateName is required"));
      }
      name = prefix + st.generatedSuffix();
      metadata["name"] = name;
    }
    if (!metaString(object, "resourceVersion").empty()) {
      return std::unexpected(
          badRequest("resourceVersion should not be set on objects to be created"));
    }
    Store& s = st.store(type);
    const ObjectKey key{ns, name};
    if (s.at(key) != nullptr) return std::unexpected(alreadyExists(type, name));
    metadata["uid"] = st.newUid();
    metadata["creationTimestamp"] = common::formatRfc3339(std::chrono::system_clock::now());
    metadata["generation"] = 1;
    metadata.erase("deletionTimestamp");
    metadata.erase("deletionGracePeriodSeconds");
    // Create cannot set status where status is a subresource; a namespace starts Active.
    if (type.status_subresource) object.erase("status");
    if (type.groupResource() == "namespaces") object["status"] = {{"phase", "Active"}};
    if (dry_run) return object;
    return st.commit(s, key, std::move(object), WatchEventType::kAdded, std::nullopt);
  }

  // Custom resources refuse a PUT without resourceVersion (their strategy does not allow
  // unconditional updates); built-in types such as ConfigMap accept it. A CRD's group has a dot
  // and is not one of Kubernetes' own *.k8s.io groups.
  static KubeStatus checkUpdateHasVersion(const ResourceType& type, const json& incoming) {
    const bool custom = type.group.find('.') != std::string::npos &&
                        !type.group.ends_with(".k8s.io") && type.group != "k8s.io";
    if (!custom || !metaString(incoming, "resourceVersion").empty()) return {};
    return std::unexpected(invalid(type, metaString(incoming, "name"), "metadata.resourceVersion",
                                   "FieldValueInvalid",
                                   "Invalid value: 0x0: must be specified for an update"));
  }

  static KubeStatus checkPreconditions(const ResourceType& type, const json& current,
                                       const json& incoming) {
    const std::string name = metaString(current, "name");
    const std::string uid = metaString(incoming, "uid");
    if (!uid.empty() && uid != metaString(current, "uid")) {
      return std::unexpected(conflict(
          type, name,
          fmt::format("Precondition failed: UID in precondition: {}, UID in object meta: {}", uid,
                      metaString(current, "uid"))));
    }
    const std::string rv = metaString(incoming, "resourceVersion");
    if (!rv.empty() && rv != metaString(current, "resourceVersion")) {
      return std::unexpected(conflict(type, name, kStaleMessage));
    }
    return {};
  }

  // Stores `candidate` as the next state of the object `current` (an update of the main resource
  // or of status): keeps system fields, enforces finalizer rules, bumps generation, skips no-op
  // writes, and deletes an object whose deletion was waiting for its last finalizer.
  static KubeResult<json> write(State& st, Store& s, const ResourceType& type, const json& current,
                                json candidate, bool status_only, bool dry_run) {
    const ObjectKey key = objectKeyOf(current);
    json next;
    if (status_only) {
      next = current;
      if (candidate.contains("status")) {
        next["status"] = candidate["status"];
      } else {
        next.erase("status");
      }
    } else {
      if (auto ok = checkKindAndVersion(type, candidate); !ok) return std::unexpected(ok.error());
      next = std::move(candidate);
      json& metadata = metadataOf(next);
      const json& old_metadata = current["metadata"];
      for (const char* field : {"uid", "creationTimestamp", "generation", "deletionTimestamp",
                                "deletionGracePeriodSeconds", "name", "namespace"}) {
        if (old_metadata.contains(field)) {
          metadata[field] = old_metadata[field];
        } else {
          metadata.erase(field);
        }
      }
      if (type.status_subresource) {
        if (current.contains("status")) {
          next["status"] = current["status"];
        } else {
          next.erase("status");
        }
      }
      if (isDeleting(current)) {
        const auto before = finalizersOf(current);
        std::vector<std::string> added;
        for (const auto& f : finalizersOf(next)) {
          if (std::find(before.begin(), before.end(), f) == before.end()) added.push_back(f);
        }
        if (!added.empty()) {
          return std::unexpected(invalid(
              type, key.name, "metadata.finalizers", "FieldValueForbidden",
              fmt::format("Forbidden: no new finalizers can be added if the object is being "
                          "deleted, found new finalizers {}",
                          json(added).dump())));
        }
      }
      if (specContent(type, next) != specContent(type, current)) {
        metadata["generation"] = current["metadata"].value("generation", int64_t{0}) + 1;
      }
    }
    metadataOf(next)["resourceVersion"] = metaString(current, "resourceVersion");
    if (withoutResourceVersion(next) == withoutResourceVersion(current))
      return current;  // no write
    if (dry_run) return next;
    if (isDeleting(next) && finalizersOf(next).empty()) {
      return st.commit(s, key, std::move(next), WatchEventType::kDeleted, current);
    }
    return st.commit(s, key, std::move(next), WatchEventType::kModified, current);
  }
};

KubeResult<json> FakeKubeClient::get(const ResourceType& type, const ObjectKey& key) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  st.actions.push_back({Verb::kGet, type.groupResource(), key, ""});
  auto fault = st.takeFault(Verb::kGet);
  if (fault) return std::unexpected(fault->error);
  const json* object = st.store(type).at({type.namespaced ? key.ns : "", key.name});
  if (object == nullptr) return std::unexpected(notFound(type, key.name));
  return *object;
}

KubeResult<ObjectList> FakeKubeClient::list(const ResourceType& type, std::string_view ns,
                                            const ListOptions& options) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  st.actions.push_back({Verb::kList, type.groupResource(), {std::string(ns), ""}, ""});
  auto fault = st.takeFault(Verb::kList);
  if (fault && fault->timing == FaultTiming::kBeforeApply) return std::unexpected(fault->error);

  auto labels = LabelSelector::parse(options.label_selector);
  if (!labels) return std::unexpected(badRequest(labels.error()));
  auto fields = FieldSelector::parse(options.field_selector);
  if (!fields) return std::unexpected(badRequest(fields.error()));

  int64_t at = st.rv;
  std::string start_after;
  if (!options.continue_token.empty()) {
    std::optional<json> token;
    if (auto decoded = common::base64Decode(options.continue_token)) {
      json parsed = json::parse(*decoded, nullptr, false);
      if (parsed.is_object() && parsed.contains("rv") && parsed.contains("start")) token = parsed;
    }
    if (!token) return std::unexpected(badRequest("continue key is not valid"));
    at = (*token)["rv"].get<int64_t>();
    start_after = (*token)["start"].get<std::string>();
    if (at < st.compacted) {
      return std::unexpected(statusError(
          410, "Expired",
          "The provided continue parameter is too old to display a consistent list result. You "
          "can start a new list without the continue parameter."));
    }
  } else if (options.resource_version_match == ResourceVersionMatch::kExact) {
    auto exact = parseVersion(options.resource_version);
    if (!exact)
      return std::unexpected(badRequest("resourceVersionMatch=Exact needs a resourceVersion"));
    if (*exact < st.compacted) {
      return std::unexpected(
          statusError(410, "Expired", "The resourceVersion for the provided list is too old."));
    }
    if (*exact > st.rv) {
      return std::unexpected(
          statusError(504, "Timeout",
                      fmt::format("Too large resource version: {}, current: {}", *exact, st.rv)));
    }
    at = *exact;
  }

  const Store& s = st.store(type);
  ObjectList out;
  out.resource_version = std::to_string(at);
  int64_t remaining = 0;
  std::string last_key;
  for (const auto& [key, revisions] : s.objects) {
    if (type.namespaced && !ns.empty() && key.ns != ns) continue;
    const std::string flat = key.ns + "/" + key.name;
    if (!start_after.empty() && flat <= start_after) continue;
    const json* object = s.at(key, at);
    if (object == nullptr || !labels->matchesObject(*object) || !fields->matchesObject(*object)) {
      continue;
    }
    if (options.limit > 0 && static_cast<int64_t>(out.items.size()) >= options.limit) {
      ++remaining;
      continue;
    }
    out.items.push_back(*object);
    last_key = flat;
  }
  if (remaining > 0) {
    out.continue_token = common::base64Encode(json{{"rv", at}, {"start", last_key}}.dump());
    // The apiserver leaves remainingItemCount out when a selector made the count unknowable.
    if (labels->empty() && options.field_selector.empty()) out.remaining_item_count = remaining;
  }
  if (fault) return std::unexpected(fault->error);
  return out;
}

KubeResult<json> FakeKubeClient::create(const ResourceType& type, const json& object,
                                        const WriteOptions& options) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  st.actions.push_back({Verb::kCreate, type.groupResource(), objectKeyOf(object), ""});
  auto fault = st.takeFault(Verb::kCreate);
  if (fault && fault->timing == FaultTiming::kBeforeApply) return std::unexpected(fault->error);
  auto result = FakeOps::create(st, type, object, options.dry_run);
  if (fault) return std::unexpected(fault->error);
  return result;
}

namespace {

// The stored object for an update: found, namespaced correctly, preconditions met.
KubeResult<const json*> currentFor(FakeKubeClient::State& st, Store& s, const ResourceType& type,
                                   const ObjectKey& key) {
  if (key.name.empty()) return std::unexpected(badRequest("name is required"));
  if (type.namespaced && key.ns.empty()) {
    return std::unexpected(badRequest("an empty namespace may not be set during a request"));
  }
  (void)st;
  const json* current = s.at({type.namespaced ? key.ns : "", key.name});
  if (current == nullptr) return std::unexpected(notFound(type, key.name));
  return current;
}

}  // namespace

KubeResult<json> FakeKubeClient::update(const ResourceType& type, const json& object,
                                        const WriteOptions& options) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  const ObjectKey key = objectKeyOf(object);
  st.actions.push_back({Verb::kUpdate, type.groupResource(), key, ""});
  auto fault = st.takeFault(Verb::kUpdate);
  if (fault && fault->timing == FaultTiming::kBeforeApply) return std::unexpected(fault->error);
  Store& s = st.store(type);
  auto result = [&]() -> KubeResult<json> {
    auto current = currentFor(st, s, type, key);
    if (!current) return std::unexpected(current.error());
    const json snapshot = **current;
    if (auto ok = FakeOps::checkUpdateHasVersion(type, object); !ok) {
      return std::unexpected(ok.error());
    }
    if (auto ok = FakeOps::checkPreconditions(type, snapshot, object); !ok) {
      return std::unexpected(ok.error());
    }
    return FakeOps::write(st, s, type, snapshot, object, /*status_only=*/false, options.dry_run);
  }();
  if (fault) return std::unexpected(fault->error);
  return result;
}

KubeResult<json> FakeKubeClient::updateStatus(const ResourceType& type, const json& object,
                                              const WriteOptions& options) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  const ObjectKey key = objectKeyOf(object);
  st.actions.push_back({Verb::kUpdateStatus, type.groupResource(), key, "status"});
  auto fault = st.takeFault(Verb::kUpdateStatus);
  if (fault && fault->timing == FaultTiming::kBeforeApply) return std::unexpected(fault->error);
  Store& s = st.store(type);
  auto result = [&]() -> KubeResult<json> {
    if (!type.status_subresource) {
      return std::unexpected(
          statusError(404, "NotFound", "the server could not find the requested resource"));
    }
    auto current = currentFor(st, s, type, key);
    if (!current) return std::unexpected(current.error());
    const json snapshot = **current;
    if (auto ok = FakeOps::checkUpdateHasVersion(type, object); !ok) {
      return std::unexpected(ok.error());
    }
    if (auto ok = FakeOps::checkPreconditions(type, snapshot, object); !ok) {
      return std::unexpected(ok.error());
    }
    return FakeOps::write(st, s, type, snapshot, object, /*status_only=*/true, options.dry_run);
  }();
  if (fault) return std::unexpected(fault->error);
  return result;
}

KubeResult<json> FakeKubeClient::patch(const ResourceType& type, const ObjectKey& key,
                                       PatchType patch_type, const json& patch,
                                       const PatchOptions& options) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  st.actions.push_back({Verb::kPatch, type.groupResource(), key, options.subresource});
  auto fault = st.takeFault(Verb::kPatch);
  if (fault && fault->timing == FaultTiming::kBeforeApply) return std::unexpected(fault->error);
  Store& s = st.store(type);
  auto result = [&]() -> KubeResult<json> {
    const bool status_only = options.subresource == "status";
    if (!options.subresource.empty() && !status_only) {
      return std::unexpected(
          badRequest(fmt::format("unknown subresource {}", options.subresource)));
    }
    if (status_only && !type.status_subresource) {
      return std::unexpected(
          statusError(404, "NotFound", "the server could not find the requested resource"));
    }
    if (patch_type == PatchType::kStrategicMerge) {
      return std::unexpected(statusError(
          415, "UnsupportedMediaType",
          "FakeKubeClient does not implement strategic merge patch; use a merge patch"));
    }
    if (patch_type == PatchType::kApply && options.field_manager.empty()) {
      return std::unexpected(
          badRequest("PATCH, application/apply-patch+yaml requires fieldManager"));
    }
    if (options.force && patch_type != PatchType::kApply) {
      return std::unexpected(badRequest("force is only allowed for apply patches"));
    }
    auto current = currentFor(st, s, type, key);
    if (!current) {
      if (patch_type != PatchType::kApply || current.error().kind != KubeErrorKind::kNotFound ||
          status_only) {
        return std::unexpected(current.error());
      }
      // Apply creates what does not exist.
      json object = patch;
      json& metadata = metadataOf(object);
      metadata["name"] = key.name;
      if (type.namespaced) metadata["namespace"] = key.ns;
      return FakeOps::create(st, type, std::move(object), options.dry_run);
    }
    const json snapshot = **current;
    json patched = snapshot;
    try {
      if (patch_type == PatchType::kJson) {
        patched = snapshot.patch(patch);
      } else {
        if (!patch.is_object())
          return std::unexpected(badRequest("a merge patch must be a JSON object"));
        patched.merge_patch(patch);
      }
    } catch (const json::exception& e) {
      return std::unexpected(statusError(422, "", e.what()));
    }
    // A resourceVersion in the patch is a precondition, as the apiserver treats it.
    if (auto ok = FakeOps::checkPreconditions(type, snapshot, patched); !ok) {
      return std::unexpected(ok.error());
    }
    return FakeOps::write(st, s, type, snapshot, std::move(patched), status_only, options.dry_run);
  }();
  if (fault) return std::unexpected(fault->error);
  return result;
}

KubeResult<DeleteResult> FakeKubeClient::remove(const ResourceType& type, const ObjectKey& key,
                                                const DeleteOptions& options) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  st.actions.push_back({Verb::kDelete, type.groupResource(), key, ""});
  auto fault = st.takeFault(Verb::kDelete);
  if (fault && fault->timing == FaultTiming::kBeforeApply) return std::unexpected(fault->error);
  Store& s = st.store(type);
  auto result = [&]() -> KubeResult<DeleteResult> {
    auto found = currentFor(st, s, type, key);
    if (!found) return std::unexpected(found.error());
    const json current = **found;
    const std::string name = key.name;
    if (options.precondition_uid && *options.precondition_uid != metaString(current, "uid")) {
      return std::unexpected(conflict(
          type, name,
          fmt::format("Precondition failed: UID in precondition: {}, UID in object meta: {}",
                      *options.precondition_uid, metaString(current, "uid"))));
    }
    if (options.precondition_resource_version &&
        *options.precondition_resource_version != metaString(current, "resourceVersion")) {
      return std::unexpected(conflict(
          type, name,
          fmt::format("Precondition failed: ResourceVersion in precondition: {}, ResourceVersion "
                      "in object meta: {}",
                      *options.precondition_resource_version,
                      metaString(current, "resourceVersion"))));
    }
    if (isDeleting(current)) return DeleteResult{false, current};  // already waiting
    json next = current;
    auto finalizers = finalizersOf(next);
    // The garbage collector's finalizers; nothing here removes them (no kube-controller-manager).
    if (options.propagation_policy == PropagationPolicy::kForeground ||
        options.propagation_policy == PropagationPolicy::kOrphan) {
      const char* gc = options.propagation_policy == PropagationPolicy::kForeground
                           ? "foregroundDeletion"
                           : "orphan";
      if (std::find(finalizers.begin(), finalizers.end(), gc) == finalizers.end()) {
        finalizers.push_back(gc);
        metadataOf(next)["finalizers"] = finalizers;
      }
    }
    const ObjectKey stored_key{type.namespaced ? key.ns : "", key.name};
    if (!finalizers.empty()) {
      json& metadata = metadataOf(next);
      metadata["deletionTimestamp"] = common::formatRfc3339(std::chrono::system_clock::now());
      metadata["deletionGracePeriodSeconds"] = 0;
      metadata["generation"] = metadata.value("generation", int64_t{0}) + 1;
      if (options.dry_run) return DeleteResult{false, next};
      return DeleteResult{
          false, st.commit(s, stored_key, std::move(next), WatchEventType::kModified, current)};
    }
    json status = {{"kind", "Status"},
                   {"apiVersion", "v1"},
                   {"metadata", json::object()},
                   {"status", "Success"},
                   {"details",
                    {{"name", name},
                     {"group", type.group},
                     {"kind", type.resource},
                     {"uid", metaString(current, "uid")}}}};
    if (!options.dry_run) {
      st.commit(s, stored_key, std::move(next), WatchEventType::kDeleted, current);
    }
    return DeleteResult{true, std::move(status)};
  }();
  if (fault) return std::unexpected(fault->error);
  return result;
}

KubeResult<std::unique_ptr<Watch>> FakeKubeClient::watch(const ResourceType& type,
                                                         std::string_view ns,
                                                         const WatchOptions& options,
                                                         WatchEventHandler on_event,
                                                         WatchEndHandler on_end) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  st.actions.push_back({Verb::kWatch, type.groupResource(), {std::string(ns), ""}, ""});
  if (auto fault = st.takeFault(Verb::kWatch)) return std::unexpected(fault->error);

  auto core = std::make_shared<WatchCore>();
  core->resource = type.groupResource();
  core->ns = type.namespaced ? std::string(ns) : std::string();
  auto labels = LabelSelector::parse(options.label_selector);
  if (!labels) return std::unexpected(badRequest(labels.error()));
  auto fields = FieldSelector::parse(options.field_selector);
  if (!fields) return std::unexpected(badRequest(fields.error()));
  core->labels = std::move(*labels);
  core->fields = std::move(*fields);
  core->bookmarks = options.allow_watch_bookmarks;
  core->kind = type.kind;
  core->api_version = type.apiVersion();
  core->on_event = std::move(on_event);
  core->on_end = std::move(on_end);
  if (options.timeout_seconds) {
    core->deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(*options.timeout_seconds);
  }

  Store& s = st.store(type);
  if (options.resource_version.empty() || options.resource_version == "0") {
    // "Get state and start at most recent": synthetic ADDED for what exists now.
    for (const auto& [key, revisions] : s.objects) {
      const json* object = s.at(key);
      if (object != nullptr && core->selects(*object)) {
        core->pending.push_back(WatchEvent{WatchEventType::kAdded, *object, {}});
      }
    }
  } else {
    auto from = parseVersion(options.resource_version);
    if (!from) {
      return std::unexpected(
          badRequest(fmt::format("invalid resourceVersion '{}'", options.resource_version)));
    }
    if (*from < st.compacted) {
      json status = statusObject(
          410, "Expired", fmt::format("too old resource version: {} ({})", *from, st.compacted));
      core->pending.push_back(
          WatchEvent{WatchEventType::kError, status, kubeErrorFromStatus(status)});
      core->server_closed = true;  // the apiserver ends the stream after the ERROR event
    } else {
      for (const auto& entry : st.log) {
        if (entry.rv <= *from) continue;
        if (auto event = core->eventFor(entry)) core->pending.push_back(std::move(*event));
      }
    }
  }
  if (!core->server_closed) st.watches.insert(core);
  return std::unique_ptr<Watch>(new WatchImpl(core, state_));
}

void FakeKubeClient::failNextForTest(Verb verb, KubeError error, int count, FaultTiming timing) {
  std::lock_guard lock(state_->mu);
  for (int i = 0; i < count; ++i) state_->faults[verb].push_back({error, timing});
}

void FakeKubeClient::compactForTest(int64_t resource_version) {
  std::lock_guard lock(state_->mu);
  State& st = *state_;
  const int64_t upto = resource_version == 0 ? st.rv : std::min(resource_version, st.rv);
  st.compacted = std::max(st.compacted, upto);
  while (!st.log.empty() && st.log.front().rv <= st.compacted) st.log.pop_front();
  for (auto& [name, store] : st.stores) {
    for (auto it = store.objects.begin(); it != store.objects.end();) {
      auto& revisions = it->second;
      // Keep the revision in effect at `compacted` and everything after it.
      std::size_t keep_from = 0;
      for (std::size_t i = 0; i < revisions.size(); ++i) {
        if (revisions[i].rv <= st.compacted) keep_from = i;
      }
      revisions.erase(revisions.begin(),
                      revisions.begin() + static_cast<std::ptrdiff_t>(keep_from));
      if (revisions.size() == 1 && !revisions.front().object) {
        it = store.objects.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void FakeKubeClient::bookmarkForTest() {
  std::lock_guard lock(state_->mu);
  for (const auto& core : state_->watches) {
    if (!core->bookmarks) continue;
    json object = {{"kind", core->kind},
                   {"apiVersion", core->api_version},
                   {"metadata", {{"resourceVersion", std::to_string(state_->rv)}}}};
    core->push(WatchEvent{WatchEventType::kBookmark, std::move(object), {}});
  }
}

void FakeKubeClient::closeWatchesForTest() {
  std::lock_guard lock(state_->mu);
  for (const auto& core : state_->watches) core->closeFromServer();
}

int64_t FakeKubeClient::currentResourceVersionForTest() const {
  std::lock_guard lock(state_->mu);
  return state_->rv;
}

std::vector<Action> FakeKubeClient::actionsForTest() const {
  std::lock_guard lock(state_->mu);
  return state_->actions;
}

void FakeKubeClient::clearActionsForTest() {
  std::lock_guard lock(state_->mu);
  state_->actions.clear();
}

std::size_t FakeKubeClient::activeWatchesForTest() const {
  std::lock_guard lock(state_->mu);
  return state_->watches.size();
}

}  // namespace rtable::op::testing
