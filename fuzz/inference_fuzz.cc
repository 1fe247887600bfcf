// Fuzzes the Open Inference Protocol's request decoding (server/inference_model.h and
// server/deployment_model.h): the input is a serialized ModelInferRequest, as gRPC hands it over,
// decoded both as a request to the attention model and as one to a deployment. Each is either
// refused (NOT_FOUND for another model or version, INVALID_ARGUMENT with a message, nothing else)
// or turned into its call: an Attend call whose inputs are whole tensors of the declared shape and
// datatype (q, k, v and maybe dout); a Score of the declared tokens (or one text); with outputs
// valid and distinct, and a response that can be built.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "server/deployment_model.h"
#include "server/inference_model.h"

namespace {

void CheckAt(bool ok, int line) {
  if (!ok) {
    std::fprintf(stderr, "inference_fuzz: check at line %d failed\n", line);
    __builtin_trap();
  }
}
#define Check(ok) CheckAt((ok), __LINE__)

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  // As a deployment's Score.
  absl::StatusOr<dattn::server::ScoreInferCall> score = dattn::server::ParseScoreInfer(request);
  if (!score.ok()) {
    Check(absl::IsInvalidArgument(score.status()) || absl::IsNotFound(score.status()));
    Check(!score.status().message().empty());
  } else {
    Check(request.inputs_size() == 1);
    const auto& input = request.inputs(0);
    Check(score->score.deployment_id() == request.model_name());
    if (input.name() == "tokens") {
      Check(score->score.text().empty());
      Check(score->score.tokens_size() == input.shape(input.shape_size() - 1));
    } else {
      Check(input.name() == "text" && score->score.tokens_size() == 0);
    }
    Check(!score->outputs.empty() && score->outputs.size() <= 2);
    if (score->outputs.size() == 2) Check(score->outputs[0] != score->outputs[1]);
    dattn::v1::ScoreResponse scored;
    for (int i = 1; i < score->score.tokens_size(); ++i) scored.add_logprobs(-1.0);
    const inference::ModelInferResponse response =
        dattn::server::MakeScoreInferResponse(request, *score, scored);
    Check(response.outputs_size() == static_cast<int>(score->outputs.size()));
    Check(response.raw_output_contents_size() == response.outputs_size());
  }
  // As the attention model.
  absl::StatusOr<dattn::server::InferenceCall> call = dattn::server::ParseModelInfer(request);
  if (!call.ok()) {
    Check(absl::IsInvalidArgument(call.status()) || absl::IsNotFound(call.status()));
    Check(!call.status().message().empty());
    return 0;
  }
  const dattn::v1::TensorShape& s = call->start.shape();
  const int64_t elements = s.batch() * s.seq_len() * s.num_heads() * s.head_dim();
  const int64_t element_bytes = call->datatype == "FP64" ? 8 : call->datatype == "FP32" ? 4 : 2;
  Check(call->inputs.size() == 3 || call->inputs.size() == 4);
  Check(call->start.backward() == (call->inputs.size() == 4));
  for (const std::string& input : call->inputs) {
    Check(static_cast<int64_t>(input.size()) == elements * element_bytes);
  }
  Check(!call->outputs.empty());
  std::vector<bool> seen(4, false);
  for (int t : call->outputs) {
    Check(t >= 0 && t < 4 && !seen[t] && (t == 0 || call->start.backward()));
    seen[t] = true;
  }
  Check(call->start.attention().segment_lengths_size() > 0);
  std::vector<std::string> outputs(call->start.backward() ? 4 : 1,
                                   std::string(static_cast<size_t>(elements * element_bytes), 'x'));
  const inference::ModelInferResponse response = dattn::server::MakeModelInferResponse(
      request, *call, outputs, dattn::v1::AttendAccepted(), dattn::v1::AttentionJobResult());
  Check(response.outputs_size() == static_cast<int>(call->outputs.size()));
  Check(response.raw_output_contents_size() == response.outputs_size());
  return 0;
}
