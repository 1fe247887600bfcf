#include "model/cuda/cuda_sequence_attention.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/ring/cuda_block_kernels.h"
#include "model/ring_sequence_attention.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

// The ring's SequenceAttention together with the kernels it borrows (destroyed after it).
class OwningRingAttention final : public SequenceAttention {
 public:
  OwningRingAttention(std::unique_ptr<ring::CudaBlockKernels> kernels, comm::Communicator* sp,
                      ring::RingOptions options)
      : kernels_(std::move(kernels)),
        ring_(NewRingSequenceAttention(sp, kernels_.get(), std::move(options))) {}

  Device device() const override { return ring_->device(); }
  absl::Status Forward(const AttentionSpec& spec, const SequencePositions& positions,
                       const ForwardArgs& args) override {
    return ring_->Forward(spec, positions, args);
  }
  absl::Status Backward(const AttentionSpec& spec, const SequencePositions& positions,
                        const BackwardArgs& args) override {
    return ring_->Backward(spec, positions, args);
  }

 private:
  const std::unique_ptr<ring::CudaBlockKernels> kernels_;
  const std::unique_ptr<SequenceAttention> ring_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SequenceAttention>> NewCudaRingSequenceAttention(
    comm::Communicator* sp, cudaStream_t stream, int device, ring::RingOptions options) {
  if (sp == nullptr) {
    return absl::InvalidArgumentError("NewCudaRingSequenceAttention: the communicator is null");
  }
  if (stream == nullptr) {
    return absl::InvalidArgumentError(
        "NewCudaRingSequenceAttention: the stream is null; pass the model's stream");
  }
  if (sp->device() != Device::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NewCudaRingSequenceAttention: the ring's ", sp->name(), " communicator works on ",
        DeviceName(sp->device()), " memory; a GPU rank's ring needs one on CUDA memory (NCCL)"));
  }
  ring::CudaBlockKernelOptions kernel_options;
  kernel_options.device = device;
  kernel_options.stream = stream;
  absl::StatusOr<std::unique_ptr<ring::CudaBlockKernels>> kernels =
      ring::NewCudaBlockKernels(kernel_options);
  if (!kernels.ok()) return kernels.status();
  return std::unique_ptr<SequenceAttention>(
      new OwningRingAttention(*std::move(kernels), sp, std::move(options)));
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
