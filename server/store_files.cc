#include "server/store_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/job_store.h"

namespace dattn {
namespace server {

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

// Declared in job_store.h (the coordinator calls it for its data dir).
std::optional<std::string> GroupOrWorldAccessWarning(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;
  if ((st.st_mode & 077) == 0) return std::nullopt;
  return absl::StrCat("warning: data dir ", dir, " is mode ", OctalMode(st.st_mode),
                      ": group or others may reach the job history in it (the store's files are "
                      "0600); make it private with: chmod 700 ",
                      dir);
}

namespace store_internal {

absl::Status CreateParentDirectories(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return absl::OkStatus();
  if (absl::Status s = CreatePrivateDirectories(parent); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("job store ", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> LockStore(const std::string& path) {
  // SQLite's own locks would let a second process write the same file; two coordinators
  // interleaving submit sequences would break the FIFO, so one JobStore owns the file at a time.
  const std::string lock_path = path + ".lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    return absl::UnavailableError(absl::StrCat("job store ", path, ": cannot open lock file ",
                                               lock_path, ": ", std::strerror(errno)));
  }
  if (absl::Status s = MakePrivate(lock_fd, lock_path); !s.ok()) {
    ::close(lock_fd);
    return s;
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("job store ", path, " is in use by another process or JobStore (", lock_path,
                       " is locked)"));
    }
    return absl::UnavailableError(
        absl::StrCat("job store ", path, ": cannot lock ", lock_path, ": ", std::strerror(err)));
  }
  return lock_fd;
}

absl::Status CreateDatabaseFile(const std::string& path) {
  // A new database is created here, 0600, rather than by SQLite (0644 less the umask): SQLite gives
  // the WAL and shared-memory files the database file's mode, so they are private too. An existing
  // one is made private by MakeStoreFilesPrivate, once it is known to be a job store.
  const int db_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (db_fd >= 0) {
    absl::Status s = MakePrivate(db_fd, path);
    ::close(db_fd);
    return s;
  }
  if (errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("job store ", path, ": cannot create it: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status MakeStoreFilesPrivate(const std::string& path) {
  // A job store from before its files were private: make them so.
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string file = path + suffix;
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // Not there (yet): SQLite creates it with the database's mode.
    absl::Status s = MakePrivate(fd, file);
    ::close(fd);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status SyncParentDirectory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
    const int err = errno;
    if (dir_fd >= 0) ::close(dir_fd);
    return absl::UnavailableError(absl::StrCat("job store ", path, ": cannot sync directory ", dir,
                                               ": ", std::strerror(err)));
  }
  ::close(dir_fd);
  return absl::OkStatus();
}

}  // namespace store_internal
}  // namespace server
}  // namespace dattn
