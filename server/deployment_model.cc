#include "server/deployment_model.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "api/quote.h"

namespace dattn {
namespace server {
namespace {

constexpr const char* kOutputs[] = {"logprobs", "loss"};

absl::Status Invalid(const std::string& what, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::string s = "[";
  for (int i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i > 0 ? ", " : "", shape[i]);
  return s + "]";
}

// The element count of a [N] or [1, N] shape (`elements_fixed` > 0: also N == elements_fixed).
absl::StatusOr<int64_t> CountOf(const std::string& what,
                                const google::protobuf::RepeatedField<int64_t>& shape,
                                int64_t elements_fixed, bool* batched) {
  const bool ok_rank = shape.size() == 1 || (shape.size() == 2 && shape[0] == 1);
  const int64_t n = shape.empty() ? 0 : shape[shape.size() - 1];
  const bool ok_n = elements_fixed > 0 ? n == elements_fixed : n >= 1;
  if (!ok_rank || !ok_n) {
    return Invalid(absl::StrCat(what, ".shape"),
                   absl::StrCat(ShapeText(shape), " is not ",
                                elements_fixed > 0 ? absl::StrCat("[", elements_fixed, "] or [1, ",
                                                                  elements_fixed, "]")
                                                   : "[N] or [1, N] with N >= 1"));
  }
  *batched = shape.size() == 2;
  return n;
}

absl::Status ParseTokens(const inference::ModelInferRequest& request, ScoreInferCall* call) {
  const auto& input = request.inputs(0);
  const std::string what = "inputs[\"tokens\"]";
  const bool int32 = input.datatype() == "INT32";
  if (!int32 && input.datatype() != "INT64") {
    return Invalid(absl::StrCat(what, ".datatype"),
                   absl::StrCat(api::Quote(input.datatype()), " is not \"INT32\" or \"INT64\""));
  }
  absl::StatusOr<int64_t> n = CountOf(what, input.shape(), 0, &call->batched);
  if (!n.ok()) return n.status();
  const auto& c = input.contents();
  const bool typed = c.int_contents_size() + c.int64_contents_size() + c.bool_contents_size() +
                         c.uint_contents_size() + c.uint64_contents_size() +
                         c.fp32_contents_size() + c.fp64_contents_size() + c.bytes_contents_size() >
                     0;
  auto* tokens = call->score.mutable_tokens();
  const int64_t width = int32 ? 4 : 8;
  auto add = [&](int64_t i, int64_t v) -> absl::Status {
    if (v < INT32_MIN || v > INT32_MAX) {
      return Invalid(absl::StrCat(what, "[", i, "]"), absl::StrCat(v, " does not fit an int32"));
    }
    tokens->Add(static_cast<int32_t>(v));
    return absl::OkStatus();
  };
  if (request.raw_input_contents_size() > 0) {
    if (typed) return Invalid(what, "both raw_input_contents and contents; give one");
    const std::string& raw = request.raw_input_contents(0);
    if (static_cast<int64_t>(raw.size()) != *n * width) {
      return Invalid("raw_input_contents[0]",
                     absl::StrCat(raw.size(), " bytes for ", *n, " ", input.datatype(), " values (",
                                  *n * width, " bytes)"));
    }
    tokens->Reserve(static_cast<int>(*n));
    for (int64_t i = 0; i < *n; ++i) {
      if (int32) {
        int32_t v;
        std::memcpy(&v, raw.data() + i * 4, 4);
        tokens->Add(v);
      } else {
        int64_t v;
        std::memcpy(&v, raw.data() + i * 8, 8);
        if (absl::Status s = add(i, v); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  const int64_t count = int32 ? c.int_contents_size() : c.int64_contents_size();
  const int64_t others = c.int_contents_size() + c.int64_contents_size() - count;
  if (count != *n || others != 0 ||
      c.bool_contents_size() + c.uint_contents_size() + c.uint64_contents_size() +
              c.fp32_contents_size() + c.fp64_contents_size() + c.bytes_contents_size() >
          0) {
    return Invalid(
        absl::StrCat(what, ".contents"),
        absl::StrCat("want ", *n, " values in ", int32 ? "int_contents" : "int64_contents",
                     " and nothing else (or raw_input_contents); got ", count));
  }
  tokens->Reserve(static_cast<int>(*n));
  for (int64_t i = 0; i < *n; ++i) {
    if (absl::Status s = add(
            i, int32 ? c.int_contents(static_cast<int>(i)) : c.int64_contents(static_cast<int>(i)));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseText(const inference::ModelInferRequest& request, ScoreInferCall* call) {
  const auto& input = request.inputs(0);
  const std::string what = "inputs[\"text\"]";
  if (input.datatype() != "BYTES") {
    return Invalid(absl::StrCat(what, ".datatype"),
                   absl::StrCat(api::Quote(input.datatype()), " is not \"BYTES\""));
  }
  absl::StatusOr<int64_t> n = CountOf(what, input.shape(), 1, &call->batched);
  if (!n.ok()) return n.status();
  const auto& c = input.contents();
  const int64_t typed_other = c.int_contents_size() + c.int64_contents_size() +
                              c.bool_contents_size() + c.uint_contents_size() +
                              c.uint64_contents_size() + c.fp32_contents_size() +
                              c.fp64_contents_size();
  if (request.raw_input_contents_size() > 0) {
    if (c.bytes_contents_size() + typed_other > 0) {
      return Invalid(what, "both raw_input_contents and contents; give one");
    }
    // The protocol's raw BYTES layout: each element a little-endian uint32 length, then its bytes.
    const std::string& raw = request.raw_input_contents(0);
    uint32_t length = 0;
    if (raw.size() < 4) {
      return Invalid("raw_input_contents[0]",
                     absl::StrCat(raw.size(), " bytes: a BYTES element needs its 4-byte length"));
    }
    std::memcpy(&length, raw.data(), 4);
    if (raw.size() - 4 != length) {
      return Invalid("raw_input_contents[0]",
                     absl::StrCat("its length prefix says ", length, " bytes, ", raw.size() - 4,
                                  " follow (one element expected)"));
    }
    call->score.set_text(raw.substr(4));
    return absl::OkStatus();
  }
  if (c.bytes_contents_size() != 1 || typed_other > 0) {
    return Invalid(absl::StrCat(what, ".contents"),
                   absl::StrCat("want one element in bytes_contents and nothing else (or "
                                "raw_input_contents); got ",
                                c.bytes_contents_size()));
  }
  call->score.set_text(c.bytes_contents(0));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDeploymentVersion(const std::string& deployment_id, const std::string& version) {
  if (version.empty() || version == kDeploymentModelVersion) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("model ", api::Quote(deployment_id), " has no version ",
                                          api::Quote(version), " (it serves version \"",
                                          kDeploymentModelVersion, "\")"));
}

absl::StatusOr<ScoreInferCall> ParseScoreInfer(const inference::ModelInferRequest& request) {
  if (absl::Status s = CheckDeploymentVersion(request.model_name(), request.model_version());
      !s.ok()) {
    return s;
  }
  ScoreInferCall call;
  call.score.set_deployment_id(request.model_name());
  if (!request.parameters().empty()) {
    std::map<std::string, int> names;  // the first in name order, whatever the map's order
    for (const auto& [name, p] : request.parameters()) names[name] = 0;
    return Invalid(absl::StrCat("parameters[", api::Quote(names.begin()->first), "]"),
                   "a deployment takes no request parameters");
  }
  if (request.inputs_size() != 1) {
    return Invalid("inputs", absl::StrCat(request.inputs_size(),
                                          " inputs: give exactly one, \"tokens\" or \"text\""));
  }
  const auto& input = request.inputs(0);
  if (!input.parameters().empty()) {
    std::map<std::string, int> names;
    for (const auto& [name, p] : input.parameters()) names[name] = 0;
    return Invalid(absl::StrCat("inputs[", api::Quote(input.name()), "].parameters[",
                                api::Quote(names.begin()->first), "]"),
                   "a deployment's inputs take no parameters");
  }
  if (request.raw_input_contents_size() > 1) {
    return Invalid("raw_input_contents",
                   absl::StrCat(request.raw_input_contents_size(), " entries for 1 input"));
  }
  if (input.name() == "tokens") {
    if (absl::Status s = ParseTokens(request, &call); !s.ok()) return s;
  } else if (input.name() == "text") {
    if (absl::Status s = ParseText(request, &call); !s.ok()) return s;
  } else {
    return Invalid("inputs[0].name",
                   absl::StrCat(api::Quote(input.name()), " is not \"tokens\" or \"text\""));
  }
  bool asked[2] = {false, false};
  for (int i = 0; i < request.outputs_size(); ++i) {
    const auto& out = request.outputs(i);
    int t = -1;
    for (int k = 0; k < 2; ++k) {
      if (out.name() == kOutputs[k]) t = k;
    }
    const std::string what = absl::StrCat("outputs[", i, "]");
    if (t < 0) {
      return Invalid(absl::StrCat(what, ".name"),
                     absl::StrCat(api::Quote(out.name()), " is not \"logprobs\" or \"loss\""));
    }
    if (asked[t]) {
      return Invalid(absl::StrCat(what, ".name"), absl::StrCat("\"", kOutputs[t], "\" repeated"));
    }
    if (!out.parameters().empty()) {
      return Invalid(absl::StrCat(what, ".parameters"), "a deployment's outputs take none");
    }
    asked[t] = true;
    call.outputs.push_back(t);
  }
  if (call.outputs.empty()) call.outputs = {0, 1};
  return call;
}

inference::ModelInferResponse MakeScoreInferResponse(const inference::ModelInferRequest& request,
                                                     const ScoreInferCall& call,
                                                     const v1::ScoreResponse& score) {
  inference::ModelInferResponse response;
  response.set_model_name(request.model_name());
  response.set_model_version(kDeploymentModelVersion);
  response.set_id(request.id());
  for (int t : call.outputs) {
    inference::ModelInferResponse::InferOutputTensor* out = response.add_outputs();
    out->set_name(kOutputs[t]);
    out->set_datatype("FP64");
    if (call.batched) out->add_shape(1);
    std::string raw;
    if (t == 0) {
      out->add_shape(score.logprobs_size());
      raw.resize(static_cast<size_t>(score.logprobs_size()) * 8);
      if (!raw.empty()) std::memcpy(raw.data(), score.logprobs().data(), raw.size());
    } else {
      out->add_shape(1);
      const double loss = score.loss();
      raw.assign(reinterpret_cast<const char*>(&loss), 8);
    }
    response.add_raw_output_contents(std::move(raw));
  }
  (*response.mutable_parameters())["tokens"].set_int64_param(score.tokens());
  (*response.mutable_parameters())["seconds"].set_double_param(score.seconds());
  return response;
}

inference::ModelMetadataResponse DeploymentModelMetadata(const std::string& deployment_id) {
  inference::ModelMetadataResponse m;
  m.set_name(deployment_id);
  m.add_versions(kDeploymentModelVersion);
  m.set_platform(kDeploymentPlatform);
  auto add = [](auto* list, const char* name, const char* datatype, int64_t dim) {
    auto* t = list->Add();
    t->set_name(name);
    t->set_datatype(datatype);
    t->add_shape(dim);
  };
  add(m.mutable_inputs(), "tokens", "INT32", -1);
  add(m.mutable_inputs(), "text", "BYTES", 1);
  add(m.mutable_outputs(), "logprobs", "FP64", -1);
  add(m.mutable_outputs(), "loss", "FP64", 1);
  (*m.mutable_properties())["inputs"] =
      "exactly one of tokens (INT32 or INT64, [N] or [1, N]) and text (BYTES, [1]; byte-level "
      "models)";
  (*m.mutable_properties())["call"] =
      "Score: logprobs[i] = log p(token i + 1 | tokens 0..i); loss = their mean negated";
  return m;
}

}  // namespace server
}  // namespace dattn
