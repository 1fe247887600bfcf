// The values the scheduler exchanges with its caller (the coordinator): what a worker offers, what
// a job asks for, and where a job's ranks go.
//
// All types are plain values with no hidden state; every function here is pure and may be called
// from any thread. Memory is in bytes, counts are ranks. The scheduler never reads a clock: times
// come in through these values and through function arguments.
#ifndef DATTN_SCHEDULER_TYPES_H_
#define DATTN_SCHEDULER_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dattn {
namespace scheduler {

enum class WorkerState {
  kReady,     // Takes new ranks.
  kDraining,  // Finishes what it runs, takes nothing new.
  kDead,      // Stopped heartbeating; holds nothing the scheduler may count on.
};

// "ready" | "draining" | "dead".
const char* WorkerStateName(WorkerState state);
// Inverse of WorkerStateName; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<WorkerState> ParseWorkerState(const std::string& name);

// One worker process as the coordinator last heard of it. A worker offers `max_ranks` rank slots (1
// for a GPU worker, as many as it is configured for on a CPU host) of which `running_ranks` are
// taken.
struct WorkerInfo {
  std::string id;  // Unique among the workers passed in one call.
  int64_t total_memory_bytes = 0;
  int64_t free_memory_bytes = 0;  // What new ranks may use now: 0 <= free <= total.
  bool is_gpu = false;
  std::string device_name;          // "NVIDIA H100 80GB HBM3", "cpu": for messages only.
  std::vector<std::string> dtypes;  // Engine dtype names it runs: "fp32", "bf16", ...
  WorkerState state = WorkerState::kReady;
  int running_ranks = 0;  // 0 <= running_ranks <= max_ranks.
  int max_ranks = 1;      // >= 1.
  // Whether the worker can form a sequence-parallel ring (its engine has ring kernels and a
  // communicator for its device). Ranks of a multi-rank job go only to workers that can.
  bool joins_rings = true;
  // Head dimensions its engine runs; empty means any.
  std::vector<int64_t> head_dims;

  int free_ranks() const { return max_ranks - running_ranks; }
  bool SupportsDType(const std::string& dtype) const;
  // Whether it runs head dimension `head_dim` (0, "no requirement", always).
  bool SupportsHeadDim(int64_t head_dim) const;
  // "gpu-3 (GPU NVIDIA H100, ready, 1/1 ranks, 12 GiB of 80 GiB free)" for logs and errors.
  std::string DebugString() const;
};

// Ranks each tenant's started jobs hold on workers now (tenants absent hold none).
using TenantRanks = absl::flat_hash_map<std::string, int64_t>;

// One job waiting for placement: a gang of `num_ranks` ranks that start together or not at all.
struct JobRequest {
  std::string job_id;  // Non-empty, unique within a queue.
  std::string tenant;  // Fairness is among tenants; "" is a tenant like any other.
  int priority = 0;    // Higher runs first.
  // Monotonic submit order from the caller (the store's sequence): FIFO within a tenant and
  // priority. A job enqueued again after a failed start keeps its place by keeping its submit_seq.
  int64_t submit_seq = 0;
  // When the job was first submitted; compared with the `now` given to Scheduler::Schedule to
  // decide starvation. Keep it across requeues so waiting time accumulates. Unset (InfiniteFuture),
  // the job never counts as starved.
  absl::Time submit_time = absl::InfiniteFuture();
  int num_ranks = 1;                  // >= 1.
  int64_t memory_per_rank_bytes = 0;  // >= 0; the engine's memory planner's estimate for one rank.
  std::string dtype = "fp32";         // Non-empty; must be in a worker's dtypes.
  bool needs_gpu = true;  // GPU jobs go to GPU workers only, CPU jobs to CPU workers only.
  // The head dimension the workers must run (WorkerInfo::head_dims); 0: no requirement.
  int64_t head_dim = 0;

  // "job-7 (tenant=a prio=0 seq=12, 4 ranks x 3.2 GiB, GPU, bf16)".
  std::string DebugString() const;
};

// Where a job's ranks go: worker_ids[r] hosts rank r. A worker appears once per rank it hosts, and
// the ranks one worker hosts are consecutive, so ring neighbours share a host where they can.
struct Placement {
  std::string job_id;
  std::vector<std::string> worker_ids;
};

// OK, or INVALID_ARGUMENT naming the field and its value: empty id, negative memory, free > total,
// max_ranks < 1, running_ranks outside [0, max_ranks].
absl::Status ValidateWorker(const WorkerInfo& worker);
// ValidateWorker for each, plus INVALID_ARGUMENT naming a worker id that appears twice.
absl::Status ValidateWorkers(const std::vector<WorkerInfo>& workers);
// OK, or INVALID_ARGUMENT naming the field and its value: empty job_id or dtype, num_ranks < 1,
// memory_per_rank_bytes < 0.
absl::Status ValidateJob(const JobRequest& job);

// Whether `worker` is of the job's device kind, supports its dtype and head dimension, is ready
// and, for a multi-rank job, joins rings: the workers a job's ranks may ever use, regardless of how
// busy they are now.
bool IsEligible(const WorkerInfo& worker, const JobRequest& job);

// Human-readable bytes with binary units and at most two decimals: "512 B", "3.2 GiB", "1.25 TiB".
std::string FormatBytes(int64_t bytes);

}  // namespace scheduler
}  // namespace dattn

#endif  // DATTN_SCHEDULER_TYPES_H_
