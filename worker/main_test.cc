// End-to-end tests of the dattn-worker binary: health endpoint, registration with a fake
// coordinator, the SIGTERM shutdown (running task cancelled and reported, exit status 0), and its
// own metrics endpoint (--metrics-listen).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <poll.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/testing/test_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/fake_registry.h"
#include "worker/test_plans.h"

namespace dattn {
namespace worker {
namespace {

// A TCP port that was free a moment ago.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class WorkerProcess {
 public:
  explicit WorkerProcess(std::vector<std::string> args) {
    args.insert(args.begin(), testutil::RunfilePath("worker/dattn-worker"));
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~WorkerProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return pid_ > 0; }
  void Signal(int sig) { kill(pid_, sig); }
  // The exit status, or -1 if the process is still running after `timeout`.
  int WaitExit(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
};

// Polls the health endpoint until `service` reports `want`, up to `timeout`.
bool WaitHealth(grpc::health::v1::Health::Stub* stub, const std::string& service,
                grpc::health::v1::HealthCheckResponse::ServingStatus want,
                absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    // Wait for the connection inside the call: a fail-fast call on a channel in backoff returns at
    // once, and then nothing in this process would drive the reconnection but gRPC's 5 s backup
    // poller.
    context.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    if (stub->Check(&context, request, &response).ok() && response.status() == want) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

using Serving = grpc::health::v1::HealthCheckResponse;

// A channel that retries connecting quickly while the binary starts up.
std::shared_ptr<grpc::Channel> HealthChannel(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

TEST(WorkerMainTest, ServesHealthRegistersAndShutsDownCleanlyOnSigterm) {
  const std::string address = "unix:" + TestSocketPath("main");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeRegistry& fake = coordinator.registry();
  const int port = FreePort();
  ASSERT_GT(port, 0);
  WorkerProcess worker({"--insecure", "--coordinator", address, "--name", "main-test", "--slots",
                        "1", "--threads", "1", "--heartbeat-ms", "100", "--health-port",
                        std::to_string(port), "--memory-bytes", "1073741824"});
  ASSERT_TRUE(worker.started());

  auto channel = HealthChannel(port);
  auto health = grpc::health::v1::Health::NewStub(channel);
  ASSERT_TRUE(WaitHealth(health.get(), "", Serving::SERVING)) << "liveness never SERVING";
  ASSERT_TRUE(WaitHealth(health.get(), "dattn-worker", Serving::SERVING))
      << "readiness never SERVING";
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
  {
    absl::MutexLock lock(&fake.mu_);
    ASSERT_EQ(fake.registrations_.size(), 1u);
    EXPECT_EQ(fake.registrations_[0].name(), "main-test");
    EXPECT_EQ(fake.registrations_[0].address(), absl::StrCat("127.0.0.1:", port));
    EXPECT_EQ(fake.registrations_[0].capabilities().total_memory_bytes(), 1073741824);
  }

  // A task that would run for hours: SIGTERM must cancel it, report it, and exit 0.
  v1::WorkerCommand command;
  v1::TaskAssignment* task = command.mutable_assign();
  task->set_task_id("j-main/1/0");
  v1::AttentionJobSpec* job = task->mutable_spec()->mutable_attention();
  job->mutable_attention()->add_segment_lengths(512);
  job->mutable_attention()->add_dilation_rates(1);
  job->mutable_shape()->set_batch(1);
  job->mutable_shape()->set_seq_len(2048);
  job->mutable_shape()->set_num_heads(4);
  job->mutable_shape()->set_head_dim(32);
  job->set_dtype(v1::DTYPE_FP32);
  job->set_iterations(1000000);
  job->set_num_ranks(1);
  *task = Planned(*task);
  fake.Push(command);
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasStateLocked("j-main/1/0", v1::TASK_STATE_STARTED);
  }));

  worker.Signal(SIGTERM);
  EXPECT_EQ(worker.WaitExit(absl::Seconds(10)), 0);
  absl::MutexLock lock(&fake.mu_);
  std::vector<v1::TaskReport> reports = fake.ReportsOfLocked("j-main/1/0");
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().state(), v1::TASK_STATE_CANCELLED);
}

TEST(WorkerMainTest, LiveButNotReadyWithoutACoordinatorAndStillExitsOnSigint) {
  const std::string address = "unix:" + TestSocketPath("nobody");
  const int port = FreePort();
  ASSERT_GT(port, 0);
  WorkerProcess worker({"--insecure", "--coordinator", address, "--health-port",
                        std::to_string(port), "--threads", "1", "--shutdown-timeout-s", "1"});
  ASSERT_TRUE(worker.started());
  auto channel = HealthChannel(port);
  auto health = grpc::health::v1::Health::NewStub(channel);
  ASSERT_TRUE(WaitHealth(health.get(), "", Serving::SERVING));
  EXPECT_TRUE(WaitHealth(health.get(), "dattn-worker", Serving::NOT_SERVING));
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(worker.WaitExit(absl::ZeroDuration()), -1) << "exited without a coordinator";
  worker.Signal(SIGINT);
  EXPECT_EQ(worker.WaitExit(absl::Seconds(10)), 0);
}

// GET http://127.0.0.1:port/path: the whole response (head and body), or "" when nothing answers
// within 5 s.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  char buffer[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

// GETs /metrics until `want` appears in it (up to 10 s); returns the last body.
// Whether the exposition `body` has the sample line `sample` ("name{labels} value"), whole: a
// substring match would also find "dattn_worker_ready 1" in its own HELP text ("... 1 while ...").
bool HasSample(const std::string& body, const std::string& sample) {
  return absl::StrContains("\n" + body, "\n" + sample + "\n");
}

std::string WaitForMetrics(int port, const std::string& want) {
  std::string body;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    const std::string r = HttpGet(port, "/metrics");
    const size_t end = r.find("\r\n\r\n");
    body = end == std::string::npos ? "" : r.substr(end + 4);
    if (HasSample(body, want)) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return body;
}

// --metrics-listen: the worker serves its own dattn_worker_* metrics, valid for promtool, that
// follow a rank from assignment to success and the worker's readiness.
TEST(WorkerMainTest, ServesItsOwnMetrics) {
  const std::string address = "unix:" + TestSocketPath("metrics");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeRegistry& fake = coordinator.registry();
  const int health_port = FreePort(), metrics_port = FreePort();
  ASSERT_GT(health_port, 0);
  ASSERT_GT(metrics_port, 0);
  WorkerProcess worker({"--insecure", "--coordinator", address, "--name", "metrics-test",
                        "--threads", "1", "--heartbeat-ms", "100", "--health-port",
                        std::to_string(health_port), "--metrics-listen",
                        absl::StrCat("127.0.0.1:", metrics_port), "--memory-bytes", "1073741824"});
  ASSERT_TRUE(worker.started());
  std::string text = WaitForMetrics(metrics_port, "dattn_worker_ready 1");
  ASSERT_TRUE(HasSample(text, "dattn_worker_ready 1")) << text;
  EXPECT_TRUE(HasSample(text, "dattn_worker_memory_budget_bytes 1073741824")) << text;
  EXPECT_TRUE(HasSample(text, "dattn_worker_registrations_total 1")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kind=\"cpu\"")) << text;
  EXPECT_TRUE(absl::StrContains(text, "worker=\"metrics-test\"")) << text;

  v1::WorkerCommand command;
  v1::TaskAssignment* task = command.mutable_assign();
  task->set_task_id("j-metrics/1/0");
  v1::AttentionJobSpec* job = task->mutable_spec()->mutable_attention();
  job->mutable_attention()->add_segment_lengths(64);
  job->mutable_attention()->add_dilation_rates(1);
  job->mutable_shape()->set_batch(1);
  job->mutable_shape()->set_seq_len(128);
  job->mutable_shape()->set_num_heads(2);
  job->mutable_shape()->set_head_dim(16);
  job->set_dtype(v1::DTYPE_FP32);
  job->set_iterations(3);
  job->set_num_ranks(1);
  *task = Planned(*task);
  fake.Push(command);
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasStateLocked("j-metrics/1/0", v1::TASK_STATE_SUCCEEDED);
  }));
  text = WaitForMetrics(metrics_port, "dattn_worker_ranks_total{outcome=\"succeeded\"} 1");
  EXPECT_TRUE(HasSample(text, "dattn_worker_ranks_total{outcome=\"succeeded\"} 1")) << text;
  EXPECT_TRUE(HasSample(text, "dattn_worker_steps_total 3")) << text;
  EXPECT_TRUE(HasSample(text, "dattn_worker_step_seconds_count 1")) << text;
  EXPECT_TRUE(HasSample(text, "dattn_worker_ranks{phase=\"running\"} 0")) << text;

  // Valid exposition: promtool (Debian's prometheus package, scripts/setup.sh) finds no problem.
  const std::string file = absl::StrCat(::testing::TempDir(), "/worker-metrics.txt");
  std::ofstream(file) << text;
  const std::string check = absl::StrCat("/usr/bin/promtool check metrics < ", file, " 2>&1");
  FILE* promtool = popen(check.c_str(), "r");
  ASSERT_NE(promtool, nullptr);
  std::string said;
  char line[512];
  while (fgets(line, sizeof(line), promtool) != nullptr) said += line;
  EXPECT_EQ(pclose(promtool), 0) << said;
  EXPECT_EQ(said, "") << said;

  // The paths browsers, probes and port scans ask (issue 14): answered, and the worker keeps
  // serving, as the coordinator's port does (tests/front_door_test.cc).
  EXPECT_TRUE(absl::StartsWith(HttpGet(metrics_port, "/healthz"), "HTTP/1.1 200")) << "healthz";
  EXPECT_TRUE(absl::StartsWith(HttpGet(metrics_port, "/"), "HTTP/1.1 200")) << "/";
  EXPECT_TRUE(absl::StartsWith(HttpGet(metrics_port, "/favicon.ico"), "HTTP/1.1 404")) << "favicon";
  EXPECT_TRUE(
      absl::StartsWith(HttpGet(metrics_port, "/" + std::string(10 << 10, 'x')), "HTTP/1.1 404"))
      << "10 KB path";
  EXPECT_TRUE(absl::StartsWith(HttpGet(metrics_port, "/metrics"), "HTTP/1.1 200"))
      << "metrics after the other paths";
  worker.Signal(SIGTERM);
  EXPECT_EQ(worker.WaitExit(absl::Seconds(10)), 0);
}

// A metrics port already taken is a start-up failure (exit 1), as for the health port.
TEST(WorkerMainTest, AMetricsPortInUseExitsWithOne) {
  const int taken = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(taken, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(taken, reinterpret_cast<sockaddr*>(&addr), &len);
  WorkerProcess worker({"--insecure", "--coordinator", "127.0.0.1:1", "--threads", "1",
                        "--metrics-listen", absl::StrCat("127.0.0.1:", ntohs(addr.sin_port))});
  ASSERT_TRUE(worker.started());
  EXPECT_EQ(worker.WaitExit(absl::Seconds(10)), 1);
  close(taken);
}

TEST(WorkerMainTest, BadFlagsExitWithTwo) {
  WorkerProcess worker({"--slots", "0"});
  ASSERT_TRUE(worker.started());
  EXPECT_EQ(worker.WaitExit(absl::Seconds(10)), 2);
}

// The CPU worker links no CUDA library: it refuses --gpu rather than start on the wrong device.
TEST(WorkerMainTest, TheCpuWorkerRefusesGpu) {
  WorkerProcess worker({"--insecure", "--gpu", "--coordinator", "127.0.0.1:1"});
  ASSERT_TRUE(worker.started());
  EXPECT_EQ(worker.WaitExit(absl::Seconds(10)), 2);
}

}  // namespace
}  // namespace worker
}  // namespace dattn
