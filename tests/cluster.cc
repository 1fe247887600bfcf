#include "tests/cluster.h"

#include <fstream>
#include <iterator>

#include <grpcpp/grpcpp.h>

#include <regex>
#include <thread>

#include "client/connection.h"
#include "engine/testing/test_util.h"
#include "security/tokens.h"

namespace dattn::testing {
namespace {

bool IsTerminal(dattn::v1::JobState s) {
  return s == dattn::v1::JOB_STATE_SUCCEEDED || s == dattn::v1::JOB_STATE_FAILED ||
         s == dattn::v1::JOB_STATE_CANCELLED;
}

}  // namespace

Cluster::Cluster(ClusterOptions options) : options_(std::move(options)) {
  dir_ = MakeTestDir(options_.name);
  data_dir_ = dir_ + "/data";
  if (!options_.secure) return;
  // Certificates from the script users run (one worker certificate for every worker name, a
  // fleet's: tests/security_test checks certificates bound to names), and three tokens. A failure
  // here shows up as a coordinator that does not start, with the script's output in its log folder.
  certs_dir_ = dir_ + "/certs";
  ca_file_ = certs_dir_ + "/ca.pem";
  const std::string make = "bash " + testutil::RunfilePath("scripts/make-certs.sh") + " " +
                           certs_dir_ + " --hosts localhost,127.0.0.1 --worker 'worker:*' > " +
                           dir_ + "/make-certs.log 2>&1";
  if (std::system(make.c_str()) != 0)
    std::fprintf(stderr, "make-certs.sh failed: see %s\n", dir_.c_str());
  token_file_ = dir_ + "/tokens";
  std::ofstream file(token_file_);
  const std::pair<const char*, std::pair<const char*, const char*>> who[] = {
      {kAdmin, {"ops", "admin"}}, {kAlice, {"alice", "user"}}, {kBob, {"bob", "user"}}};
  for (const auto& [name, tenant_role] : who) {
    const std::string token = *security::NewToken();
    tokens_[name] = token;
    file << security::HashToken(token) << ' ' << tenant_role.first << ' ' << tenant_role.second
         << ' ' << name << '\n';
  }
}

std::string Cluster::token(const std::string& who) const {
  auto it = tokens_.find(who);
  return it == tokens_.end() ? "" : it->second;
}

std::shared_ptr<grpc::Channel> Cluster::ChannelWithToken(const std::string& token) const {
  client::ClientSecurity security;
  security.ca_file = ca_file_;
  security.token = token;
  security.insecure = !options_.secure;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = client::MakeChannel(address_, security);
  if (!channel.ok()) {
    std::fprintf(stderr, "cannot make a channel: %s\n",
                 std::string(channel.status().message()).c_str());
    return nullptr;
  }
  return *channel;
}

std::vector<std::string> Cluster::WorkerSecurityFlags() const {
  if (!options_.secure) return {"--insecure"};
  return {"--tls-ca=" + ca_file_, "--tls-cert=" + certs_dir_ + "/worker.pem",
          "--tls-key=" + certs_dir_ + "/worker-key.pem"};
}

Cluster::~Cluster() {
  for (auto& w : workers_) w->Kill();
  if (coordinator_) coordinator_->Kill();
}

bool Cluster::StartCoordinator(std::string* error) {
  // A restart reuses the first start's ports, so workers and clients reconnect to the same address.
  std::string listen = address_.empty() ? "127.0.0.1:0" : address_;
  std::string metrics = metrics_address_.empty() ? "127.0.0.1:0" : metrics_address_;
  ProcessOptions o;
  o.name = "coordinator-" + std::to_string(coordinator_starts_++);
  o.log_dir = dir_;
  o.argv = {testutil::RunfilePath("server/dattn-coordinator"),
            "--listen=" + listen,
            "--metrics-listen=" + metrics,
            "--data-dir=" + data_dir_,
            "--dead-after-ms=" + std::to_string(options_.dead_after_ms),
            "--heartbeat-ms=" + std::to_string(options_.heartbeat_ms),
            "--max-attempts=" + std::to_string(options_.max_attempts),
            "--ring-formation-timeout-ms=" + std::to_string(options_.ring_formation_timeout_ms),
            "--ring-timeout-ms=" + std::to_string(options_.ring_timeout_ms)};
  if (options_.secure) {
    o.argv.insert(
        o.argv.end(),
        {"--tls-ca=" + ca_file_, "--tls-cert=" + certs_dir_ + "/coordinator.pem",
         "--tls-key=" + certs_dir_ + "/coordinator-key.pem", "--token-file=" + token_file_});
  } else {
    o.argv.push_back("--insecure");
  }
  o.argv.insert(o.argv.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  coordinator_ = std::make_unique<Process>(o);
  if (!coordinator_->Start(error)) return false;
  // The port of the previous run may still be held by connections in TIME_WAIT; gRPC binds with
  // SO_REUSEADDR, so this succeeds at once in practice.
  std::optional<std::string> ready = coordinator_->WaitForStderr(
      "listening on ([0-9.]+:[0-9]+), metrics on [0-9.]+:[0-9]+", std::chrono::seconds(30));
  if (!ready) {
    *error = "coordinator did not become ready:\n" + coordinator_->ReadStderr();
    return false;
  }
  address_ = *ready;
  std::optional<std::string> m = coordinator_->WaitForStderr(
      "listening on [0-9.]+:[0-9]+, metrics on ([0-9.]+:[0-9]+)", std::chrono::seconds(1));
  if (m) metrics_address_ = *m;
  Connect();
  return true;
}

void Cluster::Connect() {
  channel_ = ChannelWithToken(token(kAdmin));
  jobs_ = dattn::v1::JobService::NewStub(channel_);
  admin_ = dattn::v1::AdminService::NewStub(channel_);
}

int Cluster::AddWorker(int threads, std::string* error, const std::string& name,
                       const std::vector<std::string>& flags) {
  const int index = static_cast<int>(workers_.size());
  ProcessOptions o;
  o.name = name.empty() ? "worker-" + std::to_string(index) : name;
  o.log_dir = dir_;
  o.argv = {testutil::RunfilePath("worker/dattn-worker"),
            "--coordinator=" + address_,
            "--name=" + o.name,
            "--threads=" + std::to_string(threads),
            "--heartbeat-ms=" + std::to_string(options_.heartbeat_ms),
            "--health-port=0"};
  const std::vector<std::string> security = WorkerSecurityFlags();
  o.argv.insert(o.argv.end(), security.begin(), security.end());
  o.argv.insert(o.argv.end(), flags.begin(), flags.end());
  workers_.push_back(std::make_unique<Process>(o));
  if (!workers_.back()->Start(error)) return -1;
  return index;
}

int Cluster::WorkerIndex(const std::string& name) const {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->name() == name) return static_cast<int>(i);
  }
  return -1;
}

std::string Cluster::WorkerName(const std::string& worker_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  dattn::v1::ListWorkersRequest req;
  req.set_include_dead(true);
  dattn::v1::ListWorkersResponse resp;
  if (!admin().ListWorkers(&ctx, req, &resp).ok()) return "";
  for (const auto& w : resp.workers()) {
    if (w.worker_id() == worker_id) return w.name();
  }
  return "";
}

bool Cluster::Start(int workers, std::string* error) {
  if (!StartCoordinator(error)) return false;
  for (int i = 0; i < workers; ++i) {
    if (AddWorker(1, error) < 0) return false;
  }
  if (workers > 0 && !WaitForReadyWorkers(workers, std::chrono::seconds(30))) {
    *error = std::to_string(workers) + " workers not READY within 30 s\n" + Logs();
    return false;
  }
  return true;
}

bool Cluster::WaitForReadyWorkers(int count, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    dattn::v1::ListWorkersRequest req;
    dattn::v1::ListWorkersResponse resp;
    if (admin().ListWorkers(&ctx, req, &resp).ok()) {
      int ready = 0;
      for (const auto& w : resp.workers()) ready += w.state() == dattn::v1::WORKER_STATE_READY;
      if (ready >= count) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

ProcessResult Cluster::Cli(const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                           const std::map<std::string, std::string>& env) {
  ProcessOptions o;
  o.name = "cli";
  o.log_dir = dir_;
  o.argv = {testutil::RunfilePath("client/dattn")};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env["DATTN_COORDINATOR"] = address_;
  if (options_.secure) {
    o.env["DATTN_TLS_CA"] = ca_file_;
    o.env["DATTN_TOKEN"] = token(kAdmin);
  }
  for (const auto& [name, value] : env) o.env[name] = value;
  return RunCommand(o, timeout);
}

dattn::v1::JobService::Stub& Cluster::jobs() { return *jobs_; }
dattn::v1::AdminService::Stub& Cluster::admin() { return *admin_; }

bool Cluster::WaitForJobState(const std::string& job_id, dattn::v1::JobState state,
                              std::chrono::milliseconds timeout, dattn::v1::Job* job) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    dattn::v1::GetJobRequest req;
    req.set_job_id(job_id);
    req.set_include_events(true);
    dattn::v1::Job got;
    if (jobs().GetJob(&ctx, req, &got).ok()) {
      *job = got;
      if (got.state() == state) return true;
      if (IsTerminal(got.state()) && !IsTerminal(state)) return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

bool Cluster::WaitForJobEnd(const std::string& job_id, std::chrono::milliseconds timeout,
                            dattn::v1::Job* job) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    dattn::v1::GetJobRequest req;
    req.set_job_id(job_id);
    req.set_include_events(true);
    dattn::v1::Job got;
    if (jobs().GetJob(&ctx, req, &got).ok()) {
      *job = got;
      if (IsTerminal(got.state())) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string Cluster::Logs() {
  std::string all;
  if (coordinator_) all += "--- coordinator stderr ---\n" + coordinator_->ReadStderr();
  for (auto& w : workers_) all += "--- " + w->name() + " stderr ---\n" + w->ReadStderr();
  return all;
}

std::string JobIdFrom(const std::string& text) {
  std::smatch m;
  std::regex re("(j-[0-9a-f]+)");
  if (std::regex_search(text, m, re)) return m[1].str();
  return "";
}

std::string EventsText(const dattn::v1::Job& job) {
  std::string s;
  for (const auto& e : job.events()) s += e.kind() + ": " + e.message() + "\n";
  return s;
}

bool HasEvent(const dattn::v1::Job& job, const std::string& kind) {
  for (const auto& e : job.events()) {
    if (e.kind() == kind) return true;
  }
  return false;
}

std::string ReadNpyData(const std::string& path, std::string* dict) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) != 0) {
    return "";
  }
  const size_t header =
      static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  if (bytes.size() < 10 + header) return "";
  if (dict != nullptr) *dict = bytes.substr(10, header);
  return bytes.substr(10 + header);
}

}  // namespace dattn::testing
