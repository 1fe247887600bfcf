// Validation of submitted jobs and what the coordinator derives from a valid spec: the engine's
// view of the attention problem, the device kinds it may run on and the memory one rank needs on
// each.
//
// Every error names the request's field path and the offending value, so that it can be shown to a
// user unchanged: "spec.attention.shape.head_dim: must be >= 1, got 0". Codes: INVALID_ARGUMENT for
// a bad value; UNIMPLEMENTED for a valid request the system cannot run yet.
//
// Memory per rank: worker/rank_memory_plan.h's figure for the rank of the ring that needs the most
// (shard tensors, engine workspace, ring buffers), on the CPU planned for kCpuPlanThreads threads,
// on a GPU by the CUDA backend's planner. The coordinator reserves that much on every rank's
// worker.
//
// All functions are pure and may be called from any thread.
#ifndef DATTN_SERVER_JOB_SPEC_H_
#define DATTN_SERVER_JOB_SPEC_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/engine_convert.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"
#include "engine/attention_spec.h"
#include "engine/tensor.h"

namespace dattn {
namespace server {

// API limits (job.proto, job_service.proto).
inline constexpr size_t kMaxIdempotencyKeyLength = 128;
inline constexpr size_t kMaxJobNameLength = 128;
inline constexpr size_t kMaxTenantLength = 64;
inline constexpr int kMinPriority = -100;
inline constexpr int kMaxPriority = 100;
inline constexpr int64_t kMaxIterations = 1000000;
inline constexpr int64_t kMaxReturnedOutputBytes = int64_t{64} << 20;
inline constexpr size_t kMaxCancelReasonLength = 256;
inline constexpr int kMaxPageSize = 1000;
inline constexpr int kDefaultPageSize = 50;
// A submitted JobSpec's serialized size, unknown fields included. Every known field is bounded on
// its own (name 128, tenant 64, patterns api::kMaxPatterns, the rest scalars: under 2 KiB in all);
// this bounds what a client can make the coordinator store in fields it does not know.
inline constexpr size_t kMaxSpecBytes = 64 << 10;

// Threads the memory plan of a CPU rank assumes: the CPU backend's scratch grows with its thread
// count and workers differ, so the plan takes a bound above any CPU worker's thread count. The
// per-thread scratch is small (tiles), so the bound costs little memory in the fit.
inline constexpr int kCpuPlanThreads = 64;

// One device kind a job may run on, with the planner's numbers for one rank there.
struct DeviceVariant {
  bool gpu = false;
  int64_t memory_per_rank_bytes = 0;
  std::string memory_plan;  // RankMemoryPlan::DebugString() (and which rank), for messages.
  // The communicator a ring of this kind forms: "gloo" (CPU) or "nccl" (GPU).
  std::string ring_backend;
};

// What the coordinator needs to know about a valid attention job.
struct AttentionJobInfo {
  AttentionSpec spec;  // The engine's spec.
  DType dtype = DType::kFloat32;
  int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
  int num_ranks = 1;
  int64_t iterations = 1;  // Resolved: an unset (0) iterations is 1.
  bool backward = false;
  int64_t output_bytes = 0;   // B*N*H*D*sizeof(dtype): the returned output's size.
  double flops_per_step = 0;  // Nominal FLOPs of one step (x3.5 with backward).
  double tokens = 0;          // B*N*iterations: what dattn_attention_tokens_total counts.
  // Device kinds it may run on, in preference order (GPU before CPU for DEVICE_PREFERENCE_ANY);
  // never empty.
  std::vector<DeviceVariant> variants;
};

// v1 <-> engine conversions (api/engine_convert.h), shared with the workers.
using api::ToEngineDType;
using api::ToEngineSpec;

// Checks every field of a submit request (key, name, tenant, priority, the attention work) and
// derives the job's info. See the top of this file for the errors.
absl::StatusOr<AttentionJobInfo> ValidateSubmitJobRequest(const v1::SubmitJobRequest& request);

// The same checks on a spec alone (fields named from "spec."); used for stored jobs at restart.
absl::StatusOr<AttentionJobInfo> AnalyzeJobSpec(const v1::JobSpec& spec);

// The job's result from its ranks' results (any order; one per rank) and its assembled output
// tensor (set only when the job asked for it): per-rank results in rank order, the slowest rank's
// step time, sums of the checksums, the nominal FLOPs of one step and the whole job's effective
// TFLOP/s (the whole problem's FLOPs over the slowest rank's step: ranks run in parallel).
v1::AttentionJobResult CombineRankResults(const AttentionJobInfo& info,
                                          std::vector<v1::RankResult> ranks, v1::Tensor output,
                                          bool return_output);

// The job's (B, N, H, D) output from its ranks' (B, N/P, H, D) shards, keyed by rank: rank r's rows
// go to positions [r N/P, (r+1) N/P) of every batch item. INVALID_ARGUMENT naming the rank for a
// missing shard or one whose dtype, shape or size is not the job's.
absl::StatusOr<v1::Tensor> AssembleOutput(const AttentionJobInfo& info,
                                          const std::map<int, v1::Tensor>& shards);

// Request checks of the other job RPCs (INVALID_ARGUMENT naming the field and value).
absl::Status ValidateJobId(const std::string& job_id);
absl::Status ValidateListJobsRequest(const v1::ListJobsRequest& request);
absl::Status ValidateCancelJobRequest(const v1::CancelJobRequest& request);

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_JOB_SPEC_H_
