// A deployment (docs/SERVING.md) as a model of the Open Inference Protocol v2 (proto/inference/
// grpc_predict_v2.proto; docs/INFERENCE_PROTOCOL.md): the model's name is the deployment's job id,
// its version "1", and ModelInfer is Score (job_service.proto): the log-probability of each token
// given those before it, and their mean negated. This file checks what a ModelInferRequest asks
// of a deployment and turns it into a ScoreRequest, and the ScoreResponse into the
// ModelInferResponse. No gRPC, no I/O: the service (inference_service.h) runs the call through
// Coordinator::Score, so it shares Score's routing, checks (vocabulary, context) and metrics.
//
// Inputs: exactly one of
//   "tokens"  INT32 or INT64, shape [N] or [1, N] (N >= 1), as int_contents (INT32),
//             int64_contents (INT64) or one raw_input_contents entry (N little-endian values);
//             each value must fit an int32 (the vocabulary check is Score's);
//   "text"    BYTES, shape [1] or [1, 1]: one element, the bytes of the text (byte-level models),
//             as bytes_contents or a raw entry in the protocol's BYTES layout (a little-endian
//             uint32 length, then the bytes).
// Outputs (always raw_output_contents, little-endian; `outputs` may ask for a subset, in its
// order): "logprobs" FP64 [N - 1] ([1, N - 1] when the input had a batch dimension),
// logprobs[i] = log p(token i + 1 | tokens 0..i); "loss" FP64 [1] ([1, 1]), their mean negated
// (nats per token). Response parameters: "tokens" (int64, the tokens scored) and "seconds" (double,
// the rank's time). No request or tensor parameters are taken.
//
// Thread-safe (pure functions).
#ifndef DATTN_SERVER_DEPLOYMENT_MODEL_H_
#define DATTN_SERVER_DEPLOYMENT_MODEL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dattn/v1/job_service.pb.h"
#include "inference/grpc_predict_v2.pb.h"

namespace dattn {
namespace server {

inline constexpr char kDeploymentModelVersion[] = "1";
inline constexpr char kDeploymentPlatform[] = "dattn-longnet";

// A checked ModelInferRequest for a deployment.
struct ScoreInferCall {
  v1::ScoreRequest score;    // deployment_id = the request's model_name; tokens or text.
  bool batched = false;      // The input had a leading dimension of 1: so do the outputs.
  std::vector<int> outputs;  // Which of logprobs (0) and loss (1) to return, in order.
};

// NOT_FOUND for a version other than "" or "1" (naming it); INVALID_ARGUMENT naming the tensor,
// field or parameter and the value for: no input, more than one, or one not named "tokens" or
// "text"; a datatype or shape not listed above; contents of the wrong kind, count or byte length
// (or both raw and typed contents; or a raw entry count that is not 1); an INT64 token outside
// int32; a request or tensor parameter; an unknown or repeated output.
absl::StatusOr<ScoreInferCall> ParseScoreInfer(const inference::ModelInferRequest& request);

// The response to `request` (checked as `call`) whose Score answered `score`.
inference::ModelInferResponse MakeScoreInferResponse(const inference::ModelInferRequest& request,
                                                     const ScoreInferCall& call,
                                                     const v1::ScoreResponse& score);

// The deployment's metadata: its version, platform, inputs and outputs (shapes with -1 for a
// dimension of any size).
inference::ModelMetadataResponse DeploymentModelMetadata(const std::string& deployment_id);

// NOT_FOUND unless `version` is empty or the deployment model's version.
absl::Status CheckDeploymentVersion(const std::string& deployment_id, const std::string& version);

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_DEPLOYMENT_MODEL_H_
