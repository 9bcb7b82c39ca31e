// A small HTTP/1.1 server for the replica's API (DESIGN.md 2.8): blocking sockets, a thread per
// connection, keep-alive, Content-Length and chunked request bodies, and "Expect: 100-continue".
// curl sends that header with every body over 1 MiB and waits a second for the interim answer;
// cpprestsdk's listener never gives it, which made every large curl insert a second slower.
//
// A handler reads the body and writes the response through blocking calls, so a slow peer holds
// back the handler (flow control comes for free) until the socket timeout.
//
// Thread safety: the handler runs on many connection threads at once; stop() from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rtable/common/tls.h"

namespace rtable::core {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;
  std::string path;   // the target before '?'
  std::string query;  // the target after '?', not decoded
  int minor_version = 1;
  HttpHeaders headers;  // names lower-cased

  // The first header of that name, in any case (header names are case-insensitive).
  std::optional<std::string> header(std::string_view name) const;
};

// One request and its response.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;
  // Up to `size` bytes of the body, 0 at its end. An error: the body is malformed or the client
  // went away (or sent nothing for the socket timeout).
  virtual std::expected<std::size_t, std::string> readBody(char* data, std::size_t size) = 0;
  // The whole response, once. False: the client went away.
  virtual bool respond(int status, const HttpHeaders& headers, std::string_view body) = 0;
  // A response of `content_length` bytes that writeBody() sends piece by piece.
  virtual bool beginResponse(int status, const HttpHeaders& headers, uint64_t content_length) = 0;
  virtual bool writeBody(const char* data, std::size_t size) = 0;
};

struct HttpServerOptions {
  std::size_t max_connections = 1024;        // more are answered 503 (plain HTTP) and closed
  std::chrono::seconds socket_timeout{60};   // an idle keep-alive connection, or a stalled peer
  std::size_t max_header_bytes = 64 * 1024;  // request line and headers
  // HTTPS only, with this server context (its renewed certificates are picked up per connection);
  // null: plain HTTP. A client that fails the handshake is closed without an answer.
  std::shared_ptr<common::TlsContext> tls;
};

class HttpServer {
 public:
  using Handler = std::function<void(HttpExchange&)>;

  // Listens on address:port (port 0: any free port, see port()). The address is numeric
  // (0.0.0.0, 127.0.0.1, ::) or a host name.
  static std::expected<std::unique_ptr<HttpServer>, std::string> start(
      const std::string& address, uint16_t port, Handler handler, HttpServerOptions options = {});
  ~HttpServer();  // stop()

  uint16_t port() const;
  // Stops accepting, cuts every connection (a handler still running finds its client gone) and
  // waits until every connection thread has ended. Idempotent.
  void stop();

  class Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// Serves the requests arriving on the connected socket `fd` (plain HTTP) with `handler` until
// the connection ends, as the server serves each connection it accepts; `fd` stays open. The
// request parser on bytes of one's choosing, without a listener (fuzz/fuzz_http_request.cpp).
void serveHttpConnection(int fd, const HttpServer::Handler& handler,
                         const HttpServerOptions& options = {});

// "Continue", "OK", "Not Found", ... ("Unknown" for codes it does not know).
std::string_view httpReasonPhrase(int status);

}  // namespace rtable::core
