#include "scheduler/test_util.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace scheduler {
namespace testing {

WorkerInfo Gpu(const std::string& id, int64_t total_bytes, int64_t free_bytes) {
  WorkerInfo w;
  w.id = id;
  w.total_memory_bytes = total_bytes;
  w.free_memory_bytes = free_bytes < 0 ? total_bytes : free_bytes;
  w.is_gpu = true;
  w.device_name = "test GPU";
  w.dtypes = {"fp32", "bf16"};
  w.max_ranks = 1;
  return w;
}

WorkerInfo Cpu(const std::string& id, int slots, int64_t total_bytes, int64_t free_bytes) {
  WorkerInfo w;
  w.id = id;
  w.total_memory_bytes = total_bytes;
  w.free_memory_bytes = free_bytes < 0 ? total_bytes : free_bytes;
  w.is_gpu = false;
  w.device_name = "cpu";
  w.dtypes = {"fp32"};
  w.max_ranks = slots;
  return w;
}

JobRequest Job(const std::string& id, int num_ranks, int64_t memory_per_rank_bytes,
               int64_t submit_seq) {
  JobRequest j;
  j.job_id = id;
  j.tenant = "t";
  j.submit_seq = submit_seq;
  j.num_ranks = num_ranks;
  j.memory_per_rank_bytes = memory_per_rank_bytes;
  j.dtype = "fp32";
  j.needs_gpu = true;
  return j;
}

int64_t RanksThatFitNow(const JobRequest& job, const std::vector<WorkerInfo>& workers) {
  int64_t total = 0;
  for (const WorkerInfo& w : workers) {
    bool dtype = false;
    for (const std::string& d : w.dtypes) dtype |= d == job.dtype;
    if (w.state != WorkerState::kReady || w.is_gpu != job.needs_gpu || !dtype) continue;
    for (int64_t k = 1; k <= w.max_ranks - w.running_ranks && k <= job.num_ranks; ++k) {
      if (k * job.memory_per_rank_bytes > w.free_memory_bytes) break;
      ++total;
    }
  }
  return total;
}

std::string CheckPlacements(const std::vector<WorkerInfo>& workers,
                            const std::vector<JobRequest>& jobs,
                            const std::vector<Placement>& placements) {
  std::map<std::string, const WorkerInfo*> by_id;
  for (const WorkerInfo& w : workers) by_id[w.id] = &w;
  std::map<std::string, const JobRequest*> job_by_id;
  for (const JobRequest& j : jobs) job_by_id[j.job_id] = &j;

  std::string errors;
  std::map<std::string, int64_t> ranks_used;
  std::map<std::string, int64_t> memory_used;
  std::set<std::string> placed;
  for (const Placement& p : placements) {
    if (!placed.insert(p.job_id).second) absl::StrAppend(&errors, p.job_id, " placed twice\n");
    auto job_it = job_by_id.find(p.job_id);
    if (job_it == job_by_id.end()) {
      absl::StrAppend(&errors, "unknown job ", p.job_id, "\n");
      continue;
    }
    const JobRequest& job = *job_it->second;
    if (static_cast<int>(p.worker_ids.size()) != job.num_ranks) {
      absl::StrAppend(&errors, job.job_id, ": ", p.worker_ids.size(), " ranks placed, wants ",
                      job.num_ranks, "\n");
    }
    for (const std::string& id : p.worker_ids) {
      auto w_it = by_id.find(id);
      if (w_it == by_id.end()) {
        absl::StrAppend(&errors, job.job_id, ": unknown worker ", id, "\n");
        continue;
      }
      const WorkerInfo& w = *w_it->second;
      if (w.state != WorkerState::kReady)
        absl::StrAppend(&errors, job.job_id, " on unready ", id, "\n");
      if (w.is_gpu != job.needs_gpu)
        absl::StrAppend(&errors, job.job_id, " on wrong kind ", id, "\n");
      bool dtype_ok = false;
      for (const std::string& d : w.dtypes) dtype_ok |= d == job.dtype;
      if (!dtype_ok) absl::StrAppend(&errors, job.job_id, " on ", id, " without ", job.dtype, "\n");
      ranks_used[id] += 1;
      memory_used[id] += job.memory_per_rank_bytes;
    }
  }
  for (const auto& [id, ranks] : ranks_used) {
    const WorkerInfo* w = by_id.count(id) ? by_id[id] : nullptr;
    if (w == nullptr) continue;
    if (ranks > w->max_ranks - w->running_ranks) {
      absl::StrAppend(&errors, id, ": ", ranks, " ranks placed, ", w->max_ranks - w->running_ranks,
                      " slots free\n");
    }
    if (memory_used[id] > w->free_memory_bytes) {
      absl::StrAppend(&errors, id, ": ", memory_used[id], " bytes placed, ", w->free_memory_bytes,
                      " free\n");
    }
  }
  return errors;
}

}  // namespace testing
}  // namespace scheduler
}  // namespace dattn
