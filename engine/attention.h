// The engine's attention API: forward and backward of dilated attention on one device.
//
// Layouts (docs/ENGINE.md, "Inputs" and "Log-sum-exp"):
//   q, k, v, out, dout, dq, dk, dv: rank 4, (B, N, H, D), all the same shape, dtype and device.
//     Inputs may be any strided view; outputs must be row-major contiguous.
//   lse: rank 3, (B, H, N), contiguous, fp64 when the inputs are fp64 and fp32 otherwise.
//     Row (b, h, p) holds the natural-log softmax denominator of that output row: grouped mode,
//     the pattern's own log-sum-exp; mixture mode, log sum_{i in S} exp(l_i). Rows no pattern
//     selects hold -inf.
//
// Errors are absl::Status values; validation (validate.h) runs first in every call and, on failure,
// nothing is written. A failure after validation (a device error) leaves the outputs unspecified.
#ifndef DATTN_ENGINE_ATTENTION_H_
#define DATTN_ENGINE_ATTENTION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/attention_spec.h"
#include "engine/tensor.h"

namespace dattn {

// What a backend accepts; validation reports unsupported values against these lists.
struct BackendCaps {
  std::string name;  // "cpu", "cuda".
  Device device = Device::kCpu;
  std::vector<DType> dtypes;       // Element types of q, k, v.
  std::vector<int64_t> head_dims;  // Supported D; empty means any D >= 1.
};

struct ForwardArgs {
  TensorView q, k, v;
  TensorView out;  // Written in full (zeros where no pattern selects the row).
  TensorView lse;  // Written in full.
};

struct BackwardArgs {
  TensorView q, k, v;
  TensorView out;         // The forward output for these inputs.
  TensorView lse;         // The forward log-sum-exp for these inputs.
  TensorView dout;        // Gradient of the loss with respect to out.
  TensorView dq, dk, dv;  // Written in full.
};

// One backend instance owns its threads, streams and handles. Unless a backend says otherwise, an
// instance may be used by one thread at a time; use one instance per thread for concurrency.
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;

  virtual const BackendCaps& caps() const = 0;

  // out, lse := dilated attention of (q, k, v) under spec.
  virtual absl::Status Forward(const AttentionSpec& spec, const ForwardArgs& args) = 0;

  // dq, dk, dv := gradients of sum(out * dout) with respect to q, k, v.
  virtual absl::Status Backward(const AttentionSpec& spec, const BackwardArgs& args) = 0;
};

}  // namespace dattn

#endif  // DATTN_ENGINE_ATTENTION_H_
