#include "scheduler/types.h"

#include <algorithm>
#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dattn {
namespace scheduler {

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kReady:
      return "ready";
    case WorkerState::kDraining:
      return "draining";
    case WorkerState::kDead:
      return "dead";
  }
  return "unknown";
}

absl::StatusOr<WorkerState> ParseWorkerState(const std::string& name) {
  for (WorkerState s : {WorkerState::kReady, WorkerState::kDraining, WorkerState::kDead}) {
    if (name == WorkerStateName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown worker state '", name, "'; expected ready, draining or dead"));
}

bool WorkerInfo::SupportsDType(const std::string& dtype) const {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

std::string WorkerInfo::DebugString() const {
  return absl::StrCat(
      id, " (", is_gpu ? "GPU" : "CPU", device_name.empty() ? "" : absl::StrCat(" ", device_name),
      ", ", WorkerStateName(state), ", ", running_ranks, "/", max_ranks, " ranks, ",
      FormatBytes(free_memory_bytes), " of ", FormatBytes(total_memory_bytes), " free)");
}

std::string JobRequest::DebugString() const {
  return absl::StrCat(job_id, " (tenant=", tenant, " prio=", priority, " seq=", submit_seq, ", ",
                      num_ranks, num_ranks == 1 ? " rank x " : " ranks x ",
                      FormatBytes(memory_per_rank_bytes), ", ", needs_gpu ? "GPU" : "CPU", ", ",
                      dtype, ")");
}

absl::Status ValidateWorker(const WorkerInfo& w) {
  if (w.id.empty()) return absl::InvalidArgumentError("worker id is empty");
  if (w.total_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", w.id, ": total_memory_bytes ",
                                                   w.total_memory_bytes, " is negative"));
  }
  if (w.free_memory_bytes < 0 || w.free_memory_bytes > w.total_memory_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", w.id, ": free_memory_bytes ", w.free_memory_bytes,
                     " is outside [0, total_memory_bytes=", w.total_memory_bytes, "]"));
  }
  if (w.max_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", w.id, ": max_ranks ", w.max_ranks, " is below 1"));
  }
  if (w.running_ranks < 0 || w.running_ranks > w.max_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", w.id, ": running_ranks ",
                                                   w.running_ranks,
                                                   " is outside [0, max_ranks=", w.max_ranks, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkers(const std::vector<WorkerInfo>& workers) {
  absl::flat_hash_set<std::string> seen;
  for (const WorkerInfo& w : workers) {
    if (absl::Status s = ValidateWorker(w); !s.ok()) return s;
    if (!seen.insert(w.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("worker id '", w.id, "' appears twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateJob(const JobRequest& job) {
  if (job.job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (job.num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job.job_id, ": num_ranks ", job.num_ranks, " is below 1"));
  }
  if (job.memory_per_rank_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.job_id, ": memory_per_rank_bytes ",
                                                   job.memory_per_rank_bytes, " is negative"));
  }
  if (job.dtype.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.job_id, ": dtype is empty"));
  }
  return absl::OkStatus();
}

bool IsEligible(const WorkerInfo& worker, const JobRequest& job) {
  return worker.state == WorkerState::kReady && worker.is_gpu == job.needs_gpu &&
         worker.SupportsDType(job.dtype) && worker.SupportsHeadDim(job.head_dim) &&
         (job.num_ranks == 1 || worker.joins_rings);
}

bool WorkerInfo::SupportsHeadDim(int64_t head_dim) const {
  return head_dim == 0 || head_dims.empty() ||
         std::find(head_dims.begin(), head_dims.end(), head_dim) != head_dims.end();
}

std::string FormatBytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 0) return absl::StrCat("-", FormatBytes(bytes == INT64_MIN ? INT64_MAX : -bytes));
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  // Two decimals with trailing zeros dropped: "3.2 GiB", "3.25 GiB", "4 GiB".
  std::string text = absl::StrFormat("%.2f", value);
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return absl::StrCat(text, " ", kUnits[unit]);
}

}  // namespace scheduler
}  // namespace dattn
