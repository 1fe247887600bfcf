#include "server/grpc_service.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "api/limits.h"
#include "api/tenant.h"
#include "dattn/v1/admin.grpc.pb.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "dattn/v1/worker.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/inference_service.h"

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
constexpr char kReadOutput[] = "/dattn.v1.JobService/ReadOutput";
constexpr char kDeleteJob[] = "/dattn.v1.JobService/DeleteJob";
constexpr char kAttend[] = "/dattn.v1.JobService/Attend";
constexpr char kGenerate[] = "/dattn.v1.JobService/Generate";
constexpr char kScore[] = "/dattn.v1.JobService/Score";
constexpr char kImportModel[] = "/dattn.v1.JobService/ImportModel";
constexpr char kListModels[] = "/dattn.v1.JobService/ListModels";
constexpr char kDeleteModel[] = "/dattn.v1.JobService/DeleteModel";
constexpr char kServe[] = "/dattn.v1.WorkerRegistry/Serve";
constexpr char kRegisterWorker[] = "/dattn.v1.WorkerRegistry/RegisterWorker";
constexpr char kHeartbeat[] = "/dattn.v1.WorkerRegistry/Heartbeat";
constexpr char kStreamAssignments[] = "/dattn.v1.WorkerRegistry/StreamAssignments";
constexpr char kReportTask[] = "/dattn.v1.WorkerRegistry/ReportTask";
constexpr char kUploadOutput[] = "/dattn.v1.WorkerRegistry/UploadOutput";
constexpr char kReadInput[] = "/dattn.v1.WorkerRegistry/ReadInput";
constexpr char kListWorkers[] = "/dattn.v1.AdminService/ListWorkers";
constexpr char kDrainWorker[] = "/dattn.v1.AdminService/DrainWorker";
constexpr char kUndrainWorker[] = "/dattn.v1.AdminService/UndrainWorker";
constexpr const char* kMethods[] = {
    kSubmitJob,    kGetJob,    kListJobs,       kCancelJob,   kWatchJob,          kReadOutput,
    kDeleteJob,    kAttend,    kRegisterWorker, kHeartbeat,   kStreamAssignments, kReportTask,
    kUploadOutput, kReadInput, kListWorkers,    kDrainWorker, kUndrainWorker,     kGenerate,
    kScore,        kServe,     kImportModel,    kListModels,  kDeleteModel};

constexpr const char* kServiceNames[] = {"", "dattn.v1.JobService", "dattn.v1.WorkerRegistry",
                                         "dattn.v1.AdminService", "inference.GRPCInferenceService"};

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
  JobServiceImpl(Coordinator* coordinator, Metrics* metrics, const Access* access)
      : core_(coordinator), calls_(metrics), access_(access) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    return calls_.Run(kSubmitJob, [&]() -> absl::Status {
      absl::StatusOr<security::Principal> caller = access_->Caller(*context);
      if (!caller.ok()) return caller.status();
      v1::SubmitJobRequest scoped = *request;
      if (absl::Status s = Access::ScopeSubmit(*caller, scoped.mutable_spec()); !s.ok()) return s;
      return Assign(core_->SubmitJob(scoped), response);
    });
  }
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    return calls_.Run(kGetJob, [&]() -> absl::Status {
      absl::StatusOr<security::Principal> caller = access_->Caller(*context);
      if (!caller.ok()) return caller.status();
      absl::StatusOr<v1::Job> job = core_->GetJob(*request);
      if (job.ok() && !Access::MaySee(*caller, *job)) return core_->JobNotFound(request->job_id());
      return Assign(std::move(job), response);
    });
  }
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    return calls_.Run(kListJobs, [&]() -> absl::Status {
      absl::StatusOr<security::Principal> caller = access_->Caller(*context);
      if (!caller.ok()) return caller.status();
      v1::ListJobsRequest scoped = *request;
      if (caller->role != security::Role::kAdmin) {
        if (!scoped.tenant().empty() && scoped.tenant() != caller->tenant) {
          return absl::PermissionDeniedError(
              absl::StrCat("tenant \"", scoped.tenant().substr(0, 64),
                           "\": a user lists its own tenant's jobs only (", caller->tenant, ")"));
        }
        scoped.set_tenant(caller->tenant);
      }
      return Assign(core_->ListJobs(scoped), response);
    });
  }
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override {
    return calls_.Run(kCancelJob, [&] {
      return OnJob(*context, kCancelJob, request->job_id(), kAudited,
                   [&] { return Assign(core_->CancelJob(*request), response); });
    });
  }
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    return calls_.Run(kWatchJob, [&] {
      return OnJob(*context, kWatchJob, request->job_id(), kStream, [&] {
        return core_->WatchJob(
            *request, [writer](const v1::JobEvent& event) { return writer->Write(event); },
            [context] { return context->IsCancelled(); });
      });
    });
  }
  grpc::Status ReadOutput(grpc::ServerContext* context, const v1::ReadOutputRequest* request,
                          grpc::ServerWriter<v1::TensorChunk>* writer) override {
    return calls_.Run(kReadOutput, [&] {
      return OnJob(*context, kReadOutput, request->job_id(), kStream, [&] {
        return core_->ReadOutput(
            *request, [writer](const v1::TensorChunk& chunk) { return writer->Write(chunk); });
      });
    });
  }
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override {
    return calls_.Run(kDeleteJob, [&] {
      return OnJob(*context, kDeleteJob, request->job_id(), kAudited,
                   [&] { return Assign(core_->DeleteJob(*request), response); });
    });
  }
  grpc::Status Attend(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::AttendResponse, v1::AttendRequest>* stream) override {
    return calls_.Run(kAttend, [&]() -> absl::Status {
      absl::StatusOr<security::Principal> caller = access_->Caller(*context);
      if (!caller.ok()) return caller.status();
      // A stream: it holds one of the caller's stream slots while it lasts.
      absl::StatusOr<Access::StreamSlot> slot = access_->OpenStream(*caller, *context, kAttend);
      if (!slot.ok()) return slot.status();
      v1::AttendRequest first;
      if (!stream->Read(&first)) {
        return absl::InvalidArgumentError("start: the Attend stream carried no message");
      }
      if (first.has_start()) {
        // The tenant is the caller's, as for SubmitJob.
        v1::JobSpec scope;
        scope.set_tenant(first.start().tenant());
        if (absl::Status s = Access::ScopeSubmit(*caller, &scope); !s.ok()) return s;
        first.mutable_start()->set_tenant(scope.tenant());
        if (first.start().has_shared_memory() && !Access::IsLocalPeer(context->peer())) {
          return absl::FailedPreconditionError(absl::StrCat(
              "start.shared_memory: only a caller on the coordinator's host (loopback or a Unix "
              "socket) may name shared memory; this call comes from ",
              context->peer(), ": stream the tensors instead"));
        }
      }
      absl::Status status = core_->Attend(
          first, [stream](v1::AttendRequest* next) { return stream->Read(next); },
          [stream](const v1::AttendResponse& response) { return stream->Write(response); },
          [context] { return context->IsCancelled(); }, [context] { context->TryCancel(); });
      if (absl::IsCancelled(status) && std::chrono::system_clock::now() >= context->deadline()) {
        return absl::DeadlineExceededError(
            absl::StrCat("the Attend call's deadline passed: ", status.message()));
      }
      return status;
    });
  }
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    return calls_.Run(kGenerate, [&] {
      return OnJob(*context, kGenerate, request->deployment_id(), kStream, [&]() -> absl::Status {
        const auto deadline = context->deadline();
        const absl::Duration timeout =
            deadline == std::chrono::system_clock::time_point::max()
                ? absl::InfiniteDuration()
                : absl::FromChrono(deadline - std::chrono::system_clock::now());
        absl::Status status = core_->Generate(
            *request,
            [writer](const v1::GenerateResponse& response) { return writer->Write(response); },
            [context] { return context->IsCancelled(); }, timeout);
        if (absl::IsCancelled(status) && std::chrono::system_clock::now() >= deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("the Generate call's deadline passed: ", status.message()));
        }
        return status;
      });
    });
  }
  grpc::Status Score(grpc::ServerContext* context, const v1::ScoreRequest* request,
                     v1::ScoreResponse* response) override {
    return calls_.Run(kScore, [&] {
      return OnJob(*context, kScore, request->deployment_id(), kStream, [&] {
        return Assign(core_->Score(*request, [context] { return context->IsCancelled(); }),
                      response);
      });
    });
  }

  grpc::Status ImportModel(grpc::ServerContext* context, const v1::ImportModelRequest* request,
                           v1::RegisteredModel* response) override {
    return calls_.Run(kImportModel, [&] {
      v1::ImportModelRequest scoped = *request;
      return OnTenant(*context, kImportModel, scoped.mutable_tenant(), scoped.name(), [&] {
        return Assign(core_->ImportModel(scoped, [context] { return context->IsCancelled(); }),
                      response);
      });
    });
  }
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override {
    return calls_.Run(kListModels, [&] {
      v1::ListModelsRequest scoped = *request;
      return OnTenant(*context, nullptr, scoped.mutable_tenant(), scoped.name(),
                      [&] { return Assign(core_->ListModels(scoped), response); });
    });
  }
  grpc::Status DeleteModel(grpc::ServerContext* context, const v1::DeleteModelRequest* request,
                           v1::DeleteModelResponse* response) override {
    return calls_.Run(kDeleteModel, [&] {
      v1::DeleteModelRequest scoped = *request;
      return OnTenant(*context, kDeleteModel, scoped.mutable_tenant(), scoped.name(),
                      [&] { return Assign(core_->DeleteModel(scoped), response); });
    });
  }

 private:
  // Authenticates the caller of a registry call and scopes `tenant` to it (Access::ScopeTenant),
  // then runs `call`; an admin's act (`audited_method` not null) on another tenant's model is
  // audited.
  template <typename Fn>
  absl::Status OnTenant(const grpc::ServerContext& context, const char* audited_method,
                        std::string* tenant, const std::string& name, Fn&& call) {
    absl::StatusOr<security::Principal> caller = access_->Caller(context);
    if (!caller.ok()) return caller.status();
    bool foreign = false;
    if (absl::Status s = Access::ScopeTenant(*caller, "tenant", tenant, &foreign); !s.ok()) {
      return s;
    }
    absl::Status done = call();
    if (foreign && audited_method != nullptr) {
      access_->Audit(*caller, context, audited_method, absl::StrCat("model ", *tenant, "/", name),
                     done);
    }
    return done;
  }

  // What OnJob's call is: an act audited when an admin does it to another tenant's job, or a
  // stream that takes one of the caller's stream slots while it is open.
  enum CallKind { kAudited, kStream };

  // Authenticates the caller of `method` on `job_id` and runs `call`. A user asking for another
  // tenant's job gets the NOT_FOUND of a job that does not exist (a job that does not exist is left
  // to `call` to report); an admin's act on another tenant's job is audited when kAudited; a
  // kStream call holds one of the caller's stream slots (Access::OpenStream) until it ends.
  template <typename Fn>
  absl::Status OnJob(const grpc::ServerContext& context, const char* method,
                     const std::string& job_id, CallKind kind, Fn&& call) {
    absl::StatusOr<security::Principal> caller = access_->Caller(context);
    if (!caller.ok()) return caller.status();
    std::optional<Access::StreamSlot> slot;
    if (kind == kStream) {
      absl::StatusOr<Access::StreamSlot> opened = access_->OpenStream(*caller, context, method);
      if (!opened.ok()) return opened.status();
      slot.emplace(*std::move(opened));
    }
    bool foreign = false;
    if (access_->authenticates()) {
      v1::GetJobRequest get;
      get.set_job_id(job_id);
      get.set_max_events(1);
      absl::StatusOr<v1::Job> job = core_->GetJob(get);
      if (job.ok() && api::TenantOrDefault(job->spec().tenant()) != caller->tenant) {
        if (!Access::MaySee(*caller, *job)) return core_->JobNotFound(job_id);
        foreign = true;
      }
    }
    absl::Status done = call();
    if (foreign && kind == kAudited) access_->Audit(*caller, context, method, job_id, done);
    return done;
  }

  Coordinator* const core_;
  const CallRunner calls_;
  const Access* const access_;
};

class WorkerRegistryImpl final : public v1::WorkerRegistry::Service {
 public:
  WorkerRegistryImpl(Coordinator* coordinator, Metrics* metrics, const Access* access)
      : core_(coordinator), calls_(metrics), access_(access) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    return calls_.Run(kRegisterWorker, [&]() -> absl::Status {
      if (absl::Status s = access_->CheckWorker(*context, kRegisterWorker, request->name());
          !s.ok())
        return s;
      return Assign(core_->RegisterWorker(*request), response);
    });
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    return calls_.Run(kHeartbeat, [&]() -> absl::Status {
      if (absl::Status s = CheckWorkerId(*context, kHeartbeat, request->worker_id()); !s.ok())
        return s;
      return Assign(core_->Heartbeat(*request), response);
    });
  }
  grpc::Status StreamAssignments(grpc::ServerContext* context,
                                 const v1::StreamAssignmentsRequest* request,
                                 grpc::ServerWriter<v1::WorkerCommand>* writer) override {
    return calls_.Run(kStreamAssignments, [&]() -> absl::Status {
      if (absl::Status s = CheckWorkerId(*context, kStreamAssignments, request->worker_id());
          !s.ok())
        return s;
      return core_->StreamAssignments(
          *request, [writer](const v1::WorkerCommand& command) { return writer->Write(command); },
          [context] { return context->IsCancelled(); });
    });
  }
  grpc::Status ReportTask(grpc::ServerContext* context, const v1::TaskReport* request,
                          v1::ReportTaskResponse* response) override {
    return calls_.Run(kReportTask, [&]() -> absl::Status {
      if (absl::Status s = CheckWorkerId(*context, kReportTask, request->worker_id()); !s.ok())
        return s;
      return Assign(core_->ReportTask(*request), response);
    });
  }
  grpc::Status ReadInput(grpc::ServerContext* context, const v1::ReadInputRequest* request,
                         grpc::ServerWriter<v1::AttendChunk>* writer) override {
    return calls_.Run(kReadInput, [&]() -> absl::Status {
      if (absl::Status s = CheckWorkerId(*context, kReadInput, request->worker_id()); !s.ok())
        return s;
      return core_->ReadInput(
          *request, [writer](const v1::AttendChunk& chunk) { return writer->Write(chunk); },
          [context] { return context->IsCancelled(); });
    });
  }
  grpc::Status UploadOutput(grpc::ServerContext* context,
                            grpc::ServerReader<v1::UploadOutputRequest>* reader,
                            v1::UploadOutputResponse* response) override {
    return calls_.Run(kUploadOutput, [&]() -> absl::Status {
      if (absl::Status s = access_->CheckWorker(*context, kUploadOutput, ""); !s.ok()) return s;
      v1::UploadOutputRequest first;
      if (!reader->Read(&first)) {
        return absl::InvalidArgumentError("UploadOutput: the stream carried no message");
      }
      if (absl::Status s = CheckWorkerId(*context, kUploadOutput, first.worker_id()); !s.ok()) {
        return s;
      }
      return Assign(
          core_->UploadOutput(
              first, [reader](v1::UploadOutputRequest* next) { return reader->Read(next); }),
          response);
    });
  }
  grpc::Status Serve(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<v1::ServeWork, v1::ServeUpdate>* stream) override {
    return calls_.Run(kServe, [&]() -> absl::Status {
      if (absl::Status s = access_->CheckWorker(*context, kServe, ""); !s.ok()) return s;
      v1::ServeUpdate first;
      if (!stream->Read(&first)) {
        return absl::InvalidArgumentError("Serve: the stream carried no message");
      }
      if (absl::Status s = CheckWorkerId(*context, kServe, first.worker_id()); !s.ok()) return s;
      return core_->Serve(
          first, [stream](v1::ServeUpdate* next) { return stream->Read(next); },
          [stream](const v1::ServeWork& work) { return stream->Write(work); },
          [context] { return context->IsCancelled(); }, [context] { context->TryCancel(); });
    });
  }

 private:
  // Access::CheckWorker for a call that names its registration by id: the certificate must bind
  // the name the id was registered under.
  absl::Status CheckWorkerId(const grpc::ServerContext& context, const char* method,
                             const std::string& worker_id) const {
    return access_->CheckWorker(context, method,
                                access_->binds_worker_names() ? core_->WorkerName(worker_id) : "");
  }

  Coordinator* const core_;
  const CallRunner calls_;
  const Access* const access_;
};

class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  AdminServiceImpl(Coordinator* coordinator, Metrics* metrics, const Access* access)
      : core_(coordinator), calls_(metrics), access_(access) {}

  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override {
    return calls_.Run(kListWorkers, [&] {
      return Admin(*context, kListWorkers, "",
                   [&] { return Assign(core_->ListWorkers(*request), response); });
    });
  }
  grpc::Status DrainWorker(grpc::ServerContext* context, const v1::DrainWorkerRequest* request,
                           v1::Worker* response) override {
    return calls_.Run(kDrainWorker, [&] {
      return Admin(*context, kDrainWorker, request->worker_id(),
                   [&] { return Assign(core_->DrainWorker(*request), response); });
    });
  }
  grpc::Status UndrainWorker(grpc::ServerContext* context, const v1::UndrainWorkerRequest* request,
                             v1::Worker* response) override {
    return calls_.Run(kUndrainWorker, [&] {
      return Admin(*context, kUndrainWorker, request->worker_id(),
                   [&] { return Assign(core_->UndrainWorker(*request), response); });
    });
  }

 private:
  // Authenticates, requires the admin role, runs `call` and audits the attempt (refused or not).
  template <typename Fn>
  absl::Status Admin(const grpc::ServerContext& context, const char* method,
                     const std::string& target, Fn&& call) {
    absl::StatusOr<security::Principal> caller = access_->Caller(context);
    if (!caller.ok()) return caller.status();
    absl::Status status = Access::RequireAdmin(*caller, method);
    if (status.ok()) status = call();
    access_->Audit(*caller, context, method, target, status);
    return status;
  }

  Coordinator* const core_;
  const CallRunner calls_;
  const Access* const access_;
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
  Services(Coordinator* coordinator, Metrics* metrics, const Access* access)
      : jobs(coordinator, metrics, access),
        workers(coordinator, metrics, access),
        admin(coordinator, metrics, access),
        inference(
            [coordinator](const v1::AttendRequest& first, const AttendSource& next,
                          const AttendSink& emit, const CancelledFn& cancelled) {
              return coordinator->Attend(first, next, emit, cancelled);
            },
            [coordinator] { return coordinator->Health(); },
            DeploymentCalls{
                [coordinator](const std::string& id) {
                  v1::GetJobRequest get;
                  get.set_job_id(id);
                  get.set_max_events(1);
                  return coordinator->GetJob(get);
                },
                [coordinator](const std::string& id) {
                  return coordinator->ServingDeployment(id).status();
                },
                [coordinator](const v1::ScoreRequest& request, const CancelledFn& cancelled) {
                  return coordinator->Score(request, cancelled);
                }},
            metrics, access) {}
  JobServiceImpl jobs;
  WorkerRegistryImpl workers;
  AdminServiceImpl admin;
  InferenceService inference;  // The Open Inference Protocol (inference_service.h).
  absl::Mutex mu;              // Serialises health changes with Shutdown.
};

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const std::string& address,
                                                              Coordinator* coordinator,
                                                              Metrics* metrics,
                                                              GrpcServerOptions options) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address must be HOST:PORT, got \"", address, "\""));
  }
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  if (options.access == nullptr) {
    absl::StatusOr<std::unique_ptr<Access>> open = Access::Create(AccessOptions{});
    if (!open.ok()) return open.status();
    server->own_access_ = *std::move(open);
    options.access = server->own_access_.get();
  }
  server->services_ = std::make_unique<Services>(coordinator, metrics, options.access);
  // Process-wide switch; must be on before the server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC enables SO_REUSEPORT by default; then a second coordinator on the same address would bind
  // too and take half the calls. A port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(
      address, options.credentials ? options.credentials : grpc::InsecureServerCredentials(),
      &port);
  builder.SetMaxReceiveMessageSize(api::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(api::kMaxMessageBytes);
  builder.RegisterService(&server->services_->jobs);
  builder.RegisterService(&server->services_->workers);
  builder.RegisterService(&server->services_->admin);
  builder.RegisterService(&server->services_->inference);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    // Nothing to shut down: the destructor must not touch a server that never started.
    server->shut_down_ = true;
    return absl::UnavailableError(
        absl::StrCat("cannot listen for gRPC on ", address, " (address in use or not local?)"));
  }
  server->address_ = absl::StrCat(address.substr(0, colon), ":", port);
  for (const char* method : kMethods) metrics->DeclareRpc(method);
  for (const char* method : InferenceService::kMethods) metrics->DeclareRpc(method);
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
