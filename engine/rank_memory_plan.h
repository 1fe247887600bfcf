// The memory one rank of an attention job needs on its device, before anything is allocated.
//
// The coordinator places ranks with these numbers (a rank goes only to a worker with this much
// memory free) and the worker budgets and refuses tasks with the same numbers, so the two agree by
// construction. A rank holds its shard of the job's tensors: q, k, v (+ dout) and out (+ dq, dk,
// dv) of (B, N/P, H, D) and lse of (B, H, N/P); the engine's workspace for that shard; and, on a
// ring of P > 1 ranks, the packed blocks of the exchange (engine/ring/ring_plan.h,
// RingPlan::buffer_bytes of the larger of its forward and backward call) plus the small buffer of
// the ring's agreement check. Ring ranks differ (a rank whose shard a spanning segment crosses
// holds more blocks), so the coordinator plans the largest rank and reserves that much on every
// rank's worker.
//
// Engine workspace per device:
//   CPU, one rank   the CPU backend's tile scratch per thread (engine/memory_plan.h).
//   CPU, ring       the CPU ring kernels' tile scratch per thread (score and probability tiles,
//                   accumulators, row statistics, gradient tiles:
//                   engine/ring/cpu_block_kernels.cc).
//   CUDA, one rank  the CUDA backend's planner (engine/cuda/cuda_memory_plan.h).
//   CUDA, ring      the CUDA planner's figure for the shard with cuDNN's backward workspace
//                   (the CUDA ring kernels cut their local calls to the same workspace limit;
//                   their local backward calls run on our Hopper kernels with far less, and the
//                   larger cuDNN figure stands in for the tiles and fp32 accumulators of the
//                   shared segments' packed cuDNN calls, which are not modeled): to be checked
//                   against measured peaks.
//
// All functions are pure and thread-safe.
#ifndef DATTN_ENGINE_RANK_MEMORY_PLAN_H_
#define DATTN_ENGINE_RANK_MEMORY_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/attention_spec.h"
#include "engine/memory_plan.h"
#include "engine/tensor.h"

namespace dattn {

// The whole job, as every rank sees it.
struct RankProblem {
  AttentionSpec spec;  // Must have passed ValidateSpec.
  int64_t batch = 0;
  int64_t seq_len = 0;  // N of the whole sequence.
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int ranks = 1;  // P; must divide seq_len.
  DType dtype = DType::kFloat32;
  bool backward = false;
};

struct RankMemoryPlan {
  int rank = 0;
  MemoryPlan shard;        // The shard's tensors and the engine's workspace.
  int64_t ring_bytes = 0;  // Exchange buffers of the largest call and the agreement buffer.
  int64_t total_bytes() const { return shard.total_bytes() + ring_bytes; }
  // "inputs 1.50 MiB + outputs 512.00 KiB + lse 8.00 KiB + workspace 640.00 KiB + ring buffers
  // 96.00 KiB = 2.73 MiB".
  std::string DebugString() const;
};

// Bytes of tile scratch one thread of the CPU ring kernels allocates for `dtype` and head_dim `d`.
int64_t CpuRingKernelScratchBytes(DType dtype, int64_t head_dim);

// The plan of rank `rank` of `problem` on `backend` with `cpu_threads` engine threads (CPU only;
// <= 0 means hardware concurrency). INVALID_ARGUMENT for a rank outside [0, P), a P that does not
// divide N, a shape or spec the ring geometry rejects, a dtype the backend's planner does not run,
// or byte counts that overflow int64.
absl::StatusOr<RankMemoryPlan> PlanRankMemory(const RankProblem& problem, int rank,
                                              BackendKind backend, int cpu_threads);

// The plan of the rank that needs the most (the lowest such rank on ties); same errors.
absl::StatusOr<RankMemoryPlan> PlanLargestRankMemory(const RankProblem& problem,
                                                     BackendKind backend, int cpu_threads);

}  // namespace dattn

#endif  // DATTN_ENGINE_RANK_MEMORY_PLAN_H_
