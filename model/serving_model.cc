#include "model/serving_model.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "model/cpu_layer_ops.h"
#include "model/decoder.h"
#include "model/longnet.h"
#include "model/ring_sequence_attention.h"

namespace dattn {
namespace model {
namespace {

class CpuServingModel final : public ServingModel {
 public:
  std::string device() const override { return "cpu fp32"; }
  int64_t parameters() const override { return lm_->layout().total(); }
  int64_t cache_bytes_per_sequence() const override { return cache_bytes_; }
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
  absl::Status Lead() override { return decoder_->Lead(); }
  absl::Status Follow() override { return decoder_->Follow(); }
  absl::Status KeepAlive(absl::Duration interval) override { return decoder_->KeepAlive(interval); }
  absl::Status Release() override { return decoder_->Release(); }

  std::unique_ptr<LongNetLM<float>> lm_;
  std::unique_ptr<Decoder<float>> decoder_;
  std::unique_ptr<BatchGenerator<float>> generator_;
  int64_t cache_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ServingModel>> NewCpuServingModel(const LongNetConfig& config,
                                                                 absl::Span<const float> params,
                                                                 int64_t max_context,
                                                                 int64_t max_batch, int threads,
                                                                 comm::Communicator* ring) {
  auto served = std::make_unique<CpuServingModel>();
  absl::StatusOr<std::unique_ptr<LongNetLM<float>>> lm;
  if (ring == nullptr || ring->size() == 1) {
    lm = LongNetLM<float>::CreateCpu(config, {}, threads);
  } else {
    // The ring's attention: a prompt's prefill and a Score split over the ranks.
    CpuLayerOpsOptions ops;
    ops.num_threads = threads;
    lm = LongNetLM<float>::Create(config, {}, NewCpuLayerOps<float>(ops),
                                  NewCpuRingSequenceAttention(ring, threads));
  }
  if (!lm.ok()) return lm.status();
  served->lm_ = *std::move(lm);
  if (static_cast<int64_t>(params.size()) != served->lm_->layout().total()) {
    return absl::InvalidArgumentError(absl::StrCat("serving model: ", params.size(),
                                                   " parameters given, the model has ",
                                                   served->lm_->layout().total()));
  }
  if (absl::Status s = served->lm_->CopyParamsFromHost(params.data()); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Decoder<float>>> decoder =
      Decoder<float>::Create(served->lm_.get(), max_context, ring);
  if (!decoder.ok()) return decoder.status();
  served->decoder_ = *std::move(decoder);
  absl::StatusOr<std::unique_ptr<BatchGenerator<float>>> generator =
      BatchGenerator<float>::Create(served->decoder_.get(), max_batch);
  if (!generator.ok()) return generator.status();
  served->generator_ = *std::move(generator);
  // Every rank's share together: the cache of one sequence.
  absl::StatusOr<KvCacheGeometry> whole = KvCacheGeometry::Make(config, max_context);
  if (!whole.ok()) return whole.status();
  served->cache_bytes_ = whole->ElementsPerSequence() * static_cast<int64_t>(sizeof(float));
  return std::unique_ptr<ServingModel>(std::move(served));
}

}  // namespace model
}  // namespace dattn
