#include "server/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/job_state.h"
#include "server/sqlite_db.h"

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
  std::string idempotency_key;
  std::string job_blob;   // Serialized job as stored.
  std::string spec_blob;  // Deterministic serialization of the spec.
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

using store_internal::IsStatementLevel;
using store_internal::Query;
using store_internal::SqliteDb;
using store_internal::WriteOp;

// Schema migrations, applied in order inside one transaction; entry i brings the file to version
// i+1. Never edit a released entry: append a new one.
const char* const kMigrations[] = {
    // Version 1.
    "CREATE TABLE jobs ("
    "  job_id TEXT PRIMARY KEY NOT NULL,"
    "  idempotency_key TEXT NOT NULL UNIQUE,"
    "  spec_hash TEXT NOT NULL,"  // FNV-1a 64 of the deterministic spec serialization.
    "  state INTEGER NOT NULL,"   // v1.JobState.
    "  tenant TEXT NOT NULL,"     // "default" for an empty spec.tenant.
    "  kind TEXT NOT NULL,"       // JobKind(spec).
    "  priority INTEGER NOT NULL,"
    "  submit_seq INTEGER NOT NULL UNIQUE,"
    "  create_time_us INTEGER NOT NULL,"
    "  update_time_us INTEGER NOT NULL,"  // The time of the job's latest event (its writer's
                                          // clock).
    "  job BLOB NOT NULL"                 // Serialized v1.Job without events.
    ");"
    "CREATE INDEX jobs_by_state ON jobs (state, submit_seq);"
    "CREATE INDEX jobs_by_tenant ON jobs (tenant, submit_seq);"
    "CREATE INDEX jobs_by_kind ON jobs (kind, submit_seq);"
    "CREATE TABLE events ("
    "  job_id TEXT NOT NULL REFERENCES jobs (job_id),"
    "  seq INTEGER NOT NULL,"
    "  time_us INTEGER NOT NULL,"
    "  event BLOB NOT NULL,"  // Serialized v1.JobEvent.
    "  PRIMARY KEY (job_id, seq)"
    ") WITHOUT ROWID;",
    // Version 2: finished jobs by the time of their last write, for the retention (ListExpired).
    "CREATE INDEX jobs_by_state_update ON jobs (state, update_time_us);",
};
constexpr int kSchemaVersion = sizeof(kMigrations) / sizeof(kMigrations[0]);

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;
constexpr absl::string_view kPageTokenPrefix = "dattn.jobs.v1:";

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

std::string TenantColumn(const v1::JobSpec& spec) {
  return spec.tenant().empty() ? "default" : spec.tenant();
}

std::string EncodePageToken(int64_t submit_seq) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, submit_seq));
}

absl::StatusOr<int64_t> DecodePageToken(absl::string_view token) {
  auto bad = [token] {
    return absl::InvalidArgumentError(
        absl::StrCat("page token \"", token, "\" is not a token returned by ListJobs"));
  };
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return bad();
  absl::string_view rest = raw;
  int64_t seq = 0;
  if (!absl::ConsumePrefix(&rest, kPageTokenPrefix) || !absl::SimpleAtoi(rest, &seq) || seq < 1) {
    return bad();
  }
  return seq;
}

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
  op->idempotency_key = job.idempotency_key();
  op->state = job.state();
  op->tenant = TenantColumn(job.spec());
  op->kind_name = std::string(JobKind(job.spec()));
  op->priority = job.spec().priority();
  op->spec_blob = SpecBlob(job.spec());
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

namespace {

std::string OctalMode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// mkdir -p with mode 0700 for each directory it creates (chmod'ed, so the umask does not matter).
absl::Status CreatePrivateDirectories(const std::filesystem::path& dir) {
  std::filesystem::path prefix;
  for (const std::filesystem::path& part : dir) {
    prefix /= part;
    if (::mkdir(prefix.c_str(), 0700) == 0) {
      if (::chmod(prefix.c_str(), 0700) != 0) {
        return absl::UnavailableError(absl::StrCat("cannot make directory ", prefix.string(),
                                                   " private: ", std::strerror(errno)));
      }
    } else if (errno != EEXIST) {
      return absl::UnavailableError(
          absl::StrCat("cannot create directory ", prefix.string(), ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// Removes the group and other permission bits of the open file `fd` (named `path` in errors).
absl::Status MakePrivate(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::UnavailableError(
        absl::StrCat("job store file ", path, ": cannot stat it: ", std::strerror(errno)));
  }
  if ((st.st_mode & 077) == 0) return absl::OkStatus();
  if (::fchmod(fd, st.st_mode & 0700) != 0) {
    return absl::UnavailableError(
        absl::StrCat("job store file ", path, " is mode ", OctalMode(st.st_mode),
                     " and cannot be made private: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<std::string> GroupOrWorldAccessWarning(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;
  if ((st.st_mode & 077) == 0) return std::nullopt;
  return absl::StrCat("warning: data dir ", dir, " is mode ", OctalMode(st.st_mode),
                      ": group or others may reach the job history in it (the store's files are "
                      "0600); make it private with: chmod 700 ",
                      dir);
}

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
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) {
    if (absl::Status s = CreatePrivateDirectories(parent); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("job store ", path_, ": ", s.message()));
    }
  }

  // SQLite's own locks would let a second process write the same file; two coordinators
  // interleaving submit sequences would break the FIFO, so one JobStore owns the file at a time.
  const std::string lock_path = path_ + ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("job store ", path_, ": cannot open lock file ",
                                               lock_path, ": ", std::strerror(errno)));
  }
  if (absl::Status s = MakePrivate(lock_fd_, lock_path); !s.ok()) return s;
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("job store ", path_, " is in use by another process or JobStore (",
                       lock_path, " is locked)"));
    }
    return absl::UnavailableError(
        absl::StrCat("job store ", path_, ": cannot lock ", lock_path, ": ", std::strerror(err)));
  }
  // A new database is created here, 0600, rather than by SQLite (0644 less the umask): SQLite gives
  // the WAL and shared-memory files the database file's mode, so they are private too. An existing
  // one is made private below, once it is known to be a job store.
  {
    const int db_fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (db_fd >= 0) {
      absl::Status s = MakePrivate(db_fd, path_);
      ::close(db_fd);
      if (!s.ok()) return s;
    } else if (errno != EEXIST) {
      return absl::UnavailableError(
          absl::StrCat("job store ", path_, ": cannot create it: ", std::strerror(errno)));
    }
  }

  auto writer =
      SqliteDb::Open(path_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, options_.busy_timeout);
  if (!writer.ok()) return writer.status();
  writer_db_ = std::move(*writer);
  SqliteDb* db = writer_db_.get();

  // Read before any write, so that a file that is not a job store is left untouched.
  bool has_version_table = false;
  int64_t other_tables = 0;
  {
    Query q(db, "SELECT name FROM sqlite_master WHERE type = 'table'");
    for (;;) {
      absl::StatusOr<bool> row = q.Step();
      if (!row.ok()) {
        return absl::Status(row.status().code(),
                            absl::StrCat(row.status().message(),
                                         " (is it a job store? it is not a readable SQLite file)"));
      }
      if (!*row) break;
      if (q.ColText(0) == "schema_version") {
        has_version_table = true;
      } else {
        ++other_tables;
      }
    }
  }
  if (!has_version_table && other_tables > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job store ", path_,
                     " is an SQLite database but not a job store (no schema_version table)"));
  }
  // A job store from before its files were private: make them so.
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string file = path_ + suffix;
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // Not there (yet): SQLite creates it with the database's mode.
    absl::Status s = MakePrivate(fd, file);
    ::close(fd);
    if (!s.ok()) return s;
  }

  if (options_.check_integrity_on_open) {
    Query q(db, "PRAGMA quick_check");
    std::vector<std::string> problems;
    for (;;) {
      absl::StatusOr<bool> row = q.Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      if (q.ColText(0) != "ok" && problems.size() < 5) problems.emplace_back(q.ColText(0));
    }
    if (!problems.empty()) {
      return absl::DataLossError(absl::StrCat("job store ", path_, " is damaged: quick_check says ",
                                              absl::StrJoin(problems, "; ")));
    }
  }

  {
    Query q(db, "PRAGMA journal_mode = WAL");
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row || q.ColText(0) != "wal") {
      return absl::UnavailableError(absl::StrCat("job store ", path_,
                                                 ": cannot switch to WAL journal mode (got \"",
                                                 *row ? std::string(q.ColText(0)) : "", "\")"));
    }
  }
  // journal_size_limit: a WAL that grew large (big results) is cut back when it restarts.
  absl::Status s = db->Exec(
      "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA journal_size_limit = 67108864;");
  if (!s.ok()) return s;
  {
    // Both pragmas are silently ignored in some builds or states (e.g. foreign_keys inside a
    // transaction); the durability promise depends on them, so read them back.
    Query q1(db, "PRAGMA synchronous");
    absl::StatusOr<bool> row = q1.Step();
    if (!row.ok()) return row.status();
    if (!*row || q1.ColInt(0) != 2) {
      return absl::InternalError(
          absl::StrCat("job store ", path_, ": synchronous=FULL did not stick"));
    }
    Query q2(db, "PRAGMA foreign_keys");
    row = q2.Step();
    if (!row.ok()) return row.status();
    if (!*row || q2.ColInt(0) != 1) {
      return absl::InternalError(
          absl::StrCat("job store ", path_, ": foreign_keys=ON did not stick"));
    }
  }

  // Migrations: one transaction brings the file from its version to kSchemaVersion.
  s = db->Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  auto rollback = absl::MakeCleanup([db] { db->Exec("ROLLBACK").IgnoreError(); });
  s = db->Exec(
      "CREATE TABLE IF NOT EXISTS schema_version ("
      "  version INTEGER PRIMARY KEY NOT NULL,"
      "  applied_time_us INTEGER NOT NULL)");
  if (!s.ok()) return s;
  int64_t version = 0;
  {
    Query q(db, "SELECT COALESCE(MAX(version), 0) FROM schema_version");
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    version = q.ColInt(0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("job store ", path_, " has schema version ",
                                                      version, ", newer than this binary's ",
                                                      kSchemaVersion));
  }
  for (int64_t v = version + 1; v <= kSchemaVersion; ++v) {
    s = db->Exec(kMigrations[v - 1]);
    if (!s.ok()) return s;
    Query q(db, "INSERT INTO schema_version (version, applied_time_us) VALUES (?1, ?2)");
    s = q.Int(v).Int(absl::ToUnixMicros(absl::Now())).Run();
    if (!s.ok()) return s;
  }
  s = db->Exec("COMMIT");
  if (!s.ok()) return s;
  std::move(rollback).Cancel();
  // SQLite syncs the directory when it creates the WAL but not when it creates the main file: sync
  // it once here, so a new store's file name survives a power loss along with its first commits.
  {
    const std::string dir = parent.empty() ? "." : parent.string();
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
      const int err = errno;
      if (dir_fd >= 0) ::close(dir_fd);
      return absl::UnavailableError(absl::StrCat("job store ", path_, ": cannot sync directory ",
                                                 dir, ": ", std::strerror(err)));
    }
    ::close(dir_fd);
  }

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

absl::StatusOr<std::vector<std::string>> JobStore::ListExpired(absl::Time before, int limit) {
  if (limit < 1) return absl::InvalidArgumentError(absl::StrCat("limit ", limit, " must be >= 1"));
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db,
          "SELECT job_id FROM jobs WHERE state IN (?1, ?2, ?3) AND update_time_us < ?4 "
          "ORDER BY update_time_us LIMIT ?5");
  q.Int(v1::JOB_STATE_SUCCEEDED)
      .Int(v1::JOB_STATE_FAILED)
      .Int(v1::JOB_STATE_CANCELLED)
      .Int(absl::ToUnixMicros(before))
      .Int(limit);
  std::vector<std::string> ids;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    ids.emplace_back(q.ColText(0));
  }
  return ids;
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
        if (SpecBlob(existing.spec()) == op->spec_blob) {
          op->submit.job = std::move(existing);
          op->submit.submit_seq = q.ColInt(3);
          op->submit.created = false;
          return absl::OkStatus();
        }
      }
      op->status = absl::AlreadyExistsError(absl::StrCat("idempotency key \"", op->idempotency_key,
                                                         "\" is already used by job ", existing_id,
                                                         " with a different spec"));
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

// ---- Reads --------------------------------------------------------------------------------------

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

absl::StatusOr<StoredJob> JobStore::RowToJob(SqliteDb* db, absl::string_view blob,
                                             int64_t submit_seq) {
  StoredJob out;
  out.submit_seq = submit_seq;
  if (!out.job.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError(absl::StrCat("job store ", db->path(), ": the job of submit_seq ",
                                            submit_seq, " is unreadable (", blob.size(),
                                            " bytes)"));
  }
  return out;
}

absl::StatusOr<StoredJob> JobStore::GetOne(absl::string_view sql, absl::string_view what,
                                           absl::string_view value) {
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db, sql);
  absl::StatusOr<bool> row = q.Text(value).Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(what, " \"", value, "\" not found"));
  return RowToJob(*db, q.ColBlob(0), q.ColInt(1));
}

absl::StatusOr<StoredJob> JobStore::GetJob(absl::string_view job_id) {
  return GetOne("SELECT job, submit_seq FROM jobs WHERE job_id = ?1", "job", job_id);
}

absl::StatusOr<StoredJob> JobStore::GetJobByKey(absl::string_view idempotency_key) {
  return GetOne("SELECT job, submit_seq FROM jobs WHERE idempotency_key = ?1",
                "job with idempotency key", idempotency_key);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::Events(absl::string_view job_id,
                                                           int64_t after_seq, int limit) {
  if (after_seq < 0) {
    return absl::InvalidArgumentError(absl::StrCat("after_seq ", after_seq, " must be >= 0"));
  }
  if (limit < 0) return absl::InvalidArgumentError(absl::StrCat("limit ", limit, " must be >= 0"));
  return ReadEvents(job_id, after_seq, limit, /*latest=*/false);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::LatestEvents(absl::string_view job_id,
                                                                 int limit) {
  if (limit < 1) return absl::InvalidArgumentError(absl::StrCat("limit ", limit, " must be >= 1"));
  return ReadEvents(job_id, 0, limit, /*latest=*/true);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::ReadEvents(absl::string_view job_id,
                                                               int64_t after_seq, int limit,
                                                               bool latest) {
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  std::vector<v1::JobEvent> events;
  {
    // The latest `limit`: the newest first from the (job_id, seq) key, reordered below.
    Query q(*db, latest ? "SELECT event FROM events WHERE job_id = ?1 AND seq > ?2 "
                          "ORDER BY seq DESC LIMIT ?3"
                        : "SELECT event FROM events WHERE job_id = ?1 AND seq > ?2 "
                          "ORDER BY seq LIMIT ?3");
    q.Text(job_id).Int(after_seq).Int(limit == 0 ? -1 : limit);
    for (;;) {
      absl::StatusOr<bool> row = q.Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      absl::string_view blob = q.ColBlob(0);
      if (!events.emplace_back().ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
        return absl::DataLossError(absl::StrCat("job store ", path_, ": an event of job ", job_id,
                                                " is unreadable (", blob.size(), " bytes)"));
      }
    }
  }
  if (events.empty()) {
    // Tell "no such job" from "no new events"; every stored job has at least its submitted event.
    Query q(*db, "SELECT 1 FROM jobs WHERE job_id = ?1");
    absl::StatusOr<bool> row = q.Text(job_id).Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
  }
  if (latest) std::reverse(events.begin(), events.end());
  return events;
}

absl::StatusOr<ListPage> JobStore::List(const ListFilter& filter, int page_size,
                                        absl::string_view page_token) {
  if (page_size == 0) page_size = kDefaultPageSize;
  if (page_size < 1 || page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size ", page_size, " is outside 1 .. ", kMaxPageSize));
  }
  int64_t before = std::numeric_limits<int64_t>::max();
  if (!page_token.empty()) {
    absl::StatusOr<int64_t> seq = DecodePageToken(page_token);
    if (!seq.ok()) return seq.status();
    before = *seq;
  }
  std::set<int> states;
  for (v1::JobState st : filter.states) {
    if (st == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(st)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state filter ", static_cast<int>(st), " is not a job state"));
    }
    states.insert(st);
  }
  // Only the shape of the query varies (which filters are present), so the statement cache stays
  // small; values are always bound.
  std::string sql = "SELECT job, submit_seq FROM jobs WHERE submit_seq < ?";
  if (!states.empty()) {
    absl::StrAppend(&sql, " AND state IN (",
                    absl::StrJoin(std::vector<std::string>(states.size(), "?"), ","), ")");
  }
  if (!filter.tenant.empty()) absl::StrAppend(&sql, " AND tenant = ?");
  if (!filter.kind.empty()) absl::StrAppend(&sql, " AND kind = ?");
  absl::StrAppend(&sql, " ORDER BY submit_seq DESC LIMIT ?");

  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db, sql);
  q.Int(before);
  for (int st : states) q.Int(st);
  if (!filter.tenant.empty()) q.Text(filter.tenant);
  if (!filter.kind.empty()) q.Text(filter.kind);
  q.Int(page_size + 1);  // One more row tells whether a next page exists.
  ListPage page;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = EncodePageToken(page.jobs.back().submit_seq);
      break;
    }
    absl::StatusOr<StoredJob> job = RowToJob(*db, q.ColBlob(0), q.ColInt(1));
    if (!job.ok()) return job.status();
    page.jobs.push_back(*std::move(job));
  }
  return page;
}

absl::StatusOr<std::vector<StoredJob>> JobStore::LoadActive() {
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db,
          "SELECT job, submit_seq FROM jobs WHERE state NOT IN (?1, ?2, ?3) ORDER BY submit_seq");
  q.Int(v1::JOB_STATE_SUCCEEDED).Int(v1::JOB_STATE_FAILED).Int(v1::JOB_STATE_CANCELLED);
  std::vector<StoredJob> jobs;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    absl::StatusOr<StoredJob> job = RowToJob(*db, q.ColBlob(0), q.ColInt(1));
    if (!job.ok()) return job.status();
    jobs.push_back(*std::move(job));
  }
  return jobs;
}

absl::StatusOr<std::map<v1::JobState, int64_t>> JobStore::CountByState() {
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
  std::map<v1::JobState, int64_t> counts;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    counts[static_cast<v1::JobState>(q.ColInt(0))] = q.ColInt(1);
  }
  return counts;
}

}  // namespace server
}  // namespace dattn
