#include "server/inference_model.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "api/quote.h"

namespace dattn {
namespace server {
namespace {

using inference::InferParameter;

constexpr const char* kInputs[] = {"q", "k", "v", "dout"};
constexpr const char* kOutputs[] = {"out", "dq", "dk", "dv"};

struct Datatype {
  const char* name;
  v1::DType dtype;
  int64_t bytes;
};
constexpr Datatype kDatatypes[] = {{"FP32", v1::DTYPE_FP32, 4},
                                   {"FP64", v1::DTYPE_FP64, 8},
                                   {"FP16", v1::DTYPE_FP16, 2},
                                   {"BF16", v1::DTYPE_BF16, 2}};

absl::Status Invalid(const std::string& what, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
}

std::string Quoted(const std::string& s) { return api::Quote(s); }

// An integer list parameter: "2048,4096", or an int64 for one value.
absl::StatusOr<std::vector<int64_t>> IntList(const std::string& name, const InferParameter& p) {
  const std::string what = absl::StrCat("parameters[\"", name, "\"]");
  if (p.parameter_choice_case() == InferParameter::kInt64Param) return {{p.int64_param()}};
  if (p.parameter_choice_case() != InferParameter::kStringParam) {
    return Invalid(what, "a string of comma-separated integers (or an int64 for one)");
  }
  std::vector<int64_t> values;
  for (absl::string_view part : absl::StrSplit(p.string_param(), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return Invalid(what, absl::StrCat(Quoted(std::string(part)), " in ", Quoted(p.string_param()),
                                        " is not an integer"));
    }
    values.push_back(v);
    if (values.size() > 64) return Invalid(what, "more than 64 values");
  }
  return values;
}

absl::StatusOr<std::string> Text(const std::string& name, const InferParameter& p) {
  if (p.parameter_choice_case() != InferParameter::kStringParam) {
    return Invalid(absl::StrCat("parameters[\"", name, "\"]"), "a string");
  }
  return p.string_param();
}

absl::StatusOr<int64_t> Int(const std::string& name, const InferParameter& p) {
  if (p.parameter_choice_case() == InferParameter::kInt64Param) return p.int64_param();
  if (p.parameter_choice_case() == InferParameter::kUint64Param &&
      p.uint64_param() <= static_cast<uint64_t>(INT64_MAX)) {
    return static_cast<int64_t>(p.uint64_param());
  }
  return Invalid(absl::StrCat("parameters[\"", name, "\"]"), "an int64");
}

absl::Status ApplyParameters(const inference::ModelInferRequest& request, v1::AttendStart* start) {
  v1::AttentionSpec* spec = start->mutable_attention();
  bool segments = false, rates = false;
  // In name order, so that the first error is the same whatever order the map iterates in.
  std::map<std::string, InferParameter> ordered(request.parameters().begin(),
                                                request.parameters().end());
  for (const auto& [name, p] : ordered) {
    const std::string what = absl::StrCat("parameters[\"", name, "\"]");
    if (name == "segment_lengths" || name == "dilation_rates") {
      absl::StatusOr<std::vector<int64_t>> values = IntList(name, p);
      if (!values.ok()) return values.status();
      auto* field = name == "segment_lengths" ? spec->mutable_segment_lengths()
                                              : spec->mutable_dilation_rates();
      field->Add(values->begin(), values->end());
      (name == "segment_lengths" ? segments : rates) = true;
    } else if (name == "mode") {
      absl::StatusOr<std::string> v = Text(name, p);
      if (!v.ok()) return v.status();
      if (*v == "grouped") {
        spec->set_mode(v1::ATTENTION_MODE_GROUPED);
      } else if (*v == "mixture") {
        spec->set_mode(v1::ATTENTION_MODE_MIXTURE);
      } else {
        return Invalid(what, absl::StrCat(Quoted(*v), " is not \"grouped\" or \"mixture\""));
      }
    } else if (name == "head_offsets") {
      absl::StatusOr<std::string> v = Text(name, p);
      if (!v.ok()) return v.status();
      if (*v == "modulo") {
        spec->set_head_offsets(v1::HEAD_OFFSETS_MODULO);
      } else if (*v == "blocked") {
        spec->set_head_offsets(v1::HEAD_OFFSETS_BLOCKED);
      } else {
        return Invalid(what, absl::StrCat(Quoted(*v), " is not \"modulo\" or \"blocked\""));
      }
    } else if (name == "causal") {
      if (p.parameter_choice_case() != InferParameter::kBoolParam) return Invalid(what, "a bool");
      spec->set_causal(p.bool_param());
    } else if (name == "scale") {
      if (p.parameter_choice_case() != InferParameter::kDoubleParam) {
        return Invalid(what, "a double");
      }
      spec->set_scale(p.double_param());
    } else if (name == "num_ranks") {
      absl::StatusOr<int64_t> v = Int(name, p);
      if (!v.ok()) return v.status();
      if (*v < 0 || *v > 256) return Invalid(what, absl::StrCat(*v, " is not in 0 .. 256"));
      start->set_num_ranks(static_cast<int32_t>(*v));
    } else if (name == "priority") {
      absl::StatusOr<int64_t> v = Int(name, p);
      if (!v.ok()) return v.status();
      if (*v < -100 || *v > 100) return Invalid(what, absl::StrCat(*v, " is not in -100 .. 100"));
      start->set_priority(static_cast<int32_t>(*v));
    } else if (name == "device") {
      absl::StatusOr<std::string> v = Text(name, p);
      if (!v.ok()) return v.status();
      if (*v == "any") {
        start->set_device(v1::DEVICE_PREFERENCE_ANY);
      } else if (*v == "cpu") {
        start->set_device(v1::DEVICE_PREFERENCE_CPU);
      } else if (*v == "gpu") {
        start->set_device(v1::DEVICE_PREFERENCE_GPU);
      } else {
        return Invalid(what, absl::StrCat(Quoted(*v), " is not \"any\", \"cpu\" or \"gpu\""));
      }
    } else {
      return Invalid(what,
                     absl::StrCat("unknown; the model takes segment_lengths, dilation_rates, mode, "
                                  "causal, scale, head_offsets, num_ranks, device and priority"));
    }
  }
  if (!segments) return Invalid("parameters[\"segment_lengths\"]", "required");
  if (!rates) return Invalid("parameters[\"dilation_rates\"]", "required");
  return absl::OkStatus();
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::Status CheckModel(const std::string& name, const std::string& version) {
  if (name != kAttentionModel) {
    return absl::NotFoundError(absl::StrCat(
        "model ", Quoted(name), " not found; this server serves ", Quoted(kAttentionModel)));
  }
  if (!version.empty() && version != kAttentionModelVersion) {
    return absl::NotFoundError(absl::StrCat("model ", Quoted(name), " has no version ",
                                            Quoted(version), "; its version is ",
                                            Quoted(kAttentionModelVersion)));
  }
  return absl::OkStatus();
}

absl::StatusOr<InferenceCall> ParseModelInfer(const inference::ModelInferRequest& request) {
  if (absl::Status s = CheckModel(request.model_name(), request.model_version()); !s.ok()) {
    return s;
  }
  InferenceCall call;
  // Which request input is each of q, k, v, dout.
  int index[4] = {-1, -1, -1, -1};
  for (int i = 0; i < request.inputs_size(); ++i) {
    const std::string& name = request.inputs(i).name();
    int which = -1;
    for (int t = 0; t < 4; ++t) {
      if (name == kInputs[t]) which = t;
    }
    if (which < 0) {
      return Invalid(absl::StrCat("inputs[", i, "]"),
                     absl::StrCat("unknown input ", Quoted(name),
                                  "; the model's inputs are q, k, v and (backward) dout"));
    }
    if (index[which] >= 0) return Invalid(absl::StrCat("input \"", name, "\""), "given twice");
    index[which] = i;
  }
  for (int t = 0; t < 3; ++t) {
    if (index[t] < 0) {
      return Invalid(absl::StrCat("input \"", kInputs[t], "\""), "required (q, k and v)");
    }
  }
  const int count = index[3] >= 0 ? 4 : 3;
  if (request.raw_input_contents_size() != 0 &&
      request.raw_input_contents_size() != request.inputs_size()) {
    return Invalid("raw_input_contents",
                   absl::StrCat(request.raw_input_contents_size(), " entries for ",
                                request.inputs_size(), " inputs (one per input, or none)"));
  }
  const inference::ModelInferRequest::InferInputTensor& q = request.inputs(index[0]);
  const Datatype* type = nullptr;
  for (const Datatype& d : kDatatypes) {
    if (q.datatype() == d.name) type = &d;
  }
  if (type == nullptr) {
    return Invalid("input \"q\"", absl::StrCat("datatype ", Quoted(q.datatype()),
                                               " is not FP32, FP64, FP16 or BF16"));
  }
  if (q.shape_size() != 4) {
    return Invalid("input \"q\"",
                   absl::StrCat("shape ", ShapeText(q.shape()), " is not (B, N, H, D)"));
  }
  int64_t elements = 1;
  for (int64_t d : q.shape()) {
    if (d < 1 || __builtin_mul_overflow(elements, d, &elements) || elements > (int64_t{1} << 40)) {
      return Invalid("input \"q\"", absl::StrCat("shape ", ShapeText(q.shape()),
                                                 ": every dimension >= 1, 2^40 elements at most"));
    }
  }
  const int64_t bytes = elements * type->bytes;
  for (int t = 0; t < count; ++t) {
    const inference::ModelInferRequest::InferInputTensor& in = request.inputs(index[t]);
    const std::string what = absl::StrCat("input \"", kInputs[t], "\"");
    if (in.datatype() != q.datatype()) {
      return Invalid(what, absl::StrCat("datatype ", Quoted(in.datatype()), " is not q's (",
                                        q.datatype(), ")"));
    }
    if (ShapeText(in.shape()) != ShapeText(q.shape())) {
      return Invalid(what, absl::StrCat("shape ", ShapeText(in.shape()), " is not q's (",
                                        ShapeText(q.shape()), ")"));
    }
    const inference::InferTensorContents& c = in.contents();
    const bool typed = c.bool_contents_size() + c.int_contents_size() + c.int64_contents_size() +
                           c.uint_contents_size() + c.uint64_contents_size() +
                           c.fp32_contents_size() + c.fp64_contents_size() +
                           c.bytes_contents_size() >
                       0;
    if (request.raw_input_contents_size() > 0) {
      if (typed) return Invalid(what, "both raw_input_contents and contents; give one");
      const std::string& raw = request.raw_input_contents(index[t]);
      if (static_cast<int64_t>(raw.size()) != bytes) {
        return Invalid(
            what, absl::StrCat(raw.size(), " bytes of raw contents, expected ", bytes, " (shape ",
                               ShapeText(q.shape()), " of ", type->name, ")"));
      }
      call.inputs.push_back(raw);
      continue;
    }
    std::string data;
    if (type->dtype == v1::DTYPE_FP32 && c.fp32_contents_size() == elements &&
        c.fp32_contents_size() + c.fp64_contents_size() == elements) {
      data.resize(static_cast<size_t>(bytes));
      std::memcpy(data.data(), c.fp32_contents().data(), static_cast<size_t>(bytes));
    } else if (type->dtype == v1::DTYPE_FP64 && c.fp64_contents_size() == elements &&
               c.fp32_contents_size() + c.fp64_contents_size() == elements) {
      data.resize(static_cast<size_t>(bytes));
      std::memcpy(data.data(), c.fp64_contents().data(), static_cast<size_t>(bytes));
    } else if (type->dtype == v1::DTYPE_FP16 || type->dtype == v1::DTYPE_BF16) {
      return Invalid(what, absl::StrCat(type->name, " travels only as raw_input_contents"));
    } else {
      return Invalid(what, absl::StrCat("contents hold ", c.fp32_contents_size(), " fp32 and ",
                                        c.fp64_contents_size(), " fp64 values; ", type->name,
                                        " of shape ", ShapeText(q.shape()), " needs ", elements,
                                        " in ", type->dtype == v1::DTYPE_FP32 ? "fp32" : "fp64",
                                        "_contents (or raw_input_contents)"));
    }
    call.inputs.push_back(std::move(data));
  }
  // Outputs: all the call has, or those asked for.
  if (request.outputs_size() == 0) {
    for (int t = 0; t < (count == 4 ? 4 : 1); ++t) call.outputs.push_back(t);
  }
  for (int i = 0; i < request.outputs_size(); ++i) {
    const std::string& name = request.outputs(i).name();
    int which = -1;
    for (int t = 0; t < 4; ++t) {
      if (name == kOutputs[t]) which = t;
    }
    const std::string what = absl::StrCat("outputs[", i, "]");
    if (which < 0) {
      return Invalid(what,
                     absl::StrCat("unknown output ", Quoted(name),
                                  "; the model's outputs are out and (with dout) dq, dk, dv"));
    }
    if (which > 0 && count < 4) {
      return Invalid(what, absl::StrCat(name, " needs the input dout (the backward)"));
    }
    for (int seen : call.outputs) {
      if (seen == which) return Invalid(what, absl::StrCat(name, " asked for twice"));
    }
    call.outputs.push_back(which);
  }
  call.datatype = type->name;
  call.start.set_dtype(type->dtype);
  call.start.mutable_shape()->set_batch(q.shape(0));
  call.start.mutable_shape()->set_seq_len(q.shape(1));
  call.start.mutable_shape()->set_num_heads(q.shape(2));
  call.start.mutable_shape()->set_head_dim(q.shape(3));
  call.start.set_backward(count == 4);
  call.start.set_name(absl::StrCat("infer ", request.id().substr(0, 100)));
  if (absl::Status s = ApplyParameters(request, &call.start); !s.ok()) return s;
  return call;
}

inference::ModelInferResponse MakeModelInferResponse(const inference::ModelInferRequest& request,
                                                     const InferenceCall& call,
                                                     std::vector<std::string> outputs,
                                                     const v1::AttendAccepted& accepted,
                                                     const v1::AttentionJobResult& result) {
  inference::ModelInferResponse response;
  response.set_model_name(kAttentionModel);
  response.set_model_version(kAttentionModelVersion);
  response.set_id(request.id());
  for (int t : call.outputs) {
    inference::ModelInferResponse::InferOutputTensor* out = response.add_outputs();
    out->set_name(kOutputs[t]);
    out->set_datatype(call.datatype);
    const v1::TensorShape& s = call.start.shape();
    for (int64_t d : {s.batch(), s.seq_len(), s.num_heads(), s.head_dim()}) out->add_shape(d);
    response.add_raw_output_contents(
        t < static_cast<int>(outputs.size()) ? std::move(outputs[static_cast<size_t>(t)]) : "");
  }
  (*response.mutable_parameters())["job_id"].set_string_param(accepted.job_id());
  (*response.mutable_parameters())["num_ranks"].set_int64_param(accepted.num_ranks());
  (*response.mutable_parameters())["engine_seconds"].set_double_param(result.seconds_per_step());
  return response;
}

inference::ModelMetadataResponse AttentionModelMetadata() {
  inference::ModelMetadataResponse m;
  m.set_name(kAttentionModel);
  m.add_versions(kAttentionModelVersion);
  m.set_platform("dattn");
  for (const char* name : kInputs) {
    auto* t = m.add_inputs();
    t->set_name(name);
    t->set_datatype("FP32");
    for (int i = 0; i < 4; ++i) t->add_shape(-1);
  }
  for (const char* name : kOutputs) {
    auto* t = m.add_outputs();
    t->set_name(name);
    t->set_datatype("FP32");
    for (int i = 0; i < 4; ++i) t->add_shape(-1);
  }
  auto& p = *m.mutable_properties();
  p["datatypes"] =
      "FP32, FP64, FP16, BF16 (every tensor of a request the same; FP16 and BF16 as "
      "raw contents only); CPU workers run FP32 and FP64, GPU workers FP16, BF16, FP32";
  p["shape"] = "(B, N, H, D), the same for every tensor";
  p["optional"] = "dout (then dq, dk, dv are outputs too)";
  p["parameters"] =
      "segment_lengths, dilation_rates (required; \"2048,4096\" or an int64), mode "
      "(grouped|mixture), causal (bool), scale (double), head_offsets (modulo|blocked), num_ranks "
      "(int64, 0: the fewest that fit), device (any|cpu|gpu), priority (int64)";
  return m;
}

}  // namespace server
}  // namespace dattn
