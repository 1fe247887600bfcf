#include "scheduler/job_queue.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace scheduler {

absl::Status JobQueue::Enqueue(JobRequest job) {
  if (absl::Status s = ValidateJob(job); !s.ok()) return s;
  if (jobs_.contains(job.job_id)) {
    return absl::AlreadyExistsError(absl::StrCat("job '", job.job_id, "' is already queued"));
  }
  by_priority_[job.priority][job.tenant].emplace(job.submit_seq, job.job_id);
  std::string id = job.job_id;
  jobs_.emplace(std::move(id), std::move(job));
  return absl::OkStatus();
}

void JobQueue::Erase(const JobRequest& job) {
  auto prio_it = by_priority_.find(job.priority);
  auto tenant_it = prio_it->second.find(job.tenant);
  tenant_it->second.erase(FifoKey(job.submit_seq, job.job_id));
  if (tenant_it->second.empty()) prio_it->second.erase(tenant_it);
  if (prio_it->second.empty()) by_priority_.erase(prio_it);
  jobs_.erase(job.job_id);
}

absl::Status JobQueue::Remove(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' is not queued"));
  }
  Erase(it->second);
  return absl::OkStatus();
}

absl::StatusOr<JobRequest> JobQueue::Dispatch(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' is not queued"));
  }
  JobRequest job = it->second;
  Erase(job);
  last_served_[job.tenant] = ++serve_clock_;
  PruneLastServed();
  return job;
}

void JobQueue::PruneLastServed() {
  // Tenant names come from clients, so the record must not grow with every name ever served. When
  // it holds more than twice the tenants with queued jobs (plus slack), the longest-idle tenants
  // with nothing queued are forgotten, down to half that; a forgotten tenant that returns counts as
  // never served (it may go before tenants waiting then: the price of a bounded record).
  absl::flat_hash_map<std::string, bool> queued;
  for (const auto& [priority, tenants] : by_priority_) {
    (void)priority;
    for (const auto& [tenant, fifo] : tenants) {
      if (!fifo.empty()) queued[tenant] = true;
    }
  }
  const size_t cap = 2 * queued.size() + 64;
  if (last_served_.size() <= cap) return;
  std::vector<std::pair<uint64_t, std::string>> idle;
  for (const auto& [tenant, served] : last_served_) {
    if (!queued.contains(tenant)) idle.emplace_back(served, tenant);
  }
  std::sort(idle.begin(), idle.end());
  const size_t keep = queued.size() + 32;
  for (size_t k = 0; k < idle.size() && last_served_.size() > keep; ++k) {
    last_served_.erase(idle[k].second);
  }
}

const JobRequest* JobQueue::Find(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<JobRequest> JobQueue::Ordered() const {
  std::vector<JobRequest> out;
  out.reserve(jobs_.size());
  for (const auto& [priority, tenants] : by_priority_) {
    (void)priority;
    // Turn order: never served first (0 sorts first because the clock starts at 1), then oldest
    // service, then earliest waiting job, then name.
    struct Turn {
      uint64_t last_served;
      int64_t head_seq;
      const std::string* tenant;
      std::set<FifoKey>::const_iterator next;
      std::set<FifoKey>::const_iterator end;
    };
    std::vector<Turn> turns;
    turns.reserve(tenants.size());
    for (const auto& [tenant, fifo] : tenants) {
      auto served = last_served_.find(tenant);
      turns.push_back({served == last_served_.end() ? 0 : served->second, fifo.begin()->first,
                       &tenant, fifo.begin(), fifo.end()});
    }
    std::sort(turns.begin(), turns.end(), [](const Turn& a, const Turn& b) {
      return std::tie(a.last_served, a.head_seq, *a.tenant) <
             std::tie(b.last_served, b.head_seq, *b.tenant);
    });
    // Serving a tenant moves it behind every other, so the turn order repeats as a cycle; tenants
    // drop out of it as their jobs run out.
    while (!turns.empty()) {
      std::vector<Turn> remaining;
      remaining.reserve(turns.size());
      for (Turn& turn : turns) {
        out.push_back(jobs_.at(turn.next->second));
        if (++turn.next != turn.end) remaining.push_back(turn);
      }
      turns.swap(remaining);
    }
  }
  return out;
}

std::optional<size_t> JobQueue::Position(const std::string& job_id) const {
  // The same order as Ordered(), counted instead of built: Ordered() copies every queued request,
  // and the coordinator asks for one position per submit and per GetJob.
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return std::nullopt;
  const JobRequest& job = found->second;
  size_t position = 0;
  for (const auto& [priority, tenants] : by_priority_) {
    if (priority > job.priority) {
      for (const auto& [tenant, fifo] : tenants) {
        (void)tenant;
        position += fifo.size();
      }
      continue;
    }
    if (priority < job.priority) break;
    const auto own = tenants.find(job.tenant);
    if (own == tenants.end()) return std::nullopt;
    const std::set<FifoKey>& own_fifo = own->second;
    const auto self = own_fifo.find(FifoKey{job.submit_seq, job.job_id});
    if (self == own_fifo.end()) return std::nullopt;
    // Round i of the cycle serves the i-th job of every tenant that still has one, tenants in turn
    // order: the job (index i in its tenant) follows min(len, i) jobs of every tenant, plus the
    // i-th job of each tenant whose turn comes before its own.
    const size_t index = static_cast<size_t>(std::distance(own_fifo.begin(), self));
    // Turn order, as in Ordered(): (last served, earliest waiting job, tenant name).
    auto turn_key = [this](const std::string& tenant, const std::set<FifoKey>& fifo) {
      auto served = last_served_.find(tenant);
      return std::make_tuple(served == last_served_.end() ? uint64_t{0} : served->second,
                             fifo.begin()->first, tenant);
    };
    const auto own_turn = turn_key(own->first, own_fifo);
    for (const auto& [tenant, fifo] : tenants) {
      if (&fifo == &own_fifo) {
        position += index;
        continue;
      }
      position += std::min(fifo.size(), index);
      if (fifo.size() > index && turn_key(tenant, fifo) < own_turn) ++position;
    }
    return position;
  }
  return std::nullopt;
}

}  // namespace scheduler
}  // namespace dattn
