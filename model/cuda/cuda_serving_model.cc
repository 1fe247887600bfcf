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

class CudaServingModel final : public ServingModel {
 public:
  std::string device() const override { return "cuda bf16"; }
  int64_t parameters() const override { return lm_->layout().total(); }
  int64_t cache_bytes_per_sequence() const override {
    // ElementsPerSequence counts K and V.
    return decoder_->geometry().ElementsPerSequence() * static_cast<int64_t>(sizeof(bf16_t));
  }
  absl::Status Score(const int32_t* tokens, int64_t n, double* logprobs) override {
    return decoder_->Score(tokens, n, logprobs);
  }
  absl::StatusOr<int64_t> Submit(GenerationRequest request) override {
    return generator_->Submit(std::move(request));
  }
  bool Cancel(int64_t id) override { return generator_->Cancel(id); }
  absl::StatusOr<TickStats> Tick(absl::Time now) override { return generator_->Tick(now); }
  int64_t running() const override { return generator_->running(); }
  int64_t queued() const override { return generator_->queued(); }
  absl::Status Lead() override { return absl::OkStatus(); }
  absl::Status Follow() override {
    return absl::FailedPreconditionError(
        "a GPU deployment runs on one GPU: there is no ring to follow");
  }
  absl::Status KeepAlive(absl::Duration) override { return absl::OkStatus(); }
  absl::Status Release() override { return absl::OkStatus(); }

  // Destroyed in reverse: the generator's states before the decoder, the decoder before the model.
  std::unique_ptr<CudaLongNetLM> lm_;
  std::unique_ptr<CudaDecoder> decoder_;
  std::unique_ptr<BatchGenerator<float, CudaDecoder>> generator_;
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
  auto served = std::make_unique<CudaServingModel>();
  served->lm_ = *std::move(lm);
  if (static_cast<int64_t>(params.size()) != served->lm_->layout().total()) {
    return absl::InvalidArgumentError(absl::StrCat("GPU serving model: ", params.size(),
                                                   " parameters given, the model has ",
                                                   served->lm_->layout().total()));
  }
  if (absl::Status s = served->lm_->CopyParamsFromHost(params.data()); !s.ok()) return s;
  // The activations of a max_context-token prompt or Score, claimed now: a device without room
  // fails the deployment as it loads, not at its first long request, and prompts of any length
  // then run without an allocation.
  if (absl::Status s = served->lm_->ReserveActivations(1, max_context); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<CudaDecoder>> decoder =
      CudaDecoder::Create(served->lm_.get(), max_context);
  if (!decoder.ok()) return decoder.status();
  served->decoder_ = *std::move(decoder);
  absl::StatusOr<std::unique_ptr<BatchGenerator<float, CudaDecoder>>> generator =
      BatchGenerator<float, CudaDecoder>::Create(served->decoder_.get(), max_batch);
  if (!generator.ok()) return generator.status();
  served->generator_ = *std::move(generator);
  return std::unique_ptr<ServingModel>(std::move(served));
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
