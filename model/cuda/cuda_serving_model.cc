#include "model/cuda/cuda_serving_model.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/batch_generator_impl.h"
#include "model/cuda/cuda_decoder.h"
#include "model/cuda/cuda_longnet.h"
#include "model/cuda/cuda_sequence_attention.h"

namespace dattn {
namespace model {

// The generator over the GPU decoder (batch_generator.h's template, defined in
// batch_generator_impl.h).
template class BatchGenerator<float, cuda::CudaDecoder>;

namespace cuda {

absl::StatusOr<std::unique_ptr<ServingModel>> NewCudaServingModel(const LongNetConfig& config,
                                                                  absl::Span<const float> params,
                                                                  int64_t max_context,
                                                                  int64_t max_batch, int device,
                                                                  comm::Communicator* ring) {
  if (ring != nullptr && ring->size() == 1) ring = nullptr;
  const int shards = ring == nullptr ? 1 : ring->size();
  if (max_context % shards != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPU serving model: max_context ", max_context,
                                                   " is not a multiple of the ring's ", shards,
                                                   " ranks"));
  }
  ModelOptions options;
  options.checkpoint_activations = true;
  CudaModelOptions cuda_options;
  cuda_options.device = device;
  cuda_options.norms = CudaModelOptions::Norms::kRecompute;
  if (ring != nullptr) {
    // A prompt's prefill and a Score split over the ring's GPUs.
    cuda_options.attention_factory = [ring, device](cudaStream_t stream) {
      return NewCudaRingSequenceAttention(ring, stream, device);
    };
  }
  absl::StatusOr<std::unique_ptr<CudaLongNetLM>> lm =
      CudaLongNetLM::Create(config, options, cuda_options);
  if (!lm.ok()) return lm.status();
  if (static_cast<int64_t>(params.size()) != (*lm)->layout().total()) {
    return absl::InvalidArgumentError(absl::StrCat("GPU serving model: ", params.size(),
                                                   " parameters given, the model has ",
                                                   (*lm)->layout().total()));
  }
  if (absl::Status s = (*lm)->CopyParamsFromHost(params.data()); !s.ok()) return s;
  // The activations of a max_context-token prompt or Score, claimed now: a device without room
  // fails the deployment as it loads, not at its first long request, and prompts of any length
  // then run without an allocation.
  if (absl::Status s = (*lm)->ReserveActivations(1, max_context / shards); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<CudaDecoder>> decoder =
      CudaDecoder::Create(lm->get(), max_context, ring);
  if (!decoder.ok()) return decoder.status();
  absl::StatusOr<std::unique_ptr<BatchGenerator<float, CudaDecoder>>> generator =
      BatchGenerator<float, CudaDecoder>::Create(decoder->get(), max_batch);
  if (!generator.ok()) return generator.status();
  // Every rank's share together: the cache of one sequence (ElementsPerSequence counts K and V).
  absl::StatusOr<KvCacheGeometry> whole = KvCacheGeometry::Make(config, max_context);
  if (!whole.ok()) return whole.status();
  return std::unique_ptr<ServingModel>(
      std::make_unique<DecoderServingModel<CudaLongNetLM, CudaDecoder>>(
          *std::move(lm), *std::move(decoder), *std::move(generator), "cuda bf16",
          whole->ElementsPerSequence() * static_cast<int64_t>(sizeof(bf16_t))));
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
