#include "metrics/http_server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dattn {
namespace metrics {
namespace {

// After the response, how long and how much unread input is discarded before closing, so that the
// kernel does not answer the client's unread bytes with a reset that can destroy the response.
constexpr absl::Duration kLingerTime = absl::Milliseconds(200);
constexpr size_t kLingerBytes = 1 << 20;

// poll's timeout for `deadline`: -1 (no timeout) for InfiniteFuture, else the milliseconds left,
// rounded up.
int RemainingMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), int64_t{1} << 30));
}

// tchar of RFC 9110: the characters of a method token.
bool TokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

// A request line's bytes are printable ASCII and single spaces; anything else (a TLS handshake,
// binary noise) cannot become valid by reading more.
bool RequestLineChar(char c) { return c >= 0x20 && c < 0x7f; }

std::string ErrorBody(int status, absl::string_view detail) {
  return absl::StrCat(status, " ", HttpReasonPhrase(status), ": ", detail, "\n");
}

HttpResponse ErrorResponse(int status, absl::string_view detail) {
  HttpResponse response;
  response.status = status;
  response.body = ErrorBody(status, detail);
  return response;
}

// The outcome of reading one request head.
struct ParsedRequest {
  HttpRequest request;
  std::optional<HttpResponse> error;  // Set when the server answers by itself.
};

ParsedRequest ParseRequestLine(absl::string_view line) {
  ParsedRequest parsed;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t first = line.find(' ');
  const size_t second = first == absl::string_view::npos ? first : line.find(' ', first + 1);
  if (second == absl::string_view::npos || line.find(' ', second + 1) != absl::string_view::npos) {
    parsed.error = ErrorResponse(400, "the request line is not \"METHOD /path HTTP/1.1\"");
    return parsed;
  }
  const absl::string_view method = line.substr(0, first);
  const absl::string_view target = line.substr(first + 1, second - first - 1);
  const absl::string_view version = line.substr(second + 1);
  const bool method_ok = !method.empty() && std::all_of(method.begin(), method.end(), TokenChar);
  const bool version_ok = version.size() == 8 && version.substr(0, 7) == "HTTP/1." &&
                          version[7] >= '0' && version[7] <= '9';
  if (!method_ok || !version_ok || target.empty()) {
    parsed.error = ErrorResponse(400, "the request line is not \"METHOD /path HTTP/1.1\"");
    return parsed;
  }
  if (method != "GET" && method != "HEAD") {
    parsed.error = ErrorResponse(405, "this endpoint serves GET and HEAD only");
    return parsed;
  }
  if (target.front() != '/') {
    parsed.error = ErrorResponse(400, "the request target must be a path starting with '/'");
    return parsed;
  }
  parsed.request.method = std::string(method);
  const size_t question = target.find('?');
  parsed.request.path = std::string(target.substr(0, question));
  if (question != absl::string_view::npos) {
    parsed.request.query = std::string(target.substr(question + 1));
  }
  return parsed;
}

// Waits until `fd` is ready for `events` or the wake fd fires or the deadline passes. 1: ready;
// 0: timed out; -1: woken (the server is stopping) or the poll failed.
int WaitFor(int fd, short events, int wake_fd, absl::Time deadline) {
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(fds, 2, RemainingMs(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (fds[1].revents != 0) return -1;
    if (n == 0) return 0;
    return 1;
  }
}

}  // namespace

const char* HttpReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              HttpHandler handler,
                                                              const Options& options) {
  const std::string quoted = absl::StrCat("\"", address, "\"");
  if (options.threads < 1 || options.max_request_head_bytes < 64 ||
      options.read_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP server options for ", quoted, ": threads must be >= 1 (got ",
                     options.threads, "), max_request_head_bytes >= 64 (got ",
                     options.max_request_head_bytes, ") and both timeouts > 0"));
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP address must be HOST:PORT, got ", quoted));
  }
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  int port = -1;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP address ", quoted, ": the port must be 0 .. 65535"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP address ", quoted, ": cannot resolve \"",
                                                   host, "\": ", ::gai_strerror(gai)));
  }
  int listen_fd = -1;
  std::string bind_error = "no address to bind";
  for (addrinfo* ai = found; ai != nullptr && listen_fd < 0; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      bind_error = absl::StrCat("socket: ", std::strerror(errno));
      continue;
    }
    // SO_REUSEADDR lets a restart bind while old connections sit in TIME_WAIT; without
    // SO_REUSEPORT a second live process on the same port still fails to bind.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      bind_error = absl::StrCat("bind: ", std::strerror(errno));
      ::close(fd);
      continue;
    }
    if (::listen(fd, 64) != 0) {
      bind_error = absl::StrCat("listen: ", std::strerror(errno));
      ::close(fd);
      continue;
    }
    listen_fd = fd;
  }
  ::freeaddrinfo(found);
  if (listen_fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", address, ": ", bind_error));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  int bound_port = port;
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) == 0) {
    if (bound.ss_family == AF_INET) {
      bound_port = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    } else if (bound.ss_family == AF_INET6) {
      bound_port = ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    }
  }
  const int wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int err = errno;
    ::close(listen_fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", address, ": eventfd: ", std::strerror(err)));
  }
  std::unique_ptr<HttpServer> server(
      new HttpServer(listen_fd, wake_fd, absl::StrCat(address.substr(0, colon), ":", bound_port),
                     std::move(handler), options));
  for (int i = 0; i < options.threads; ++i) {
    server->threads_.emplace_back([s = server.get()] { s->ServeLoop(); });
  }
  return server;
}

HttpServer::HttpServer(int listen_fd, int wake_fd, std::string address, HttpHandler handler,
                       Options options)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      address_(std::move(address)),
      handler_(std::move(handler)),
      options_(options) {}

HttpServer::~HttpServer() {
  stopping_.store(true);
  // The counter stays non-zero (nobody reads it), so every poll on wake_fd_ returns from now on.
  const uint64_t one = 1;
  while (::write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  for (std::thread& t : threads_) t.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void HttpServer::ServeLoop() {
  while (!stopping_.load()) {
    const int ready = WaitFor(listen_fd_, POLLIN, wake_fd_, absl::InfiniteFuture());
    if (ready == 0) continue;  // Not expected without a deadline.
    if (ready < 0) {
      if (stopping_.load()) return;
      // poll itself failed (not expected): do not spin.
      WaitFor(-1, 0, wake_fd_, absl::Now() + absl::Milliseconds(100));
      continue;
    }
    // Several threads wake for one connection; the others get EAGAIN.
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        // Out of descriptors or memory: wait a little instead of spinning on the ready socket.
        WaitFor(-1, 0, wake_fd_, absl::Now() + absl::Milliseconds(100));
      }
      continue;
    }
    ServeConnection(fd);
    ::close(fd);
  }
}

void HttpServer::ServeConnection(int fd) {
  // 1. The request head, up to the blank line.
  std::string head;
  const absl::Time read_deadline = absl::Now() + options_.read_timeout;
  ParsedRequest parsed;
  bool have_request = false;
  char buffer[4096];
  while (!have_request) {
    const int ready = WaitFor(fd, POLLIN, wake_fd_, read_deadline);
    if (ready < 0) return;
    if (ready == 0) {
      parsed.error = ErrorResponse(408, absl::StrCat("the request head did not arrive within ",
                                                     absl::FormatDuration(options_.read_timeout)));
      break;
    }
    const size_t room = options_.max_request_head_bytes + 4 - head.size();
    const ssize_t n = ::recv(fd, buffer, std::min(sizeof(buffer), room), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) return;  // The client went away (or reset) before a whole head: nobody to answer.
    const size_t scanned = head.size() >= 3 ? head.size() - 3 : 0;
    head.append(buffer, static_cast<size_t>(n));
    // The first line alone says whether this can be HTTP; garbage is refused at once.
    const size_t line_end = head.find('\n');
    const absl::string_view line =
        absl::string_view(head).substr(0, line_end == std::string::npos ? head.size() : line_end);
    const absl::string_view checked =
        !line.empty() && line.back() == '\r' ? line.substr(0, line.size() - 1) : line;
    if (!std::all_of(checked.begin(), checked.end(), RequestLineChar)) {
      parsed.error =
          ErrorResponse(400, "the request line holds bytes that are not printable ASCII");
      break;
    }
    size_t end = head.find("\r\n\r\n", scanned);
    size_t end_len = 4;
    if (end == std::string::npos) {
      end = head.find("\n\n", scanned);
      end_len = 2;
    }
    if (end != std::string::npos && end + end_len <= options_.max_request_head_bytes) {
      parsed = ParseRequestLine(line);
      have_request = true;
    } else if (head.size() > options_.max_request_head_bytes) {
      parsed.error = ErrorResponse(431, absl::StrCat("the request head is over ",
                                                     options_.max_request_head_bytes, " bytes"));
      break;
    }
  }

  // 2. The response.
  HttpResponse response;
  std::string allow;
  if (parsed.error.has_value()) {
    response = *std::move(parsed.error);
    if (response.status == 405) allow = "Allow: GET, HEAD\r\n";
  } else {
    try {
      response = handler_(parsed.request);
    } catch (const std::exception& e) {
      response = ErrorResponse(500, e.what());
    } catch (...) {
      response = ErrorResponse(500, "the handler failed");
    }
  }
  const bool head_only = have_request && parsed.request.method == "HEAD";
  std::string out =
      absl::StrCat("HTTP/1.1 ", response.status, " ", HttpReasonPhrase(response.status),
                   "\r\nContent-Type: ", response.content_type,
                   "\r\nContent-Length: ", response.body.size(), "\r\n", allow,
                   "Cache-Control: no-store\r\nX-Content-Type-Options: "
                   "nosniff\r\nConnection: close\r\n\r\n");
  if (!head_only) out += response.body;

  const absl::Time write_deadline = absl::Now() + options_.write_timeout;
  size_t sent = 0;
  while (sent < out.size()) {
    const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (WaitFor(fd, POLLOUT, wake_fd_, write_deadline) != 1) return;
      continue;
    }
    return;  // The client went away.
  }

  // 3. A lingering close: no more output, then discard what the client still sends (an unread
  // body, the rest of an oversized head) for a moment, so that closing does not reset the
  // connection before the client has read the response.
  ::shutdown(fd, SHUT_WR);
  const absl::Time linger_deadline = absl::Now() + kLingerTime;
  size_t discarded = 0;
  while (discarded < kLingerBytes) {
    if (WaitFor(fd, POLLIN, wake_fd_, linger_deadline) != 1) return;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) return;
    discarded += static_cast<size_t>(n);
  }
}

}  // namespace metrics
}  // namespace dattn
