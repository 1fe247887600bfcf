#include "server/job_state.h"

#include "absl/strings/str_cat.h"

namespace dattn {
namespace server {
namespace {

bool IsKnown(v1::JobState state) {
  return state != v1::JOB_STATE_UNSPECIFIED && v1::JobState_IsValid(state);
}

// The forbidden/allowed table for two known states, self-moves excluded (handled by the caller).
bool Allowed(v1::JobState from, v1::JobState to) {
  switch (from) {
    case v1::JOB_STATE_QUEUED:
      return to == v1::JOB_STATE_PLACED || to == v1::JOB_STATE_CANCELLED ||
             to == v1::JOB_STATE_FAILED;
    case v1::JOB_STATE_PLACED:
      return to == v1::JOB_STATE_RUNNING || to == v1::JOB_STATE_QUEUED ||
             to == v1::JOB_STATE_CANCELLED || to == v1::JOB_STATE_FAILED;
    case v1::JOB_STATE_RUNNING:
      return to == v1::JOB_STATE_SUCCEEDED || to == v1::JOB_STATE_FAILED ||
             to == v1::JOB_STATE_CANCELLED || to == v1::JOB_STATE_QUEUED;
    default:
      return false;
  }
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

absl::string_view StateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_UNSPECIFIED:
      return "unspecified";
    case v1::JOB_STATE_QUEUED:
      return "queued";
    case v1::JOB_STATE_PLACED:
      return "placed";
    case v1::JOB_STATE_RUNNING:
      return "running";
    case v1::JOB_STATE_SUCCEEDED:
      return "succeeded";
    case v1::JOB_STATE_FAILED:
      return "failed";
    case v1::JOB_STATE_CANCELLED:
      return "cancelled";
    default:
      return "unknown";
  }
}

absl::Status CheckTransition(v1::JobState from, v1::JobState to) {
  for (v1::JobState s : {from, to}) {
    if (!IsKnown(s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job state transition ", StateName(from), " (", static_cast<int>(from), ") -> ",
          StateName(to), " (", static_cast<int>(to), "): both states must be known and specified"));
    }
  }
  if (IsTerminal(from)) {
    return absl::FailedPreconditionError(absl::StrCat("job state transition ", StateName(from),
                                                      " -> ", StateName(to), " is not allowed (",
                                                      StateName(from), " is terminal)"));
  }
  if (from == to || Allowed(from, to)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("job state transition ", StateName(from),
                                                    " -> ", StateName(to), " is not allowed"));
}

}  // namespace server
}  // namespace dattn
