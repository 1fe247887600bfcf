// The analysis of an attention job's spec, done once by the coordinator when the job is submitted,
// and the per-rank plan derived from it that travels in each rank's assignment (so that no worker
// analyses the spec again).
//
// AnalyzeAttentionJob checks every field of a dattn.v1 AttentionJobSpec and derives the engine's
// view of the problem: its AttentionSpec, dtype and shape, the resolved iterations and pass, the
// output size, nominal FLOPs, and the device kinds it may run on with the memory one rank needs on
// each (engine/rank_memory_plan.h: the largest rank of the ring; on the CPU planned for
// kCpuPlanThreads threads, on a GPU by the CUDA backend's planner).
//
// Every error names the field path (prefixed by the caller's `path`) and the offending value, so
// that it can be shown to a user unchanged: "spec.attention.shape.head_dim: must be >= 1, got 0".
// Codes: INVALID_ARGUMENT for a bad value; UNIMPLEMENTED for a valid job the system cannot plan.
// All functions are pure and thread-safe.
#ifndef DATTN_API_ATTENTION_JOB_H_
#define DATTN_API_ATTENTION_JOB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/worker.pb.h"
#include "engine/attention_spec.h"
#include "engine/tensor.h"

namespace dattn {
namespace api {

// Threads the memory plan of a CPU rank assumes: the CPU backend's scratch grows with its thread
// count and workers differ, so the plan takes a bound above any CPU worker's thread count. The
// per-thread scratch is small (tiles), so the bound costs little memory in the fit.
inline constexpr int kCpuPlanThreads = 64;

// One device kind a job may run on, with the planner's numbers for one rank there.
struct DeviceVariant {
  bool gpu = false;
  int64_t memory_per_rank_bytes = 0;  // The largest rank's plan; reserved on every rank's worker.
  std::string memory_plan;            // RankMemoryPlan::DebugString() (and which rank).
  // The communicator a ring of this kind forms: "gloo" (CPU) or "nccl" (GPU).
  std::string ring_backend;
};

// The engine's view of a valid attention job.
struct AttentionJobInfo {
  AttentionSpec spec;
  DType dtype = DType::kFloat32;
  int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
  int num_ranks = 1;
  int64_t iterations = 1;  // Resolved: an unset (0) iterations is 1.
  bool backward = false;
  bool return_output = false;
  // AttentionJobSpec.streamed: the inputs come from a JobService.Attend call and every output goes
  // back on it (nothing is stored); one step.
  bool streamed = false;
  // AttentionJobSpec.shared_memory (checked, api/attend_tensors.h): the streamed call's tensors are
  // in a shared-memory region of the caller's host instead of on its stream.
  bool shared_memory = false;
  int64_t output_bytes = 0;   // B*N*H*D*sizeof(dtype): the returned output's size.
  double flops_per_step = 0;  // Nominal FLOPs of one step (x3.5 with backward).
  double tokens = 0;          // B*N*iterations.
  // Device kinds it may run on, in preference order (GPU before CPU for DEVICE_PREFERENCE_ANY);
  // never empty.
  std::vector<DeviceVariant> variants;
};

// Checks `job` (the message at `path`, e.g. "spec.attention") and derives its info.
absl::StatusOr<AttentionJobInfo> AnalyzeAttentionJob(const v1::AttentionJobSpec& job,
                                                     const std::string& path);

// The plan of rank `rank` (0 <= rank < info.num_ranks) of the job on `variant` (one of
// info.variants): its positions, resolved steps and pass, the memory reserved for it and its
// share of the FLOPs.
v1::AttentionRankPlan PlanAttentionRank(const AttentionJobInfo& info, const DeviceVariant& variant,
                                        int rank);

}  // namespace api
}  // namespace dattn

#endif  // DATTN_API_ATTENTION_JOB_H_
