// inference.GRPCInferenceService (the Open Inference Protocol v2, proto/inference/
// grpc_predict_v2.proto) on the coordinator's gRPC server: dilated attention as the model
// "dilated-attention" (inference_model.h; docs/INFERENCE_PROTOCOL.md), so that KServe and Triton
// clients call it unchanged.
//
// ModelInfer is an adapter around one Attend call (an AttendFn: in the coordinator,
// Coordinator::Attend, bound by grpc_service.cc), so an inference shares the admission, quotas,
// placement, ring, job (`dattn status` shows it) and metrics of JobService.Attend. The adapter
// checks the request (inference_model.h), sets AttendStart.tenant from the caller's credentials
// exactly as JobService does for SubmitJob and Attend (Access::ScopeSubmit), feeds the request's
// q, k, v (and dout) through `next` in that order, each in chunks of at most
// api::kMaxOutputChunkBytes (4 MiB) at consecutive byte offsets, and gathers the answer into the
// response. The answer must follow Attend's protocol (job_service.proto): `accepted`, then every
// output the call has (out; with dout also dq, dk, dv) in that order, each in non-empty chunks at
// consecutive offsets up to exactly its size, then `done`; anything else is INTERNAL naming what
// departed (and the Attend call is told to stop: `emit` answers false).
//
// A request carries its tensors whole, so it is bounded by the server's message size
// (api::kMaxMessageBytes, 32 MiB; gRPC itself answers RESOURCE_EXHAUSTED beyond it); larger
// tensors go through JobService.Attend, which streams them. ServerLive is true while the process
// serves; ServerReady and ModelReady are whether `health` is OK. Every call is counted in
// dattn_rpc_total{method,code}; ModelInfer also in dattn_inference_* (metrics.h).
//
// Errors: UNAUTHENTICATED or PERMISSION_DENIED from Access; those of inference_model.h
// (INVALID_ARGUMENT naming the tensor or parameter, NOT_FOUND for another model or version);
// the AttendFn's own, passed on unchanged (the job's failure with the failing rank's code,
// RESOURCE_EXHAUSTED when it fits nowhere, CANCELLED), except that a CANCELLED after the call's
// deadline is DEADLINE_EXCEEDED; INTERNAL for an answer that departs from the protocol.
//
// Thread-safety: every method may be called from any thread (gRPC's), concurrently; the AttendFn
// and the health function must allow that too.
#ifndef DATTN_SERVER_INFERENCE_SERVICE_H_
#define DATTN_SERVER_INFERENCE_SERVICE_H_

#include <functional>
#include <utility>

#include "absl/status/status.h"
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

class InferenceService final : public inference::GRPCInferenceService::Service {
 public:
  // `metrics` and `access` are not owned and outlive the service.
  InferenceService(AttendFn attend, HealthFn health, Metrics* metrics, const Access* access)
      : attend_(std::move(attend)),
        health_(std::move(health)),
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

  const AttendFn attend_;
  const HealthFn health_;
  Metrics* const metrics_;
  const Access* const access_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_INFERENCE_SERVICE_H_
