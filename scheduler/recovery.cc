#include "scheduler/recovery.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/placement.h"

namespace dattn {
namespace scheduler {
namespace {

constexpr char kLowerDType[] = "bf16";

// A job of `ranks` ranks shaped like the failed one, for TryPlace.
JobRequest ProbeJob(const RecoveryInput& in, int ranks, int64_t memory_per_rank) {
  JobRequest job;
  job.job_id = "recovery-probe";
  job.num_ranks = ranks;
  job.memory_per_rank_bytes = memory_per_rank;
  job.dtype = in.dtype;
  job.needs_gpu = in.needs_gpu;
  return job;
}

// Free memory of the workers that could take one more rank of the job, largest first, for messages:
// "60 GiB, 10 GiB, 10 GiB, 10 GiB and 2 more".
std::string FreeMemory(const RecoveryInput& in, const std::vector<WorkerInfo>& workers) {
  JobRequest probe = ProbeJob(in, 1, 0);
  std::vector<int64_t> free;
  for (const WorkerInfo& w : workers) {
    if (IsEligible(w, probe) && w.free_ranks() > 0) free.push_back(w.free_memory_bytes);
  }
  if (free.empty()) return "none with a free slot";
  std::sort(free.rbegin(), free.rend());
  constexpr size_t kShown = 4;
  std::vector<std::string> shown;
  for (size_t i = 0; i < free.size() && i < kShown; ++i) shown.push_back(FormatBytes(free[i]));
  std::string text = absl::StrJoin(shown, ", ");
  if (free.size() > kShown) absl::StrAppend(&text, " and ", free.size() - kShown, " more");
  return text;
}

// "1 rank", "4 ranks".
std::string Ranks(int64_t n) { return absl::StrCat(n, n == 1 ? " rank" : " ranks"); }

// Eligible free slots on `workers`: the most ranks any placement there could have.
int FreeSlots(const RecoveryInput& in, const std::vector<WorkerInfo>& workers) {
  JobRequest probe = ProbeJob(in, 1, 0);
  int64_t slots = 0;
  for (const WorkerInfo& w : workers) {
    if (IsEligible(w, probe)) slots += w.free_ranks();
  }
  return static_cast<int>(std::min<int64_t>(slots, INT32_MAX));
}

// Tries `ranks` ranks on `workers`. On success fills `action`'s placement fields; otherwise appends
// why to `tried` ("4 ranks x 6 GiB").
bool TryRing(const RecoveryInput& in, int ranks, const std::vector<WorkerInfo>& workers,
             RecoveryAction* action, std::vector<std::string>* tried) {
  std::optional<int64_t> mem = in.memory_per_rank(ranks);
  if (!mem.has_value() || *mem < 0) {
    tried->push_back(absl::StrCat(Ranks(ranks), " (the planner rejects it)"));
    return false;
  }
  absl::StatusOr<std::optional<Placement>> placed = TryPlace(ProbeJob(in, ranks, *mem), workers);
  if (!placed.ok() || !placed->has_value()) {
    tried->push_back(absl::StrCat(Ranks(ranks), " x ", FormatBytes(*mem)));
    return false;
  }
  action->num_ranks = ranks;
  action->worker_ids = std::move((*placed)->worker_ids);
  action->memory_per_rank_bytes = *mem;
  return true;
}

// "tried 6 ranks x 2 GiB, 4 ranks x 3 GiB, ..." with at most a few entries.
std::string Tried(const std::vector<std::string>& tried) {
  constexpr size_t kShown = 3;
  std::vector<std::string> shown(tried.begin(), tried.begin() + std::min(kShown, tried.size()));
  std::string text = absl::StrJoin(shown, ", ");
  if (tried.size() > kShown) absl::StrAppend(&text, ", and ", tried.size() - kShown, " smaller");
  return text;
}

absl::Status Validate(const RecoveryInput& in) {
  if (in.num_ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_ranks ", in.num_ranks, " is below 1"));
  }
  if (in.surviving_ranks < 0 || in.surviving_ranks > in.num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "surviving_ranks ", in.surviving_ranks, " is outside [0, num_ranks=", in.num_ranks, "]"));
  }
  if (in.seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len ", in.seq_len, " is below 1"));
  }
  if (in.micro_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch_size ", in.micro_batch_size, " is below 1"));
  }
  if (in.dtype.empty()) return absl::InvalidArgumentError("dtype is empty");
  if (in.attempts < 0 || in.max_attempts < 0) {
    return absl::InvalidArgumentError(absl::StrCat("attempts ", in.attempts, " and max_attempts ",
                                                   in.max_attempts, " must be >= 0"));
  }
  if (!in.memory_per_rank) return absl::InvalidArgumentError("memory_per_rank is not set");
  if (absl::Status s = ValidateWorkers(in.survivors); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("survivors: ", s.message()));
  }
  if (absl::Status s = ValidateWorkers(in.cluster); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cluster: ", s.message()));
  }
  return absl::OkStatus();
}

RecoveryAction DecideOom(const RecoveryInput& in, RecoveryAction action) {
  const std::string prefix = absl::StrCat("oom on ", Ranks(in.num_ranks), ": ");
  if (in.micro_batch_size > 1) {
    action.kind = RecoveryKind::kSplitBatch;
    action.micro_batch_size = (in.micro_batch_size + 1) / 2;
    action.reason = absl::StrCat(prefix, "splitting the micro-batch ", in.micro_batch_size, " -> ",
                                 action.micro_batch_size, " on the same placement");
    return action;
  }
  std::vector<std::string> why_not;
  why_not.push_back("micro-batch already 1");

  if (!in.allow_precision_fallback) {
    why_not.push_back("precision fallback not allowed");
  } else if (in.dtype != "fp32") {
    why_not.push_back(absl::StrCat("dtype already ", in.dtype));
  } else {
    auto lacking = std::find_if(in.survivors.begin(), in.survivors.end(),
                                [](const WorkerInfo& w) { return !w.SupportsDType(kLowerDType); });
    if (in.survivors.empty() || lacking != in.survivors.end()) {
      why_not.push_back(absl::StrCat(
          "cannot lower to ", kLowerDType, ": ",
          in.survivors.empty() ? std::string("no workers listed")
                               : absl::StrCat("worker ", lacking->id, " does not support it")));
    } else {
      action.kind = RecoveryKind::kLowerPrecision;
      action.dtype = kLowerDType;
      action.reason = absl::StrCat(prefix, "micro-batch already 1; lowering precision ", in.dtype,
                                   " -> ", kLowerDType, " on the same placement");
      return action;
    }
  }

  if (!in.allow_more_ranks) {
    why_not.push_back("more ranks not allowed");
  } else {
    const int limit = FreeSlots(in, in.cluster);
    std::vector<std::string> tried;
    for (int ranks = in.num_ranks + 1; ranks <= limit; ++ranks) {
      if (in.seq_len % ranks != 0) continue;
      if (TryRing(in, ranks, in.cluster, &action, &tried)) {
        action.kind = RecoveryKind::kMoreRanks;
        action.reason = absl::StrCat(prefix, "spreading the sequence over ", ranks,
                                     " ranks (divides N=", in.seq_len, "), ",
                                     FormatBytes(action.memory_per_rank_bytes), " per rank");
        return action;
      }
    }
    why_not.push_back(
        tried.empty() ? absl::StrCat("no ring of more ranks dividing N=", in.seq_len,
                                     " within the cluster's ", limit, " free slots")
                      : absl::StrCat("no larger ring fits the cluster (tried ", Tried(tried),
                                     "; free on the cluster: ", FreeMemory(in, in.cluster), ")"));
  }

  std::optional<int64_t> planned = in.memory_per_rank(in.num_ranks);
  action.kind = RecoveryKind::kFail;
  action.memory_per_rank_bytes = planned.value_or(0);
  action.reason =
      absl::StrCat(prefix, "out of memory: planner estimate ",
                   planned.has_value() ? FormatBytes(*planned) : std::string("unavailable"),
                   " per rank, measured free ", FormatBytes(in.oom_free_memory_bytes), "; ",
                   absl::StrJoin(why_not, "; "));
  return action;
}

RecoveryAction DecidePeerLoss(const RecoveryInput& in, RecoveryAction action) {
  const std::string prefix = absl::StrCat(FailureKindName(in.failure), " with ", in.surviving_ranks,
                                          " of ", in.num_ranks, " ranks surviving: ");
  std::vector<std::string> why_not;

  if (!in.allow_shrink) {
    why_not.push_back("shrinking not allowed");
  } else if (in.num_ranks <= 2 || in.surviving_ranks < 2) {
    why_not.push_back("no ring of 2 or more ranks is left to shrink to");
  } else {
    const int upper = std::min(in.num_ranks - 1, in.surviving_ranks);
    std::vector<std::string> tried;
    for (int ranks = upper; ranks >= 2; --ranks) {
      if (in.seq_len % ranks != 0) continue;
      if (TryRing(in, ranks, in.survivors, &action, &tried)) {
        action.kind = RecoveryKind::kShrinkRing;
        action.reason =
            absl::StrCat(prefix, "shrinking the ring ", in.num_ranks, " -> ", ranks,
                         " ranks (largest divisor of N=", in.seq_len, " <= ", upper,
                         " that fits), ", FormatBytes(action.memory_per_rank_bytes), " per rank");
        return action;
      }
    }
    why_not.push_back(tried.empty()
                          ? absl::StrCat("no ring size in [2, ", upper, "] divides N=", in.seq_len)
                          : absl::StrCat("no smaller ring fits the survivors (tried ", Tried(tried),
                                         "; free on the survivors: ", FreeMemory(in, in.survivors),
                                         ")"));
  }

  if (!in.allow_single_device) {
    why_not.push_back("single-device fallback not allowed");
  } else if (in.num_ranks == 1) {
    why_not.push_back("already on a single device");
  } else {
    std::vector<std::string> tried;
    if (TryRing(in, 1, in.survivors, &action, &tried)) {
      action.kind = RecoveryKind::kSingleDevice;
      action.reason = absl::StrCat(prefix, "falling back to one device on ", action.worker_ids[0],
                                   ", ", FormatBytes(action.memory_per_rank_bytes), " needed");
      if (!why_not.empty()) absl::StrAppend(&action.reason, " (", why_not.back(), ")");
      return action;
    }
    why_not.push_back(absl::StrCat("one device does not fit (", tried.back(),
                                   "; free on the survivors: ", FreeMemory(in, in.survivors), ")"));
  }

  action.kind = RecoveryKind::kRequeue;
  action.reason =
      absl::StrCat(prefix, "requeueing to restart from the last checkpoint (attempt ",
                   in.attempts + 1, " of ", in.max_attempts, "); ", absl::StrJoin(why_not, "; "));
  return action;
}

}  // namespace

const char* FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kOom:
      return "oom";
    case FailureKind::kPeerLost:
      return "peer_lost";
    case FailureKind::kWorkerDead:
      return "worker_dead";
    case FailureKind::kCommTimeout:
      return "comm_timeout";
  }
  return "unknown";
}

absl::StatusOr<FailureKind> ParseFailureKind(const std::string& name) {
  for (FailureKind k : {FailureKind::kOom, FailureKind::kPeerLost, FailureKind::kWorkerDead,
                        FailureKind::kCommTimeout}) {
    if (name == FailureKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown failure kind '", name, "'; expected oom, peer_lost, worker_dead or comm_timeout"));
}

const char* RecoveryKindName(RecoveryKind kind) {
  switch (kind) {
    case RecoveryKind::kSplitBatch:
      return "split_batch";
    case RecoveryKind::kLowerPrecision:
      return "lower_precision";
    case RecoveryKind::kMoreRanks:
      return "more_ranks";
    case RecoveryKind::kShrinkRing:
      return "shrink_ring";
    case RecoveryKind::kSingleDevice:
      return "single_device";
    case RecoveryKind::kRequeue:
      return "requeue";
    case RecoveryKind::kFail:
      return "fail";
  }
  return "unknown";
}

absl::StatusOr<RecoveryAction> DecideRecovery(const RecoveryInput& input) {
  if (absl::Status s = Validate(input); !s.ok()) return s;
  // Unless an action says otherwise, the next attempt looks like the failed one.
  RecoveryAction action;
  action.num_ranks = input.num_ranks;
  action.dtype = input.dtype;
  action.micro_batch_size = input.micro_batch_size;
  if (input.attempts >= input.max_attempts) {
    action.kind = RecoveryKind::kFail;
    action.reason = absl::StrCat(FailureKindName(input.failure), ": recovery attempts exhausted (",
                                 input.attempts, " of ", input.max_attempts, "); failing the job");
    return action;
  }
  if (input.failure == FailureKind::kOom) return DecideOom(input, std::move(action));
  return DecidePeerLoss(input, std::move(action));
}

}  // namespace scheduler
}  // namespace dattn
