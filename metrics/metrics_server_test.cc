// The metrics endpoint over real sockets: every path, method and size a browser, a probe or a port
// scan sends gets an HTTP answer, and /metrics keeps answering afterwards.
//
// The ballast below gives this test process the static TLS that the coordinator and the workers
// carry through OpenBLAS (60 KiB): glibc places static TLS on every thread's stack, which is what
// made civetweb's fixed 100 KiB worker stacks overflow on its 404 path. With it, this test crashes
// on any endpoint that runs its handlers on small fixed stacks.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/http_server.h"
#include "metrics/metrics_server.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace dattn {
namespace metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

thread_local std::array<char, 64 << 10> tls_ballast;

// Host and port of "127.0.0.1:PORT".
int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

// Connects to 127.0.0.1:port, sends `request`, and reads until the server closes the connection
// (or 10 s pass). "" when the connection fails.
std::string Exchange(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // The server may answer and close before reading everything.
    sent += static_cast<size_t>(n);
  }
  std::string response;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return response;
}

std::string Get(int port, const std::string& path) {
  return Exchange(port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\n\r\n"));
}

// The status code of a response ("HTTP/1.1 404 Not Found" -> 404), or -1.
int StatusOf(const std::string& response) {
  int code = -1;
  if (response.size() < 12 || !absl::StartsWith(response, "HTTP/1.")) return -1;
  if (!absl::SimpleAtoi(response.substr(9, 3), &code)) return -1;
  return code;
}

std::string BodyOf(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tls_ballast[0] = 1;  // Keeps the ballast in the binary.
    prometheus::BuildCounter()
        .Name("dattn_test_jobs_submitted_total")
        .Help("Jobs submitted (unit: jobs).")
        .Register(*registry_)
        .Add({{"kind", "attention"}})
        .Increment();
    absl::StatusOr<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start("127.0.0.1:0", registry_, "dattn-test");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    port_ = PortOf(server_->address());
    ASSERT_GT(port_, 0);
  }

  void ExpectMetricsServed() {
    const std::string r = Get(port_, "/metrics");
    ASSERT_EQ(StatusOf(r), 200) << r;
    EXPECT_THAT(r, HasSubstr("Content-Type: text/plain; version=0.0.4"));
    EXPECT_THAT(BodyOf(r), HasSubstr("dattn_test_jobs_submitted_total{kind=\"attention\"} 1"));
  }

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<MetricsServer> server_;
  int port_ = 0;
};

TEST_F(MetricsServerTest, ServesMetrics) { ExpectMetricsServed(); }

// before_scrape runs before every /metrics answer (and only then), so a gauge it sets is current in
// that answer; once the registry is gone, /metrics answers 503 and the other paths still answer.
TEST(MetricsServerScrapeTest, BeforeScrapeRunsForEveryScrapeAndTheRegistryIsWeak) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Gauge& gauge = prometheus::BuildGauge()
                                 .Name("dattn_test_scrapes")
                                 .Help("Scrapes so far (unit: scrapes).")
                                 .Register(*registry)
                                 .Add({});
  std::atomic<int> calls{0};
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", registry, "dattn-test", [&] { gauge.Set(++calls); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->address());
  EXPECT_THAT(BodyOf(Get(port, "/metrics")), HasSubstr("dattn_test_scrapes 1\n"));
  EXPECT_EQ(StatusOf(Get(port, "/healthz")), 200);
  EXPECT_THAT(BodyOf(Get(port, "/metrics")), HasSubstr("dattn_test_scrapes 2\n"));
  EXPECT_EQ(calls.load(), 2);
  registry.reset();
  const std::string r = Get(port, "/metrics");
  EXPECT_EQ(StatusOf(r), 503) << r;
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(StatusOf(Get(port, "/healthz")), 200);
}

TEST(MetricsServerReadyTest, ReadyzFollowsTheProcessReadiness) {
  auto registry = std::make_shared<prometheus::Registry>();
  std::atomic<bool> ready{false};
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", registry, "dattn-test", nullptr, [&]() -> absl::Status {
        if (ready) return absl::OkStatus();
        return absl::UnavailableError("the job store cannot be written");
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->address());
  std::string r = Get(port, "/readyz");
  EXPECT_EQ(StatusOf(r), 503) << r;
  EXPECT_THAT(BodyOf(r), HasSubstr("not ready: the job store cannot be written"));
  EXPECT_EQ(StatusOf(Get(port, "/healthz")), 200) << "liveness does not follow readiness";
  ready = true;
  r = Get(port, "/readyz");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_THAT(BodyOf(r), StartsWith("ready"));
  EXPECT_THAT(BodyOf(Get(port, "/")), HasSubstr("/readyz"));
}

// What browsers, probes and scanners ask for: each gets an answer and the endpoint keeps serving.
TEST_F(MetricsServerTest, EveryPathGetsAnAnswer) {
  std::string r = Get(port_, "/");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_THAT(BodyOf(r), HasSubstr("/metrics"));
  EXPECT_THAT(BodyOf(r), HasSubstr("/healthz"));
  EXPECT_THAT(BodyOf(r), HasSubstr("dattn-test"));

  r = Get(port_, "/healthz");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_THAT(BodyOf(r), StartsWith("ok"));

  r = Get(port_, "/favicon.ico");
  EXPECT_EQ(StatusOf(r), 404) << r;
  r = Get(port_, "/metrics/../etc/passwd");
  EXPECT_EQ(StatusOf(r), 404) << r;
  r = Get(port_, "/metrics?name[]=dattn_jobs");  // A query is ignored.
  EXPECT_EQ(StatusOf(r), 200) << r;

  r = Get(port_, "/" + std::string(10 << 10, 'a'));  // 10 KiB path.
  EXPECT_EQ(StatusOf(r), 404) << r.substr(0, 200);
  r = Get(port_, "/" + std::string(100 << 10, 'b'));  // Over the 16 KiB request head limit.
  EXPECT_EQ(StatusOf(r), 431) << r.substr(0, 200);

  ExpectMetricsServed();
}

TEST_F(MetricsServerTest, MethodsOtherThanGetAndHead) {
  std::string r = Exchange(port_, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_THAT(r, HasSubstr("Content-Length: "));
  EXPECT_EQ(BodyOf(r), "");  // HEAD: headers only.

  r = Exchange(port_, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello=world");
  EXPECT_EQ(StatusOf(r), 405) << r;
  EXPECT_THAT(r, HasSubstr("Allow: GET, HEAD"));
  r = Exchange(port_, "PUT / HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde");
  EXPECT_EQ(StatusOf(r), 405) << r;
  r = Exchange(port_, "BREW /pot HTTP/1.1\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 405) << r;
  r = Exchange(port_, "OPTIONS * HTTP/1.1\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 405) << r;

  ExpectMetricsServed();
}

TEST_F(MetricsServerTest, MalformedRequestsGet400) {
  for (const std::string& request :
       {std::string("garbage\r\n\r\n"), std::string("GET\r\n\r\n"),
        std::string("GET /metrics\r\n\r\n"), std::string("GET metrics HTTP/1.1\r\n\r\n"),
        std::string("GET /metrics SMTP/1.0\r\n\r\n"),
        std::string("\x16\x03\x01\x02\x00\x01\r\n\r\n"),
        std::string("GET /a\x01 HTTP/1.1\r\n\r\n")}) {
    const std::string r = Exchange(port_, request);
    EXPECT_EQ(StatusOf(r), 400) << request << " -> " << r;
  }
  // Bare LF line ends are tolerated.
  EXPECT_EQ(StatusOf(Exchange(port_, "GET /healthz HTTP/1.0\n\n")), 200);
  ExpectMetricsServed();
}

// A client that connects and says nothing (or stops half-way) is cut off after the read timeout;
// meanwhile the other serving threads answer.
TEST(HttpServerTest, SilentClientsTimeOutWhileOthersAreServed) {
  tls_ballast[0] = 1;
  HttpServer::Options options;
  options.threads = 2;
  options.read_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      "127.0.0.1:0",
      [](const HttpRequest& request) {
        HttpResponse response;
        response.body = absl::StrCat("path ", request.path, "\n");
        return response;
      },
      options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->address());
  std::string silent_reply;
  std::thread silent([&] { silent_reply = Exchange(port, "GET /slow HTTP/1.1\r\n"); });
  const std::string r = Get(port, "/x");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_EQ(BodyOf(r), "path /x\n");
  silent.join();
  EXPECT_EQ(StatusOf(silent_reply), 408) << silent_reply;
}

// Many clients at once, more than the serving threads: all are answered.
TEST_F(MetricsServerTest, ConcurrentClients) {
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      const std::string r = Get(port_, i % 2 == 0 ? "/metrics" : "/favicon.ico");
      if (StatusOf(r) == (i % 2 == 0 ? 200 : 404)) ++ok;
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok.load(), 16);
}

// Waiting for connections costs no CPU: the serving threads block in poll.
TEST(HttpServerTest, AnIdleServerDoesNotSpin) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      "127.0.0.1:0", [](const HttpRequest&) { return HttpResponse{}; }, HttpServer::Options());
  ASSERT_TRUE(server.ok()) << server.status();
  auto cpu_seconds = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  };
  const double before = cpu_seconds();
  absl::SleepFor(absl::Milliseconds(500));  // The interval measured, not a wait for a condition.
  EXPECT_LT(cpu_seconds() - before, 0.1) << "CPU seconds used by an idle server in 0.5 s";
}

// A handler that throws answers 500; the server goes on.
TEST(HttpServerTest, AThrowingHandlerIsA500) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      "127.0.0.1:0",
      [](const HttpRequest& request) -> HttpResponse {
        if (request.path == "/boom") throw std::runtime_error("boom");
        return HttpResponse{};
      },
      HttpServer::Options());
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->address());
  EXPECT_EQ(StatusOf(Get(port, "/boom")), 500);
  EXPECT_EQ(StatusOf(Get(port, "/fine")), 200);
}

TEST(HttpServerTest, BadAddressesAndPortsInUse) {
  auto handler = [](const HttpRequest&) { return HttpResponse{}; };
  for (const char* address : {"", "7071", "127.0.0.1:", ":7071", "127.0.0.1:70000", "127.0.0.1:x",
                              "no-such-host.invalid:1"}) {
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start(address, handler, HttpServer::Options());
    EXPECT_FALSE(server.ok()) << address;
    EXPECT_THAT(server.status().message(), HasSubstr(absl::StrCat("\"", address, "\"")))
        << server.status();
  }
  absl::StatusOr<std::unique_ptr<HttpServer>> first =
      HttpServer::Start("127.0.0.1:0", handler, HttpServer::Options());
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<HttpServer>> second =
      HttpServer::Start((*first)->address(), handler, HttpServer::Options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr((*first)->address()));
}

// Stopping with a client connected and silent does not wait for the client.
TEST(HttpServerTest, StopsPromptlyWithAnIdleClientConnected) {
  HttpServer::Options options;
  options.read_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      "127.0.0.1:0", [](const HttpRequest&) { return HttpResponse{}; }, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->address());
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::send(fd, "GET", 3, MSG_NOSIGNAL), 3);
  // Whether a serving thread holds the half-sent request or it still waits in the backlog, the
  // stop must not wait out the 30 s read timeout.
  const auto start = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ::close(fd);
}

}  // namespace
}  // namespace metrics
}  // namespace dattn
