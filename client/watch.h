// Following a job until it ends: `dattn watch`, and `dattn submit --watch/--wait`.
//
// WatchJob reads the job once (GetJob), then streams its events (WatchJob RPC). When the stream
// breaks (UNAVAILABLE, INTERNAL, a dropped connection, ...) it waits (backoff 0.1 s doubling to
// 2 s), asks for the job until the coordinator answers, and reconnects with after_seq = the last
// event seen, so no event is shown twice or skipped. It gives up after `reconnect_for` from the
// break of a stream that had been working (it delivered an event or stayed open 2 s). On `err` it
// says so once per outage: "lost the event stream of J after event #N (CODE: ...); reconnecting
// for up to 1m00s" when it breaks and "reconnected to the event stream of J after 4.2s" when the
// coordinator answers again; failed attempts in between print nothing. When the job ends it reads
// the job again to return its final state and result.
//
// kTty: a training job's line adds its last loss, tokens/s and last validation loss
// ("J  RUNNING  [###---]  120/1000 steps  12%  loss 2.3456  12.3K tok/s  val 2.3100  elapsed
// 1m02s"). The live line ends on the job's final state, from the final job: a SUCCEEDED job's bar
// full (N/N steps, 100%) even when the last progress event said less; a FAILED or CANCELLED job's
// line without a bar ("J  FAILED  at step 3 of 10  elapsed 4.1s"; the caller prints the reason).
//
// Thread-safety: WatchJob may be called from any thread; it writes to `out`/`err` only from the
// calling thread, except in kTty mode, where a helper thread it owns redraws the progress line once
// per `redraw_every` until WatchJob returns.
#ifndef DATTN_CLIENT_WATCH_H_
#define DATTN_CLIENT_WATCH_H_

#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "grpcpp/support/status.h"

namespace dattn {
namespace client {

struct WatchOptions {
  enum class Display {
    kTty,    // A live progress line (bar, steps, state, elapsed), redrawn in place; other events
             // print above it.
    kLines,  // One line per event (stdout is not a terminal): EventLine. A training job's progress,
             // checkpoint, evaluation and resumed events carry their figures in their messages.
    kJson,   // One compact JSON JobEvent per line.
    kQuiet,  // Nothing (--wait); only the final job is returned.
  };
  Display display = Display::kLines;
  absl::Duration rpc_timeout = absl::Seconds(10);    // Deadline of each GetJob.
  absl::Duration reconnect_for = absl::Seconds(60);  // Give up after this long without progress.
  absl::Duration redraw_every = absl::Seconds(1);    // kTty only.
};

struct WatchResult {
  // OK when the job was followed to its end; otherwise the RPC error that stopped the watch
  // (UNAVAILABLE after reconnecting failed for reconnect_for, NOT_FOUND for an unknown job, ...).
  grpc::Status status;
  // With an OK status: the job in a terminal state, as GetJob returned it after the end (or, should
  // that read fail, the id, state and reason carried by the final event).
  v1::Job job;
};

// Follows `job_id` to its end, rendering events on `out` as `options.display` says. Reconnection
// notices go to `err`. `stub` must outlive the call.
WatchResult WatchJob(v1::JobService::StubInterface* stub, const std::string& job_id,
                     const WatchOptions& options, std::ostream& out, std::ostream& err);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_WATCH_H_
