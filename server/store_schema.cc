#include "server/store_schema.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace dattn {
namespace server {
namespace store_internal {

namespace {

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
    // Version 3: idempotency keys per tenant ("TENANT/KEY", ScopedIdempotencyKey in job_store.h);
    // the tenant column already holds "default" for an empty spec.tenant.
    "UPDATE jobs SET idempotency_key = tenant || '/' || idempotency_key;",
};
constexpr int kSchemaVersion = sizeof(kMigrations) / sizeof(kMigrations[0]);

}  // namespace

absl::Status CheckIsJobStore(SqliteDb* db) {
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
        absl::StrCat("job store ", db->path(),
                     " is an SQLite database but not a job store (no schema_version table)"));
  }
  return absl::OkStatus();
}

absl::Status CheckIntegrity(SqliteDb* db) {
  Query q(db, "PRAGMA quick_check");
  std::vector<std::string> problems;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    if (q.ColText(0) != "ok" && problems.size() < 5) problems.emplace_back(q.ColText(0));
  }
  if (!problems.empty()) {
    return absl::DataLossError(absl::StrCat(
        "job store ", db->path(), " is damaged: quick_check says ", absl::StrJoin(problems, "; ")));
  }
  return absl::OkStatus();
}

absl::Status ConfigureWriter(SqliteDb* db) {
  {
    Query q(db, "PRAGMA journal_mode = WAL");
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row || q.ColText(0) != "wal") {
      return absl::UnavailableError(absl::StrCat("job store ", db->path(),
                                                 ": cannot switch to WAL journal mode (got \"",
                                                 *row ? std::string(q.ColText(0)) : "", "\")"));
    }
  }
  // journal_size_limit: a WAL that grew large (big results) is cut back when it restarts.
  absl::Status s = db->Exec(
      "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA journal_size_limit = 67108864;");
  if (!s.ok()) return s;
  // Both pragmas are silently ignored in some builds or states (e.g. foreign_keys inside a
  // transaction); the durability promise depends on them, so read them back.
  Query q1(db, "PRAGMA synchronous");
  absl::StatusOr<bool> row = q1.Step();
  if (!row.ok()) return row.status();
  if (!*row || q1.ColInt(0) != 2) {
    return absl::InternalError(
        absl::StrCat("job store ", db->path(), ": synchronous=FULL did not stick"));
  }
  Query q2(db, "PRAGMA foreign_keys");
  row = q2.Step();
  if (!row.ok()) return row.status();
  if (!*row || q2.ColInt(0) != 1) {
    return absl::InternalError(
        absl::StrCat("job store ", db->path(), ": foreign_keys=ON did not stick"));
  }
  return absl::OkStatus();
}

absl::Status Migrate(SqliteDb* db) {
  // One transaction brings the file from its version to kSchemaVersion.
  absl::Status s = db->Exec("BEGIN IMMEDIATE");
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
    return absl::FailedPreconditionError(
        absl::StrCat("job store ", db->path(), " has schema version ", version,
                     ", newer than this binary's ", kSchemaVersion));
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
  return absl::OkStatus();
}

}  // namespace store_internal
}  // namespace server
}  // namespace dattn
