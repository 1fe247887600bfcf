// Conversions between the public API (dattn.v1 messages) and the engine's types, shared by the
// coordinator (validation at submit) and the workers (running a task), so that both read a spec the
// same way.
//
// Errors are INVALID_ARGUMENT, "FIELD: unknown value N (choose ...)", FIELD being the path the
// caller names (e.g. "spec.attention.attention.mode"). Pure functions; thread-safe.
#ifndef DATTN_API_ENGINE_CONVERT_H_
#define DATTN_API_ENGINE_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "api/limits.h"
#include "dattn/v1/attention.pb.h"
#include "engine/attention_spec.h"
#include "engine/tensor.h"

namespace dattn {
namespace api {

// UNSPECIFIED mode is grouped and UNSPECIFIED head offsets are modulo (the API's documented
// defaults). The spec is converted, not validated: ValidateSpec does that, except for the number of
// patterns, checked here before anything is copied: INVALID_ARGUMENT "PATH.segment_lengths: at
// most 64 patterns, got N" (or dilation_rates). `path` names the AttentionSpec message in error
// messages.
absl::StatusOr<AttentionSpec> ToEngineSpec(const v1::AttentionSpec& spec,
                                           const std::string& path = "attention");

// DTYPE_UNSPECIFIED is an error ("a job must say its precision"), as is a value outside the enum.
absl::StatusOr<DType> ToEngineDType(v1::DType dtype, const std::string& field = "dtype");

v1::DType ToApiDType(DType dtype);

}  // namespace api
}  // namespace dattn

#endif  // DATTN_API_ENGINE_CONVERT_H_
