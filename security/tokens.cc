#include "security/tokens.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "api/tenant.h"

namespace dattn {
namespace security {
namespace {

constexpr absl::Duration kRecheck = absl::Seconds(1);

bool IsHex64(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

struct FileState {
  int64_t mtime_ns = -1;
  int64_t size = -1;
};

absl::StatusOr<FileState> Stat(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " cannot be read"));
  }
  return FileState{static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                   static_cast<int64_t>(st.st_size)};
}

absl::StatusOr<std::map<std::string, Principal>> ReadTable(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::map<std::string, Principal>> table = ParseTokenFile(text.str(), path);
  if (table.ok() && table->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " has no token: nobody could call the coordinator"));
  }
  return table;
}

}  // namespace

const char* RoleName(Role role) { return role == Role::kAdmin ? "admin" : "user"; }

std::string HashToken(absl::string_view token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(token.data(), token.size(), digest, &length, EVP_sha256(), nullptr);
  return absl::StrCat("sha256:", absl::BytesToHexString(absl::string_view(
                                     reinterpret_cast<const char*>(digest), length)));
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("the OS's random number generator failed");
  }
  std::string encoded;
  absl::WebSafeBase64Escape(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)),
                            &encoded);
  return absl::StrCat("dattn_", encoded);
}

absl::StatusOr<std::map<std::string, Principal>> ParseTokenFile(absl::string_view text,
                                                                const std::string& path) {
  std::map<std::string, Principal> table;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat("token file ", path, " line ", line_no, ": ");
    if (fields.size() < 3 || fields.size() > 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected \"sha256:<hex> TENANT user|admin [NAME]\", got ",
                       fields.size(), " field(s)"));
    }
    if (!absl::StartsWith(fields[0], "sha256:") || !IsHex64(fields[0].substr(7))) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          "the first field must be sha256: and 64 lowercase hex digits (the token's hash, "
          "never the token itself)"));
    }
    if (!api::IsTenantName(fields[1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "tenant \"", absl::CHexEscape(fields[1]),
                       "\" must be 1..64 characters of [A-Za-z0-9._-]"));
    }
    Principal p;
    p.tenant = std::string(fields[1]);
    if (fields[2] == "user") {
      p.role = Role::kUser;
    } else if (fields[2] == "admin") {
      p.role = Role::kAdmin;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "role \"", absl::CHexEscape(fields[2]), "\" must be user or admin"));
    }
    p.name = fields.size() == 4 ? std::string(fields[3]) : std::string(fields[0].substr(7, 12));
    if (!table.emplace(std::string(fields[0]), std::move(p)).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the same token hash appears twice"));
    }
  }
  return table;
}

absl::StatusOr<std::unique_ptr<TokenTable>> TokenTable::Load(const std::string& path) {
  std::unique_ptr<TokenTable> table(new TokenTable(path));
  absl::MutexLock lock(&table->mu_);
  absl::StatusOr<FileState> state = Stat(path);
  if (!state.ok()) return state.status();
  absl::StatusOr<std::map<std::string, Principal>> parsed = ReadTable(path);
  if (!parsed.ok()) return parsed.status();
  table->by_hash_ = *std::move(parsed);
  table->mtime_ns_ = state->mtime_ns;
  table->size_ = state->size;
  table->last_check_ = absl::Now();
  return table;
}

absl::Status TokenTable::ReloadIfChangedLocked() {
  const absl::Time now = absl::Now();
  if (now - last_check_ < kRecheck) return absl::OkStatus();
  last_check_ = now;
  absl::StatusOr<FileState> state = Stat(path_);
  if (!state.ok()) return state.status();
  if (state->mtime_ns == mtime_ns_ && state->size == size_) return absl::OkStatus();
  absl::StatusOr<std::map<std::string, Principal>> parsed = ReadTable(path_);
  if (!parsed.ok()) return parsed.status();
  by_hash_ = *std::move(parsed);
  mtime_ns_ = state->mtime_ns;
  size_ = state->size;
  return absl::OkStatus();
}

absl::StatusOr<Principal> TokenTable::Authenticate(absl::string_view token) {
  const std::string hash = HashToken(token);
  absl::MutexLock lock(&mu_);
  absl::Status reloaded = ReloadIfChangedLocked();
  reload_error_ = reloaded.ok() ? "" : std::string(reloaded.message());
  // The table is keyed by hash; the comparison that finds it is over hashes of equal length, so
  // its timing says nothing about the token.
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) {
    return absl::UnauthenticatedError(
        "the bearer token is not known to this coordinator (revoked, mistyped, or for another "
        "cluster)");
  }
  return it->second;
}

std::string TokenTable::reload_error() const {
  absl::MutexLock lock(&mu_);
  return reload_error_;
}

size_t TokenTable::size() const {
  absl::MutexLock lock(&mu_);
  return by_hash_.size();
}

}  // namespace security
}  // namespace dattn
