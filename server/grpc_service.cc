#include "server/grpc_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dattn/v1/admin.grpc.pb.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "dattn/v1/worker.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"

namespace dattn {
namespace server {
namespace {

// The one mapping table. The codes share their numbers today; the table keeps the conversion
// explicit and total (anything unknown becomes UNKNOWN).
constexpr std::pair<absl::StatusCode, grpc::StatusCode> kCodeTable[] = {
    {absl::StatusCode::kOk, grpc::StatusCode::OK},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
};

// Full method names, as dattn_rpc_total labels them.
constexpr char kSubmitJob[] = "/dattn.v1.JobService/SubmitJob";
constexpr char kGetJob[] = "/dattn.v1.JobService/GetJob";
constexpr char kListJobs[] = "/dattn.v1.JobService/ListJobs";
constexpr char kCancelJob[] = "/dattn.v1.JobService/CancelJob";
constexpr char kWatchJob[] = "/dattn.v1.JobService/WatchJob";
constexpr char kRegisterWorker[] = "/dattn.v1.WorkerRegistry/RegisterWorker";
constexpr char kHeartbeat[] = "/dattn.v1.WorkerRegistry/Heartbeat";
constexpr char kStreamAssignments[] = "/dattn.v1.WorkerRegistry/StreamAssignments";
constexpr char kReportTask[] = "/dattn.v1.WorkerRegistry/ReportTask";
constexpr char kListWorkers[] = "/dattn.v1.AdminService/ListWorkers";
constexpr char kDrainWorker[] = "/dattn.v1.AdminService/DrainWorker";
constexpr char kUndrainWorker[] = "/dattn.v1.AdminService/UndrainWorker";
constexpr const char* kMethods[] = {kSubmitJob,  kGetJob,         kListJobs,    kCancelJob,
                                    kWatchJob,   kRegisterWorker, kHeartbeat,   kStreamAssignments,
                                    kReportTask, kListWorkers,    kDrainWorker, kUndrainWorker};

constexpr const char* kServiceNames[] = {"", "dattn.v1.JobService", "dattn.v1.WorkerRegistry",
                                         "dattn.v1.AdminService"};

// Moves a StatusOr's value into a gRPC response object.
template <typename T>
absl::Status Assign(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return result.status();
  *out = *std::move(result);
  return absl::OkStatus();
}

// The per-call boilerplate, written once: run the handler, count the call, map the status.
class CallRunner {
 public:
  explicit CallRunner(Metrics* metrics) : metrics_(metrics) {}

  template <typename Fn>
  grpc::Status Run(const char* method, Fn&& handler) const {
    const absl::Status status = handler();
    metrics_->CountRpc(method, absl::StatusCodeToString(status.code()));
    return ToGrpcStatus(status);
  }

 private:
  Metrics* const metrics_;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(Coordinator* coordinator, Metrics* metrics)
      : core_(coordinator), calls_(metrics) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    return calls_.Run(kSubmitJob, [&] { return Assign(core_->SubmitJob(*request), response); });
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    return calls_.Run(kGetJob, [&] { return Assign(core_->GetJob(*request), response); });
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    return calls_.Run(kListJobs, [&] { return Assign(core_->ListJobs(*request), response); });
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::Job* response) override {
    return calls_.Run(kCancelJob, [&] { return Assign(core_->CancelJob(*request), response); });
  }
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    return calls_.Run(kWatchJob, [&] {
      return core_->WatchJob(
          *request, [writer](const v1::JobEvent& event) { return writer->Write(event); },
          [context] { return context->IsCancelled(); });
    });
  }

 private:
  Coordinator* const core_;
  const CallRunner calls_;
};

class WorkerRegistryImpl final : public v1::WorkerRegistry::Service {
 public:
  WorkerRegistryImpl(Coordinator* coordinator, Metrics* metrics)
      : core_(coordinator), calls_(metrics) {}

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    return calls_.Run(kRegisterWorker,
                      [&] { return Assign(core_->RegisterWorker(*request), response); });
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    return calls_.Run(kHeartbeat, [&] { return Assign(core_->Heartbeat(*request), response); });
  }
  grpc::Status StreamAssignments(grpc::ServerContext* context,
                                 const v1::StreamAssignmentsRequest* request,
                                 grpc::ServerWriter<v1::WorkerCommand>* writer) override {
    return calls_.Run(kStreamAssignments, [&] {
      return core_->StreamAssignments(
          *request, [writer](const v1::WorkerCommand& command) { return writer->Write(command); },
          [context] { return context->IsCancelled(); });
    });
  }
  grpc::Status ReportTask(grpc::ServerContext*, const v1::TaskReport* request,
                          v1::ReportTaskResponse* response) override {
    return calls_.Run(kReportTask, [&] { return Assign(core_->ReportTask(*request), response); });
  }

 private:
  Coordinator* const core_;
  const CallRunner calls_;
};

class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  AdminServiceImpl(Coordinator* coordinator, Metrics* metrics)
      : core_(coordinator), calls_(metrics) {}

  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override {
    return calls_.Run(kListWorkers, [&] { return Assign(core_->ListWorkers(*request), response); });
  }
  grpc::Status DrainWorker(grpc::ServerContext*, const v1::DrainWorkerRequest* request,
                           v1::Worker* response) override {
    return calls_.Run(kDrainWorker, [&] { return Assign(core_->DrainWorker(*request), response); });
  }
  grpc::Status UndrainWorker(grpc::ServerContext*, const v1::UndrainWorkerRequest* request,
                             v1::Worker* response) override {
    return calls_.Run(kUndrainWorker,
                      [&] { return Assign(core_->UndrainWorker(*request), response); });
  }

 private:
  Coordinator* const core_;
  const CallRunner calls_;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  for (const auto& [from, to] : kCodeTable) {
    if (from == status.code()) code = to;
  }
  return grpc::Status(code, std::string(status.message()));
}

class GrpcServer::Services {
 public:
  Services(Coordinator* coordinator, Metrics* metrics)
      : jobs(coordinator, metrics), workers(coordinator, metrics), admin(coordinator, metrics) {}
  JobServiceImpl jobs;
  WorkerRegistryImpl workers;
  AdminServiceImpl admin;
  absl::Mutex mu;  // Serialises health changes with Shutdown.
};

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const std::string& address,
                                                              Coordinator* coordinator,
                                                              Metrics* metrics) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address must be HOST:PORT, got \"", address, "\""));
  }
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->services_ = std::make_unique<Services>(coordinator, metrics);
  // Process-wide switch; must be on before the server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC enables SO_REUSEPORT by default; then a second coordinator on the same address would bind
  // too and take half the calls. A port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(&server->services_->jobs);
  builder.RegisterService(&server->services_->workers);
  builder.RegisterService(&server->services_->admin);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    // Nothing to shut down: the destructor must not touch a server that never started.
    server->shut_down_ = true;
    return absl::UnavailableError(
        absl::StrCat("cannot listen for gRPC on ", address, " (address in use or not local?)"));
  }
  server->address_ = absl::StrCat(address.substr(0, colon), ":", port);
  for (const char* method : kMethods) metrics->DeclareRpc(method);
  server->SetServing(false);
  return server;
}

GrpcServer::~GrpcServer() { Shutdown(absl::Now()); }

void GrpcServer::SetServing(bool serving) {
  absl::MutexLock lock(&services_->mu);
  if (shut_down_) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  for (const char* name : kServiceNames) health->SetServingStatus(name, serving);
}

void GrpcServer::Shutdown(absl::Time deadline) {
  {
    absl::MutexLock lock(&services_->mu);
    if (shut_down_) return;
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      for (const char* name : kServiceNames) health->SetServingStatus(name, false);
    }
    shut_down_ = true;
  }
  server_->Shutdown(absl::ToChronoTime(deadline));
}

}  // namespace server
}  // namespace dattn
