// The device memory of a GPU deployment (cuda_decoder.h on one GPU), for the coordinator's
// planner (which links no CUDA runtime) and the decoder itself: host-only and pure.
//
// A deployment's GPU holds (PlanCudaServingMemory):
//   - the model: CudaLongNetLM's fp32 parameters and gradient buffer, its bf16 working copy, its
//     GEMM workspace and the libraries' allowance (training_plan.h's PlanTrainingMemory without
//     the optimizer);
//   - the prefill: the activation arena of a max_context-token forward pass with activation
//     checkpointing and recomputed norms (what the serving model creates the CUDA model with) and
//     the attention's workspace;
//   - max_batch caches of KvCacheGeometry::ElementsPerSequence bf16 values (K and V), each one
//     cudaMalloc (rounded to the 2 MiB granule);
//   - the decoder's step buffers for max_batch rows (DecodeStepLayout) and its tables.
#ifndef DATTN_MODEL_CUDA_SERVING_PLAN_H_
#define DATTN_MODEL_CUDA_SERVING_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/decoder.h"

namespace dattn {
namespace model {
namespace cuda {

// Byte offsets of a decoding step's buffers for `rows` sequences in one allocation, each 256-byte
// aligned: first what a step uploads (tokens int32, positions int64, the caches' K and V pointers,
// each (sequence, slot)'s row int32, and on a ring of `shards` > 1 ranks its append and merge rows
// too: decode_kernels.h's DecodeBatch), then the activations (bf16: x, x_next, ln, qkv [3d], attn,
// sub, x_mid [d]; h, sub2 [F]; xf [d]), LayerNorm statistics (fp32 [2 rows]), the logits (fp32
// [V]), the attention's partial softmaxes (fp32 [slots][max_chunks][head_dim + 2]) and, on a
// ring, every rank's gathered (shards times those).
struct DecodeStepLayout {
  int64_t tokens = 0, positions = 0, k_cache = 0, v_cache = 0, slot_rows = 0;
  int64_t append_rows = 0, merge_rows = 0;  // a ring's; equal to slot_rows on one device
  int64_t upload_bytes = 0;                 // the upload region: [0, upload_bytes)
  int64_t x = 0, x_next = 0, ln = 0, qkv = 0, attn = 0, sub = 0, x_mid = 0, h = 0, sub2 = 0, xf = 0;
  int64_t stats = 0, logits = 0, partials = 0;
  int64_t gathered = 0;        // a ring's; equal to partials on one device
  int64_t partial_floats = 0;  // of one rank's partials
  int64_t bytes = 0;           // the whole allocation
};
// max_chunks: ceil(the largest slot's rows on this rank / kDecodeChunk) (decode_kernels.h), at
// least 1.
DecodeStepLayout LayoutDecodeStep(const LongNetConfig& config, int64_t slots, int64_t max_chunks,
                                  int64_t rows, int shards = 1);
// The chunks of 256 rows of the geometry's largest slot on shard 0, which holds the most rows of
// every slot (at least 1): the same on every rank of a ring.
int64_t DecodeMaxChunks(const KvCacheGeometry& geometry);

struct ServingMemoryPlan {
  int64_t model_bytes = 0;  // parameters, gradient buffer, working copy, GEMM workspace, libraries
  int64_t prefill_bytes = 0;  // the arena of a max_context forward pass and attention workspace
  int64_t ring_bytes = 0;     // a ring's: its exchange buffers and NCCL's own memory
  int64_t cache_bytes = 0;    // max_batch caches
  int64_t cache_bytes_per_sequence = 0;  // one cache, as allocated
  int64_t step_bytes = 0;  // the step buffers for max_batch rows and the decoder's tables
  int64_t total_bytes = 0;
  std::string DebugString() const;  // one line, every part
};
// The plan of one GPU of a deployment on `ranks` GPUs (1: one GPU; on a ring, the largest rank's,
// rank 0's: its shard of max_context / ranks positions for the prefill, with the ring's workspace
// and exchange buffers of training_plan.h's PlanTrainingRankMemory and its allowance for NCCL's
// own memory, and rank 0's share of each cache). INVALID_ARGUMENT for a config the CUDA model
// cannot run (CheckCudaConfig, naming the field), max_context or max_batch < 1, ranks < 1 or not
// dividing max_context, and the errors of KvCacheGeometry::Make and PlanTrainingMemory.
absl::StatusOr<ServingMemoryPlan> PlanCudaServingMemory(const LongNetConfig& config,
                                                        int64_t max_context, int64_t max_batch,
                                                        int ranks = 1);

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_SERVING_PLAN_H_
