// One rank of an attention job, run on a device: the worker's unit of work, free of gRPC.
//
// RunAttentionTask takes a dattn.v1.TaskAssignment whose spec is an AttentionJobSpec and:
//   1. takes the rank's plan from the assignment (AttentionRankPlan: the coordinator analysed the
//      spec once, at submit, and planned the rank; api/attention_job.h), converts the v1 spec to
//      the engine's, and checks that this device runs the problem (dtype, head dimension, ...);
//   2. admits the plan's bytes against the device's free memory and refuses to allocate a plan
//      that does not fit;
//   3. allocates its shard of q, k, v (and dout) and fills it from the job's seed
//      (random_inputs.h), so every rank and every rerun sees its slice of the single-rank inputs
//      (TaskDevice::FillInput: in place on the host, by a kernel on a GPU); or, for a streamed job
//      (AttentionJobSpec.streamed: a JobService.Attend call), with the caller's chunks of its
//      shard as they come (options.read_inputs), copied to the device one chunk at a time; or,
//      when the call's tensors are in a shared-memory region of this host (AttentionJobSpec.
//      shared_memory), read from the region (worker/shared_memory.h) through the device's
//      staging buffers (TaskDevice::FillDevice);
//   4. on a ring (num_ranks P > 1): joins its ring (ring_join.h) and runs the ring driver
//      (engine/ring/ring_attention.h) on the device's ring kernels; otherwise runs the device's
//      single-device backend;
//   5. runs `iterations` steps (forward, or forward then backward), checking for cancellation
//      before every step and reporting progress after every step;
//   6. returns the median step time, the rank's effective TFLOP/s, fp64 checksums of the last
//      step's results of its shard and, when asked, its output shard (the caller uploads it); a
//      streamed job sends out (and dq, dk, dv) through options.upload_output before it returns,
//      read from the device a chunk at a time (or writes them into its shared-memory region).
//
// Rank r of P holds positions [r N/P, (r+1) N/P). Its FLOPs per step are the whole job's nominal
// FLOPs (dilation::NominalForwardFlops, x3.5 with backward) divided by P: the job's rate is then
// the sum of its ranks' rates when they run in step.
//
// Threading: RunAttentionTask blocks its calling thread for the whole task and uses what it gets
// from the device exclusively meanwhile. Callbacks run on the calling thread and must not block
// for long; only on_progress is called between timed steps, outside the timed region.
#ifndef DATTN_WORKER_ATTENTION_TASK_H_
#define DATTN_WORKER_ATTENTION_TASK_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/attend_tensors.h"
#include "api/engine_convert.h"
#include "dattn/v1/worker.pb.h"
#include "engine/attention.h"
#include "engine/attention_spec.h"
#include "engine/comm/communicator.h"
#include "engine/comm/tcp_store.h"
#include "engine/tensor.h"
#include "worker/oom_retry.h"
#include "worker/random_inputs.h"
#include "worker/task_device.h"

namespace dattn {
namespace worker {

// v1 <-> engine conversions (api/engine_convert.h), shared with the coordinator.
using api::ToApiDType;
using api::ToEngineDType;
using api::ToEngineSpec;

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
  bool return_output = false;  // The job asked for its output: this rank returns its shard.
  bool streamed = false;       // Inputs from the caller's stream, outputs back to it.
  // A streamed job whose tensors are in the caller's shared-memory region (AttentionJobSpec.
  // shared_memory): the rank reads its inputs from it and writes its outputs into it.
  std::optional<api::SharedMemoryLayout> shared_memory;
  // Device bytes of this rank (its tensors, the engine's workspace, ring buffers), as the
  // coordinator planned and reserved them, and their breakdown for messages.
  int64_t memory_bytes = 0;
  std::string memory_plan;
  int64_t tensor_bytes = 0;   // Bytes of one of this rank's (B, N/P, H, D) tensors.
  int64_t lse_bytes = 0;      // Bytes of its (B, H, N/P) log-sum-exp.
  double flops_per_step = 0;  // Nominal FLOPs of one step of this rank (the job's / P).
};

// The plan of `task` from its assignment, checked against the job and against `caps`. Errors:
// INVALID_ARGUMENT for a task without attention work or without its attention_plan (a coordinator
// older than this worker), a plan that does not match the job (iterations outside
// [1, api::kMaxIterations], positions that are not rank r's N/P, a non-positive memory figure), a
// ring that does not match the plan (ring.size != num_ranks, ring.rank != rank), or anything the
// engine's validation rejects for this device (its message, unchanged).
absl::StatusOr<AttentionTaskPlan> PlanAttentionTask(const v1::TaskAssignment& task,
                                                    const BackendCaps& caps);

struct AttentionTaskOptions {
  // Engine threads (CPU backend or ring kernels) and threads that generate inputs.
  int num_threads = 1;
  // Device bytes the task may use; negative means what the device reports free now (or what
  // reserve_memory answers, when set).
  int64_t available_memory_bytes = -1;
  // With available_memory_bytes negative: called once, after planning and before anything is
  // allocated, with the plan's total bytes; returns the bytes this task may use, and the task fails
  // with RESOURCE_EXHAUSTED when its plan exceeds them. A caller running several tasks on one
  // device answers the device's free bytes less what its other tasks have planned but not yet
  // allocated, and records this plan as reserved in the same step when it fits (worker.h), so that
  // two tasks never both count the same free bytes. Errors end the task unchanged. Absent: the
  // device's FreeMemoryBytes().
  std::function<absl::StatusOr<int64_t>(int64_t planned_bytes)> reserve_memory;
  // Called after each of the task's tensors (inputs, outputs, lse) is allocated, with its planned
  // bytes: from then on the device's free figure shows them in use. Called with minus the bytes
  // allocated so far when they are freed again to retry after running out of memory (oom_retry.h):
  // claimed again, they are to be allocated once more.
  std::function<void(int64_t bytes)> on_allocated;
  // Called once when allocating the tensors ran out of memory and was retried (oom_retry.h), with
  // what happened (recovered or not).
  std::function<void(const OomRetry&)> on_out_of_memory_retry;
  // Stored in the ring's store when this rank arrives (who it is, for diagnostics).
  std::string member_name;
  // Longest wait for a ring peer when the assignment's RingInfo leaves it 0.
  absl::Duration default_comm_timeout = absl::Seconds(120);
  // TLS to the ring's rendezvous store (ring_join.h); empty: plaintext.
  comm::StoreTls store_tls;
  // Called as the rank moves through its phases (PREPARING, FORMING_RING, RUNNING).
  std::function<void(v1::RankPhase)> on_phase;
  // Ring tasks: called with the formed communicator and the seconds its formation took, and with
  // (nullptr, the same seconds) before it is destroyed. The caller may Abort() it from another
  // thread in between (that is how a cancel interrupts a step).
  std::function<void(comm::Communicator*, double)> on_communicator;
  // Called once, after inputs exist (and the ring is formed) and just before the first step.
  std::function<void()> on_started;
  // Called after each finished step with (steps_done, steps_total).
  std::function<void(int64_t, int64_t)> on_progress;
  // Polled before each step (and while a ring forms); true stops the task with CANCELLED. A step
  // that fails while it is true (its communicator aborted) also ends CANCELLED.
  std::function<bool()> is_cancelled;

  // Streamed jobs (AttentionJobSpec.streamed) without shared memory need both; a streamed task
  // without them fails with FAILED_PRECONDITION. `read_inputs` calls `write` with each chunk of the
  // rank's inputs, in order, as they come (WorkerRegistry.ReadInput: q, k, v, then dout, offsets
  // within the rank's (B, N/P, H, D) shard) and returns how the stream ended (OK after the last
  // chunk; a `write` error ends it with that error). `upload_output` sends output `tensor` (out,
  // then dq, dk, dv) whose shard `header` describes, reading its bytes with `read(offset, length,
  // host_dst)`.
  using ChunkWriter = std::function<absl::Status(const v1::AttendChunk&)>;
  std::function<absl::Status(const ChunkWriter& write)> read_inputs;
  using ShardReader = std::function<absl::Status(int64_t offset, int64_t length, char* dst)>;
  std::function<absl::Status(v1::AttendTensor tensor, const v1::TensorHeader& header,
                             const ShardReader& read)>
      upload_output;
};

struct AttentionTaskResult {
  // rank, seconds_total (wall time of all steps), seconds_per_step (median), tflops,
  // ring_formation_seconds, checksums and peak_memory_bytes (outputs + lse + workspace + ring
  // buffers: what the task and the engine allocate beyond the inputs). worker_id is left for the
  // caller. Checksums are of the last step's results of this rank's shard: out_sum /
  // out_sum_squares over every element of out; grad_sum / grad_sum_squares over every element of
  // dq, dk and dv together (zero for forward-only tasks); all accumulated in fp64 on the device
  // (TaskDevice::SumElements: row-major on the host, a fixed blocked order on a GPU).
  v1::RankResult rank_result;
  bool has_output = false;
  // With has_output: dtype = the job's, shape = (B, N/P, H, D), data = row-major little-endian.
  v1::Tensor output;
  int64_t steps_done = 0;
  double flops_per_step = 0;
  double ring_formation_seconds = 0;  // 0 for single-rank tasks.
  // Where the task's wall time went, for the worker's log: "inputs 0.91 s, engine 0.02 s, ...".
  std::string timeline;
};

// Runs `task` on `device` (not owned; must outlive the call).
// Errors: those of PlanAttentionTask; RESOURCE_EXHAUSTED when the memory plan exceeds the available
// bytes (the message carries the plan's DebugString and the free bytes) or an allocation fails;
// those of options.reserve_memory;
// those of JoinRing (ring_join.h); CANCELLED (saying after how many steps) when cancelled; any
// engine or communicator error, ring ones prefixed with the ring, rank and step.
absl::StatusOr<AttentionTaskResult> RunAttentionTask(const v1::TaskAssignment& task,
                                                     TaskDevice* device,
                                                     const AttentionTaskOptions& options);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_ATTENTION_TASK_H_
