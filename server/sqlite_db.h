// One SQLite connection with its statements prepared once and kept (SqliteDb), and one execution
// of such a statement (Query): the job store's access to SQLite, and nothing else's.
//
// Errors become absl::Status naming the store's path, what was being done and SQLite's message and
// code: DATA_LOSS for a damaged file or one that is not a database; UNAVAILABLE for what may pass
// or depends on the machine (busy, locked, I/O error, disk full, read-only, out of memory);
// INTERNAL otherwise.
//
// Thread-safety: a SqliteDb and its Queries are used by one thread at a time (the job store lends
// each connection to one caller at a time).
#ifndef DATTN_SERVER_SQLITE_DB_H_
#define DATTN_SERVER_SQLITE_DB_H_

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dattn {
namespace server {
namespace store_internal {

// Whether an error code concerns one statement only (a constraint, a value too big): the
// transaction may go on without that statement.
bool IsStatementLevel(int rc);

// The Status of SQLite code `rc` (with `db`'s message when given) while `doing` on `path`.
absl::Status SqliteStatus(int rc, sqlite3* db, const std::string& path, absl::string_view doing);

// One connection, used by one thread at a time (the JobStore guarantees it), with its statements
// prepared once and kept.
class SqliteDb {
 public:
  static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path, int flags,
                                                        absl::Duration busy_timeout) {
    sqlite3* raw = nullptr;
    int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
    std::unique_ptr<SqliteDb> db(new SqliteDb(raw, path));
    if (rc != SQLITE_OK) return db->Error(rc, "cannot open");
    sqlite3_extended_result_codes(raw, 1);
    rc = sqlite3_busy_timeout(raw, static_cast<int>(absl::ToInt64Milliseconds(busy_timeout)));
    if (rc != SQLITE_OK) return db->Error(rc, "cannot set the busy timeout");
    return db;
  }

  ~SqliteDb() {
    for (auto& [sql, stmt] : cache_) sqlite3_finalize(stmt);
    sqlite3_close(db_);  // Accepts nullptr.
  }

  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  sqlite3* raw() { return db_; }
  const std::string& path() const { return path_; }

  absl::Status Error(int rc, absl::string_view doing) {
    return SqliteStatus(rc, db_, path_, doing);
  }

  // Runs SQL that returns no rows we need (one or more statements).
  absl::Status Exec(const char* sql) {
    int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return Error(rc, sql);
    return absl::OkStatus();
  }

  absl::StatusOr<sqlite3_stmt*> Prepare(absl::string_view sql) {
    auto it = cache_.find(sql);
    if (it != cache_.end()) return it->second;
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) return Error(rc, absl::StrCat("cannot prepare \"", sql, "\""));
    cache_.emplace(std::string(sql), stmt);
    return stmt;
  }

 private:
  SqliteDb(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  sqlite3* db_;
  const std::string path_;
  absl::flat_hash_map<std::string, sqlite3_stmt*> cache_;
};

// One execution of a cached statement. Bound text and blobs are not copied: they must outlive the
// Query. The statement is reset for its next use on destruction.
class Query {
 public:
  Query(SqliteDb* db, absl::string_view sql) : db_(db), sql_(sql) {
    auto stmt = db->Prepare(sql);
    if (stmt.ok()) {
      stmt_ = *stmt;
    } else {
      status_ = stmt.status();
    }
  }
  ~Query() {
    if (stmt_ != nullptr) {
      sqlite3_reset(stmt_);
      sqlite3_clear_bindings(stmt_);
    }
  }
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  Query& Int(int64_t v) {
    if (stmt_ != nullptr) Check(sqlite3_bind_int64(stmt_, ++arg_, v));
    return *this;
  }
  Query& Text(absl::string_view v) {
    if (stmt_ != nullptr) {
      Check(sqlite3_bind_text(stmt_, ++arg_, v.data(), static_cast<int>(v.size()), SQLITE_STATIC));
    }
    return *this;
  }
  Query& Blob(absl::string_view v) {
    if (stmt_ != nullptr) {
      Check(sqlite3_bind_blob64(stmt_, ++arg_, v.data(), v.size(), SQLITE_STATIC));
    }
    return *this;
  }

  // True when a row is ready, false when the statement is done.
  absl::StatusOr<bool> Step() {
    if (!status_.ok()) return status_;
    rc_ = sqlite3_step(stmt_);
    if (rc_ == SQLITE_ROW) return true;
    if (rc_ == SQLITE_DONE) return false;
    status_ = db_->Error(rc_, sql_);
    return status_;
  }

  // Steps until done, ignoring rows.
  absl::Status Run() {
    for (;;) {
      absl::StatusOr<bool> row = Step();
      if (!row.ok()) return row.status();
      if (!*row) return absl::OkStatus();
    }
  }

  int64_t ColInt(int col) { return sqlite3_column_int64(stmt_, col); }
  absl::string_view ColText(int col) {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return absl::string_view(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col));
  }
  absl::string_view ColBlob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return absl::string_view(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col));
  }

  int rc() const { return rc_; }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && status_.ok()) {
      rc_ = rc;
      status_ = db_->Error(rc, absl::StrCat("cannot bind argument ", arg_, " of ", sql_));
    }
  }

  SqliteDb* db_;
  absl::string_view sql_;
  sqlite3_stmt* stmt_ = nullptr;
  absl::Status status_;
  int arg_ = 0;
  int rc_ = SQLITE_OK;
};

}  // namespace store_internal
}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_SQLITE_DB_H_
