// Bearer tokens: who a client is. A token file (in Kubernetes, a mounted Secret) maps the SHA-256
// of each token to a tenant and a role; the tokens themselves are never stored, so a leaked file
// grants nothing. The coordinator reads the file at start and again whenever it changes (checked at
// most once a second, on the next call): adding or revoking a token needs no restart. A file that
// became malformed is not taken: the last good table stays in force and the error is kept for the
// log (reload_error).
//
// File format, one token per line; '#' starts a comment; fields separated by spaces:
//
//   sha256:<64 hex digits of the token's SHA-256>  <tenant>  <user|admin>  [name]
//
// tenant: 1..64 characters of [A-Za-z0-9._-] (as JobSpec.tenant). role "user": its own tenant's
// jobs only; "admin": every tenant and AdminService. name: a label for the audit log (default: the
// first 12 hex digits of the hash). `dattn token new` makes a token and prints its line.
//
// Thread-safety: TokenTable is thread-safe.
#ifndef DATTN_SECURITY_TOKENS_H_
#define DATTN_SECURITY_TOKENS_H_

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dattn {
namespace security {

enum class Role { kUser, kAdmin };
const char* RoleName(Role role);

struct Principal {
  std::string tenant;
  Role role = Role::kUser;
  std::string name;  // For the audit log.
};

// "sha256:" + the lowercase hex SHA-256 of `token`.
std::string HashToken(absl::string_view token);

// A new random token ("dattn_" + 43 characters of base64url, 256 bits from the OS's CSPRNG).
absl::StatusOr<std::string> NewToken();

// Parses a token file's text. INVALID_ARGUMENT naming `path`, the line and the bad field.
absl::StatusOr<std::map<std::string, Principal>> ParseTokenFile(absl::string_view text,
                                                                const std::string& path);

class TokenTable {
 public:
  // Reads and parses `path` (INVALID_ARGUMENT as ParseTokenFile, or naming an unreadable file). An
  // empty table is an error: nobody could call.
  static absl::StatusOr<std::unique_ptr<TokenTable>> Load(const std::string& path);

  // The principal of `token` (the bearer token, without "Bearer "). UNAUTHENTICATED when it is
  // not in the table. Re-reads the file first when it changed (at most once a second).
  absl::StatusOr<Principal> Authenticate(absl::string_view token);

  // Non-empty when the last re-read failed (the previous table is in force).
  std::string reload_error() const;
  size_t size() const;

 private:
  explicit TokenTable(std::string path) : path_(std::move(path)) {}
  absl::Status ReloadIfChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::map<std::string, Principal> by_hash_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t size_ ABSL_GUARDED_BY(mu_) = -1;
  std::string reload_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace security
}  // namespace dattn

#endif  // DATTN_SECURITY_TOKENS_H_
