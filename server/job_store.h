// JobStore: the coordinator's durable record of every job and its event history, in one SQLite
// file.
//
// Layout: the file at `path` (SQLite, WAL mode, so also `path`-wal and `path`-shm beside it) and a
// lock file `path`.lock that one JobStore at a time holds (another process or another JobStore in
// this process gets FAILED_PRECONDITION from Open). Rows hold serialized dattn.v1 messages (Job,
// JobEvent), so the stored form is the public API's wire format; a few fields are copied into
// columns for indexing (state, tenant, kind, priority, submit order, times). Schema changes are
// migrations keyed by a version table; a binary refuses a file whose schema is newer than it knows.
//
// Durability: Submit and Update return OK only after their transaction is committed with
// synchronous=FULL (the WAL is fsync'ed), so an acknowledged write survives a process crash and a
// power loss. Writes go through one writer thread that commits everything queued at the moment in a
// single transaction (group commit): many concurrent callers share one fsync, and each caller still
// gets its own outcome. A batch is atomic as a whole only in the sense that every write in it is
// durable together; each write succeeds or fails on its own (a failed write leaves no trace).
//
// Failure model: when a commit fails for a storage reason (I/O error, fsync failure, disk full, a
// file system that became read-only, corruption) the store does not retry the batch: its callers
// and every later writer get UNAVAILABLE carrying the error (see Health()) until a Probe() commits
// again. A probe is a real write transaction (it bumps the file's user_version), so it succeeds
// only once the file takes writes again (space freed, the file system writable again); the failed
// batch left nothing behind (SQLite rolls it back, and readers never saw it), so the store then
// simply goes on. Reads keep working meanwhile. A Probe() of a healthy store is also how a caller
// learns that a store nobody has written to for a while can no longer be written (a read-only
// remount), before a real write fails. A lock held by another process past the busy timeout fails
// the writes of that moment but does not make the store unhealthy.
//
// Permissions: the job history is private to the user running the coordinator. Open creates each
// missing directory of `path` with mode 0700, and the database, its WAL and shared-memory files and
// the lock file with mode 0600 (whatever the umask), and tightens any of these files that already
// exists with group or other permission bits to 0600. It leaves existing directories alone (the
// caller may warn: GroupOrWorldAccessWarning).
//
// Reads use a small pool of separate connections; in WAL mode they see the last committed state and
// never wait for the writer's fsync. A read started after a write returned sees that write.
//
// Thread-safety: every method may be called from any number of threads at once. Close() (or the
// destructor) must not race with calls the caller still expects to succeed: calls that arrive after
// Close() began get UNAVAILABLE.
#ifndef DATTN_SERVER_JOB_STORE_H_
#define DATTN_SERVER_JOB_STORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dattn/v1/job.pb.h"

namespace dattn {
namespace server {

// A one-line warning when the directory `dir` grants group or others any access (mode & 077),
// naming the directory, its mode and the fix ("chmod 700 DIR"); nullopt when it is private or
// cannot be examined.
std::optional<std::string> GroupOrWorldAccessWarning(const std::string& dir);

namespace store_internal {
class SqliteDb;  // One SQLite connection and its prepared statements (sqlite_db.h).
struct WriteOp;  // One queued Submit or Update (job_store.cc).
}  // namespace store_internal

struct JobStoreOptions {
  // Read connections in the pool (>= 1). A read holds one for its duration; more concurrent reads
  // wait for a free one.
  int read_connections = 4;
  // How long a connection waits for a lock held by another connection before failing (SQLite's
  // busy timeout); only matters if something outside this JobStore opens the file. >= 0.
  absl::Duration busy_timeout = absl::Seconds(5);
  // Most writes committed in one transaction (>= 1). 1 turns group commit off (one fsync per
  // write).
  int max_batch_writes = 512;
  // WAL size, in pages (4 KiB), after which a background thread copies the WAL into the main file
  // (a passive checkpoint, off the commit path). The writer then copies the few pages committed
  // meanwhile and restarts the WAL before its next batch: one batch in a cycle waits for that
  // small copy and one fsync of the main file, instead of the whole checkpoint. >= 1.
  int wal_checkpoint_pages = 4096;  // 16 MiB.
  // Run PRAGMA quick_check on open (reads the whole file once): a damaged file is reported at
  // startup rather than on the first query that touches the damaged page.
  bool check_integrity_on_open = true;
};

// A job as stored, with the store's submit order (the scheduler's FIFO key; see scheduler/types.h).
struct StoredJob {
  v1::Job job;             // events is empty and queue_position is 0 (neither is stored).
  int64_t submit_seq = 0;  // >= 1; strictly increasing in submit order, never reused.
};

struct SubmitOutcome {
  v1::Job job;  // The stored job: the new one, or the existing one when !created.
  int64_t submit_seq = 0;
  bool created = false;  // False when the idempotency key named an existing job with the same spec.
};

// Conditions of List; an empty field matches everything.
struct ListFilter {
  std::vector<v1::JobState> states;  // Any of these states.
  std::string tenant;  // The spec's tenant; jobs with an empty tenant match "default".
  std::string kind;    // JobKind() of the spec, e.g. "attention".
};

struct ListPage {
  std::vector<StoredJob> jobs;  // Newest first (descending submit_seq).
  std::string next_page_token;  // Empty when no job is left after this page.
};

// Counters of the group-commit writer since Open, for metrics and benchmarks.
struct JobStoreStats {
  int64_t transactions = 0;   // Write transactions committed (each one fsync of the WAL).
  int64_t writes = 0;         // Submit/Update calls those transactions answered (errors included).
  int64_t largest_batch = 0;  // Most writes answered by one transaction.
  int64_t checkpoints = 0;    // WAL checkpoints (background passes + writer catch-ups).
  int64_t checkpoint_failures = 0;  // Checkpoints that failed (retried after the next commit).
  int64_t failed_transactions = 0;  // Commits that failed for a storage reason.
  int64_t recoveries = 0;           // Probes that committed while the store was unhealthy.
  absl::Time last_commit = absl::InfinitePast();  // When the last transaction committed.
};

// The stored kind of a spec's work: the name of the field set in JobSpec's `work` oneof
// ("attention"), or "none" when no work is set.
std::string JobKind(const v1::JobSpec& spec);

// What the idempotency_key column holds: "TENANT/KEY", the tenant as the tenant column stores it
// ("default" for an empty spec.tenant), so that keys are per tenant (one tenant's key never finds
// or blocks another's job). Tenants cannot contain '/' (requests.cc), so the pair is unambiguous.
// Stores written before schema version 3 are migrated to it.
std::string ScopedIdempotencyKey(absl::string_view spec_tenant, absl::string_view key);

class JobStore {
 public:
  // Opens (creating if missing, with any missing parent directories) the store at `path` and starts
  // its writer and checkpointer threads. The caller owns the result.
  // Errors, each naming `path`: INVALID_ARGUMENT for an empty path or bad options;
  // FAILED_PRECONDITION if another JobStore holds the lock, if the file is an SQLite database that
  // is not a job store, or if its schema version is newer than this binary's; DATA_LOSS if the file
  // is not a database or is damaged; UNAVAILABLE if the file or directory cannot be created, opened
  // or read. Nothing is written to an existing file on error, except that a job store of an older
  // schema version may have been migrated.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                        const JobStoreOptions& options = {});

  // Close()s, ignoring its status.
  ~JobStore();

  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Stores a new job, QUEUED, with `submitted_event` as its first event (seq 1). Returns once the
  // job is durable. The store fills in: the event's job_id, seq (1) and state (the job's) and its
  // time if unset; the job's create_time if unset; it drops job.events and job.queue_position. If a
  // job with job.idempotency_key() exists: with an equal spec (compared byte for byte in
  // deterministic serialization; a job's requested_spec stands for its spec when it has one) the
  // existing job is returned with created=false and nothing is written; with a different spec the
  // result is ALREADY_EXISTS naming the key. Two Submits of one key racing each other behave as if
  // they ran one after the other. Other errors: INVALID_ARGUMENT for an empty job_id or
  // idempotency_key, a state other than QUEUED, or an event naming another job or state;
  // ALREADY_EXISTS if job_id is taken by a job with another key; UNAVAILABLE if the store is closed
  // or failing (nothing written; safe to retry).
  absl::StatusOr<SubmitOutcome> Submit(const v1::Job& job, const v1::JobEvent& submitted_event);

  // Replaces the stored job with `job` (matched by job_id) and appends `event` as its next event,
  // atomically and durably. Returns the event's seq (previous last seq + 1). The store fills in the
  // event's job_id, seq, state (the job's) and time if unset, and drops job.events and
  // job.queue_position. The state change must be allowed by CheckTransition (job_state.h), checked
  // against the stored state inside the transaction, so two racing Updates cannot both leave a
  // terminal state. Concurrent Updates of one job are applied in some order, each replacing the
  // whole row: callers serialise read-modify-write of one job themselves. Errors (nothing written):
  // NOT_FOUND naming the id; FAILED_PRECONDITION for a forbidden state change; INVALID_ARGUMENT if
  // the idempotency key or spec differs from the stored one (both are immutable) or the event names
  // another job or state; UNAVAILABLE if closed or failing.
  absl::StatusOr<int64_t> Update(const v1::Job& job, v1::JobEvent event);

  // Removes a finished job (SUCCEEDED, FAILED, CANCELLED) and its events, durably; returns the job
  // as it was. NOT_FOUND naming the id; FAILED_PRECONDITION naming the state of a job that has not
  // finished; UNAVAILABLE if closed or failing.
  absl::StatusOr<v1::Job> Delete(absl::string_view job_id);

  // Reads. Besides the errors listed with each: UNAVAILABLE once closed or on an I/O error;
  // DATA_LOSS naming the job if a stored row cannot be parsed.

  // The stored job. NOT_FOUND naming the id / key.
  absl::StatusOr<StoredJob> GetJob(absl::string_view job_id);
  // Idempotency keys are per tenant: `tenant` is the spec's ("" = "default").
  absl::StatusOr<StoredJob> GetJobByKey(absl::string_view tenant,
                                        absl::string_view idempotency_key);

  // The job's events with seq > after_seq in seq order, at most `limit` of them (0 = all).
  // NOT_FOUND naming the id for an unknown job; INVALID_ARGUMENT for a negative after_seq or limit.
  absl::StatusOr<std::vector<v1::JobEvent>> Events(absl::string_view job_id, int64_t after_seq,
                                                   int limit);
  // The job's latest `limit` events (limit >= 1), in seq order. Errors as Events'.
  absl::StatusOr<std::vector<v1::JobEvent>> LatestEvents(absl::string_view job_id, int limit);

  // One page of the jobs that match `filter`, newest first. page_size 1 .. 1000 (0 means 50).
  // page_token is empty for the first page, else a next_page_token of an earlier List; pages stay
  // stable while jobs are added (a token marks a place in submit order, so new jobs never shift a
  // later page). A token may be reused and is not tied to the filter. INVALID_ARGUMENT for a
  // page_size out of range or a token this store did not produce.
  absl::StatusOr<ListPage> List(const ListFilter& filter, int page_size,
                                absl::string_view page_token);

  // Every job not in a terminal state, in submit order (ascending submit_seq): what a restarted
  // coordinator must recover.
  absl::StatusOr<std::vector<StoredJob>> LoadActive();

  // The ids of at most `limit` (>= 1) finished jobs whose latest event's time is before `before`,
  // oldest first: what a retention deletes (event times are the writer's clock, so a coordinator
  // on a fake clock expires jobs on that clock).
  absl::StatusOr<std::vector<std::string>> ListExpired(absl::Time before, int limit);

  // Number of jobs in each state that has at least one job; only jobs of `kind` (the spec's work:
  // "attention") when it is not empty.
  absl::StatusOr<std::map<v1::JobState, int64_t>> CountByState(const std::string& kind = "");

  // OK while writes work; the storage error of the last failed commit or probe until a later probe
  // commits (see the top of the file); UNAVAILABLE once closed. For readiness probes.
  absl::Status Health();

  // Commits a transaction that changes no job (it bumps the file's user_version), through the
  // writer like any write, even while the store is unhealthy. OK: the store takes writes (again:
  // Health() turns OK). Otherwise the store is (or stays) unhealthy with the returned UNAVAILABLE
  // error. A probe blocked by another process's lock past the busy timeout fails without changing
  // health.
  absl::Status Probe();

  JobStoreStats Stats();

  const std::string& path() const { return path_; }

  // Commits every write queued before the call, stops the writer thread, and closes the file. Waits
  // for reads in progress. Returns the sticky storage error if writes failed while open, else OK.
  // Idempotent; later calls of any other method get UNAVAILABLE.
  absl::Status Close();

 private:
  JobStore(std::string path, const JobStoreOptions& options);

  absl::Status OpenImpl();
  // Queues `op`, waits until the writer has answered it.
  void Enqueue(store_internal::WriteOp* op);
  void WriterLoop();
  bool WriterHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckpointLoop();
  bool CheckpointerHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one batch in one transaction and answers every op in it.
  void CommitBatch(const std::vector<store_internal::WriteOp*>& batch);
  // Apply*: the op's own outcome goes into the op; a non-OK return means the transaction itself
  // failed (a storage error) and must be rolled back.
  absl::Status ApplySubmit(store_internal::WriteOp* op, int64_t* next_submit_seq);
  absl::Status ApplyUpdate(store_internal::WriteOp* op);
  absl::Status ApplyProbe();
  absl::Status ApplyDelete(store_internal::WriteOp* op);

  // Events' and LatestEvents' query: after `after_seq`, at most `limit` (0 = all), the first ones
  // or (latest) the last ones, in seq order either way.
  absl::StatusOr<std::vector<v1::JobEvent>> ReadEvents(absl::string_view job_id, int64_t after_seq,
                                                       int limit, bool latest);
  // Lends a read connection, or UNAVAILABLE when closed; GiveBack returns it.
  absl::StatusOr<store_internal::SqliteDb*> TakeReader();
  void GiveBack(store_internal::SqliteDb* db);
  absl::StatusOr<StoredJob> GetOne(absl::string_view sql, absl::string_view what,
                                   absl::string_view value);
  absl::StatusOr<StoredJob> RowToJob(store_internal::SqliteDb* db, absl::string_view blob,
                                     int64_t submit_seq);

  const std::string path_;
  const JobStoreOptions options_;
  int lock_fd_ = -1;  // Held from OpenImpl to Close.

  // Used only by the writer thread once it runs (by OpenImpl before that).
  std::unique_ptr<store_internal::SqliteDb> writer_db_;
  int64_t last_submit_seq_ = 0;     // Highest committed submit_seq.
  int wal_pages_after_commit_ = 0;  // Set by SQLite's WAL hook during COMMIT.
  int64_t probe_count_ = 0;         // Probes written: the next user_version.
  std::thread writer_;

  // Used only by the checkpointer thread once it runs.
  std::unique_ptr<store_internal::SqliteDb> checkpoint_db_;
  std::thread checkpointer_;

  absl::Mutex mu_;
  std::deque<store_internal::WriteOp*> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status write_error_ ABSL_GUARDED_BY(mu_);  // Sticky; see the top of the file.
  int64_t wal_pages_ ABSL_GUARDED_BY(mu_) = 0;     // WAL size after the last commit.
  bool stop_checkpointer_ ABSL_GUARDED_BY(mu_) = false;
  // A background pass finished; the writer should catch up and let the WAL restart.
  bool catch_up_pending_ ABSL_GUARDED_BY(mu_) = false;
  JobStoreStats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex pool_mu_;
  std::vector<std::unique_ptr<store_internal::SqliteDb>> readers_ ABSL_GUARDED_BY(pool_mu_);
  std::vector<store_internal::SqliteDb*> free_readers_ ABSL_GUARDED_BY(pool_mu_);
  bool readers_closed_ ABSL_GUARDED_BY(pool_mu_) = false;

  absl::Mutex close_mu_ ABSL_ACQUIRED_BEFORE(mu_, pool_mu_);
  bool closed_ ABSL_GUARDED_BY(close_mu_) = false;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_JOB_STORE_H_
