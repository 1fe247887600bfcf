#include "scheduler/placement.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {
namespace scheduler {
namespace {

// Ranks of `mem_per_rank` bytes that `slots` slots and `memory` bytes hold.
int RanksThatFit(int slots, int64_t memory, int64_t mem_per_rank) {
  if (slots <= 0) return 0;
  if (mem_per_rank == 0) return slots;
  int64_t by_memory = memory / mem_per_rank;
  return static_cast<int>(std::min<int64_t>(slots, by_memory));
}

const char* KindName(bool gpu) { return gpu ? "GPU" : "CPU"; }

// "1 rank", "4 ranks".
std::string Ranks(int64_t n) { return absl::StrCat(n, n == 1 ? " rank" : " ranks"); }

}  // namespace

absl::StatusOr<std::optional<Placement>> TryPlace(const JobRequest& job,
                                                  const std::vector<WorkerInfo>& workers) {
  if (absl::Status s = ValidateJob(job); !s.ok()) return s;
  if (absl::Status s = ValidateWorkers(workers); !s.ok()) return s;

  struct Candidate {
    int64_t free_memory;
    const std::string* id;
    int capacity;
  };
  std::vector<Candidate> candidates;
  int64_t total_capacity = 0;
  for (const WorkerInfo& w : workers) {
    if (!IsEligible(w, job)) continue;
    int capacity = RanksThatFit(w.free_ranks(), w.free_memory_bytes, job.memory_per_rank_bytes);
    if (capacity == 0) continue;
    candidates.push_back({w.free_memory_bytes, &w.id, capacity});
    total_capacity += capacity;
  }
  if (total_capacity < job.num_ranks) return std::optional<Placement>();

  // Least free memory first: the leftover after each rank is smallest there, and stays smallest
  // while that worker can take more, so filling workers in this order is best fit rank by rank.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.free_memory, *a.id) < std::tie(b.free_memory, *b.id);
  });
  Placement placement;
  placement.job_id = job.job_id;
  placement.worker_ids.reserve(job.num_ranks);
  for (const Candidate& c : candidates) {
    int take =
        std::min<int>(c.capacity, job.num_ranks - static_cast<int>(placement.worker_ids.size()));
    placement.worker_ids.insert(placement.worker_ids.end(), take, *c.id);
    if (static_cast<int>(placement.worker_ids.size()) == job.num_ranks) break;
  }
  return std::optional<Placement>(std::move(placement));
}

Feasibility CheckFeasible(const JobRequest& job, const std::vector<WorkerInfo>& workers) {
  Feasibility result;
  absl::Status valid = ValidateJob(job);
  if (valid.ok()) valid = ValidateWorkers(workers);
  if (!valid.ok()) {
    result.reason = std::string(valid.message());
    return result;
  }
  const std::string kind = KindName(job.needs_gpu);
  const std::string needs =
      absl::StrCat("needs ", Ranks(job.num_ranks), " x ", FormatBytes(job.memory_per_rank_bytes),
                   " (", kind, ", ", job.dtype, ")");

  int ready = 0, draining = 0, dead = 0, of_kind = 0, with_dtype = 0, with_head_dim = 0,
      eligible = 0, with_memory = 0;
  int64_t largest = 0;
  int64_t capacity = 0;
  std::set<std::string> kind_dtypes;  // What the ready workers of the right kind do support.
  for (const WorkerInfo& w : workers) {
    if (w.state == WorkerState::kDraining) ++draining;
    if (w.state == WorkerState::kDead) ++dead;
    if (w.state != WorkerState::kReady) continue;
    ++ready;
    if (w.is_gpu != job.needs_gpu) continue;
    ++of_kind;
    kind_dtypes.insert(w.dtypes.begin(), w.dtypes.end());
    if (!w.SupportsDType(job.dtype)) continue;
    ++with_dtype;
    if (!w.SupportsHeadDim(job.head_dim)) continue;
    ++with_head_dim;
    if (job.num_ranks > 1 && !w.joins_rings) continue;
    ++eligible;
    largest = std::max(largest, w.total_memory_bytes);
    if (w.total_memory_bytes >= job.memory_per_rank_bytes) ++with_memory;
    capacity += RanksThatFit(w.max_ranks, w.total_memory_bytes, job.memory_per_rank_bytes);
  }
  result.max_ranks = static_cast<int>(std::min<int64_t>(capacity, INT32_MAX));
  const std::string pool =
      absl::StrCat("ready ", kind, " worker", eligible == 1 ? "" : "s", " supporting ", job.dtype,
                   eligible < with_head_dim ? " that join rings" : "");
  if (ready == 0) {
    result.reason =
        absl::StrCat(needs, "; no ready workers (", draining, " draining, ", dead, " dead)");
  } else if (of_kind == 0) {
    result.reason = absl::StrCat(needs, "; none of the ", ready, " ready worker",
                                 ready == 1 ? " is a " : "s is a ", kind, " worker");
  } else if (with_dtype == 0) {
    result.reason = absl::StrCat(needs, "; none of the ", of_kind, " ready ", kind, " worker",
                                 of_kind == 1 ? "" : "s", " supports ", job.dtype,
                                 " (supported: ", absl::StrJoin(kind_dtypes, ", "), ")");
  } else if (with_head_dim == 0) {
    result.reason = absl::StrCat(needs, "; none of the ", with_dtype, " ready ", kind, " worker",
                                 with_dtype == 1 ? "" : "s", " supporting ", job.dtype,
                                 " runs head_dim ", job.head_dim);
  } else if (eligible == 0) {
    result.reason = absl::StrCat(needs, "; none of the ", with_head_dim, " ready ", kind, " worker",
                                 with_head_dim == 1 ? "" : "s", " supporting ", job.dtype,
                                 with_head_dim == 1 ? " joins" : " join",
                                 " sequence-parallel rings (their engine has no ring kernels for "
                                 "this device yet); use num_ranks = 1");
  } else if (capacity < job.num_ranks) {
    result.reason = absl::StrCat(needs, "; at most ", capacity, " rank", capacity == 1 ? "" : "s",
                                 " can ever fit: ", with_memory, " of ", eligible, " ", pool,
                                 eligible == 1 ? " has" : " have",
                                 " >= ", FormatBytes(job.memory_per_rank_bytes),
                                 " total memory (largest ", FormatBytes(largest), "), room for ",
                                 capacity, " rank", capacity == 1 ? "" : "s", " in all");
  } else {
    result.feasible = true;
    result.reason = absl::StrCat("fits: up to ", Ranks(capacity), " on ", eligible, " ", pool);
  }
  return result;
}

}  // namespace scheduler
}  // namespace dattn
