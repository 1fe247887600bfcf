#include "api/engine_convert.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dattn {
namespace api {
namespace {

absl::Status Unknown(const std::string& field, int value, const char* choices) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown value ", value, " (choose ", choices, ")"));
}

}  // namespace

absl::StatusOr<AttentionSpec> ToEngineSpec(const v1::AttentionSpec& spec, const std::string& path) {
  const std::pair<const char*, int> counts[] = {{"segment_lengths", spec.segment_lengths_size()},
                                                {"dilation_rates", spec.dilation_rates_size()}};
  for (const auto& [field, count] : counts) {
    if (count > kMaxPatterns) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".", field, ": at most ", kMaxPatterns,
                                                     " patterns (entries) per job, got ", count));
    }
  }
  AttentionSpec out;
  out.segment_lengths.assign(spec.segment_lengths().begin(), spec.segment_lengths().end());
  out.dilation_rates.assign(spec.dilation_rates().begin(), spec.dilation_rates().end());
  if (spec.has_scale()) out.scale = spec.scale();
  out.causal = spec.causal();
  switch (spec.mode()) {
    case v1::ATTENTION_MODE_UNSPECIFIED:
    case v1::ATTENTION_MODE_GROUPED:
      out.mode = AttentionMode::kGrouped;
      break;
    case v1::ATTENTION_MODE_MIXTURE:
      out.mode = AttentionMode::kMixture;
      break;
    default:
      return Unknown(path + ".mode", static_cast<int>(spec.mode()), "GROUPED or MIXTURE");
  }
  switch (spec.head_offsets()) {
    case v1::HEAD_OFFSETS_UNSPECIFIED:
    case v1::HEAD_OFFSETS_MODULO:
      out.head_offsets = HeadOffsets::kModulo;
      break;
    case v1::HEAD_OFFSETS_BLOCKED:
      out.head_offsets = HeadOffsets::kBlocked;
      break;
    default:
      return Unknown(path + ".head_offsets", static_cast<int>(spec.head_offsets()),
                     "MODULO or BLOCKED");
  }
  return out;
}

absl::StatusOr<DType> ToEngineDType(v1::DType dtype, const std::string& field) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return DType::kFloat16;
    case v1::DTYPE_BF16:
      return DType::kBFloat16;
    case v1::DTYPE_FP32:
      return DType::kFloat32;
    case v1::DTYPE_FP64:
      return DType::kFloat64;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": required, got DTYPE_UNSPECIFIED (a job must say its precision: "
                       "fp16, bf16, fp32 or fp64)"));
    default:
      return Unknown(field, static_cast<int>(dtype), "fp16, bf16, fp32 or fp64");
  }
}

v1::DType ToApiDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return v1::DTYPE_FP16;
    case DType::kBFloat16:
      return v1::DTYPE_BF16;
    case DType::kFloat32:
      return v1::DTYPE_FP32;
    case DType::kFloat64:
      return v1::DTYPE_FP64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

}  // namespace api
}  // namespace dattn
