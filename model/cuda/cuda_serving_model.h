// A deployment's serving model on one GPU (model/serving_model.h): the CUDA model in bf16 on fp32
// master weights (cuda_longnet.h, with activation checkpointing and recomputed norms, so that a
// max_context-token prefill or Score keeps each block's input only: serving_plan.h counts it; the
// arena of that shape is allocated at creation, CudaLongNetLM::ReserveActivations), the
// GPU decoder (cuda_decoder.h) and a batch generator over it. On one GPU Follow is
// FAILED_PRECONDITION, and Lead, KeepAlive and Release have nothing to do; on a ring of GPUs (an
// NCCL communicator of S > 1 ranks) the model's attention is the ring over it
// (cuda_sequence_attention.h), each rank's arena is that of its max_context / S positions, and
// Lead, Follow, KeepAlive and Release are the decoder's.
#ifndef DATTN_MODEL_CUDA_CUDA_SERVING_MODEL_H_
#define DATTN_MODEL_CUDA_CUDA_SERVING_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/comm/communicator.h"
#include "model/config.h"
#include "model/serving_model.h"

namespace dattn {
namespace model {
namespace cuda {

// `params`: host fp32, the config's ParamLayout order; `device`: the CUDA ordinal; `ring`
// (borrowed, outliving the serving model; null or one rank: one GPU). Errors: the CUDA model's
// (INVALID_ARGUMENT for a config it cannot run, UNAVAILABLE without a usable GPU,
// RESOURCE_EXHAUSTED naming the bytes), the ring attention's, the decoder's and the generator's.
absl::StatusOr<std::unique_ptr<ServingModel>> NewCudaServingModel(
    const LongNetConfig& config, absl::Span<const float> params, int64_t max_context,
    int64_t max_batch, int device, comm::Communicator* ring = nullptr);

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_CUDA_SERVING_MODEL_H_
