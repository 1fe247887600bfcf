// AdamW on the GPU over the flat fp32 buffers a ParamLayout describes (the CUDA model's params()
// and grads(), or any other model's): the update of model/optimizer.h (PyTorch's
// torch.optim.AdamW: decoupled weight decay scaled by the learning rate, bias correction), in fp32
// with one rounding per operation in that header's order, so that it equals the CPU's fp32 loop
// bit for bit (cuda_adamw_test checks this, and the update against an fp64 reference).
//
//   g = grad * grad_scale;  w = p * (1 - lr wd) where the entry decays, else p
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) (g g)
//   p = w - (lr / (1 - beta1^t)) (m / (sqrt(v) / sqrt(1 - beta2^t) + epsilon))
//
// Which elements decay is chosen per layout entry by a predicate, the caller's choice: the trainer
// passes its own (optimizer.decay_embeddings: optimizer.h's DecayByConvention, which spares the
// token embedding, or WantsWeightDecay; cuda_trainable_model.h passes the trainer's AdamW's);
// null means WantsWeightDecay (matrices yes, vectors no). It is kept on the device as one bit per
// element of the layout. The optimizer owns the moments (2 x 4 bytes per element) of its shard,
// elements [begin(), end()) of the layout (all of it from Create; a ZeRO-1 rank's range from
// CreateShard), zero at creation. An update of a range touches only those elements.
//
// Asynchrony: updates enqueue on the stream given at Create and return; GradSumOfSquares and the
// copies synchronize it. Errors: INVALID_ARGUMENT naming the value (bad options or step values, a
// range outside the layout; nothing is enqueued then); CUDA errors naming the call (cuda_status.h),
// RESOURCE_EXHAUSTED when the moments cannot be allocated. Thread-safety: one call at a time.
#ifndef DATTN_MODEL_CUDA_CUDA_ADAMW_H_
#define DATTN_MODEL_CUDA_CUDA_ADAMW_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/param_layout.h"

namespace dattn {
namespace model {
namespace cuda {

// The same fields and defaults as model/optimizer.h's AdamWConfig.
struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  double weight_decay = 0.1;
};

class CudaAdamW {
 public:
  // INVALID_ARGUMENT unless 0 <= beta1, beta2 < 1, epsilon > 0 finite, weight_decay >= 0 finite and
  // the layout has elements. `decay` is called once per entry; null means WantsWeightDecay.
  static absl::StatusOr<std::unique_ptr<CudaAdamW>> Create(
      const ParamLayout& layout, const AdamWOptions& options, cudaStream_t stream,
      std::function<bool(const ParamEntry&)> decay = nullptr);
  // The same over the shard [begin, end) of the layout only: moments for those elements. Also
  // INVALID_ARGUMENT (naming the range) unless 0 <= begin < end <= layout.total().
  static absl::StatusOr<std::unique_ptr<CudaAdamW>> CreateShard(
      const ParamLayout& layout, const AdamWOptions& options, cudaStream_t stream,
      std::function<bool(const ParamEntry&)> decay, int64_t begin, int64_t end);
  ~CudaAdamW();
  CudaAdamW(const CudaAdamW&) = delete;
  CudaAdamW& operator=(const CudaAdamW&) = delete;

  // Update number t (>= 1) of elements [begin, end), inside the shard [begin(), end()), of the flat
  // device buffers `params` and `grads` (whole-layout buffers: element i at params[i]). lr >= 0
  // finite, grad_scale > 0 finite. FLOPs: about 16 per element; bytes: 28 per element (p, g, m, v
  // read; p, m, v written) plus a decay bit.
  absl::Status Update(int64_t t, double lr, double grad_scale, int64_t begin, int64_t end,
                      float* params, const float* grads);
  // Update step() + 1 of every element of the shard; step() then counts it.
  absl::Status Step(double lr, double grad_scale, float* params, const float* grads);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }  // A resumed run's count.
  int64_t total() const { return total_; }       // The layout's elements.
  int64_t begin() const { return begin_; }       // The shard: elements [begin(), end()).
  int64_t end() const { return end_; }
  bool Decays(int64_t index) const;

  // The shard's moments, end() - begin() fp32 each, on the device (element begin() at m()[0]); and
  // copies to and from host arrays of that many elements (synchronous).
  float* m() { return m_; }
  float* v() { return v_; }
  absl::Status CopyMomentsToHost(float* m, float* v);
  absl::Status CopyMomentsFromHost(const float* m, const float* v);

  // sum of grads[i]^2 over [begin, end) (any range of the layout), in fp64 (fixed partition and
  // order: deterministic, but not the CPU's element order), for global-norm clipping.
  // Synchronizes the stream. Bytes: 4 per element read.
  absl::StatusOr<double> SumOfSquares(const float* grads, int64_t begin, int64_t end);

  // Device bytes the optimizer holds: the moments, the decay bits and a scratch of partial sums.
  int64_t device_bytes() const;

 private:
  CudaAdamW() = default;
  AdamWOptions options_;
  cudaStream_t stream_ = nullptr;
  int64_t total_ = 0;
  int64_t begin_ = 0, end_ = 0;
  int64_t step_ = 0;
  std::vector<uint32_t> host_bits_;
  uint32_t* bits_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;
  double* partials_ = nullptr;     // SumOfSquaresPartials() + 1 (the last holds the result)
  double* host_result_ = nullptr;  // pinned
};

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_CUDA_ADAMW_H_
