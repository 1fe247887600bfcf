// inference.GRPCInferenceService (the Open Inference Protocol v2, proto/inference/
// grpc_predict_v2.proto) on the coordinator's gRPC server: dilated attention as the model
// "dilated-attention" (inference_model.h; docs/INFERENCE_PROTOCOL.md), so that KServe and Triton
// clients call it unchanged.
//
// Models: "dilated-attention" (inference_model.h) and every deployment, named by its job id
// (deployment_model.h; docs/SERVING.md). On a deployment ModelInfer is one Score call
// (DeploymentCalls::score: Coordinator::Score), ModelReady whether it serves now and ModelMetadata
// its tensors; a deployment of another tenant is NOT_FOUND, as an unknown model is, exactly as
// JobService hides other tenants' jobs (Access::MaySee). Counted in dattn_inference_* under the
// deployment's id (only ids of deployments that exist become labels).
//
// On "dilated-attention", ModelInfer is an adapter around one Attend call (an AttendFn: in the
// coordinator, Coordinator::Attend, bound by grpc_service.cc), so an inference shares the
// admission, quotas, placement, ring, job (`dattn status` shows it) and metrics of
// JobService.Attend. The adapter checks the request (inference_model.h), sets AttendStart.tenant
// from the caller's credentials exactly as JobService does for SubmitJob and Attend
// (Access::ScopeSubmit), feeds the request's q, k, v (and dout) through `next` in that order, each
// in chunks of at most api::kMaxOutputChunkBytes (4 MiB) at consecutive byte offsets, and gathers
// the answer into the response. The answer must follow Attend's protocol (job_service.proto):
// `accepted`, then every output the call has (out; with dout also dq, dk, dv) in that order, each
// in non-empty chunks at consecutive offsets up to exactly its size, then `done`; anything else is
// INTERNAL naming what departed (and the Attend call is told to stop: `emit` answers false).
//
// A request carries its tensors whole, so it is bounded by the server's message size
// (api::kMaxMessageBytes, 32 MiB; gRPC itself answers RESOURCE_EXHAUSTED beyond it); larger
// tensors go through JobService.Attend, which streams them. ServerLive is true while the process
// serves; ServerReady and ModelReady are whether `health` is OK. Every call is counted in
// dattn_rpc_total{method,code}; ModelInfer also in dattn_inference_* (metrics.h).
//
// Errors: UNAUTHENTICATED or PERMISSION_DENIED from Access; NOT_FOUND for a model that is neither;
// those of inference_model.h and deployment_model.h (INVALID_ARGUMENT naming the tensor or
// parameter, NOT_FOUND for another version); Score's on a deployment (FAILED_PRECONDITION while it
// does not serve, INVALID_ARGUMENT for tokens outside its vocabulary or over its context);
// the AttendFn's own, passed on unchanged (the job's failure with the failing rank's code,
// RESOURCE_EXHAUSTED when it fits nowhere, CANCELLED), except that a CANCELLED after the call's
// deadline is DEADLINE_EXCEEDED; INTERNAL for an answer that departs from the protocol.
//
// Thread-safety: every method may be called from any thread (gRPC's), concurrently; the AttendFn
// and the health function must allow that too.
#ifndef DATTN_SERVER_INFERENCE_SERVICE_H_
#define DATTN_SERVER_INFERENCE_SERVICE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/access.h"
#include "server/coordinator.h"  // AttendSource, AttendSink and CancelledFn only.
#include "server/metrics.h"

namespace dattn {
namespace server {

// One Attend call with the semantics of Coordinator::Attend (coordinator.h): `first` holds
// `start` (its tenant set), `next` reads the input chunks, `emit` sends the answer (accepted,
// output chunks, done) and a false from it stops the call, `cancelled` is polled. Returns when the
// call has ended: OK after `done`, or why not.
using AttendFn =
    std::function<absl::Status(const v1::AttendRequest& first, const AttendSource& next,
                               const AttendSink& emit, const CancelledFn& cancelled)>;
// The server's readiness (Coordinator::Health): OK when it takes work.
using HealthFn = std::function<absl::Status()>;

// What the service asks of the coordinator about deployments (grpc_service.cc binds them).
struct DeploymentCalls {
  // The job `id` with at most one event (Coordinator::GetJob): NOT_FOUND for an unknown job.
  std::function<absl::StatusOr<v1::Job>(const std::string& id)> get_job;
  // Coordinator::ServingDeployment: OK while the deployment serves.
  std::function<absl::Status(const std::string& id)> serving;
  // Coordinator::Score.
  std::function<absl::StatusOr<v1::ScoreResponse>(const v1::ScoreRequest&, const CancelledFn&)>
      score;
};

class InferenceService final : public inference::GRPCInferenceService::Service {
 public:
  // `metrics` and `access` are not owned and outlive the service.
  InferenceService(AttendFn attend, HealthFn health, DeploymentCalls deployments, Metrics* metrics,
                   const Access* access)
      : attend_(std::move(attend)),
        health_(std::move(health)),
        deployments_(std::move(deployments)),
        metrics_(metrics),
        access_(access) {}

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
  // Whether `name` is a deployment the authenticated `caller` may use (OK), or NOT_FOUND: neither
  // the attention model nor such a deployment. Call only for names other than the attention
  // model's.
  absl::Status FindDeployment(const security::Principal& caller, const std::string& name) const;
  // ModelInfer on a deployment.
  absl::Status InferDeployment(grpc::ServerContext* context,
                               const inference::ModelInferRequest& request,
                               inference::ModelInferResponse* response, int64_t* bytes_in,
                               int64_t* bytes_out) const;

  const AttendFn attend_;
  const HealthFn health_;
  const DeploymentCalls deployments_;
  Metrics* const metrics_;
  const Access* const access_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_INFERENCE_SERVICE_H_
