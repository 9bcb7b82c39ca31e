#include "rtable/operator/http_kube_client.h"

#include <cpprest/containerstream.h>
#include <cpprest/http_client.h>
#include <cpprest/producerconsumerstream.h>
#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace rtable::op {

namespace http = web::http;
namespace client = web::http::client;
using nlohmann::json;

std::string defaultUserAgent() {
  return std::string("rtable-operator/") + RTABLE_VERSION;
}

namespace {

// client-go re-reads a token file at most once a minute (cachingTokenSource).
constexpr auto kTokenRefresh = std::chrono::minutes(1);
// A watch without timeoutSeconds: the apiserver closes it after --min-request-timeout (1800 s),
// randomized up to twice that.
constexpr auto kDefaultWatchSeconds = std::chrono::seconds(3600);
// Slack over the server-side watch timeout before the client gives up on a silent stream.
constexpr auto kWatchClientSlack = std::chrono::seconds(60);
// A large chunk of watch bytes is handed to the splitter before the rest arrives.
constexpr std::size_t kWatchFlushBytes = 64 * 1024;

// --- PEM checks at start-up (OpenSSL), so a bad kubeconfig is an error value, not a failed
// handshake later ---

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioDeleter> memoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::string openSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

KubeError configError(const std::string& message) {
  return KubeError::of(KubeErrorKind::kBadRequest, "invalid client configuration: " + message);
}

KubeStatus checkPem(const ClusterConfig& config) {
  ERR_clear_error();
  if (!config.ca_pem.empty()) {
    auto bio = memoryBio(config.ca_pem);
    std::unique_ptr<X509, X509Deleter> cert(
        PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (!cert) return std::unexpected(configError("CA certificate: " + openSslError()));
  }
  if (config.client_certificate_pem.empty() != config.client_key_pem.empty()) {
    return std::unexpected(configError("a client certificate needs both certificate and key"));
  }
  if (!config.client_certificate_pem.empty()) {
    auto cert_bio = memoryBio(config.client_certificate_pem);
    std::unique_ptr<X509, X509Deleter> cert(
        PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
    if (!cert) return std::unexpected(configError("client certificate: " + openSslError()));
    auto key_bio = memoryBio(config.client_key_pem);
    std::unique_ptr<EVP_PKEY, KeyDeleter> key(
        PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
    if (!key) return std::unexpected(configError("client key: " + openSslError()));
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      return std::unexpected(configError("the client key does not match the client certificate"));
    }
  }
  return {};
}

// "host:port" of the server URL, the `host` label of the client metrics.
std::string hostLabel(const std::string& server) {
  web::uri uri(server);
  const int port = uri.port() > 0 ? uri.port() : (uri.scheme() == "https" ? 443 : 80);
  return fmt::format("{}:{}", uri.host(), port);
}

std::string pathOf(const std::string& path_and_query) {
  return path_and_query.substr(0, path_and_query.find('?'));
}

// The request body. cpprestsdk's set_body(std::string) reads a char buffer through an
// unsigned-char stream (a type pun UBSan reports); a byte buffer of the stream's own type avoids
// it. The buffer is not seekable on purpose: when a pooled connection turns out closed while
// cpprestsdk waits for the status line, it resends the request on a new connection if it can
// rewind the body. For a write that request may already have reached the server, so a
// non-seekable body makes cpprestsdk report the failure instead, and sendOnce() decides.
void setBody(http::http_request& request, const std::string& body,
             const std::string& content_type) {
  concurrency::streams::producer_consumer_buffer<uint8_t> buffer;
  const auto* bytes = reinterpret_cast<const uint8_t*>(body.data());
  buffer.putn_nocopy(bytes, body.size()).wait();  // copies (the buffer owns its blocks)
  buffer.close(std::ios_base::out).wait();
  request.set_body(buffer.create_istream(), body.size(), content_type);
}

// Every cpprestsdk/Boost failure becomes a value here.
KubeError transportError(const std::exception& e, const std::string& what) {
  if (const auto* h = dynamic_cast<const http::http_exception*>(&e)) {
    if (h->error_code() == std::errc::timed_out) {
      return KubeError::timeout(fmt::format("{}: client timeout: {}", what, h->what()));
    }
  }
  return KubeError::connection(fmt::format("{}: {}", what, e.what()));
}

// How far a failed request got, from cpprestsdk 2.10's asio client: it names the step that failed
// in the exception's message ("Failed to write request body", ...). Until the body is written in
// full the server cannot have acted on the request: it never saw a complete one.
bool failedBeforeTheRequestWasComplete(const std::exception& e) {
  static constexpr std::string_view kUnsentSteps[] = {
      "Error resolving address",
      "Failed to resolve address",
      "Failed to connect to any resolved endpoint",
      "Error in SSL handshake",
      "Failed to write request headers",
      "Failed to write request body",
  };
  const std::string_view what = e.what();
  for (std::string_view step : kUnsentSteps) {
    if (what.starts_with(step)) return true;
  }
  return false;
}

class TokenSource {
 public:
  explicit TokenSource(const ClusterConfig& config)
      : token_(config.bearer_token),
        file_(config.token_file),
        read_at_(std::chrono::steady_clock::now()) {}

  std::string token() {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (file_ && now - read_at_ >= kTokenRefresh) {
      read_at_ = now;
      std::ifstream in(*file_);
      std::stringstream buffer;
      buffer << in.rdbuf();
      std::string fresh = buffer.str();
      while (!fresh.empty() &&
             (fresh.back() == '\n' || fresh.back() == '\r' || fresh.back() == ' ')) {
        fresh.pop_back();
      }
      // Keep the last good token when the file is briefly unreadable (it is swapped atomically
      // by the kubelet, but be safe).
      if (in && !fresh.empty()) token_ = std::move(fresh);
    }
    return token_;
  }

 private:
  std::mutex mu_;
  std::string token_;
  std::optional<std::filesystem::path> file_;
  std::chrono::steady_clock::time_point read_at_;
};

class ClientMetrics {
 public:
  ClientMetrics(prometheus::Registry& registry)
      : duration_(prometheus::BuildHistogram()
                      .Name("rest_client_request_duration_seconds")
                      .Help("Request latency in seconds. Broken down by verb, and host.")
                      .Register(registry)),
        requests_(
            prometheus::BuildCounter()
                .Name("rest_client_requests_total")
                .Help("Number of HTTP requests, partitioned by status code, method, and host.")
                .Register(registry)) {}

  void observe(const RequestRecord& r) {
    // client-go's buckets.
    static const prometheus::Histogram::BucketBoundaries kBuckets = {
        0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0};
    duration_.Add({{"verb", r.verb}, {"host", r.host}}, kBuckets).Observe(r.duration.count());
    const std::string code = r.code == 0 ? "<error>" : std::to_string(r.code);
    requests_.Add({{"code", code}, {"method", r.verb}, {"host", r.host}}).Increment();
  }

 private:
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Counter>& requests_;
};

struct Response {
  int code = 0;
  std::string body;
  std::string retry_after;
};

}  // namespace

class HttpKubeClient::Impl {
 public:
  Impl(ClusterConfig config, HttpKubeClientOptions options)
      : config_(std::move(config)),
        options_(std::move(options)),
        host_(hostLabel(config_.server)),
        tokens_(config_) {
    if (options_.user_agent.empty()) options_.user_agent = defaultUserAgent();
    if (options_.registry != nullptr) metrics_.emplace(*options_.registry);
    client_ = std::make_shared<client::http_client>(web::uri(config_.server),
                                                    clientConfig(options_.request_timeout));
  }

  client::http_client_config clientConfig(std::chrono::milliseconds timeout) const {
    client::http_client_config cfg;
    cfg.set_timeout(timeout);
    if (config_.insecure_skip_tls_verify) cfg.set_validate_certificates(false);
    const std::string ca = config_.ca_pem;
    const std::string cert = config_.client_certificate_pem;
    const std::string key = config_.client_key_pem;
    if (!ca.empty() || !cert.empty()) {
      cfg.set_ssl_context_callback([ca, cert, key](boost::asio::ssl::context& ctx) {
        if (!ca.empty()) ctx.add_certificate_authority(boost::asio::buffer(ca.data(), ca.size()));
        if (!cert.empty()) {
          ctx.use_certificate_chain(boost::asio::buffer(cert.data(), cert.size()));
          ctx.use_private_key(boost::asio::buffer(key.data(), key.size()),
                              boost::asio::ssl::context::pem);
        }
      });
    }
    return cfg;
  }

  http::http_request makeRequest(const std::string& method, const std::string& path_and_query,
                                 const std::string& body, const std::string& content_type) {
    http::http_request request(method);
    request.set_request_uri(web::uri(path_and_query));
    auto& headers = request.headers();
    headers.add(http::header_names::accept, "application/json");
    headers.add(http::header_names::user_agent, options_.user_agent);
    if (const std::string token = tokens_.token(); !token.empty()) {
      headers.add(http::header_names::authorization, "Bearer " + token);
    }
    if (!body.empty() || !content_type.empty()) setBody(request, body, content_type);
    return request;
  }

  void record(const std::string& method, const std::string& path_and_query, int code,
              std::chrono::steady_clock::time_point start) {
    if (!metrics_ && !options_.on_request) return;
    RequestRecord r{method, host_, pathOf(path_and_query), code,
                    std::chrono::steady_clock::now() - start};
    if (metrics_) metrics_->observe(r);
    if (options_.on_request) options_.on_request(r);
  }

  // One request and its whole answer, with the retry rule of the header. Called from our threads
  // only.
  KubeResult<Response> send(const std::string& method, const std::string& path_and_query,
                            const std::string& body = {}, const std::string& content_type = {}) {
    const bool idempotent = method == "GET" || method == "HEAD";
    auto client = currentClient();
    bool unsent = false;
    auto first = sendOnce(*client, method, path_and_query, body, content_type, unsent);
    if (first || first.error().kind != KubeErrorKind::kConnection) return first;
    // Every pooled connection of this client may be dead (an apiserver restart ends them all):
    // the next requests, this retry included, start on fresh ones.
    replaceClient(client);
    if (!idempotent && !unsent) return first;
    retries_.fetch_add(1);
    return sendOnce(*currentClient(), method, path_and_query, body, content_type, unsent);
  }

  KubeResult<Response> sendOnce(client::http_client& client, const std::string& method,
                                const std::string& path_and_query, const std::string& body,
                                const std::string& content_type, bool& unsent) {
    const auto start = std::chrono::steady_clock::now();
    const std::string what = fmt::format("{} {}", method, pathOf(path_and_query));
    try {
      http::http_response response =
          client.request(makeRequest(method, path_and_query, body, content_type)).get();
      Response out;
      out.code = response.status_code();
      const auto bytes = response.extract_vector().get();
      out.body.assign(bytes.begin(), bytes.end());
      if (auto it = response.headers().find("Retry-After"); it != response.headers().end()) {
        out.retry_after = it->second;
      }
      record(method, path_and_query, out.code, start);
      return out;
    } catch (const std::exception& e) {
      record(method, path_and_query, 0, start);
      unsent = failedBeforeTheRequestWasComplete(e);
      return std::unexpected(transportError(e, what));
    }
  }

  std::shared_ptr<client::http_client> currentClient() {
    std::lock_guard lock(client_mu_);
    return client_;
  }

  // A new connection pool, unless another thread has replaced `failed` already. Requests in
  // flight on the old client keep it alive until they end.
  void replaceClient(const std::shared_ptr<client::http_client>& failed) {
    auto fresh = std::make_shared<client::http_client>(web::uri(config_.server),
                                                       clientConfig(options_.request_timeout));
    std::lock_guard lock(client_mu_);
    if (client_ == failed) client_ = std::move(fresh);
  }

  int64_t retries() const { return retries_.load(); }

  // A JSON object from a 2xx answer, or the error the answer stands for.
  KubeResult<json> sendJson(const std::string& method, const std::string& path_and_query,
                            const std::string& body = {}, const std::string& content_type = {}) {
    auto response = send(method, path_and_query, body, content_type);
    if (!response) return std::unexpected(response.error());
    if (response->code < 200 || response->code >= 300) {
      return std::unexpected(
          kubeErrorFromResponse(response->code, response->body, response->retry_after));
    }
    json parsed = json::parse(response->body, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object()) {
      return std::unexpected(KubeError::decode(
          fmt::format("{} {}: the answer is not a JSON object", method, pathOf(path_and_query))));
    }
    return parsed;
  }

  const ClusterConfig& config() const { return config_; }
  const HttpKubeClientOptions& options() const { return options_; }

 private:
  ClusterConfig config_;
  HttpKubeClientOptions options_;
  std::string host_;
  TokenSource tokens_;
  std::optional<ClientMetrics> metrics_;
  std::mutex client_mu_;
  std::shared_ptr<client::http_client> client_;  // guarded by client_mu_
  std::atomic<int64_t> retries_{0};

  friend class HttpWatch;
};

namespace {

// What a watch's reader thread shares with its handle.
struct HttpWatchCore {
  std::mutex mu;
  std::condition_variable cv;
  bool stop_requested = false;
  bool ended = false;
  pplx::cancellation_token_source cancel;
  std::unique_ptr<client::http_client> client;  // one per watch: its own long timeout
  http::http_response response;
  WatchEventHandler on_event;
  WatchEndHandler on_end;

  bool stopping() {
    std::lock_guard lock(mu);
    return stop_requested;
  }
};

void readWatchStream(const std::shared_ptr<HttpWatchCore>& core) {
  WatchEnd end{WatchEndReason::kServerClosed, std::nullopt};
  LineSplitter splitter;
  bool decode_failed = false;
  auto on_line = [&](std::string_view line) {
    if (decode_failed || core->stopping()) return;
    auto event = parseWatchEvent(line);
    if (!event) {
      decode_failed = true;
      end = WatchEnd{WatchEndReason::kError, event.error()};
      return;
    }
    if (core->on_event) core->on_event(*event);
  };
  std::string chunk;
  auto flush = [&] {
    if (chunk.empty()) return true;
    const bool ok = splitter.feed(chunk, on_line);
    chunk.clear();
    if (!ok && !decode_failed) {
      decode_failed = true;
      end = WatchEnd{WatchEndReason::kError,
                     KubeError::decode("watch stream line exceeds the line size limit")};
    }
    return !decode_failed;
  };
  try {
    using traits = concurrency::streams::istream::traits;
    auto buffer = core->response.body().streambuf();
    for (;;) {
      if (core->stopping()) break;
      auto c = buffer.sbumpc();
      if (c == traits::requires_async()) {
        // Nothing buffered: hand what we have to the splitter, then block (our own thread) until
        // the next byte or the end of the stream.
        if (!flush()) break;
        c = buffer.bumpc().get();
      }
      if (c == traits::eof()) {
        if (flush()) splitter.finish(on_line);
        break;
      }
      chunk.push_back(static_cast<char>(c));
      if (chunk.size() >= kWatchFlushBytes && !flush()) break;
    }
  } catch (const std::exception& e) {
    if (!core->stopping() && !decode_failed) {
      end = WatchEnd{WatchEndReason::kError, transportError(e, "watch stream")};
    }
  }
  if (core->stopping()) end = WatchEnd{WatchEndReason::kStopped, std::nullopt};
  // Close the connection if we stopped reading early (decode error, stop()).
  core->cancel.cancel();
  if (core->on_end) core->on_end(end);
  {
    std::lock_guard lock(core->mu);
    core->ended = true;
  }
  core->cv.notify_all();
}

class HttpWatch final : public Watch {
 public:
  explicit HttpWatch(std::shared_ptr<HttpWatchCore> core) : core_(std::move(core)) {
    thread_ = std::thread([core = core_] { readWatchStream(core); });
  }
  ~HttpWatch() override {
    stop();
    if (thread_.joinable()) thread_.detach();  // only when destroyed from its own handler
  }
  void stop() override {
    {
      std::lock_guard lock(core_->mu);
      core_->stop_requested = true;
    }
    // Closes the socket: the reader's blocking read ends with an error or the end of stream.
    core_->cancel.cancel();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }
  bool waitEnded(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(core_->mu);
    return core_->cv.wait_for(lock, timeout, [&] { return core_->ended; });
  }

 private:
  std::shared_ptr<HttpWatchCore> core_;
  std::thread thread_;
};

std::string objectNamespace(const ResourceType& type, const json& object) {
  return type.namespaced ? objectKeyOf(object).ns : std::string();
}

KubeStatus checkAddressable(const ResourceType& type, const ObjectKey& key) {
  if (key.name.empty()) {
    return std::unexpected(KubeError::of(KubeErrorKind::kBadRequest, "the object has no name"));
  }
  if (type.namespaced && key.ns.empty()) {
    return std::unexpected(KubeError::of(
        KubeErrorKind::kBadRequest,
        fmt::format("{} is namespaced: metadata.namespace is required", type.groupResource())));
  }
  return {};
}

}  // namespace

KubeResult<std::unique_ptr<HttpKubeClient>> HttpKubeClient::create(const ClusterConfig& config,
                                                                   HttpKubeClientOptions options) {
  if (!config.server.starts_with("https://") && !config.server.starts_with("http://")) {
    return std::unexpected(
        configError(fmt::format("server '{}' is not an http(s) URL", config.server)));
  }
  if (auto ok = checkPem(config); !ok) return std::unexpected(ok.error());
  try {
    return std::unique_ptr<HttpKubeClient>(
        new HttpKubeClient(std::make_shared<Impl>(config, std::move(options))));
  } catch (const std::exception& e) {
    return std::unexpected(configError(e.what()));
  }
}

HttpKubeClient::HttpKubeClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpKubeClient::~HttpKubeClient() = default;

KubeResult<json> HttpKubeClient::get(const ResourceType& type, const ObjectKey& key) {
  const ObjectKey k{type.namespaced ? key.ns : "", key.name};
  if (auto ok = checkAddressable(type, k); !ok) return std::unexpected(ok.error());
  return impl_->sendJson("GET", objectPath(type, k.ns, k.name));
}

KubeResult<ObjectList> HttpKubeClient::list(const ResourceType& type, std::string_view ns,
                                            const ListOptions& options) {
  auto body = impl_->sendJson(
      "GET", withQuery(collectionPath(type, type.namespaced ? ns : ""), listQuery(options)));
  if (!body) return std::unexpected(body.error());
  ObjectList out;
  auto items = body->find("items");
  if (items != body->end() && items->is_array()) {
    out.items.reserve(items->size());
    for (auto& item : *items) {
      // Items of a built-in list come without kind and apiVersion; give them back.
      if (item.is_object()) {
        if (!item.contains("kind")) item["kind"] = type.kind;
        if (!item.contains("apiVersion")) item["apiVersion"] = type.apiVersion();
      }
      out.items.push_back(std::move(item));
    }
  } else if (items != body->end() && !items->is_null()) {
    return std::unexpected(KubeError::decode("list answer: items is not an array"));
  }
  if (auto metadata = body->find("metadata"); metadata != body->end() && metadata->is_object()) {
    out.resource_version = metadata->value("resourceVersion", "");
    out.continue_token = metadata->value("continue", "");
    if (auto remaining = metadata->find("remainingItemCount");
        remaining != metadata->end() && remaining->is_number_integer()) {
      out.remaining_item_count = remaining->get<int64_t>();
    }
  }
  return out;
}

KubeResult<json> HttpKubeClient::create(const ResourceType& type, const json& object,
                                        const WriteOptions& options) {
  const std::string ns = objectNamespace(type, object);
  if (type.namespaced && ns.empty()) {
    return std::unexpected(checkAddressable(type, {"", "x"}).error());
  }
  return impl_->sendJson("POST", withQuery(collectionPath(type, ns), writeQuery(options)),
                         object.dump(), "application/json");
}

KubeResult<json> HttpKubeClient::update(const ResourceType& type, const json& object,
                                        const WriteOptions& options) {
  ObjectKey key = objectKeyOf(object);
  if (!type.namespaced) key.ns.clear();
  if (auto ok = checkAddressable(type, key); !ok) return std::unexpected(ok.error());
  return impl_->sendJson("PUT", withQuery(objectPath(type, key.ns, key.name), writeQuery(options)),
                         object.dump(), "application/json");
}

KubeResult<json> HttpKubeClient::updateStatus(const ResourceType& type, const json& object,
                                              const WriteOptions& options) {
  ObjectKey key = objectKeyOf(object);
  if (!type.namespaced) key.ns.clear();
  if (auto ok = checkAddressable(type, key); !ok) return std::unexpected(ok.error());
  return impl_->sendJson(
      "PUT", withQuery(objectPath(type, key.ns, key.name, "status"), writeQuery(options)),
      object.dump(), "application/json");
}

KubeResult<json> HttpKubeClient::patch(const ResourceType& type, const ObjectKey& key,
                                       PatchType patch_type, const json& patch,
                                       const PatchOptions& options) {
  const ObjectKey k{type.namespaced ? key.ns : "", key.name};
  if (auto ok = checkAddressable(type, k); !ok) return std::unexpected(ok.error());
  if (patch_type == PatchType::kApply && options.field_manager.empty()) {
    return std::unexpected(
        KubeError::of(KubeErrorKind::kBadRequest, "server-side apply needs a field manager"));
  }
  return impl_->sendJson("PATCH",
                         withQuery(objectPath(type, k.ns, k.name, options.subresource),
                                   patchQuery(patch_type, options)),
                         patch.dump(), std::string(patchContentType(patch_type)));
}

KubeResult<DeleteResult> HttpKubeClient::remove(const ResourceType& type, const ObjectKey& key,
                                                const DeleteOptions& options) {
  const ObjectKey k{type.namespaced ? key.ns : "", key.name};
  if (auto ok = checkAddressable(type, k); !ok) return std::unexpected(ok.error());
  // Everything goes in the body: with a body the apiserver ignores DeleteOptions in the query.
  auto body = impl_->sendJson("DELETE", objectPath(type, k.ns, k.name), deleteOptionsBody(options),
                              "application/json");
  if (!body) return std::unexpected(body.error());
  DeleteResult out;
  const bool is_status = body->value("kind", "") == "Status";
  out.deleted = is_status || !body->contains("metadata") ||
                !(*body)["metadata"].contains("deletionTimestamp");
  out.object = std::move(*body);
  return out;
}

KubeResult<std::unique_ptr<Watch>> HttpKubeClient::watch(const ResourceType& type,
                                                         std::string_view ns,
                                                         const WatchOptions& options,
                                                         WatchEventHandler on_event,
                                                         WatchEndHandler on_end) {
  const std::string path =
      withQuery(collectionPath(type, type.namespaced ? ns : ""), watchQuery(options));
  auto core = std::make_shared<HttpWatchCore>();
  core->on_event = std::move(on_event);
  core->on_end = std::move(on_end);
  const auto server_timeout = options.timeout_seconds
                                  ? std::chrono::seconds(*options.timeout_seconds)
                                  : kDefaultWatchSeconds;
  const auto start = std::chrono::steady_clock::now();
  try {
    core->client = std::make_unique<client::http_client>(
        web::uri(impl_->config().server),
        impl_->clientConfig(std::chrono::duration_cast<std::chrono::milliseconds>(
            server_timeout + kWatchClientSlack)));
    // Waits for the response headers only; the body is read by the watch's own thread.
    core->response =
        core->client->request(impl_->makeRequest("GET", path, {}, {}), core->cancel.get_token())
            .get();
  } catch (const std::exception& e) {
    impl_->record("GET", path, 0, start);
    return std::unexpected(transportError(e, fmt::format("watch {}", pathOf(path))));
  }
  const int code = core->response.status_code();
  impl_->record("GET", path, code, start);
  if (code != 200) {
    std::string body;
    try {
      const auto bytes = core->response.extract_vector().get();
      body.assign(bytes.begin(), bytes.end());
    } catch (const std::exception&) {  // the status code alone still says what happened
    }
    std::string retry_after;
    if (auto it = core->response.headers().find("Retry-After");
        it != core->response.headers().end()) {
      retry_after = it->second;
    }
    return std::unexpected(kubeErrorFromResponse(code, body, retry_after));
  }
  return std::unique_ptr<Watch>(new HttpWatch(std::move(core)));
}

KubeResult<std::string> HttpKubeClient::rawRequest(const std::string& method,
                                                   const std::string& path_and_query,
                                                   const std::string& body,
                                                   const std::string& content_type) {
  auto response = impl_->send(method, path_and_query, body, content_type);
  if (!response) return std::unexpected(response.error());
  if (response->code < 200 || response->code >= 300) {
    return std::unexpected(
        kubeErrorFromResponse(response->code, response->body, response->retry_after));
  }
  return std::move(response->body);
}

int64_t HttpKubeClient::retriesOnFreshConnection() const {
  return impl_->retries();
}

}  // namespace rtable::op
