#include "engine/validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string DTypeList(const std::vector<DType>& dtypes) {
  std::vector<std::string> names;
  for (DType d : dtypes) names.push_back(DTypeName(d));
  return absl::StrJoin(names, ", ");
}

// "cpu" or "cuda:1": where a tensor lives, as error messages name it.
std::string Where(Device device, int index) {
  if (device == Device::kCpu) return DeviceName(device);
  return absl::StrCat(DeviceName(device), ":", index);
}

struct Named {
  const char* name;
  const TensorView* view;
};

std::string Names(const std::vector<Named>& tensors) {
  std::vector<std::string> names;
  for (const Named& t : tensors) names.push_back(t.name);
  return absl::StrJoin(names, ", ");
}

// Rank 4, one stride per dimension, and the shape and dtype of the first tensor.
absl::Status CheckSameShapes(const std::vector<Named>& tensors) {
  const Named& ref = tensors[0];
  for (const Named& t : tensors) {
    if (t.view->rank() != 4) {
      return Invalid(absl::StrCat(t.name, " has rank ", t.view->rank(), " (shape ",
                                  ShapeString(t.view->shape),
                                  "); expected rank 4: (B, N, H, D) = (batch, position, head, "
                                  "channel)"));
    }
    if (t.view->strides.size() != t.view->shape.size()) {
      return Invalid(absl::StrCat(t.name, " has ", t.view->strides.size(), " strides for its rank-",
                                  t.view->rank(), " shape; give one stride per dimension"));
    }
  }
  for (const Named& t : tensors) {
    if (t.view->shape != ref.view->shape) {
      return Invalid(absl::StrCat(t.name, " has shape ", ShapeString(t.view->shape), " but ",
                                  ref.name, " has ", ShapeString(ref.view->shape), "; ",
                                  Names(tensors), " must all have the same shape (B, N, H, D)"));
    }
  }
  for (const Named& t : tensors) {
    if (t.view->dtype != ref.view->dtype) {
      return Invalid(absl::StrCat(t.name, " has dtype ", DTypeName(t.view->dtype), " but ",
                                  ref.name, " has ", DTypeName(ref.view->dtype), "; ",
                                  Names(tensors), " must all have the same dtype"));
    }
  }
  return absl::OkStatus();
}

// On the backend's device (and on the same ordinal as q), with memory behind it.
absl::Status CheckPlacement(const Named& t, const BackendCaps& caps, int device_index) {
  if (t.view->device != caps.device || t.view->device_index != device_index) {
    return Invalid(absl::StrCat(t.name, " is on ", Where(t.view->device, t.view->device_index),
                                " but this call computes on ", Where(caps.device, device_index),
                                " (", caps.name,
                                " backend); every tensor of one call must be on that device"));
  }
  if (t.view->data == nullptr) {
    return Invalid(absl::StrCat(t.name, " has a null data pointer (", t.view->DebugString(),
                                "); every tensor must point at memory"));
  }
  return absl::OkStatus();
}

absl::Status CheckContiguous(const Named& t, const char* role) {
  if (!t.view->IsContiguous()) {
    return Invalid(absl::StrCat(t.name, " is not contiguous (shape ", ShapeString(t.view->shape),
                                ", strides ", ShapeString(t.view->strides), "); ", role,
                                " must be row-major contiguous"));
  }
  return absl::OkStatus();
}

absl::Status CheckLse(const TensorView& lse, const TensorView& q, const BackendCaps& caps,
                      int device_index) {
  const std::vector<int64_t> want = {q.shape[0], q.shape[2], q.shape[1]};
  if (lse.rank() != 3 || lse.shape != want) {
    return Invalid(absl::StrCat("lse has shape ", ShapeString(lse.shape), "; expected (B, H, N) = ",
                                ShapeString(want), " for q of shape ", ShapeString(q.shape)));
  }
  if (lse.strides.size() != lse.shape.size()) {
    return Invalid(absl::StrCat("lse has ", lse.strides.size(),
                                " strides for its rank-3 shape; give one stride per dimension"));
  }
  const DType want_dtype = LseDType(q.dtype);
  if (lse.dtype != want_dtype) {
    return Invalid(absl::StrCat("lse has dtype ", DTypeName(lse.dtype), "; expected ",
                                DTypeName(want_dtype), " for ", DTypeName(q.dtype), " inputs"));
  }
  const Named named{"lse", &lse};
  if (absl::Status s = CheckPlacement(named, caps, device_index); !s.ok()) return s;
  return CheckContiguous(named, "lse");
}

// Checks shared by forward and backward: `tensors` starts with q; `outputs` are written by the
// call.
absl::Status CheckCall(const AttentionSpec& spec, const std::vector<Named>& tensors,
                       const std::vector<Named>& outputs, const TensorView& lse,
                       const BackendCaps& caps) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  if (absl::Status s = CheckSameShapes(tensors); !s.ok()) return s;
  const TensorView& q = *tensors[0].view;
  if (absl::Status s =
          ValidateProblem(spec, q.shape[0], q.shape[1], q.shape[2], q.shape[3], q.dtype, caps);
      !s.ok()) {
    return s;
  }
  // CPU tensors have no ordinal; a CUDA call runs on q's device.
  const int device_index = caps.device == Device::kCpu ? 0 : q.device_index;
  for (const Named& t : tensors) {
    if (absl::Status s = CheckPlacement(t, caps, device_index); !s.ok()) return s;
  }
  for (const Named& t : outputs) {
    if (absl::Status s = CheckContiguous(t, "outputs"); !s.ok()) return s;
  }
  return CheckLse(lse, q, caps, device_index);
}

absl::Status CheckPositive(const char* what, int64_t value) {
  if (value < 1) return Invalid(absl::StrCat(what, " = ", value, "; must be >= 1"));
  return absl::OkStatus();
}

}  // namespace

DType LseDType(DType dtype) { return dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

absl::Status ValidateSpec(const AttentionSpec& spec) {
  if (spec.segment_lengths.empty()) {
    return Invalid("segment_lengths is empty; give at least one segment length (each >= 1)");
  }
  if (spec.dilation_rates.empty()) {
    return Invalid("dilation_rates is empty; give one dilation rate (>= 1) per segment length");
  }
  if (spec.segment_lengths.size() != spec.dilation_rates.size()) {
    return Invalid(absl::StrCat("segment_lengths has ", spec.segment_lengths.size(), " entries (",
                                absl::StrJoin(spec.segment_lengths, ", "),
                                ") but dilation_rates has ", spec.dilation_rates.size(), " (",
                                absl::StrJoin(spec.dilation_rates, ", "),
                                "); they must have the same length, one rate per segment length"));
  }
  for (size_t i = 0; i < spec.segment_lengths.size(); ++i) {
    if (spec.segment_lengths[i] < 1) {
      return Invalid(absl::StrCat("segment_lengths[", i, "] = ", spec.segment_lengths[i],
                                  "; every segment length must be >= 1"));
    }
    if (spec.dilation_rates[i] < 1) {
      return Invalid(absl::StrCat("dilation_rates[", i, "] = ", spec.dilation_rates[i],
                                  "; every dilation rate must be >= 1"));
    }
  }
  if (spec.scale.has_value() && !(std::isfinite(*spec.scale) && *spec.scale > 0)) {
    return Invalid(
        absl::StrCat("scale = ", *spec.scale, "; must be finite and > 0 (or unset for 1/sqrt(D))"));
  }
  if (spec.mode == AttentionMode::kGrouped && spec.head_offsets == HeadOffsets::kBlocked) {
    return Invalid(
        "head_offsets = blocked applies only to mixture mode; grouped mode gives group i the "
        "offset i mod r_i (use head_offsets = modulo, or mode = mixture)");
  }
  return absl::OkStatus();
}

absl::Status ValidateProblem(const AttentionSpec& spec, int64_t batch, int64_t seq_len,
                             int64_t num_heads, int64_t head_dim, DType dtype,
                             const BackendCaps& caps) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  if (absl::Status s = CheckPositive("batch size B", batch); !s.ok()) return s;
  if (absl::Status s = CheckPositive("sequence length N", seq_len); !s.ok()) return s;
  if (absl::Status s = CheckPositive("number of heads H", num_heads); !s.ok()) return s;
  if (absl::Status s = CheckPositive("head dim D", head_dim); !s.ok()) return s;
  int64_t product = 0;
  if (__builtin_mul_overflow(batch, seq_len, &product) ||
      __builtin_mul_overflow(product, num_heads, &product) ||
      __builtin_mul_overflow(product, head_dim, &product)) {
    return Invalid(absl::StrCat("B*N*H*D = ", batch, "*", seq_len, "*", num_heads, "*", head_dim,
                                " overflows int64, the engine's index type; the largest accepted "
                                "element count is 9223372036854775807"));
  }
  // B*H*N (the lse) is at most B*N*H*D since D >= 1, so it fits too.
  const int g = spec.num_patterns();
  if (spec.mode == AttentionMode::kGrouped && num_heads < g) {
    return Invalid(absl::StrCat("grouped mode needs H >= G: H = ", num_heads, " heads but G = ", g,
                                " patterns (segment_lengths ",
                                absl::StrJoin(spec.segment_lengths, ", "), "); use at least ", g,
                                " heads, fewer patterns, or mode = mixture"));
  }
  if (!caps.head_dims.empty() &&
      std::find(caps.head_dims.begin(), caps.head_dims.end(), head_dim) == caps.head_dims.end()) {
    return Invalid(absl::StrCat("head dim D = ", head_dim, " is not supported by the ", caps.name,
                                " backend; supported D: ", absl::StrJoin(caps.head_dims, ", ")));
  }
  if (std::find(caps.dtypes.begin(), caps.dtypes.end(), dtype) == caps.dtypes.end()) {
    return Invalid(absl::StrCat("dtype ", DTypeName(dtype), " is not supported by the ", caps.name,
                                " backend; supported: ", DTypeList(caps.dtypes)));
  }
  return absl::OkStatus();
}

absl::Status ValidateForward(const AttentionSpec& spec, const ForwardArgs& args,
                             const BackendCaps& caps) {
  const std::vector<Named> tensors = {
      {"q", &args.q}, {"k", &args.k}, {"v", &args.v}, {"out", &args.out}};
  return CheckCall(spec, tensors, {{"out", &args.out}}, args.lse, caps);
}

absl::Status ValidateBackward(const AttentionSpec& spec, const BackwardArgs& args,
                              const BackendCaps& caps) {
  const std::vector<Named> tensors = {{"q", &args.q},     {"k", &args.k},       {"v", &args.v},
                                      {"out", &args.out}, {"dout", &args.dout}, {"dq", &args.dq},
                                      {"dk", &args.dk},   {"dv", &args.dv}};
  return CheckCall(spec, tensors, {{"dq", &args.dq}, {"dk", &args.dk}, {"dv", &args.dv}}, args.lse,
                   caps);
}

}  // namespace dattn
