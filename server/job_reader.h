// The job reader: what clients read about jobs. It answers GetJob and ListJobs (an active job as
// the coordinator knows it now, a finished one as stored, with when retention deletes it), streams
// a job's history and then its events as they commit (WatchJob), and streams a succeeded job's
// stored output (ReadOutput). It changes nothing: every view comes from the job book (committed
// state with live progress), the dispatcher (queue positions) and the stores.
//
// No view carries an output tensor (a job's record may hold one if it was stored before outputs
// moved out of it): tensors are read with ReadOutput only, so listings stay small.
//
// Watches. Each open WatchJob holds a server thread while it waits, so at most
// `max_watch_streams` are open at once. A watch subscribes to the book before it reads the history
// (an event committed in between is then in both and is sent once, by seq), reads the history
// from the store kWatchHistoryPage events at a time (a long job's history is never in memory at
// once), and ends after the terminal event, when its client goes away, or when Close() ends every
// watch.
//
// Locking: the reader shares the coordinator's mutex (given at construction), which guards the
// book and the dispatcher (ABSL_PT_GUARDED_BY). Public() and Close() expect it held and assert so
// (the analysis cannot tell that the coordinator's mu_ is the reader's *mu_, so they are not
// ABSL_EXCLUSIVE_LOCKS_REQUIRED); the request methods take it themselves and read the stores
// without it.
#ifndef DATTN_SERVER_JOB_READER_H_
#define DATTN_SERVER_JOB_READER_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"
#include "server/dispatcher.h"
#include "server/job_book.h"
#include "server/job_store.h"
#include "server/result_store.h"
#include "server/work_kind.h"

namespace dattn {
namespace server {

// Called by WatchJob / ReadOutput for each message; return false when the message could not be
// delivered (the client went away): the stream then ends.
using JobEventSink = std::function<bool(const v1::JobEvent&)>;
using TensorChunkSink = std::function<bool(const v1::TensorChunk&)>;
// Polled while a stream waits; true ends the stream with CANCELLED (the client cancelled).
using CancelledFn = std::function<bool()>;

// Events WatchJob reads from the store at a time while it replays a job's history.
inline constexpr int kWatchHistoryPage = 500;

// Drops a job's output tensor, if its record carries one (see the top of this file): what its kind
// says (WorkKind::StripInlineOutput).
void StripTensors(const WorkKinds& kinds, v1::Job* job);

struct ReaderOptions {
  // Finished jobs are deleted this long after they finished (their views say when);
  // InfiniteDuration: never.
  absl::Duration retention = absl::InfiniteDuration();
  int max_watch_streams = 256;  // Open WatchJob streams at most; more get RESOURCE_EXHAUSTED.
  // How long a waiting watch sleeps between checks of its client's cancellation (real time).
  absl::Duration stream_poll_interval = absl::Milliseconds(200);
};

class JobReader {
 public:
  // `mu` is the coordinator's mutex, which guards `book` and `dispatcher`; none is owned; all
  // outlive the reader.
  JobReader(absl::Mutex* mu, JobBook* book, const Dispatcher* dispatcher, const WorkKinds* kinds,
            ReaderOptions options)
      : mu_(mu), book_(book), dispatcher_(dispatcher), kinds_(kinds), options_(options) {}
  JobReader(const JobReader&) = delete;
  JobReader& operator=(const JobReader&) = delete;

  // The stores, once open (Coordinator::Start, before any other call). Not owned.
  void Attach(JobStore* store, ResultStore* outputs) {
    store_ = store;
    outputs_ = outputs;
  }

  // The job as readers see it: the book's public view, its queue position while QUEUED, no tensor.
  // Requires the mutex.
  v1::Job Public(const JobRun& run) const;

  // The semantics of the coordinator's calls of the same names (coordinator.h); the caller has
  // checked that the coordinator serves.
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WatchJob(const v1::WatchJobRequest& request, const JobEventSink& emit,
                        const CancelledFn& cancelled) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReadOutput(const v1::ReadOutputRequest& request, const TensorChunkSink& emit)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every watch (UNAVAILABLE) and makes new ones fail at once. Requires the mutex.
  void Close();

  // A NOT_FOUND job may have been deleted by retention: the message says so.
  absl::Status Explain(const absl::Status& status) const;

 private:
  // A stored finished job's expire_time (none while retention is infinite).
  void SetExpireTime(v1::Job* job) const;

  absl::Mutex* const mu_;
  JobBook* const book_ ABSL_PT_GUARDED_BY(mu_);
  const Dispatcher* const dispatcher_ ABSL_PT_GUARDED_BY(mu_);
  const WorkKinds* const kinds_;
  const ReaderOptions options_;
  JobStore* store_ = nullptr;
  ResultStore* outputs_ = nullptr;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_JOB_READER_H_
