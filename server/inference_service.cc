#include "server/inference_service.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "api/limits.h"
#include "api/quote.h"
#include "api/tenant.h"
#include "server/deployment_model.h"
#include "server/grpc_service.h"
#include "server/inference_model.h"

namespace dattn {
namespace server {
namespace {

constexpr char kServerLive[] = "/inference.GRPCInferenceService/ServerLive";
constexpr char kServerReady[] = "/inference.GRPCInferenceService/ServerReady";
constexpr char kModelReady[] = "/inference.GRPCInferenceService/ModelReady";
constexpr char kServerMetadata[] = "/inference.GRPCInferenceService/ServerMetadata";
constexpr char kModelMetadata[] = "/inference.GRPCInferenceService/ModelMetadata";
constexpr char kModelInfer[] = "/inference.GRPCInferenceService/ModelInfer";

constexpr const char* kOutputNames[] = {"out", "dq", "dk", "dv"};

// Gathers an Attend call's answer into whole outputs while checking it against Attend's protocol
// (inference_service.h): accepted, then out (and dq, dk, dv) each complete and in order, then done.
// The first departure is kept as an INTERNAL error and every later message refused.
class AnswerAssembler {
 public:
  // `count` outputs (1 or 4) of `bytes` bytes each.
  AnswerAssembler(int count, int64_t bytes) : outputs_(4), count_(count), bytes_(bytes) {}

  // Takes one message of the answer; false (the call should stop) once it departed.
  bool Take(const v1::AttendResponse& r) {
    if (!error_.ok()) return false;
    if (r.has_accepted()) {
      if (accepted_) return Depart("a second accepted");
      accepted_ = true;
      accepted_message_ = r.accepted();
      return true;
    }
    if (r.has_done()) {
      if (!accepted_) return Depart("done before accepted");
      if (done_) return Depart("a second done");
      for (int t = 0; t < count_; ++t) {
        if (Size(t) != bytes_) {
          return Depart(absl::StrCat("done while output ", kOutputNames[t], " had ", Size(t),
                                     " of its ", bytes_, " bytes"));
        }
      }
      done_ = true;
      result_ = r.done();
      return true;
    }
    if (!r.has_chunk()) return Depart("a message with neither accepted, chunk nor done");
    const v1::AttendChunk& chunk = r.chunk();
    const int t = static_cast<int>(chunk.tensor()) - static_cast<int>(v1::ATTEND_TENSOR_OUT);
    if (t < 0 || t >= count_) {
      return Depart(absl::StrCat("a chunk of tensor ", v1::AttendTensor_Name(chunk.tensor()), " (",
                                 static_cast<int>(chunk.tensor()),
                                 "), which is not an output of this call"));
    }
    const char* name = kOutputNames[t];
    if (!accepted_) return Depart(absl::StrCat("a chunk of ", name, " before accepted"));
    if (done_) return Depart(absl::StrCat("a chunk of ", name, " after done"));
    if (t < current_) {
      return Depart(
          absl::StrCat("a chunk of ", name, " after ", kOutputNames[current_], " had begun"));
    }
    for (int before = current_; before < t; ++before) {
      if (Size(before) != bytes_) {
        return Depart(absl::StrCat("a chunk of ", name, " while ", kOutputNames[before], " had ",
                                   Size(before), " of its ", bytes_, " bytes"));
      }
    }
    current_ = t;
    if (chunk.offset() != Size(t)) {
      return Depart(
          absl::StrCat("a chunk of ", name, " at offset ", chunk.offset(), ", expected ", Size(t)));
    }
    const int64_t size = static_cast<int64_t>(chunk.data().size());
    if (size == 0 || size > api::kMaxOutputChunkBytes || Size(t) + size > bytes_) {
      return Depart(absl::StrCat("a chunk of ", name, " of ", size, " bytes at offset ",
                                 chunk.offset(), " (non-empty, at most ", api::kMaxOutputChunkBytes,
                                 ", within its ", bytes_, " bytes)"));
    }
    outputs_[static_cast<size_t>(t)] += chunk.data();
    return true;
  }

  // What the call comes to, given the AttendFn's status: the departure if there was one, else
  // the AttendFn's error, else INTERNAL unless the answer ended with done.
  absl::Status Finish(const absl::Status& attended) const {
    if (!error_.ok()) return error_;
    if (!attended.ok()) return attended;
    if (!done_) return absl::InternalError("the Attend call ended OK without done");
    return absl::OkStatus();
  }

  std::vector<std::string> TakeOutputs() { return std::move(outputs_); }
  const v1::AttendAccepted& accepted() const { return accepted_message_; }
  const v1::AttentionJobResult& result() const { return result_; }

 private:
  int64_t Size(int t) const {
    return static_cast<int64_t>(outputs_[static_cast<size_t>(t)].size());
  }
  bool Depart(const std::string& what) {
    error_ = absl::InternalError(
        absl::StrCat("the Attend call's answer departed from its protocol: ", what));
    return false;
  }

  std::vector<std::string> outputs_;
  const int count_;
  const int64_t bytes_;
  int current_ = 0;  // The output being received.
  bool accepted_ = false;
  bool done_ = false;
  v1::AttendAccepted accepted_message_;
  v1::AttentionJobResult result_;
  absl::Status error_;
};

}  // namespace

const char* const InferenceService::kMethods[6] = {kServerLive,     kServerReady,   kModelReady,
                                                   kServerMetadata, kModelMetadata, kModelInfer};

grpc::Status InferenceService::Done(const char* method, const absl::Status& status) const {
  metrics_->CountRpc(method, absl::StatusCodeToString(status.code()));
  return ToGrpcStatus(status);
}

absl::Status InferenceService::Authenticate(const grpc::ServerContext& context) const {
  return access_->Caller(context).status();
}

grpc::Status InferenceService::ServerLive(grpc::ServerContext* context,
                                          const inference::ServerLiveRequest*,
                                          inference::ServerLiveResponse* response) {
  absl::Status s = Authenticate(*context);
  if (s.ok()) response->set_live(true);
  return Done(kServerLive, s);
}

grpc::Status InferenceService::ServerReady(grpc::ServerContext* context,
                                           const inference::ServerReadyRequest*,
                                           inference::ServerReadyResponse* response) {
  absl::Status s = Authenticate(*context);
  if (s.ok()) response->set_ready(health_().ok());
  return Done(kServerReady, s);
}

absl::Status InferenceService::FindDeployment(const security::Principal& caller,
                                              const std::string& name) const {
  const absl::Status not_found = absl::NotFoundError(
      absl::StrCat("model ", api::Quote(name), " not found: the models are \"", kAttentionModel,
                   "\" and the deployments, each by its job id (dattn list)"));
  if (name.empty()) return not_found;
  absl::StatusOr<v1::Job> job = deployments_.get_job(name);
  if (absl::IsNotFound(job.status())) return not_found;
  if (!job.ok()) return job.status();
  if (!job->spec().has_deployment()) return not_found;
  // Another tenant's deployment is not found, as JobService hides other tenants' jobs.
  if (access_->authenticates() && api::TenantOrDefault(job->spec().tenant()) != caller.tenant &&
      !Access::MaySee(caller, *job)) {
    return not_found;
  }
  return absl::OkStatus();
}

grpc::Status InferenceService::ModelReady(grpc::ServerContext* context,
                                          const inference::ModelReadyRequest* request,
                                          inference::ModelReadyResponse* response) {
  absl::StatusOr<security::Principal> caller = access_->Caller(*context);
  absl::Status s = caller.status();
  if (s.ok() && request->name() != kAttentionModel) {
    s = FindDeployment(*caller, request->name());
    if (s.ok()) s = CheckDeploymentVersion(request->name(), request->version());
    if (s.ok()) response->set_ready(deployments_.serving(request->name()).ok());
    return Done(kModelReady, s);
  }
  if (s.ok()) s = CheckModel(request->name(), request->version());
  if (s.ok()) response->set_ready(health_().ok());
  return Done(kModelReady, s);
}

grpc::Status InferenceService::ServerMetadata(grpc::ServerContext* context,
                                              const inference::ServerMetadataRequest*,
                                              inference::ServerMetadataResponse* response) {
  absl::Status s = Authenticate(*context);
  if (s.ok()) {
    response->set_name("dattn");
    response->set_version("v1");
  }
  return Done(kServerMetadata, s);
}

grpc::Status InferenceService::ModelMetadata(grpc::ServerContext* context,
                                             const inference::ModelMetadataRequest* request,
                                             inference::ModelMetadataResponse* response) {
  absl::StatusOr<security::Principal> caller = access_->Caller(*context);
  absl::Status s = caller.status();
  if (s.ok() && request->name() != kAttentionModel) {
    s = FindDeployment(*caller, request->name());
    if (s.ok()) s = CheckDeploymentVersion(request->name(), request->version());
    if (s.ok()) *response = DeploymentModelMetadata(request->name());
    return Done(kModelMetadata, s);
  }
  if (s.ok()) s = CheckModel(request->name(), request->version());
  if (s.ok()) *response = AttentionModelMetadata();
  return Done(kModelMetadata, s);
}

absl::Status InferenceService::InferDeployment(grpc::ServerContext* context,
                                               const inference::ModelInferRequest& request,
                                               inference::ModelInferResponse* response,
                                               int64_t* bytes_in, int64_t* bytes_out) const {
  absl::StatusOr<ScoreInferCall> call = ParseScoreInfer(request);
  if (!call.ok()) return call.status();
  *bytes_in = static_cast<int64_t>(call->score.tokens_size()) * 4 +
              static_cast<int64_t>(call->score.text().size());
  absl::StatusOr<v1::ScoreResponse> score =
      deployments_.score(call->score, [context] { return context->IsCancelled(); });
  if (absl::IsCancelled(score.status()) &&
      std::chrono::system_clock::now() >= context->deadline()) {
    return absl::DeadlineExceededError(
        absl::StrCat("the ModelInfer call's deadline passed: ", score.status().message()));
  }
  if (!score.ok()) return score.status();
  *response = MakeScoreInferResponse(request, *call, *score);
  for (const std::string& raw : response->raw_output_contents()) {
    *bytes_out += static_cast<int64_t>(raw.size());
  }
  return absl::OkStatus();
}

grpc::Status InferenceService::ModelInfer(grpc::ServerContext* context,
                                          const inference::ModelInferRequest* request,
                                          inference::ModelInferResponse* response) {
  const absl::Time begin = absl::Now();
  int64_t bytes_in = 0, bytes_out = 0;
  std::string tenant = api::TenantOrDefault("");
  if (request->model_name() != kAttentionModel) {
    // A deployment: labelled by its id once found (unknown names never become labels).
    std::string label = "unknown";
    absl::Status status = [&]() -> absl::Status {
      absl::StatusOr<security::Principal> caller = access_->Caller(*context);
      if (!caller.ok()) return caller.status();
      tenant = api::TenantOrDefault(caller->tenant);
      if (absl::Status s = FindDeployment(*caller, request->model_name()); !s.ok()) return s;
      label = request->model_name();
      return InferDeployment(context, *request, response, &bytes_in, &bytes_out);
    }();
    metrics_->CountInference(label, tenant, status.code(), bytes_in, bytes_out,
                             absl::ToDoubleSeconds(absl::Now() - begin));
    return Done(kModelInfer, status);
  }
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<security::Principal> caller = access_->Caller(*context);
    if (!caller.ok()) return caller.status();
    // The tenant is the caller's, as for SubmitJob and Attend.
    v1::JobSpec scope;
    if (absl::Status s = Access::ScopeSubmit(*caller, &scope); !s.ok()) return s;
    tenant = api::TenantOrDefault(scope.tenant());
    absl::StatusOr<InferenceCall> call = ParseModelInfer(*request);
    if (!call.ok()) return call.status();
    v1::AttendRequest first;
    *first.mutable_start() = call->start;
    first.mutable_start()->set_tenant(scope.tenant());
    // The inputs, chunk by chunk, from the request's own bytes.
    size_t tensor = 0;
    int64_t offset = 0;
    for (const std::string& input : call->inputs) bytes_in += static_cast<int64_t>(input.size());
    auto next = [&](v1::AttendRequest* message) {
      while (tensor < call->inputs.size() &&
             offset >= static_cast<int64_t>(call->inputs[tensor].size())) {
        ++tensor;
        offset = 0;
      }
      if (tensor == call->inputs.size()) return false;
      v1::AttendChunk* chunk = message->mutable_chunk();
      chunk->set_tensor(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_Q + tensor));
      chunk->set_offset(offset);
      chunk->set_data(call->inputs[tensor].substr(static_cast<size_t>(offset),
                                                  static_cast<size_t>(api::kMaxOutputChunkBytes)));
      offset += static_cast<int64_t>(chunk->data().size());
      return true;
    };
    // The answer, gathered whole (a response carries its tensors whole) and checked.
    const int count = call->start.backward() ? 4 : 1;
    const int64_t bytes = static_cast<int64_t>(call->inputs[0].size());
    AnswerAssembler answer(count, bytes);
    absl::Status attended = attend_(
        first, next, [&answer](const v1::AttendResponse& r) { return answer.Take(r); },
        [context] { return context->IsCancelled(); });
    if (absl::IsCancelled(attended) && std::chrono::system_clock::now() >= context->deadline()) {
      attended = absl::DeadlineExceededError(
          absl::StrCat("the ModelInfer call's deadline passed: ", attended.message()));
    }
    if (absl::Status s = answer.Finish(attended); !s.ok()) return s;
    std::vector<std::string> outputs = answer.TakeOutputs();
    for (int t : call->outputs) bytes_out += static_cast<int64_t>(outputs[t].size());
    *response = MakeModelInferResponse(*request, *call, std::move(outputs), answer.accepted(),
                                       answer.result());
    return absl::OkStatus();
  }();
  metrics_->CountInference(kAttentionModel, tenant, status.code(), bytes_in, bytes_out,
                           absl::ToDoubleSeconds(absl::Now() - begin));
  return Done(kModelInfer, status);
}

}  // namespace server
}  // namespace dattn
