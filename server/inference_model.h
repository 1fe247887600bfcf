// The model dattn serves through the Open Inference Protocol v2 (proto/inference/
// grpc_predict_v2.proto; docs/INFERENCE_PROTOCOL.md): dilated attention, named "dilated-attention",
// version "1". This file checks what a ModelInferRequest asks of it and turns it into an Attend
// call's start and input bytes, and the call's outputs into the ModelInferResponse. No gRPC, no
// I/O: the service (inference_service.h) runs the call through Coordinator::Attend, so an
// inference shares the admission, placement and metrics of every Attend call.
//
// The model: inputs "q", "k", "v" and optionally "dout" (which makes it forward and backward),
// each (B, N, H, D) of one datatype ("FP32", "FP64", "FP16", "BF16"), as raw_input_contents (one
// per input, in the order of `inputs`, little-endian) or typed contents (fp32_contents for FP32,
// fp64_contents for FP64; FP16 and BF16 only raw). Outputs "out" and, with dout, "dq", "dk", "dv",
// of the same datatype and shape, always as raw_output_contents; `outputs` may ask for a subset.
// Request parameters (the attention's): "segment_lengths" and "dilation_rates" (required: a
// string of comma-separated integers, or an int64 for one pattern), "mode" ("grouped" or
// "mixture"), "causal" (bool), "scale" (double), "head_offsets" ("modulo" or "blocked"),
// "num_ranks" (int64; 0 or absent: the fewest ranks that fit), "device" ("any", "cpu", "gpu"),
// "priority" (int64). The response's parameters: "job_id" (string), "num_ranks" (int64) and
// "engine_seconds" (double: the slowest rank's step).
//
// Thread-safe (pure functions).
#ifndef DATTN_SERVER_INFERENCE_MODEL_H_
#define DATTN_SERVER_INFERENCE_MODEL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"
#include "inference/grpc_predict_v2.pb.h"

namespace dattn {
namespace server {

inline constexpr char kAttentionModel[] = "dilated-attention";
inline constexpr char kAttentionModelVersion[] = "1";

// A checked ModelInferRequest.
struct InferenceCall {
  v1::AttendStart start;            // The problem; its tenant is the caller's to set.
  std::string datatype;             // "FP32", ...
  std::vector<std::string> inputs;  // q, k, v (and dout): each tensor's bytes, little-endian.
  std::vector<int> outputs;         // Which of out (0), dq, dk, dv (3) to return, in order.
};

// NOT_FOUND for another model or version (naming it and the one served); INVALID_ARGUMENT naming
// the tensor or parameter and the value for: a missing, repeated or unknown input; a datatype or
// shape that is not q's or not supported; raw contents whose byte length is not the shape's (or a
// count of raw contents that is not the inputs'); typed contents of the wrong type or count; an
// unknown parameter, one of the wrong type or value, or a required one missing; an unknown or
// repeated output, or a gradient asked for without dout. The attention's own rules (segments,
// rates, heads, ranks) are Attend's to check, with its messages.
absl::StatusOr<InferenceCall> ParseModelInfer(const inference::ModelInferRequest& request);

// The response to `request` (checked as `call`) whose Attend call sent `outputs` (out, dq, dk, dv
// bytes, as many as the call has), was accepted as `accepted` and ended with `result`.
inference::ModelInferResponse MakeModelInferResponse(const inference::ModelInferRequest& request,
                                                     const InferenceCall& call,
                                                     std::vector<std::string> outputs,
                                                     const v1::AttendAccepted& accepted,
                                                     const v1::AttentionJobResult& result);

// NOT_FOUND unless `name` is the model and `version` is empty or its version.
absl::Status CheckModel(const std::string& name, const std::string& version);

// The model's metadata: its versions, platform, tensors (datatype "FP32", shape [-1, -1, -1, -1];
// the others it takes are listed in properties) and parameters.
inference::ModelMetadataResponse AttentionModelMetadata();

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_INFERENCE_MODEL_H_
