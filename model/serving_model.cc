#include "model/serving_model.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "model/cpu_layer_ops.h"
#include "model/decoder.h"
#include "model/longnet.h"
#include "model/ring_sequence_attention.h"

namespace dattn {
namespace model {
absl::StatusOr<std::unique_ptr<ServingModel>> NewCpuServingModel(const LongNetConfig& config,
                                                                 absl::Span<const float> params,
                                                                 int64_t max_context,
                                                                 int64_t max_batch, int threads,
                                                                 comm::Communicator* ring) {
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
  if (static_cast<int64_t>(params.size()) != (*lm)->layout().total()) {
    return absl::InvalidArgumentError(absl::StrCat("serving model: ", params.size(),
                                                   " parameters given, the model has ",
                                                   (*lm)->layout().total()));
  }
  if (absl::Status s = (*lm)->CopyParamsFromHost(params.data()); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Decoder<float>>> decoder =
      Decoder<float>::Create(lm->get(), max_context, ring);
  if (!decoder.ok()) return decoder.status();
  absl::StatusOr<std::unique_ptr<BatchGenerator<float>>> generator =
      BatchGenerator<float>::Create(decoder->get(), max_batch);
  if (!generator.ok()) return generator.status();
  // Every rank's share together: the cache of one sequence.
  absl::StatusOr<KvCacheGeometry> whole = KvCacheGeometry::Make(config, max_context);
  if (!whole.ok()) return whole.status();
  return std::unique_ptr<ServingModel>(
      std::make_unique<DecoderServingModel<LongNetLM<float>, Decoder<float>>>(
          *std::move(lm), *std::move(decoder), *std::move(generator), "cpu fp32",
          whole->ElementsPerSequence() * static_cast<int64_t>(sizeof(float))));
}

}  // namespace model
}  // namespace dattn
