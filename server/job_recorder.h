// The job recorder: commits the job book's decided changes to the job store, follows the store's
// health, and keeps the durable state tidy (retention, stored outputs no job keeps).
//
// Committing: the coordinator decides changes under its mutex (they queue in the book) and then,
// without the mutex, has the recorder Flush the tickets: for each job, in decision order, the
// recorder takes the next write from the book, commits it (JobStore::Update, no lock held) and
// hands the outcome back to the book. A job's terminal write also settles its stored outputs (a
// succeeded job keeps its output attempt's shards; any other attempt's go).
//
// Store health: a write or probe that fails for a storage reason makes the store unhealthy
// (job_store.h); the recorder then reports the error (store_error()), and the coordinator answers
// changing calls with UNAVAILABLE and places nothing. CheckStore() probes the store while it fails
// (and when it has been idle for `probe_interval`, so that a store that can no longer be written is
// found before a real write fails); once a probe commits the error clears, stalled writes are
// committed in order, and CheckStore() says the store recovered.
//
// Locking: the recorder shares the coordinator's mutex (given at construction), which guards the
// book (ABSL_PT_GUARDED_BY). Methods marked LOCKS_EXCLUDED take it themselves and do their I/O
// without it; the others expect it held and assert so (the analysis cannot tell that the
// coordinator's mu_ is the recorder's *mu_, so they are not ABSL_EXCLUSIVE_LOCKS_REQUIRED).
#ifndef DATTN_SERVER_JOB_RECORDER_H_
#define DATTN_SERVER_JOB_RECORDER_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "server/job_book.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/result_store.h"
#include "server/work_kind.h"

namespace dattn {
namespace server {

struct RecorderOptions {
  absl::Duration probe_interval = absl::Seconds(5);  // An idle store's probe write.
  // Finished jobs are deleted this long after they finished; InfiniteDuration keeps them.
  absl::Duration retention = absl::InfiniteDuration();
  int expire_batch = 100;  // Jobs deleted per Expire() at most.
};

class JobRecorder {
 public:
  // `mu` is the coordinator's mutex, which guards `book`; `kinds` say which results keep an
  // output; none is owned; all outlive the recorder.
  JobRecorder(absl::Mutex* mu, JobBook* book, const WorkKinds* kinds, Metrics* metrics,
              const Clock* clock, RecorderOptions options)
      : mu_(mu), book_(book), kinds_(kinds), metrics_(metrics), clock_(clock), options_(options) {}
  JobRecorder(const JobRecorder&) = delete;
  JobRecorder& operator=(const JobRecorder&) = delete;

  // The stores, once open (Coordinator::Start, before any other call). Not owned.
  void Attach(JobStore* store, ResultStore* outputs) {
    store_ = store;
    outputs_ = outputs;
  }

  // Commits the queued writes of each ticket's job, in order; OK when every ticket's own write
  // committed, else the first error (UNAVAILABLE "cannot record job ..." for a write that failed).
  absl::Status Flush(const Tickets& tickets) ABSL_LOCKS_EXCLUDED(mu_);
  // Commits the stalled queues, oldest stall first, until one still fails.
  void RetryStalled() ABSL_LOCKS_EXCLUDED(mu_);
  // Probes the store if it fails or has been idle (see the top); true when it has just recovered.
  bool CheckStore() ABSL_LOCKS_EXCLUDED(mu_);
  // The stored QUEUED jobs the book lacks (a submit that reached the file although its client was
  // told otherwise), for the coordinator to adopt after a recovery.
  std::vector<StoredJob> QueuedNotInBook() ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes up to a batch of finished jobs older than the retention, with their outputs.
  void Expire() ABSL_LOCKS_EXCLUDED(mu_);
  // Removes stored outputs that no job keeps (at start-up, after the book is loaded).
  void CollectOutputs() ABSL_LOCKS_EXCLUDED(mu_);

  // OK, or the store's error while it cannot be written. Requires the mutex.
  absl::Status store_error() const;
  // A write outside the book (a submit) failed with `error`: the store may be unhealthy now.
  void NoteWriteFailure(const absl::Status& error);
  // Readiness: the store's error, if any. Takes the mutex.
  absl::Status Health() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status FlushOne(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the finished `job`'s result keeps a stored output (its kind says).
  bool KeepsOutput(const v1::Job& job) const;

  absl::Mutex* const mu_;
  JobBook* const book_ ABSL_PT_GUARDED_BY(mu_);
  const WorkKinds* const kinds_;
  Metrics* const metrics_;
  const Clock* const clock_;
  const RecorderOptions options_;
  JobStore* store_ = nullptr;
  ResultStore* outputs_ = nullptr;
  absl::Status store_error_ ABSL_GUARDED_BY(mu_);
  absl::Time last_probe_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_JOB_RECORDER_H_
