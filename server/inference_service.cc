#include "server/inference_service.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "api/limits.h"
#include "api/tenant.h"
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
  if (s.ok()) response->set_ready(core_->Health().ok());
  return Done(kServerReady, s);
}

grpc::Status InferenceService::ModelReady(grpc::ServerContext* context,
                                          const inference::ModelReadyRequest* request,
                                          inference::ModelReadyResponse* response) {
  absl::Status s = Authenticate(*context);
  if (s.ok()) s = CheckModel(request->name(), request->version());
  if (s.ok()) response->set_ready(core_->Health().ok());
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
  absl::Status s = Authenticate(*context);
  if (s.ok()) s = CheckModel(request->name(), request->version());
  if (s.ok()) *response = AttentionModelMetadata();
  return Done(kModelMetadata, s);
}

grpc::Status InferenceService::ModelInfer(grpc::ServerContext* context,
                                          const inference::ModelInferRequest* request,
                                          inference::ModelInferResponse* response) {
  const absl::Time begin = absl::Now();
  int64_t bytes_in = 0, bytes_out = 0;
  std::string tenant = api::TenantOrDefault("");
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
    // The answer, gathered whole (a response carries its tensors whole).
    std::vector<std::string> outputs(4);
    v1::AttendAccepted accepted;
    v1::AttentionJobResult result;
    bool in_order = true;
    auto emit = [&](const v1::AttendResponse& r) {
      if (r.has_accepted()) accepted = r.accepted();
      if (r.has_done()) result = r.done();
      if (r.has_chunk()) {
        const int t = r.chunk().tensor() - v1::ATTEND_TENSOR_OUT;
        if (t < 0 || t > 3 ||
            r.chunk().offset() != static_cast<int64_t>(outputs[static_cast<size_t>(t)].size())) {
          in_order = false;
          return false;
        }
        outputs[static_cast<size_t>(t)] += r.chunk().data();
      }
      return true;
    };
    absl::Status attended = core_->Attend(
        first, next, emit, [context] { return context->IsCancelled(); }, nullptr);
    if (!in_order) return absl::InternalError("the Attend call's outputs came out of order");
    if (!attended.ok()) {
      if (absl::IsCancelled(attended) && std::chrono::system_clock::now() >= context->deadline()) {
        return absl::DeadlineExceededError(
            absl::StrCat("the ModelInfer call's deadline passed: ", attended.message()));
      }
      return attended;
    }
    for (int t : call->outputs) bytes_out += static_cast<int64_t>(outputs[t].size());
    *response = MakeModelInferResponse(*request, *call, std::move(outputs), accepted, result);
    return absl::OkStatus();
  }();
  metrics_->CountInference(kAttentionModel, tenant, status.code(), bytes_in, bytes_out,
                           absl::ToDoubleSeconds(absl::Now() - begin));
  return Done(kModelInfer, status);
}

}  // namespace server
}  // namespace dattn
