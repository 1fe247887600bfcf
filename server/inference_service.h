// inference.GRPCInferenceService (the Open Inference Protocol v2, proto/inference/
// grpc_predict_v2.proto) on the coordinator's gRPC server: dilated attention as the model
// "dilated-attention" (inference_model.h; docs/INFERENCE_PROTOCOL.md), so that KServe and Triton
// clients call it unchanged.
//
// ModelInfer runs one Coordinator::Attend call on the request's tensors: the same admission,
// quotas, placement, ring and job (`dattn status` shows it) as JobService.Attend, the tenant from
// the caller's credentials as for every dattn.v1 call. A request carries its tensors whole, so it
// is bounded by the server's message size (api::kMaxMessageBytes, 32 MiB); larger tensors go
// through JobService.Attend, which streams them. ServerLive is true while the process serves;
// ServerReady and ModelReady follow Coordinator::Health. Every call is counted in
// dattn_rpc_total{method,code}; ModelInfer also in dattn_inference_* (metrics.h).
//
// Errors: those of inference_model.h (INVALID_ARGUMENT naming the tensor or parameter, NOT_FOUND
// for another model), of Access (UNAUTHENTICATED, PERMISSION_DENIED) and of Attend (the job's
// failure with the failing rank's code, RESOURCE_EXHAUSTED when it fits nowhere, CANCELLED or
// DEADLINE_EXCEEDED when the client goes away or its deadline passes).
//
// Thread-safety: every method may be called from any thread (gRPC's), concurrently.
#ifndef DATTN_SERVER_INFERENCE_SERVICE_H_
#define DATTN_SERVER_INFERENCE_SERVICE_H_

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/access.h"
#include "server/coordinator.h"
#include "server/metrics.h"

namespace dattn {
namespace server {

class InferenceService final : public inference::GRPCInferenceService::Service {
 public:
  // None is owned; all outlive the service.
  InferenceService(Coordinator* coordinator, Metrics* metrics, const Access* access)
      : core_(coordinator), metrics_(metrics), access_(access) {}

  // Full method names, for dattn_rpc_total.
  static const char* const kMethods[6];

  grpc::Status ServerLive(grpc::ServerContext* context, const inference::ServerLiveRequest* request,
                          inference::ServerLiveResponse* response) override;
  grpc::Status ServerReady(grpc::ServerContext* context,
                           const inference::ServerReadyRequest* request,
                           inference::ServerReadyResponse* response) override;
  grpc::Status ModelReady(grpc::ServerContext* context, const inference::ModelReadyRequest* request,
                          inference::ModelReadyResponse* response) override;
  grpc::Status ServerMetadata(grpc::ServerContext* context,
                              const inference::ServerMetadataRequest* request,
                              inference::ServerMetadataResponse* response) override;
  grpc::Status ModelMetadata(grpc::ServerContext* context,
                             const inference::ModelMetadataRequest* request,
                             inference::ModelMetadataResponse* response) override;
  grpc::Status ModelInfer(grpc::ServerContext* context, const inference::ModelInferRequest* request,
                          inference::ModelInferResponse* response) override;

 private:
  // Authenticates the caller (any role may read health and metadata).
  absl::Status Authenticate(const grpc::ServerContext& context) const;
  grpc::Status Done(const char* method, const absl::Status& status) const;

  Coordinator* const core_;
  Metrics* const metrics_;
  const Access* const access_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_INFERENCE_SERVICE_H_
