#include "server/sqlite_db.h"

#include "absl/strings/str_cat.h"

namespace dattn {
namespace server {
namespace store_internal {

bool IsStatementLevel(int rc) {
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_TOOBIG:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
      return true;
    default:
      return false;
  }
}

absl::Status SqliteStatus(int rc, sqlite3* db, const std::string& path, absl::string_view doing) {
  const char* detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string msg =
      absl::StrCat("job store ", path, ": ", doing, ": ", detail, " (sqlite code ", rc, ")");
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(msg);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_PROTOCOL:
    case SQLITE_NOMEM:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace store_internal
}  // namespace server
}  // namespace dattn
