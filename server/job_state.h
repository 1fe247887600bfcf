// The job state machine: which JobState changes the coordinator may make, and nothing else (no
// I/O).
//
//   QUEUED  -> PLACED | CANCELLED | FAILED
//   PLACED  -> RUNNING | QUEUED (requeue: a rank failed to start, a worker was lost) | CANCELLED |
//   FAILED RUNNING -> SUCCEEDED | FAILED | CANCELLED | QUEUED (requeue after worker loss or a
//   coordinator
//              restart)
//   SUCCEEDED, FAILED, CANCELLED: terminal; no change leaves them.
//
// A non-terminal state may also "move" to itself: an event that records something without changing
// the state (progress, a note about a worker) is a transition X -> X. A terminal state is final
// even in that sense, so a job's history ends with its terminal event.
//
// Thread-safety: every function here is pure and may be called from any thread.
#ifndef DATTN_SERVER_JOB_STATE_H_
#define DATTN_SERVER_JOB_STATE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dattn/v1/job.pb.h"

namespace dattn {
namespace server {

// True for SUCCEEDED, FAILED and CANCELLED. False for every other value, including UNSPECIFIED and
// values outside the enum.
bool IsTerminal(v1::JobState state);

// Lower-case name without the prefix: "queued", "placed", "running", "succeeded", "failed",
// "cancelled", "unspecified"; a value outside the enum gives "unknown".
absl::string_view StateName(v1::JobState state);

// OK if a job in state `from` may move to state `to` (see the top of this file).
// INVALID_ARGUMENT if either state is UNSPECIFIED or outside the enum (a caller bug, not a race);
// FAILED_PRECONDITION naming both states for a transition the machine forbids, e.g.
// "job state transition succeeded -> running is not allowed (succeeded is terminal)".
absl::Status CheckTransition(v1::JobState from, v1::JobState to);

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_JOB_STATE_H_
