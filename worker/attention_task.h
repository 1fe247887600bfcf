// One rank of an attention job, run on an engine backend: the worker's unit of work, free of gRPC.
//
// RunAttentionTask takes a dattn.v1.TaskAssignment whose spec is an AttentionJobSpec and:
//   1. converts the v1 spec to the engine's (UNSPECIFIED mode = grouped, UNSPECIFIED head offsets =
//      modulo, UNSPECIFIED pass = forward, iterations 0 = 1) and validates it against the backend;
//   2. plans its host memory with PlanAttentionMemory and refuses to allocate a plan that does not
//   fit;
//   3. allocates q, k, v (and dout) and fills them from the job's seed (random_inputs.h), so every
//   rank
//      and every rerun sees the single-rank inputs;
//   4. runs `iterations` steps (forward, or forward then backward), checking for cancellation
//   before
//      every step and reporting progress after every step;
//   5. returns the median step time, the effective TFLOP/s (dilation::NominalForwardFlops, x3.5
//   with
//      backward), fp64 checksums of the last step's results and, when asked, the output tensor.
//
// Threading: RunAttentionTask blocks its calling thread for the whole task and uses the backend
// exclusively meanwhile (one task per backend instance). Callbacks run on the calling thread and
// must not block for long: their time counts in the step timings only for on_progress (called
// between steps, outside the timed region).
#ifndef DATTN_WORKER_ATTENTION_TASK_H_
#define DATTN_WORKER_ATTENTION_TASK_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "dattn/v1/worker.pb.h"
#include "engine/attention.h"
#include "engine/attention_spec.h"
#include "engine/memory_plan.h"
#include "engine/tensor.h"
#include "worker/random_inputs.h"

namespace dattn {
namespace worker {

// Largest output a job may ask for (AttentionJobSpec.return_output's documented limit).
constexpr int64_t kMaxReturnedOutputBytes = int64_t{64} << 20;

// Largest `iterations` a job may ask for.
constexpr int64_t kMaxIterations = 1000000;

// v1 -> engine conversions. INVALID_ARGUMENT naming the value for an enum value outside the v1 API
// (and for DTYPE_UNSPECIFIED, which the API rejects). The spec is converted, not validated.
absl::StatusOr<AttentionSpec> ToEngineSpec(const v1::AttentionSpec& spec);
absl::StatusOr<DType> ToEngineDType(v1::DType dtype);
v1::DType ToApiDType(DType dtype);

// Everything RunAttentionTask decides before it allocates: the worker uses it to account memory.
struct AttentionTaskPlan {
  AttentionSpec spec;
  FullShape full;           // The job's whole (B, N, H, D).
  PositionRange positions;  // This rank's positions of N.
  int rank = 0;
  int num_ranks = 1;
  DType dtype = DType::kFloat32;
  bool backward = false;
  int64_t iterations = 1;
  uint64_t seed = 0;
  bool return_output = false;  // Asked for, and this rank returns it (rank 0).
  MemoryPlan memory;           // Host bytes of this rank's tensors and the backend's workspace.
  int64_t tensor_bytes = 0;    // Bytes of one of this rank's (B, N_rank, H, D) tensors.
  double flops_per_step = 0;   // Nominal FLOPs of one step of this rank.
};

// Validates `task` against `caps` and plans it for a backend using `num_threads` threads.
// Errors: INVALID_ARGUMENT for a task without attention work, a bad enum, iterations outside
// [0, kMaxIterations], an output over kMaxReturnedOutputBytes, or anything the engine's validation
// rejects (its message, unchanged); UNIMPLEMENTED "multi-rank tasks need the ring engine" when the
// ring or the job has more than one rank; FAILED_PRECONDITION for a backend that is not on the host
// (this runner allocates host memory only).
absl::StatusOr<AttentionTaskPlan> PlanAttentionTask(const v1::TaskAssignment& task,
                                                    const BackendCaps& caps, int num_threads);

struct AttentionTaskOptions {
  // Threads for input generation and the memory plan's workspace; should match the backend's.
  int num_threads = 1;
  // Host bytes the task may use; negative means the live MemAvailable of /proc/meminfo.
  int64_t available_memory_bytes = -1;
  // Called once, after inputs exist and just before the first step.
  std::function<void()> on_started;
  // Called after each finished step with (steps_done, steps_total).
  std::function<void(int64_t, int64_t)> on_progress;
  // Polled before each step; true stops the task with CANCELLED.
  std::function<bool()> is_cancelled;
};

struct AttentionTaskResult {
  // rank, seconds_total (wall time of all steps), seconds_per_step (median), tflops, checksums and
  // peak_memory_bytes (outputs + lse + the planner's workspace: what the task and the backend
  // allocate beyond the inputs). worker_id is left for the caller. Checksums are of the last step:
  // out_sum / out_sum_squares over every element of out; grad_sum / grad_sum_squares over every
  // element of dq, dk and dv together (zero for forward-only tasks); all accumulated in fp64 in
  // row-major order.
  v1::RankResult rank_result;
  bool has_output = false;
  // With has_output: dtype = the job's, shape = (B, N_rank, H, D), data = row-major little-endian.
  v1::Tensor output;
  int64_t steps_done = 0;
  double flops_per_step = 0;
};

// Runs `task` on `backend` (not owned; used exclusively until return).
// Errors: those of PlanAttentionTask; RESOURCE_EXHAUSTED when the memory plan exceeds the available
// bytes (the message carries the plan's DebugString and the free bytes) or an allocation fails;
// CANCELLED (saying after how many steps) when is_cancelled returned true; any engine error,
// unchanged.
absl::StatusOr<AttentionTaskResult> RunAttentionTask(const v1::TaskAssignment& task,
                                                     AttentionBackend* backend,
                                                     const AttentionTaskOptions& options);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_ATTENTION_TASK_H_
