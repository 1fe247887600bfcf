// HttpServer: a small HTTP/1.1 server for a process's operational endpoints (/metrics, /healthz),
// on its own sockets and threads. MetricsServer (metrics/metrics_server.h) is built on it; any
// dattn process (coordinator, worker) can serve its metrics through either.
//
// Why not civetweb (prometheus-cpp's Exposer): Debian's civetweb 1.15 starts its threads with a
// fixed 100 KiB stack (pthread_attr_setstacksize(102400), its CMake default), and glibc carves
// every thread's static TLS out of that stack. The coordinator links OpenBLAS, whose static TLS is
// 60 KiB, so civetweb's threads had about 35 KiB left, and its error path (mg_send_http_error,
// reached by any path without a handler: "/", "/favicon.ico") overflowed into the guard page:
// SIGSEGV, and the whole coordinator died. Here requests are served on std::threads with the
// process's default stack (8 MiB), and nothing on the request path depends on how much of it static
// TLS takes.
//
// What it serves, for any request:
//   - One request per connection: the response carries "Connection: close" and the server closes
//     the connection after it. Request bodies are never read.
//   - GET and HEAD go to the handler (HEAD gets the handler's headers without the body). Any other
//     method: 405 with "Allow: GET, HEAD".
//   - A request line that is not "METHOD /path HTTP/1.x" (origin form, printable ASCII): 400. A
//     request head (request line + headers) over max_request_head_bytes: 431. A head not complete
//     within read_timeout: 408. A handler that throws: 500.
//   - The query string ("?...") is split off: the handler sees the path alone, undecoded.
//
// Threads: `threads` serving threads each accept and serve one connection at a time, so at most
// that many clients are served at once; more wait in the listen backlog. A client that stalls holds
// its thread for at most read_timeout + write_timeout.
//
// Thread-safety: the handler is called from the serving threads, several at once; it must be
// thread-safe. Start and the destructor are called from one thread.
#ifndef DATTN_METRICS_HTTP_SERVER_H_
#define DATTN_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dattn {
namespace metrics {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD" (other methods never reach the handler).
  std::string path;    // The target up to '?', as sent: "/metrics".
  std::string query;   // After '?', without it; "" when there is none.
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  struct Options {
    int threads = 4;                                  // Connections served at once (>= 1).
    size_t max_request_head_bytes = 16 << 10;         // Request line + headers (>= 64).
    absl::Duration read_timeout = absl::Seconds(5);   // To receive the whole request head.
    absl::Duration write_timeout = absl::Seconds(5);  // To send the whole response.
  };

  // Listens on `address`, "HOST:PORT" (a name, an IPv4 address, or "[IPv6]"; port 0 picks a free
  // port), and serves every request with `handler`. INVALID_ARGUMENT quoting the address when it
  // is malformed or the host does not resolve; INVALID_ARGUMENT for options out of range;
  // UNAVAILABLE naming the address when it cannot be bound (in use, not local).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           HttpHandler handler,
                                                           const Options& options);

  // Stops accepting, cuts off connections being served (without waiting for slow clients) and
  // joins the serving threads.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // "HOST:PORT" actually bound: the host as given, the real port when 0 was asked for.
  const std::string& address() const { return address_; }

 private:
  HttpServer(int listen_fd, int wake_fd, std::string address, HttpHandler handler, Options options);
  void ServeLoop();
  void ServeConnection(int fd);

  const int listen_fd_;
  const int wake_fd_;  // An eventfd: readable once the destructor runs, waking every poll.
  const std::string address_;
  const HttpHandler handler_;
  const Options options_;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
};

// The reason phrase of an HTTP status code ("Not Found"); "Unknown" for codes it does not list.
const char* HttpReasonPhrase(int status);

}  // namespace metrics
}  // namespace dattn

#endif  // DATTN_METRICS_HTTP_SERVER_H_
