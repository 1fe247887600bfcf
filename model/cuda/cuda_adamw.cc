#include "model/cuda/cuda_adamw.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_status.h"
#include "model/cuda/model_kernels.h"
#include "model/longnet_params.h"

namespace dattn {
namespace model {
namespace cuda {

absl::StatusOr<std::unique_ptr<CudaAdamW>> CudaAdamW::Create(
    const ParamLayout& layout, const AdamWOptions& options, cudaStream_t stream,
    std::function<bool(const ParamEntry&)> decay) {
  return CreateShard(layout, options, stream, std::move(decay), 0, layout.total());
}

absl::StatusOr<std::unique_ptr<CudaAdamW>> CudaAdamW::CreateShard(
    const ParamLayout& layout, const AdamWOptions& o, cudaStream_t stream,
    std::function<bool(const ParamEntry&)> decay, int64_t begin, int64_t end) {
  if (!(o.beta1 >= 0 && o.beta1 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW beta1 = ", o.beta1, ": need [0, 1)"));
  }
  if (!(o.beta2 >= 0 && o.beta2 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW beta2 = ", o.beta2, ": need [0, 1)"));
  }
  if (!(o.epsilon > 0 && std::isfinite(o.epsilon))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW epsilon = ", o.epsilon, ": need a finite value > 0"));
  }
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW weight_decay = ", o.weight_decay, ": need a finite value >= 0"));
  }
  if (layout.total() <= 0) {
    return absl::InvalidArgumentError("AdamW: the parameter layout has no elements");
  }
  if (begin < 0 || end <= begin || end > layout.total()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AdamW shard [", begin, ", ", end, ") is empty or not inside [0, ", layout.total(), ")"));
  }
  std::unique_ptr<CudaAdamW> opt(new CudaAdamW());
  opt->options_ = o;
  opt->stream_ = stream;
  opt->total_ = layout.total();
  opt->begin_ = begin;
  opt->end_ = end;
  const int64_t words = (opt->total_ + 31) / 32;
  opt->host_bits_.assign(static_cast<size_t>(words), 0u);
  for (const ParamEntry& e : layout.entries()) {
    const bool d = decay ? decay(e) : WantsWeightDecay(e);
    if (!d) continue;
    for (int64_t i = e.offset; i < e.offset + e.numel; ++i) {
      opt->host_bits_[static_cast<size_t>(i >> 5)] |= 1u << (i & 31);
    }
  }
  const size_t bytes = static_cast<size_t>(end - begin) * sizeof(float);
  DATTN_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&opt->m_), bytes));
  DATTN_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&opt->v_), bytes));
  DATTN_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&opt->bits_), static_cast<size_t>(words) * 4));
  DATTN_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&opt->partials_),
                 static_cast<size_t>(SumOfSquaresPartials() + 1) * sizeof(double)));
  DATTN_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&opt->host_result_), sizeof(double)));
  DATTN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(opt->m_, 0, bytes, stream));
  DATTN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(opt->v_, 0, bytes, stream));
  DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(opt->bits_, opt->host_bits_.data(),
                                             static_cast<size_t>(words) * 4, cudaMemcpyHostToDevice,
                                             stream));
  DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return opt;
}

CudaAdamW::~CudaAdamW() {
  if (m_ != nullptr) cudaFree(m_);
  if (v_ != nullptr) cudaFree(v_);
  if (bits_ != nullptr) cudaFree(bits_);
  if (partials_ != nullptr) cudaFree(partials_);
  if (host_result_ != nullptr) cudaFreeHost(host_result_);
}

bool CudaAdamW::Decays(int64_t index) const {
  if (index < 0 || index >= total_) return false;
  return ((host_bits_[static_cast<size_t>(index >> 5)] >> (index & 31)) & 1u) != 0;
}

int64_t CudaAdamW::device_bytes() const {
  return 2 * (end_ - begin_) * 4 + (total_ + 31) / 32 * 4 + (SumOfSquaresPartials() + 1) * 8;
}

absl::Status CudaAdamW::Update(int64_t t, double lr, double grad_scale, int64_t begin, int64_t end,
                               float* params, const float* grads) {
  if (begin < begin_ || end < begin || end > end_) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW update range [", begin, ", ", end,
                                                   ") is not inside the shard [", begin_, ", ",
                                                   end_, ")"));
  }
  if (t < 1) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW step number t = ", t, ": need >= 1"));
  }
  if (!(lr >= 0 && std::isfinite(lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW learning rate ", lr, ": need a finite value >= 0"));
  }
  if (!(grad_scale > 0 && std::isfinite(grad_scale))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW grad_scale ", grad_scale, ": need a finite value > 0"));
  }
  if (params == nullptr || grads == nullptr) {
    return absl::InvalidArgumentError("AdamW: params and grads are required");
  }
  const double td = static_cast<double>(t);
  AdamWFactors f;
  f.decay_keep = static_cast<float>(1.0 - lr * options_.weight_decay);
  f.step_size = static_cast<float>(lr / (1.0 - std::pow(options_.beta1, td)));
  f.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(options_.beta2, td)));
  f.beta1 = static_cast<float>(options_.beta1);
  f.one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
  f.beta2 = static_cast<float>(options_.beta2);
  f.one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
  f.epsilon = static_cast<float>(options_.epsilon);
  f.grad_scale = static_cast<float>(grad_scale);
  DATTN_CUDA_RETURN_IF_ERROR(AdamWUpdate(f, end - begin, begin, bits_, params + begin,
                                         grads + begin, m_ + (begin - begin_),
                                         v_ + (begin - begin_), stream_));
  return absl::OkStatus();
}

absl::Status CudaAdamW::Step(double lr, double grad_scale, float* params, const float* grads) {
  DATTN_RETURN_IF_ERROR(Update(step_ + 1, lr, grad_scale, begin_, end_, params, grads));
  ++step_;
  return absl::OkStatus();
}

absl::Status CudaAdamW::CopyMomentsToHost(float* m, float* v) {
  const size_t bytes = static_cast<size_t>(end_ - begin_) * sizeof(float);
  DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m, m_, bytes, cudaMemcpyDeviceToHost, stream_));
  DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v, v_, bytes, cudaMemcpyDeviceToHost, stream_));
  DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaAdamW::CopyMomentsFromHost(const float* m, const float* v) {
  const size_t bytes = static_cast<size_t>(end_ - begin_) * sizeof(float);
  DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m_, m, bytes, cudaMemcpyHostToDevice, stream_));
  DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v_, v, bytes, cudaMemcpyHostToDevice, stream_));
  DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaAdamW::SumOfSquares(const float* grads, int64_t begin, int64_t end) {
  if (begin < 0 || end < begin || end > total_ || grads == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW sum of squares of [", begin, ", ", end,
                                                   ") is not inside [0, ", total_, ")"));
  }
  double* result = partials_ + SumOfSquaresPartials();
  DATTN_CUDA_RETURN_IF_ERROR(
      cuda::SumOfSquares(grads + begin, end - begin, partials_, result, stream_));
  DATTN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_result_, result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return *host_result_;
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
