// Where every byte of the CUDA model's training step lives, computed before anything is allocated:
// the layout of the bf16 working copy of the weights, the layout of the activation arena, and the
// memory plan of a whole step (weights, gradients, optimizer moments, activations with or without
// checkpointing, scratch, workspaces). CudaLongNetLM allocates by these same functions (one arena
// carved at the offsets below), so the plan is the allocation; what it cannot know exactly is the
// engine's attention workspace pool (planned by engine/cuda/cuda_memory_plan.h), the libraries'
// own memory (cuBLASLt, cuDNN handles and lazily loaded kernels: a fixed allowance) and the
// driver's rounding. cuda_longnet_test and bench/model_bench check the plan against the measured
// peak (device memory in use, from cudaMemGetInfo, above what it was before the model existed).
//
// Sizes (M = batch x seq_len rows, d, F, V, H, L as in docs/MODEL.md; bf16 = 2 bytes):
//   params, grads: 4 P each; working copy: about 2 P (bf16, tensors aligned to 256 bytes);
//   AdamW moments and decay bits: 8 P + P / 8;
//   residual stream xs[0..L]: (L + 1) 2 M d;
//   per block kept for the backward pass: q, k, v, attention output, x_mid: 5 M d; the FFN's
//     pre-activation h: M F; LayerNorm statistics 8 M and lse 4 H M (fp32) -- plus, unless norms
//     are recomputed, the four LayerNorm outputs 3 M d + M F;
//   with checkpoint_activations, one such block set in all (the recomputed block's);
//   final norm 2 M d + 8 M, logits 4 M V (fp32), their gradient 2 M V, row lse 4 M;
//   backward scratch: the residual gradient 4 M d (fp32) + 2 M d (bf16), 2 M max(F, 3d),
//     dqkv 6 M d, one [M, d] bf16 temporary, and with recomputed norms one more [M, d];
//   per-CTA partial column sums: 4 x 3 ctas (F + 4 d) (ctas = 4 x SMs, independent of M);
//   tokens, targets, the embedding's sorted positions and item sums: about 16 M + 4 d (M/256 + V).
// A rank of a run of several GPUs (PlanTrainingRankMemory) holds the same for its slice of the
// sequence, with ZeRO-1's optimizer shard, the ring's workspace and exchange buffers (S > 1) and
// the GPU collective's buffers (nccl_collective.h) instead.
// Pure functions; thread-safe.
#ifndef DATTN_MODEL_CUDA_TRAINING_PLAN_H_
#define DATTN_MODEL_CUDA_TRAINING_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace dattn {
namespace model {
namespace cuda {

// --- The bf16 working copy: one buffer, tensors 128-element (256-byte) aligned, the q, k, v
// projections stacked into one [3d, d] matrix and one [3d] bias (one GEMM for all three), every
// bias next to its weight. Segments say how it is filled from the fp32 master buffer.
struct WorkingBlock {
  int64_t wqkv = 0, bqkv = 0;  // [3d, d], [3d]
  int64_t wo = 0, bo = 0;      // [d, d], [d]
  int64_t w1 = 0, b1 = 0;      // [F, d], [F]
  int64_t w2 = 0, b2 = 0;      // [d, F], [d]
};
struct WorkingCopyLayout {
  int64_t size = 0;       // elements (a multiple of 8)
  int64_t embedding = 0;  // [V, d]
  int64_t head = 0;       // [V, d]: == embedding when tied
  std::vector<WorkingBlock> blocks;
  struct Segment {
    int64_t src = 0, dst = 0, n = 0;  // master[src, src + n) -> working[dst, dst + n)
  };
  std::vector<Segment> segments;  // sorted by dst, disjoint
};
// INVALID_ARGUMENT unless the config is one the CUDA model runs (CheckCudaConfig).
absl::StatusOr<WorkingCopyLayout> LayoutWorkingCopy(const LongNetConfig& config,
                                                    const ParamLayout& layout);

// What the CUDA model takes beyond ValidateConfig: d_model and ffn_dim multiples of 8 and at most
// 16384 (the row kernels' 16-byte accesses and widths), head_dim a multiple of 8 and at most 256
// (the engine's CUDA backend; 64 and 128 run on its Hopper kernels). INVALID_ARGUMENT naming the
// field and value.
absl::Status CheckCudaConfig(const LongNetConfig& config);

// --- The activation arena: byte offsets of every activation and scratch buffer of one shape.
struct ArenaOptions {
  bool checkpoint_activations = false;
  // Keep the four LayerNorm outputs of each block (faster backward) or recompute them from the
  // saved inputs and statistics (3 M d + M F less per block; about 14 M d more bytes moved).
  bool recompute_norms = false;
  int num_sms = 132;  // the device's multiprocessors (partial sums are per CTA)
};
struct BlockSlots {
  // bf16 [M, width]: ln1, sub1, ln2 [M, d]; qkv [M, 3d]; attn, x_mid [M, d]; h, sub2 [M, F].
  int64_t ln1 = 0, qkv = 0, attn = 0, sub1 = 0, x_mid = 0, ln2 = 0, h = 0, sub2 = 0;
  // fp32: (mean [M], rstd [M]) per norm; lse [B, H, N].
  int64_t ln1_stats = 0, sub1_stats = 0, ln2_stats = 0, sub2_stats = 0, lse = 0;
};
struct ArenaLayout {
  int64_t bytes = 0;
  int64_t rows = 0;              // M
  std::vector<int64_t> xs;       // L + 1 residual-stream buffers, bf16 [M, d]
  std::vector<BlockSlots> sets;  // L sets, or 1 with checkpointing
  int64_t xf = 0, xf_stats = 0;  // final norm output (bf16) and statistics
  int64_t logits = 0;            // fp32 [M, V]
  int64_t row_lse = 0;           // fp32 [M]
  int64_t dlogits = 0;           // bf16 [M, V]
  int64_t dres32 = 0;            // fp32 [M, d]: the residual stream's gradient
  int64_t dres = 0;              // bf16 copy of it
  int64_t big = 0;               // bf16 [M, max(F, 3d)]: FFN gradient; dq, dk, dv
  int64_t dqkv = 0;              // bf16 [M, 3d]
  int64_t tmp = 0;               // bf16 [M, d]
  int64_t norm_scratch = -1;     // bf16 [M, d], recompute_norms only
  // fp32 per-CTA partial sums [ctas][3][width] of the backward row kernels of one block.
  int64_t part_ffn = 0, part_ln2 = 0, part_sub1 = 0, part_rope = 0, part_ln1 = 0;
  int64_t part_ctas_ffn = 0, part_ctas_d = 0;  // rows of each (RowLaunchFor)
  int64_t tokens = 0, targets = 0;             // int32 [M]
  int64_t emb_order = 0;                       // int64 [M]
  int64_t emb_items = 0, emb_max_items = 0;    // EmbeddingItem [M / 256 + V + 1]
  int64_t emb_token_items = 0;                 // int64 [V + 1]
  int64_t emb_partial = 0;                     // fp32 [max items, d]
  int64_t ce_partials = 0, loss = 0;           // fp64
};
absl::StatusOr<ArenaLayout> LayoutArena(const LongNetConfig& config, int64_t batch, int64_t seq_len,
                                        const ArenaOptions& options);

// --- The GPU collective of a data- and sequence-parallel run (nccl_collective.h): its options and
// device memory, here so that a plan (and the coordinator, which links no CUDA runtime) can count
// them.
struct CudaCollectiveOptions {
  // Bound on ReduceScatterGradients' receive buffer: W - 1 slots of `chunk` fp32 elements,
  // chunk = CollectiveChunkElements(largest shard, W, max_temp_bytes).
  int64_t max_temp_bytes = int64_t{64} << 20;
  // Whether ReduceScatterGradients and AllGatherParameters end with Communicator::Synchronize on
  // the model's stream (a host wait bounded by the communicator's timeout); false: they only
  // enqueue (nccl_collective.h says what each choice costs).
  bool wait_on_host = true;
};
// Elements of one receive slot: min(largest_shard, max(1024, max_temp_bytes / 4 / (W - 1))), at
// least 1. Pure.
int64_t CollectiveChunkElements(int64_t largest_shard, int world, int64_t max_temp_bytes);
// The device staging buffer of the collective's host values (AllGather, AllGatherBytes) as
// allocated at creation: 64 KiB (it grows only for larger messages than that holds).
inline constexpr int64_t kCollectiveStagingBytes = int64_t{64} << 10;
// Device bytes the collective holds for a buffer of `total` elements sharded over `world` ranks
// (ShardRanges): the receive buffer, (W - 1) x chunk x 4, and the staging buffer; 0 for W = 1.
// Each rounded up to the 2 MiB allocation granule. Pure.
int64_t CollectiveDeviceBytes(int64_t total, int world, const CudaCollectiveOptions& options);

// --- A whole training step on one GPU.
struct TrainingMemoryOptions {
  ArenaOptions arena;
  bool include_optimizer = true;              // CudaAdamW's moments, bits and scratch
  int64_t gemm_workspace_bytes = 32ll << 20;  // CudaModelOptions::gemm_workspace_bytes
  // cuBLASLt's and cuDNN's handles, their lazily loaded kernels, and the engine's item counters:
  // not computable; a fixed allowance (measured on an H200 with CUDA 13.0, cuDNN 9.19).
  int64_t library_allowance_bytes = 128ll << 20;
  // PlanTrainingRankMemory only: the collective whose buffers the rank holds.
  CudaCollectiveOptions collective;
  // PlanTrainingRankMemory only: NCCL's own device memory (its channels' buffers for every
  // connected peer, its work queues, its kernels), not computable from outside NCCL: a fixed
  // allowance for the world's communicator (W > 1) and another for the sequence group's (S > 1).
  // Measured on 4 x H100 with NCCL 2.28 (P2P over NVLink; docs/PERFORMANCE.md): without them,
  // rank 0's peak exceeded the plan by 1.93 GiB (4 x 1), 2.32 GiB (2 x 2) and 2.16 GiB (1 x 4).
  int64_t nccl_world_allowance_bytes = 2048ll << 20;
  int64_t nccl_group_allowance_bytes = 512ll << 20;
};
struct TrainingMemoryPlan {
  int64_t params_bytes = 0, grads_bytes = 0, working_copy_bytes = 0, optimizer_bytes = 0;
  int64_t activations_bytes = 0;  // the arena's saved activations (xs, block sets, final norm,
                                  // logits)
  int64_t scratch_bytes = 0;      // the rest of the arena
  int64_t attention_workspace_bytes = 0;  // the engine's pool at its high-water mark
  int64_t gemm_workspace_bytes = 0;
  int64_t library_bytes = 0;
  // A rank of several (PlanTrainingRankMemory): the ring's exchange buffers (S > 1) and the
  // collective's buffers (W > 1); 0 on one GPU.
  int64_t ring_bytes = 0;
  int64_t collective_bytes = 0;
  int64_t nccl_bytes = 0;  // the NCCL allowances (W > 1)
  int64_t total_bytes = 0;
  std::string DebugString() const;  // one line, every part in MiB
};
absl::StatusOr<TrainingMemoryPlan> PlanTrainingMemory(const LongNetConfig& config, int64_t batch,
                                                      int64_t seq_len,
                                                      const TrainingMemoryOptions& options);

// Bytes of CudaAdamW over a shard of `shard_elements` of a layout of `total` elements
// (CudaAdamW::CreateShard): the two fp32 moments of the shard, the decay bits of the whole layout
// and the sum-of-squares scratch, each rounded to the allocation granule. Pure.
int64_t ShardOptimizerBytes(int64_t total, int64_t shard_elements);

// --- One GPU rank of a training run of W = D x S ranks (trainer.h: D data-parallel groups of S
// sequence-parallel ranks; TrainerOptions::sequence_parallel), what the coordinator reserves on
// the rank's GPU and the worker budgets. `micro_rows`: the rank's rows per micro-batch (batch_size
// / micro_batches / D); `seq_len`: the whole sequence N (S must divide it). The plan is
// PlanTrainingMemory for (micro_rows, N / S) with:
//   - the optimizer: ZeRO-1's shard, ShardOptimizerBytes(P, ceil(P / W)) (the largest of
//     ShardRanges(P, W));
//   - S > 1: the attention is the ring's (NewCudaRingSequenceAttention), not the local backend:
//     attention_workspace_bytes is the ring kernels' workspace for the shard and ring_bytes the
//     exchange buffers and agreement check, both of engine/rank_memory_plan.h's
//     PlanLargestRankMemory for the (micro_rows, N, H, head_dim, bf16, forward + backward) problem
//     on S ranks of the CUDA backend (the shard's q, k, v, out and gradients are the arena's and
//     are not counted twice);
//   - W > 1: collective_bytes, CollectiveDeviceBytes(P, W, options.collective).
// D = S = 1 gives PlanTrainingMemory(config, micro_rows, N, options) exactly. options.
// include_optimizer false leaves the optimizer out as there. INVALID_ARGUMENT naming the value for
// D or S < 1, micro_rows < 1, S not dividing seq_len, W larger than the parameters, and the errors
// of PlanTrainingMemory and PlanLargestRankMemory. Host-only (no CUDA runtime); pure.
absl::StatusOr<TrainingMemoryPlan> PlanTrainingRankMemory(const LongNetConfig& config,
                                                          int64_t micro_rows, int64_t seq_len,
                                                          int data_parallel, int sequence_parallel,
                                                          const TrainingMemoryOptions& options);

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_TRAINING_PLAN_H_
