// The replica API's HTTP/1.1 request parser on untrusted bytes (anyone who reaches port 8123):
// request lines, headers, Content-Length and chunked bodies, Expect: 100-continue, pipelined
// requests on one keep-alive connection. The bytes arrive on one end of a socket pair; the
// server's connection loop (serveHttpConnection, as for every accepted connection) reads them
// from the other, and a handler reads each body whole and answers. No crash, no sanitizer report,
// no hang (libFuzzer's -timeout), and a body read never yields more bytes than were sent.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rtable/replication_core/http_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return 0;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
  // Room for the input and every answer: nobody reads the answers until the end.
  const int buffer = 4 << 20;
  for (int fd : fds) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  }
  std::size_t sent = 0;
  while (sent < size) {
    const ssize_t n = write(fds[1], data + sent, size - sent);
    if (n <= 0) std::abort();
    sent += static_cast<std::size_t>(n);
  }
  shutdown(fds[1], SHUT_WR);  // the client is done: the server sees the end after the bytes

  std::size_t body_bytes = 0;
  rtable::core::HttpServerOptions options;
  options.max_header_bytes = 4096;
  rtable::core::serveHttpConnection(
      fds[0],
      [&](rtable::core::HttpExchange& exchange) {
        const auto& request = exchange.request();
        (void)request.header("content-type");
        char chunk[4096];
        std::string body;
        for (;;) {
          auto n = exchange.readBody(chunk, sizeof(chunk));
          if (!n || *n == 0) break;
          body.append(chunk, *n);
        }
        body_bytes += body.size();
        exchange.respond(200, {{"Content-Type", "text/plain"}},
                         request.method + " " + request.path + " " + std::to_string(body.size()));
      },
      options);
  close(fds[0]);
  close(fds[1]);
  if (body_bytes > size) {
    std::fprintf(stderr, "bodies of %zu bytes read from %zu bytes of input\n", body_bytes, size);
    std::abort();
  }
  return 0;
}
