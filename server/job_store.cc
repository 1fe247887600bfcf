// JobStore (job_store.h): opening and closing the store, and its writes: the group-commit writer
// thread and the background checkpointer. Elsewhere: the reads (job_store_reads.cc), the store's
// files outside SQLite (store_files.h), the schema and the checks on open (store_schema.h), the
// SQLite connection (sqlite_db.h).
#include "server/job_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "api/tenant.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/job_state.h"
#include "server/sqlite_db.h"
#include "server/store_files.h"
#include "server/store_schema.h"

namespace dattn {
namespace server {

namespace store_internal {

// One Submit or Update on its way through the writer thread. The caller prepares everything that
// does not depend on the stored state (serialization is the bulk of the CPU work, and callers run
// in parallel while the writer is one thread); the writer fills in the outcome and then notifies.
struct WriteOp {
  // kProbe writes nothing of a job: it bumps the file's user_version, to learn whether the store
  // can be written at all (JobStore::Probe).
  // kDelete removes a finished job and its events.
  enum class Kind { kSubmit, kUpdate, kProbe, kDelete };
  Kind kind = Kind::kSubmit;

  v1::Job job;  // Submit: the job to insert (returned in the outcome). Update: unused.
  std::string job_id;
  std::string idempotency_key;      // Scoped: ScopedIdempotencyKey.
  std::string raw_idempotency_key;  // As the client gave it, for messages.
  std::string job_blob;             // Serialized job as stored.
  std::string spec_blob;            // Deterministic serialization of the spec.
  std::string spec_hash;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  std::string tenant;
  std::string kind_name;
  int64_t priority = 0;
  int64_t create_time_us = 0;
  int64_t now_us = 0;
  v1::JobEvent event;      // seq is assigned by the writer for updates.
  std::string event_blob;  // Submit only: seq is always 1.

  // Outcome, valid once `done` is notified.
  absl::Status status;
  SubmitOutcome submit;
  int64_t event_seq = 0;
  absl::Notification done;
};

}  // namespace store_internal

namespace {

using store_internal::CheckIntegrity;
using store_internal::CheckIsJobStore;
using store_internal::ConfigureWriter;
using store_internal::CreateDatabaseFile;
using store_internal::CreateParentDirectories;
using store_internal::IsStatementLevel;
using store_internal::LockStore;
using store_internal::MakeStoreFilesPrivate;
using store_internal::Migrate;
using store_internal::Query;
using store_internal::SqliteDb;
using store_internal::SyncParentDirectory;
using store_internal::WriteOp;

std::string SerializeDeterministic(const google::protobuf::MessageLite& msg) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    msg.SerializePartialToCodedStream(&coded);
  }
  return out;
}

std::string SpecBlob(const v1::JobSpec& spec) { return SerializeDeterministic(spec); }

// FNV-1a 64: stable across processes and versions (absl::Hash is seeded per process).
std::string SpecHash(absl::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

int64_t ToMicros(const google::protobuf::Timestamp& t) {
  return t.seconds() * 1000000 + t.nanos() / 1000;
}

void SetTime(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t us = absl::ToUnixMicros(t);
  int64_t sec = us / 1000000;
  int64_t rem = us % 1000000;
  if (rem < 0) {
    rem += 1000000;
    --sec;
  }
  out->set_seconds(sec);
  out->set_nanos(static_cast<int32_t>(rem * 1000));
}

}  // namespace

std::string ScopedIdempotencyKey(absl::string_view spec_tenant, absl::string_view key) {
  return absl::StrCat(api::TenantOrDefault(spec_tenant), "/", key);
}

namespace {

// Checks the fields both writes share and fills the op's copy of the event.
absl::Status PrepareEvent(const v1::Job& job, const v1::JobEvent& event, WriteOp* op) {
  if (!event.job_id().empty() && event.job_id() != job.job_id()) {
    return absl::InvalidArgumentError(absl::StrCat("event names job \"", event.job_id(),
                                                   "\" but the job is \"", job.job_id(), "\""));
  }
  if (event.state() != v1::JOB_STATE_UNSPECIFIED && event.state() != job.state()) {
    return absl::InvalidArgumentError(absl::StrCat("event of job ", job.job_id(), " has state ",
                                                   StateName(event.state()), " but the job is ",
                                                   StateName(job.state())));
  }
  op->event = event;
  op->event.set_job_id(job.job_id());
  op->event.set_state(job.state());
  if (!op->event.has_time()) SetTime(absl::FromUnixMicros(op->now_us), op->event.mutable_time());
  return absl::OkStatus();
}

// Fills the columns and blobs of `op` from `job` (events and queue_position dropped; a new job
// without a create_time gets the current time).
void PrepareJob(const v1::Job& job, WriteOp* op) {
  const bool submit = op->kind == WriteOp::Kind::kSubmit;
  op->job_id = job.job_id();
  op->idempotency_key = ScopedIdempotencyKey(job.spec().tenant(), job.idempotency_key());
  op->raw_idempotency_key = job.idempotency_key();
  op->state = job.state();
  op->tenant = api::TenantOrDefault(job.spec().tenant());
  op->kind_name = std::string(JobKind(job.spec()));
  op->priority = job.spec().priority();
  // Idempotency compares what was asked for: the requested spec when the coordinator changed it.
  op->spec_blob = SpecBlob(job.has_requested_spec() ? job.requested_spec() : job.spec());
  op->spec_hash = SpecHash(op->spec_blob);
  if (job.events_size() == 0 && job.queue_position() == 0 && (job.has_create_time() || !submit)) {
    op->job_blob = job.SerializeAsString();  // The common case needs no copy.
    op->create_time_us = ToMicros(job.create_time());
    if (submit) op->job = job;
    return;
  }
  v1::Job copy = job;
  copy.clear_events();
  copy.set_queue_position(0);
  if (submit && !copy.has_create_time()) {
    SetTime(absl::FromUnixMicros(op->now_us), copy.mutable_create_time());
  }
  op->create_time_us = ToMicros(copy.create_time());
  op->job_blob = copy.SerializeAsString();
  if (submit) op->job = std::move(copy);
}

absl::Status Closed(const std::string& path) {
  return absl::UnavailableError(absl::StrCat("job store ", path, " is closed"));
}

}  // namespace

std::string JobKind(const v1::JobSpec& spec) {
  // The name of the field set in the spec's `work` oneof: every kind is stored without the store
  // knowing it.
  const google::protobuf::OneofDescriptor* work = spec.GetDescriptor()->FindOneofByName("work");
  const google::protobuf::FieldDescriptor* field =
      work == nullptr ? nullptr : spec.GetReflection()->GetOneofFieldDescriptor(spec, work);
  return field == nullptr ? "none" : field->name();
}

JobStore::JobStore(std::string path, const JobStoreOptions& options)
    : path_(std::move(path)), options_(options) {}

JobStore::~JobStore() { Close().IgnoreError(); }

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path,
                                                         const JobStoreOptions& options) {
  if (path.empty()) return absl::InvalidArgumentError("job store path is empty");
  if (options.read_connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat("job store ", path, ": read_connections ",
                                                   options.read_connections, " must be >= 1"));
  }
  if (options.max_batch_writes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("job store ", path, ": max_batch_writes ",
                                                   options.max_batch_writes, " must be >= 1"));
  }
  if (options.wal_checkpoint_pages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("job store ", path, ": wal_checkpoint_pages ",
                                                   options.wal_checkpoint_pages, " must be >= 1"));
  }
  if (options.busy_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("job store ", path, ": busy_timeout ",
                                                   absl::FormatDuration(options.busy_timeout),
                                                   " must be >= 0"));
  }
  std::unique_ptr<JobStore> store(new JobStore(path, options));
  absl::Status s = store->OpenImpl();
  if (!s.ok()) return s;  // ~JobStore releases whatever OpenImpl got.
  return store;
}

absl::Status JobStore::OpenImpl() {
  // The files first (store_files.h), then what is in the database (store_schema.h), in this order:
  // nothing is written into an existing database before it is known to be a job store.
  if (absl::Status s = CreateParentDirectories(path_); !s.ok()) return s;
  absl::StatusOr<int> lock_fd = LockStore(path_);
  if (!lock_fd.ok()) return lock_fd.status();
  lock_fd_ = *lock_fd;
  if (absl::Status s = CreateDatabaseFile(path_); !s.ok()) return s;

  auto writer =
      SqliteDb::Open(path_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, options_.busy_timeout);
  if (!writer.ok()) return writer.status();
  writer_db_ = std::move(*writer);
  SqliteDb* db = writer_db_.get();

  absl::Status s = CheckIsJobStore(db);
  if (!s.ok()) return s;
  s = MakeStoreFilesPrivate(path_);
  if (!s.ok()) return s;
  if (options_.check_integrity_on_open) {
    s = CheckIntegrity(db);
    if (!s.ok()) return s;
  }
  s = ConfigureWriter(db);
  if (!s.ok()) return s;
  s = Migrate(db);
  if (!s.ok()) return s;
  s = SyncParentDirectory(path_);
  if (!s.ok()) return s;

  {
    Query q(db, "SELECT COALESCE(MAX(submit_seq), 0) FROM jobs");
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    last_submit_seq_ = q.ColInt(0);
  }

  // Replaces SQLite's automatic checkpoint, which would run inside a COMMIT and make that batch's
  // callers wait for the main file's writes and fsync.
  sqlite3_wal_hook(
      db->raw(),
      [](void* arg, sqlite3*, const char*, int pages) {
        *static_cast<int*>(arg) = pages;
        return SQLITE_OK;
      },
      &wal_pages_after_commit_);
  auto checkpoint_db = SqliteDb::Open(path_, SQLITE_OPEN_READWRITE, options_.busy_timeout);
  if (!checkpoint_db.ok()) return checkpoint_db.status();
  checkpoint_db_ = std::move(*checkpoint_db);
  {
    // A connection that has never read the file has not opened the WAL, and SQLite then treats a
    // checkpoint on it as a no-op that succeeds.
    Query q(checkpoint_db_.get(), "SELECT COUNT(*) FROM schema_version");
    s = q.Run();
    if (!s.ok()) return s;
  }

  {
    absl::MutexLock l(&pool_mu_);
    for (int i = 0; i < options_.read_connections; ++i) {
      auto reader = SqliteDb::Open(path_, SQLITE_OPEN_READWRITE, options_.busy_timeout);
      if (!reader.ok()) return reader.status();
      s = (*reader)->Exec("PRAGMA query_only = ON");
      if (!s.ok()) return s;
      free_readers_.push_back(reader->get());
      readers_.push_back(std::move(*reader));
    }
  }

  writer_ = std::thread([this] { WriterLoop(); });
  checkpointer_ = std::thread([this] { CheckpointLoop(); });
  return absl::OkStatus();
}

absl::Status JobStore::Close() {
  absl::MutexLock close_lock(&close_mu_);
  if (closed_) {
    absl::MutexLock l(&mu_);
    return write_error_;
  }
  closed_ = true;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();  // The writer drains pending_ first.
  {
    absl::MutexLock l(&mu_);
    stop_checkpointer_ = true;
  }
  if (checkpointer_.joinable()) checkpointer_.join();
  checkpoint_db_.reset();
  {
    absl::MutexLock l(&pool_mu_);
    readers_closed_ = true;
    auto all_back = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu_) {
      return free_readers_.size() == readers_.size();
    };
    pool_mu_.Await(absl::Condition(&all_back));
    free_readers_.clear();
    readers_.clear();
  }
  writer_db_.reset();  // The last connection checkpoints the WAL into the main file.
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);  // Releases the flock.
    lock_fd_ = -1;
  }
  absl::MutexLock l(&mu_);
  return write_error_;
}

absl::Status JobStore::Health() {
  absl::MutexLock l(&mu_);
  if (stopping_) return Closed(path_);
  return write_error_;
}

JobStoreStats JobStore::Stats() {
  absl::MutexLock l(&mu_);
  return stats_;
}

// ---- Writes -------------------------------------------------------------------------------------

absl::StatusOr<SubmitOutcome> JobStore::Submit(const v1::Job& job,
                                               const v1::JobEvent& submitted_event) {
  if (job.job_id().empty()) return absl::InvalidArgumentError("Submit: job_id is empty");
  if (job.idempotency_key().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Submit: job ", job.job_id(), " has an empty idempotency_key"));
  }
  if (job.state() != v1::JOB_STATE_QUEUED) {
    return absl::InvalidArgumentError(absl::StrCat("Submit: job ", job.job_id(), " is ",
                                                   StateName(job.state()),
                                                   "; a new job must be queued"));
  }
  WriteOp op;
  op.kind = WriteOp::Kind::kSubmit;
  op.now_us = absl::ToUnixMicros(absl::Now());
  absl::Status s = PrepareEvent(job, submitted_event, &op);
  if (!s.ok()) return s;
  op.event.set_seq(1);
  op.event_blob = op.event.SerializeAsString();
  PrepareJob(job, &op);

  Enqueue(&op);
  if (!op.status.ok()) return op.status;
  return std::move(op.submit);
}

absl::StatusOr<int64_t> JobStore::Update(const v1::Job& job, v1::JobEvent event) {
  if (job.job_id().empty()) return absl::InvalidArgumentError("Update: job_id is empty");
  WriteOp op;
  op.kind = WriteOp::Kind::kUpdate;
  op.now_us = absl::ToUnixMicros(absl::Now());
  absl::Status s = PrepareEvent(job, event, &op);
  if (!s.ok()) return s;
  PrepareJob(job, &op);

  Enqueue(&op);
  if (!op.status.ok()) return op.status;
  return op.event_seq;
}

absl::Status JobStore::Probe() {
  WriteOp op;
  op.kind = WriteOp::Kind::kProbe;
  Enqueue(&op);
  return op.status;
}

void JobStore::Enqueue(WriteOp* op) {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) {
      op->status = Closed(path_);
      return;
    }
    if (!write_error_.ok() && op->kind != WriteOp::Kind::kProbe) {
      op->status = write_error_;
      return;
    }
    pending_.push_back(op);
  }
  op->done.WaitForNotification();
}

bool JobStore::WriterHasWork() const { return stopping_ || !pending_.empty(); }

void JobStore::WriterLoop() {
  std::vector<WriteOp*> batch;
  for (;;) {
    batch.clear();
    bool catch_up = false;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &JobStore::WriterHasWork));
      if (pending_.empty()) return;  // stopping_ and drained.
      while (!pending_.empty() && static_cast<int>(batch.size()) < options_.max_batch_writes) {
        batch.push_back(pending_.front());
        pending_.pop_front();
      }
      catch_up = catch_up_pending_;
    }
    if (catch_up) {
      // Copies only what was committed since the background pass, so the WAL is fully copied when
      // the BEGIN below runs and SQLite starts it over from its first frame.
      int rc = sqlite3_wal_checkpoint_v2(writer_db_->raw(), nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                         nullptr, nullptr);
      absl::MutexLock l(&mu_);
      catch_up_pending_ = false;
      if (rc == SQLITE_OK) {
        ++stats_.checkpoints;
      } else {
        ++stats_.checkpoint_failures;
      }
    }
    CommitBatch(batch);
  }
}

void JobStore::CommitBatch(const std::vector<WriteOp*>& batch) {
  absl::Status sticky;
  {
    absl::MutexLock l(&mu_);
    sticky = write_error_;
  }
  std::vector<WriteOp*> ops = batch;
  if (!sticky.ok()) {
    // Writes queued before the failure get its error; only probes may try the file again.
    std::vector<WriteOp*> probes;
    for (WriteOp* op : batch) {
      if (op->kind == WriteOp::Kind::kProbe) {
        probes.push_back(op);
      } else {
        op->status = sticky;
        op->done.Notify();
      }
    }
    if (probes.empty()) return;
    ops = std::move(probes);
  }
  auto answer_ops = [&ops](const absl::Status& status) {
    for (WriteOp* op : ops) {
      op->status = status;
      op->done.Notify();
    }
  };

  SqliteDb* db = writer_db_.get();
  // Single statements through the statement cache: parsing them per write would cost more than the
  // writes themselves.
  auto run = [db](const char* sql) { return Query(db, sql).Run(); };
  Query begin(db, "BEGIN IMMEDIATE");
  absl::Status s = begin.Run();
  if (!s.ok()) {
    // Nothing was written (someone outside this JobStore holds the write lock, or the file cannot
    // be locked for writing): these writes fail; a lock held elsewhere leaves the store usable,
    // while a file that cannot be written at all fails a probe and makes the store unhealthy.
    absl::Status err = absl::UnavailableError(s.message());
    if (!sticky.ok() || std::any_of(ops.begin(), ops.end(), [](const WriteOp* op) {
          return op->kind == WriteOp::Kind::kProbe;
        })) {
      absl::MutexLock l(&mu_);
      const int rc = begin.rc() & 0xff;
      if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) write_error_ = err;
    }
    answer_ops(err);
    return;
  }
  int64_t next_submit_seq = last_submit_seq_;
  for (WriteOp* op : ops) {
    s = run("SAVEPOINT write_op");
    if (!s.ok()) break;
    switch (op->kind) {
      case WriteOp::Kind::kSubmit:
        s = ApplySubmit(op, &next_submit_seq);
        break;
      case WriteOp::Kind::kUpdate:
        s = ApplyUpdate(op);
        break;
      case WriteOp::Kind::kProbe:
        s = ApplyProbe();
        break;
      case WriteOp::Kind::kDelete:
        s = ApplyDelete(op);
        break;
    }
    if (!s.ok()) break;
    if (!op->status.ok()) {
      s = run("ROLLBACK TO write_op");
      if (!s.ok()) break;
    }
    s = run("RELEASE write_op");
    if (!s.ok()) break;
  }
  if (s.ok()) s = run("COMMIT");
  if (!s.ok()) {
    if (sqlite3_get_autocommit(db->raw()) == 0) db->Exec("ROLLBACK").IgnoreError();
    absl::Status err = absl::UnavailableError(
        absl::StrCat(s.message(), "; the store refuses writes until a probe write succeeds again"));
    {
      absl::MutexLock l(&mu_);
      write_error_ = err;
      ++stats_.failed_transactions;
    }
    answer_ops(err);
    return;
  }
  last_submit_seq_ = next_submit_seq;
  {
    absl::MutexLock l(&mu_);
    if (!write_error_.ok()) ++stats_.recoveries;
    write_error_ = absl::OkStatus();  // A probe committed: the file takes writes again.
    wal_pages_ = wal_pages_after_commit_;
    ++stats_.transactions;
    stats_.writes += static_cast<int64_t>(ops.size());
    stats_.largest_batch = std::max<int64_t>(stats_.largest_batch, ops.size());
    stats_.last_commit = absl::Now();
  }
  for (WriteOp* op : ops) op->done.Notify();
}

absl::StatusOr<v1::Job> JobStore::Delete(absl::string_view job_id) {
  WriteOp op;
  op.kind = WriteOp::Kind::kDelete;
  op.job_id = std::string(job_id);
  Enqueue(&op);
  if (!op.status.ok()) return op.status;
  return std::move(op.submit.job);
}

absl::Status JobStore::ApplyDelete(WriteOp* op) {
  SqliteDb* db = writer_db_.get();
  {
    Query q(db, "SELECT job, state FROM jobs WHERE job_id = ?1");
    absl::StatusOr<bool> row = q.Text(op->job_id).Step();
    if (!row.ok()) return row.status();
    if (!*row) {
      op->status = absl::NotFoundError(absl::StrCat("job \"", op->job_id, "\" not found"));
      return absl::OkStatus();
    }
    const auto state = static_cast<v1::JobState>(q.ColInt(1));
    if (!IsTerminal(state)) {
      op->status = absl::FailedPreconditionError(
          absl::StrCat("job ", op->job_id, " is ", StateName(state),
                       "; only finished jobs (succeeded, failed, cancelled) can be deleted"));
      return absl::OkStatus();
    }
    absl::string_view blob = q.ColBlob(0);
    op->submit.job.ParseFromArray(blob.data(), static_cast<int>(blob.size()));
  }
  for (const char* sql :
       {"DELETE FROM events WHERE job_id = ?1", "DELETE FROM jobs WHERE job_id = ?1"}) {
    Query q(db, sql);
    absl::Status s = q.Text(op->job_id).Run();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status JobStore::ApplyProbe() {
  // The header's user_version is not used by the schema: bumping it writes page 1 and commits like
  // any write (the WAL frame and its fsync), without touching a job.
  ++probe_count_;
  const std::string sql = absl::StrCat("PRAGMA user_version = ", probe_count_ % 1000000000);
  return writer_db_->Exec(sql.c_str());
}

bool JobStore::CheckpointerHasWork() const {
  return stop_checkpointer_ || (wal_pages_ >= options_.wal_checkpoint_pages && !catch_up_pending_);
}

void JobStore::CheckpointLoop() {
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &JobStore::CheckpointerHasWork));
      if (stop_checkpointer_) return;
    }
    // PASSIVE: copies what it can without blocking the writer or readers. The writer keeps
    // committing meanwhile, so the WAL is never completely copied at the moment the writer starts
    // its next transaction, which is when SQLite restarts the WAL: the writer finishes the job
    // (see WriterLoop). Whatever could not be copied is retried after the next commit.
    int rc = sqlite3_wal_checkpoint_v2(checkpoint_db_->raw(), nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                       nullptr, nullptr);
    absl::MutexLock l(&mu_);
    wal_pages_ = 0;
    if (rc == SQLITE_OK) {
      ++stats_.checkpoints;
      catch_up_pending_ = true;
    } else {
      ++stats_.checkpoint_failures;
    }
  }
}

absl::Status JobStore::ApplySubmit(WriteOp* op, int64_t* next_submit_seq) {
  SqliteDb* db = writer_db_.get();
  {
    Query q(db, "SELECT job_id, spec_hash, job, submit_seq FROM jobs WHERE idempotency_key = ?1");
    absl::StatusOr<bool> row = q.Text(op->idempotency_key).Step();
    if (!row.ok()) return row.status();
    if (*row) {
      const std::string existing_id(q.ColText(0));
      v1::Job existing;
      if (q.ColText(1) == op->spec_hash) {
        absl::string_view blob = q.ColBlob(2);
        if (!existing.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
          op->status = absl::DataLossError(absl::StrCat("job store ", path_, ": job ", existing_id,
                                                        " holds an unreadable Job (", blob.size(),
                                                        " bytes)"));
          return absl::OkStatus();
        }
        if (SpecBlob(existing.has_requested_spec() ? existing.requested_spec() : existing.spec()) ==
            op->spec_blob) {
          op->submit.job = std::move(existing);
          op->submit.submit_seq = q.ColInt(3);
          op->submit.created = false;
          return absl::OkStatus();
        }
      }
      op->status = absl::AlreadyExistsError(
          absl::StrCat("idempotency key \"", op->raw_idempotency_key, "\" is already used by job ",
                       existing_id, " with a different spec"));
      return absl::OkStatus();
    }
  }
  {
    Query q(db, "SELECT idempotency_key FROM jobs WHERE job_id = ?1");
    absl::StatusOr<bool> row = q.Text(op->job_id).Step();
    if (!row.ok()) return row.status();
    if (*row) {
      op->status = absl::AlreadyExistsError(absl::StrCat(
          "job id ", op->job_id, " is already taken by the job of key \"", q.ColText(0), "\""));
      return absl::OkStatus();
    }
  }
  const int64_t seq = *next_submit_seq + 1;
  {
    Query q(db,
            "INSERT INTO jobs (job_id, idempotency_key, spec_hash, state, tenant, kind, priority,"
            " submit_seq, create_time_us, update_time_us, job)"
            " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)");
    absl::Status s = q.Text(op->job_id)
                         .Text(op->idempotency_key)
                         .Text(op->spec_hash)
                         .Int(op->state)
                         .Text(op->tenant)
                         .Text(op->kind_name)
                         .Int(op->priority)
                         .Int(seq)
                         .Int(op->create_time_us)
                         .Int(ToMicros(op->event.time()))
                         .Blob(op->job_blob)
                         .Run();
    if (!s.ok()) {
      if (!IsStatementLevel(q.rc())) return s;
      op->status = s;
      return absl::OkStatus();
    }
  }
  {
    Query q(db, "INSERT INTO events (job_id, seq, time_us, event) VALUES (?1, 1, ?2, ?3)");
    absl::Status s = q.Text(op->job_id).Int(ToMicros(op->event.time())).Blob(op->event_blob).Run();
    if (!s.ok()) {
      if (!IsStatementLevel(q.rc())) return s;
      op->status = s;
      return absl::OkStatus();
    }
  }
  *next_submit_seq = seq;
  op->submit.job = std::move(op->job);
  op->submit.submit_seq = seq;
  op->submit.created = true;
  return absl::OkStatus();
}

absl::Status JobStore::ApplyUpdate(WriteOp* op) {
  SqliteDb* db = writer_db_.get();
  int64_t last_seq = 0;
  {
    Query q(db,
            "SELECT state, idempotency_key, spec_hash,"
            " (SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?1)"
            " FROM jobs WHERE job_id = ?1");
    absl::StatusOr<bool> row = q.Text(op->job_id).Step();
    if (!row.ok()) return row.status();
    if (!*row) {
      op->status = absl::NotFoundError(absl::StrCat("job ", op->job_id, " not found"));
      return absl::OkStatus();
    }
    const auto stored_state = static_cast<v1::JobState>(q.ColInt(0));
    absl::Status t = CheckTransition(stored_state, op->state);
    if (!t.ok()) {
      op->status = absl::Status(t.code(), absl::StrCat("job ", op->job_id, ": ", t.message()));
      return absl::OkStatus();
    }
    if (q.ColText(1) != op->idempotency_key) {
      op->status = absl::InvalidArgumentError(
          absl::StrCat("job ", op->job_id, ": idempotency key cannot change (stored \"",
                       q.ColText(1), "\", update has \"", op->idempotency_key, "\")"));
      return absl::OkStatus();
    }
    if (q.ColText(2) != op->spec_hash) {
      op->status = absl::InvalidArgumentError(
          absl::StrCat("job ", op->job_id, ": the spec of a submitted job cannot change"));
      return absl::OkStatus();
    }
    last_seq = q.ColInt(3);
  }
  const int64_t seq = last_seq + 1;
  op->event.set_seq(seq);
  const std::string event_blob = op->event.SerializeAsString();
  {
    Query q(
        db,
        "UPDATE jobs SET state = ?1, tenant = ?2, kind = ?3, priority = ?4, update_time_us = ?5,"
        " job = ?6 WHERE job_id = ?7");
    absl::Status s = q.Int(op->state)
                         .Text(op->tenant)
                         .Text(op->kind_name)
                         .Int(op->priority)
                         .Int(ToMicros(op->event.time()))
                         .Blob(op->job_blob)
                         .Text(op->job_id)
                         .Run();
    if (!s.ok()) {
      if (!IsStatementLevel(q.rc())) return s;
      op->status = s;
      return absl::OkStatus();
    }
  }
  {
    Query q(db, "INSERT INTO events (job_id, seq, time_us, event) VALUES (?1, ?2, ?3, ?4)");
    absl::Status s =
        q.Text(op->job_id).Int(seq).Int(ToMicros(op->event.time())).Blob(event_blob).Run();
    if (!s.ok()) {
      if (!IsStatementLevel(q.rc())) return s;
      op->status = s;
      return absl::OkStatus();
    }
  }
  op->event_seq = seq;
  return absl::OkStatus();
}

// ---- The read pool (the reads themselves are in job_store_reads.cc) -----------------------------

absl::StatusOr<SqliteDb*> JobStore::TakeReader() {
  absl::MutexLock l(&pool_mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu_) {
    return readers_closed_ || !free_readers_.empty();
  };
  pool_mu_.Await(absl::Condition(&ready));
  if (readers_closed_) return Closed(path_);
  SqliteDb* db = free_readers_.back();
  free_readers_.pop_back();
  return db;
}

void JobStore::GiveBack(SqliteDb* db) {
  absl::MutexLock l(&pool_mu_);
  free_readers_.push_back(db);
}

}  // namespace server
}  // namespace dattn
