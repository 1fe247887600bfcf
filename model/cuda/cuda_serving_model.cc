#include "model/cuda/cuda_serving_model.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/batch_generator_impl.h"
#include "model/cuda/cuda_decoder.h"
#include "model/cuda/cuda_longnet.h"

namespace dattn {
namespace model {

// The generator over the GPU decoder (batch_generator.h's template, defined in
// batch_generator_impl.h).
template class BatchGenerator<float, cuda::CudaDecoder>;

namespace cuda {
namespace {

class CudaServingModel final : public DecoderServingModel<CudaLongNetLM, CudaDecoder> {
 public:
  using DecoderServingModel::DecoderServingModel;
  std::string device() const override { return "cuda bf16"; }
  int64_t cache_bytes_per_sequence() const override {
    // ElementsPerSequence counts K and V.
    return decoder_->geometry().ElementsPerSequence() * static_cast<int64_t>(sizeof(bf16_t));
  }
  absl::Status Lead() override { return absl::OkStatus(); }
  absl::Status Follow() override {
    return absl::FailedPreconditionError(
        "a GPU deployment runs on one GPU: there is no ring to follow");
  }
  absl::Status KeepAlive(absl::Duration) override { return absl::OkStatus(); }
  absl::Status Release() override { return absl::OkStatus(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<ServingModel>> NewCudaServingModel(const LongNetConfig& config,
                                                                  absl::Span<const float> params,
                                                                  int64_t max_context,
                                                                  int64_t max_batch, int device) {
  ModelOptions options;
  options.checkpoint_activations = true;
  CudaModelOptions cuda_options;
  cuda_options.device = device;
  cuda_options.norms = CudaModelOptions::Norms::kRecompute;
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
  if (absl::Status s = (*lm)->ReserveActivations(1, max_context); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<CudaDecoder>> decoder =
      CudaDecoder::Create(lm->get(), max_context);
  if (!decoder.ok()) return decoder.status();
  absl::StatusOr<std::unique_ptr<BatchGenerator<float, CudaDecoder>>> generator =
      BatchGenerator<float, CudaDecoder>::Create(decoder->get(), max_batch);
  if (!generator.ok()) return generator.status();
  return std::unique_ptr<ServingModel>(std::make_unique<CudaServingModel>(
      *std::move(lm), *std::move(decoder), *std::move(generator)));
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
