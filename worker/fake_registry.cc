#include "worker/fake_registry.h"

#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dattn {
namespace worker {

grpc::Status FakeRegistry::RegisterWorker(grpc::ServerContext*,
                                          const v1::RegisterWorkerRequest* request,
                                          v1::RegisterWorkerResponse* response) {
  absl::MutexLock lock(&mu_);
  registrations_.push_back(*request);
  const std::string id = absl::StrCat("w-", instance_, "-", registrations_.size());
  known_.insert(id);
  response->set_worker_id(id);
  response->set_heartbeat_interval_ms(100);
  cv_.SignalAll();
  return grpc::Status::OK;
}

grpc::Status FakeRegistry::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                                     v1::HeartbeatResponse* response) {
  absl::MutexLock lock(&mu_);
  heartbeats_.push_back(*request);
  if (known_.count(request->worker_id()) == 0) response->set_reregister(true);
  if (request->draining()) drain_ = true;  // As the coordinator: a leaving worker is drained.
  response->set_drain(drain_);
  cv_.SignalAll();
  return grpc::Status::OK;
}

grpc::Status FakeRegistry::StreamAssignments(grpc::ServerContext* context,
                                             const v1::StreamAssignmentsRequest* request,
                                             grpc::ServerWriter<v1::WorkerCommand>* writer) {
  absl::MutexLock lock(&mu_);
  if (known_.count(request->worker_id()) == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker " + request->worker_id());
  }
  ++streams_opened_;
  cv_.SignalAll();
  while (!shutting_down_ && !context->IsCancelled()) {
    if (commands_.empty() && drain_ && close_streams_while_drained_) break;
    if (commands_.empty()) {
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
      continue;
    }
    v1::WorkerCommand command = commands_.front();
    commands_.pop_front();
    mu_.Unlock();
    const bool written = writer->Write(command);
    mu_.Lock();
    if (!written) {
      commands_.push_front(std::move(command));
      break;
    }
  }
  ++streams_ended_;
  cv_.SignalAll();
  return grpc::Status::OK;
}

grpc::Status FakeRegistry::ReportTask(grpc::ServerContext*, const v1::TaskReport* request,
                                      v1::ReportTaskResponse* response) {
  std::function<void(const v1::TaskReport&)> on_final;
  {
    absl::MutexLock lock(&mu_);
    if (known_.count(request->worker_id()) == 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker " + request->worker_id());
    }
    reports_.push_back(*request);
    if (stop_tasks_.count(request->task_id()) > 0) response->set_stop(true);
    cv_.SignalAll();
    const v1::TaskState state = request->state();
    if (state == v1::TASK_STATE_SUCCEEDED || state == v1::TASK_STATE_FAILED ||
        state == v1::TASK_STATE_CANCELLED) {
      on_final = on_final_;
    }
  }
  if (on_final) on_final(*request);
  return grpc::Status::OK;
}

grpc::Status FakeRegistry::UploadOutput(grpc::ServerContext*,
                                        grpc::ServerReader<v1::UploadOutputRequest>* reader,
                                        v1::UploadOutputResponse* response) {
  v1::UploadOutputRequest message;
  if (!reader->Read(&message)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty upload");
  }
  Upload upload;
  upload.header = message.chunk().header();
  const std::string task_id = message.task_id();
  do {
    if (message.chunk().offset() != static_cast<int64_t>(upload.data.size())) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "chunk out of order");
    }
    upload.data += message.chunk().data();
  } while (reader->Read(&message));
  if (static_cast<int64_t>(upload.data.size()) != upload.header.total_bytes()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "shard of the wrong size");
  }
  absl::MutexLock lock(&mu_);
  if (stop_tasks_.count(task_id) > 0) response->set_stop(true);
  uploads_[task_id] = std::move(upload);
  cv_.SignalAll();
  return grpc::Status::OK;
}

void FakeRegistry::SetOnFinalReport(std::function<void(const v1::TaskReport&)> on_final) {
  absl::MutexLock lock(&mu_);
  on_final_ = std::move(on_final);
}

void FakeRegistry::Push(v1::WorkerCommand command) {
  absl::MutexLock lock(&mu_);
  commands_.push_back(std::move(command));
  cv_.SignalAll();
}

void FakeRegistry::SetDrain(bool drain) {
  absl::MutexLock lock(&mu_);
  drain_ = drain;
  cv_.SignalAll();
}

void FakeRegistry::SetCloseStreamsWhileDrained(bool close) {
  absl::MutexLock lock(&mu_);
  close_streams_while_drained_ = close;
  cv_.SignalAll();
}

void FakeRegistry::StopTaskOnReport(const std::string& task_id) {
  absl::MutexLock lock(&mu_);
  stop_tasks_.insert(task_id);
}

void FakeRegistry::ShutDown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  cv_.SignalAll();
}

bool FakeRegistry::WaitFor(const std::function<bool()>& pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!pred()) {
    if (absl::Now() >= deadline) return false;
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(10));
  }
  return true;
}

std::vector<v1::TaskReport> FakeRegistry::ReportsOf(const std::string& task_id) {
  absl::MutexLock lock(&mu_);
  return ReportsOfLocked(task_id);
}

std::vector<v1::TaskReport> FakeRegistry::ReportsOfLocked(const std::string& task_id) {
  std::vector<v1::TaskReport> out;
  for (const v1::TaskReport& r : reports_) {
    if (r.task_id() == task_id) out.push_back(r);
  }
  return out;
}

bool FakeRegistry::HasFinalLocked(const std::string& task_id) {
  for (const v1::TaskReport& r : reports_) {
    if (r.task_id() == task_id && r.state() >= v1::TASK_STATE_SUCCEEDED) return true;
  }
  return false;
}

bool FakeRegistry::HasStateLocked(const std::string& task_id, v1::TaskState state) {
  for (const v1::TaskReport& r : reports_) {
    if (r.task_id() == task_id && r.state() == state) return true;
  }
  return false;
}

FakeCoordinator::FakeCoordinator(const std::string& address, int instance) : registry_(instance) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(80 << 20);  // Reports may carry a 64 MiB output.
  builder.RegisterService(&registry_);
  server_ = builder.BuildAndStart();
}

FakeCoordinator::~FakeCoordinator() {
  registry_.ShutDown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
}

std::string TestSocketPath(const char* name) {
  struct Paths {
    std::vector<std::string> paths;  // A socket, then its directory.
    ~Paths() {
      for (const std::string& p : paths) ::remove(p.c_str());
    }
  };
  static Paths created;
  char dir[] = "/tmp/dattn-worker-test-XXXXXX";
  if (mkdtemp(dir) == nullptr) return absl::StrCat("/tmp/dattn-worker-test-", name, ".sock");
  const std::string path = absl::StrCat(dir, "/", name, ".sock");
  created.paths.push_back(path);
  created.paths.push_back(dir);
  return path;
}

}  // namespace worker
}  // namespace dattn
