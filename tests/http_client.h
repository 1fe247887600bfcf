// A minimal HTTP/1.0 client for multi-process tests: one GET per connection to a numeric IPv4
// address, the whole response read until the server closes (metrics endpoints, Prometheus' API).
// Not for production use: no redirects, no chunked encoding (HTTP/1.0 servers do not send it), no
// TLS. Thread-safe (no shared state).
#ifndef DATTN_TESTS_HTTP_CLIENT_H_
#define DATTN_TESTS_HTTP_CLIENT_H_

#include <chrono>
#include <string>

namespace dattn::testing {

struct HttpResult {
  int status = -1;    // -1: no answer (connection refused, timeout, malformed response).
  std::string body;   // After the head.
  std::string error;  // Why status is -1.
};

// GET http://HOST:PORT/TARGET where `address` is "HOST:PORT" (numeric IPv4) and `target` starts
// with '/' and is already percent-encoded; gives up after `timeout` in all.
HttpResult HttpGet(const std::string& address, const std::string& target,
                   std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Percent-encodes `text` for a query parameter value (RFC 3986 unreserved characters stay).
std::string UrlEncode(const std::string& text);

}  // namespace dattn::testing

#endif  // DATTN_TESTS_HTTP_CLIENT_H_
