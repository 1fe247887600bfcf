// Validation of an attention call against docs/ENGINE.md's error list ("Errors").
//
// Every error is INVALID_ARGUMENT and names the offending value and what would be accepted, so that
// the message can be shown to a user unchanged (the coordinator does so). Functions are pure.
#ifndef DATTN_ENGINE_VALIDATE_H_
#define DATTN_ENGINE_VALIDATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/attention.h"

namespace dattn {

// The spec alone: non-empty lists of equal length, every w_i >= 1 and r_i >= 1, finite positive
// scale if set, head_offsets=blocked only in mixture mode.
absl::Status ValidateSpec(const AttentionSpec& spec);

// The spec against a problem size (B, N, H, D) and a backend's capabilities, without tensors: used
// by the coordinator to reject a job at submit. Checks B, N, H, D >= 1; B*N*H*D and B*H*N fit in
// int64; H >= G in grouped mode; D and dtype supported by the backend.
absl::Status ValidateProblem(const AttentionSpec& spec, int64_t batch, int64_t seq_len,
                             int64_t num_heads, int64_t head_dim, DType dtype,
                             const BackendCaps& caps);

// Full checks for a forward call: the above plus ranks, equal shapes, dtypes and devices, non-null
// data, contiguous outputs, lse shape (B, H, N) and dtype.
absl::Status ValidateForward(const AttentionSpec& spec, const ForwardArgs& args,
                             const BackendCaps& caps);
absl::Status ValidateBackward(const AttentionSpec& spec, const BackwardArgs& args,
                              const BackendCaps& caps);

// The lse dtype for inputs of `dtype`: fp64 for fp64, fp32 otherwise.
DType LseDType(DType dtype);

}  // namespace dattn

#endif  // DATTN_ENGINE_VALIDATE_H_
