// cuDNN fused attention (flash attention) through the cuDNN graph backend API, on strided views.
//
// cudnn-frontend is not available here, so the operation graphs that cuDNN's runtime fusion engine
// recognises as scaled-dot-product attention are built with raw cudnnBackend* descriptors:
//   forward:  S = Q K^T; S *= scale; [causal: S = row >= col ? S : -inf]; softmax, its log-sum-exp
//             written as Stats; [P *= c]; O = P V (Stats unscaled; cuDNN 9.19 takes no variant
//             that divides by sum / c instead);
//   backward: softmax_sum = rowsum(dO * O); P = exp(scale Q K^T - Stats) [causal mask];
//             dV = P^T dO; dS = P * (dO V^T - softmax_sum) * scale; dQ = dS K (fp32 accumulator);
//             dK = dS^T Q. (The fusion engine ignores a scale on softmax_sum: scale O instead.)
// Q, K, V, O, dO, dQ, dK, dV are [b, h, s, d] tensors with any element strides whose channel stride
// is 1 (the batch, head and sequence strides are what let the engine read dilated rows in place);
// Stats is a packed fp32 [b, h, s, 1] tensor. fp16 and bf16 only; d a multiple of 8.
//
// A CudnnSdpa owns one cuDNN handle bound to one stream and a cache of built execution plans keyed
// by shape, strides, dtype and options (plans are built on first use; building takes milliseconds
// to seconds). Not thread-safe: one instance per thread (the CUDA backend owns one per instance).
// Execution is asynchronous on the stream; nothing here synchronizes the device.
#ifndef DATTN_ENGINE_CUDA_CUDNN_SDPA_H_
#define DATTN_ENGINE_CUDA_CUDNN_SDPA_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"

namespace dattn {
namespace cuda {

// Element strides of a [b, h, s, d] view; the channel stride is 1.
struct SdpaStrides {
  int64_t b = 0;
  int64_t h = 0;
  int64_t s = 0;
};

struct SdpaShape {
  DType dtype = DType::kBFloat16;
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t seq = 0;
  int64_t head_dim = 0;
  bool causal = false;
};

struct SdpaForwardArgs {
  SdpaShape shape;
  SdpaStrides q_strides, k_strides, v_strides, o_strides;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* stats = nullptr;  // packed fp32 [b, h, s]
  float scale = 1.0f;
  // Multiplies the probabilities before P V (the 1/G of grouped mode); 1 builds the plain graph.
  float p_scale = 1.0f;
};

struct SdpaBackwardArgs {
  SdpaShape shape;
  SdpaStrides q_strides, k_strides, v_strides, o_strides, do_strides;
  SdpaStrides dq_strides, dk_strides, dv_strides;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  const float* stats = nullptr;  // packed fp32 [b, h, s]: the log-sum-exp P is normalised by
  float scale = 1.0f;
  // Scratch the graph needs as tensors of its own, both in device memory the caller owns:
  float* softmax_sum = nullptr;  // fp32 [b, h, s]
  float* dq_accum = nullptr;     // fp32 [b, h, s, d]
};

// Statistics of one CudnnSdpa, for tests and benchmarks.
struct SdpaCounters {
  int64_t plans_built = 0;
  int64_t plan_failures = 0;  // graphs no engine would take (the caller falls back)
  int64_t executions = 0;
  int64_t max_workspace = 0;  // the largest plan workspace seen
};

class CudnnSdpa {
 public:
  // A handle on the current device, bound to `stream` (not owned). Errors: UNAVAILABLE/INTERNAL
  // from cudnnCreate (for example no device); FAILED_PRECONDITION if the loaded cuDNN is older
  // than 9.0.
  static absl::StatusOr<std::unique_ptr<CudnnSdpa>> Create(cudaStream_t stream);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // The plan's workspace in bytes (builds and caches the plan). UNIMPLEMENTED when no engine takes
  // the graph (the message says why, from cuDNN); the failure is cached too.
  absl::StatusOr<int64_t> ForwardWorkspace(const SdpaForwardArgs& args);
  absl::StatusOr<int64_t> BackwardWorkspace(const SdpaBackwardArgs& args);

  // Enqueues the attention on the stream. `workspace` must hold the plan's workspace bytes.
  absl::Status Forward(const SdpaForwardArgs& args, void* workspace);
  absl::Status Backward(const SdpaBackwardArgs& args, void* workspace);

  const SdpaCounters& counters() const { return counters_; }
  // cudnnGetVersion() of the library actually loaded, e.g. 91900.
  static int64_t LoadedVersion();

  struct Plan;  // Opaque: descriptors that must outlive the plan, plus the plan itself.

 private:
  explicit CudnnSdpa(void* handle);
  // The plan cached under `key`, or the cached failure; otherwise build() once and cache either.
  absl::StatusOr<Plan*> CachedPlan(
      const std::string& key, const std::function<absl::StatusOr<std::unique_ptr<Plan>>()>& build);
  absl::StatusOr<Plan*> ForwardPlan(const SdpaForwardArgs& args);
  absl::StatusOr<Plan*> BackwardPlan(const SdpaBackwardArgs& args);

  void* handle_;  // cudnnHandle_t
  std::map<std::string, std::unique_ptr<Plan>> plans_;
  std::map<std::string, absl::Status> failures_;
  SdpaCounters counters_;
};

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_CUDNN_SDPA_H_
