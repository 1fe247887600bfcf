// What is inside a job store's SQLite file before the first job is written: the check that a file
// is a job store at all, the integrity check, the writer connection's settings that the durability
// promise rests on, and the schema itself with its migrations. JobStore::OpenImpl (job_store.cc)
// calls these on its writer connection, in the order it documents; nothing else does.
//
// Schema: a `schema_version` table (one row per applied version) marks a job store; the `jobs` and
// `events` tables and their indexes hold the jobs (see store_schema.cc: kMigrations, the only
// place that says what they are). Each schema change is a migration appended to kMigrations and
// applied once, in order, in one transaction; a file whose version is newer than this binary's is
// refused, never changed. The file header's user_version is not part of the schema (the writer's
// probes bump it: JobStore::Probe).
//
// Errors name the store's path: DATA_LOSS for a file that is not a database or is damaged;
// FAILED_PRECONDITION for an SQLite database that is not a job store or has a newer schema;
// UNAVAILABLE or INTERNAL as sqlite_db.h says for SQLite's own errors (and INTERNAL when SQLite
// ignored a setting the store depends on). CheckIsJobStore and CheckIntegrity only read; call the
// others only on a file CheckIsJobStore accepted: ConfigureWriter switches it to the WAL journal
// and Migrate writes the schema.
//
// Thread-safety: each function uses the connection it is given, which the caller lends to it alone
// for the call (sqlite_db.h).
#ifndef DATTN_SERVER_STORE_SCHEMA_H_
#define DATTN_SERVER_STORE_SCHEMA_H_

#include "absl/status/status.h"
#include "server/sqlite_db.h"

namespace dattn {
namespace server {
namespace store_internal {

// Reads the names of the file's tables and writes nothing. OK for an empty database (a new store)
// and for a job store (it has the schema_version table). FAILED_PRECONDITION for an SQLite
// database with other tables and no schema_version table; DATA_LOSS (or UNAVAILABLE) for a file
// that cannot be read as SQLite, its message asking whether it is a job store at all.
absl::Status CheckIsJobStore(SqliteDb* db);

// PRAGMA quick_check: reads the whole file once, so that a damaged file is reported now rather
// than by the first query that touches the damaged page. DATA_LOSS "... is damaged: quick_check
// says ..." with up to five of SQLite's findings.
absl::Status CheckIntegrity(SqliteDb* db);

// Makes `db` the store's writer connection: the WAL journal (UNAVAILABLE if SQLite will not switch
// to it), synchronous=FULL (every commit fsyncs the WAL), foreign keys on, and a journal size
// limit of 64 MiB (a WAL that grew large is cut back when it restarts). synchronous and
// foreign_keys are read back, because SQLite silently ignores them in some builds and states:
// INTERNAL "... did not stick" if one did not take.
absl::Status ConfigureWriter(SqliteDb* db);

// Brings the file to this binary's schema version in one transaction (creating schema_version in
// a new file): applies every migration after the file's version, recording each. The file is
// unchanged on error. FAILED_PRECONDITION "... has schema version N, newer than this binary's M";
// SQLite's errors otherwise (UNAVAILABLE when the file cannot be written or locked).
absl::Status Migrate(SqliteDb* db);

}  // namespace store_internal
}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_STORE_SCHEMA_H_
