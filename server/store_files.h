// The job store's files as files, outside what SQLite does with them: the directories on the way to
// the store, the lock file that makes one JobStore the owner of a store, the permissions of the
// database and its WAL and shared-memory files, and the directory sync that makes a new store's
// name durable. JobStore::OpenImpl (job_store.cc) calls these in the order it documents; nothing
// else does.
//
// The history is private to the user running the coordinator: directories created here are 0700
// and files created or tightened here 0600, whatever the umask. Existing directories are left as
// they are (GroupOrWorldAccessWarning, job_store.h, tells the caller).
//
// Errors name the store's path (or the file concerned) and carry errno's text: FAILED_PRECONDITION
// when another owner holds the store's lock; UNAVAILABLE for anything else the file system refused
// (missing permission, no space, a read-only file system, I/O errors).
//
// Thread-safety: these functions keep no state; they are safe to call from any thread. Two calls
// on one store at once are not meaningful (the lock decides which JobStore owns it).
#ifndef DATTN_SERVER_STORE_FILES_H_
#define DATTN_SERVER_STORE_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dattn {
namespace server {
namespace store_internal {

// mkdir -p of the directory of `path` (none for a bare file name), each directory it creates with
// mode 0700. UNAVAILABLE "job store PATH: ..." naming the directory that could not be created or
// made private.
absl::Status CreateParentDirectories(const std::string& path);

// Takes the store's lock: opens (creating it 0600, or tightening it to 0600) `path`.lock and flocks
// it exclusively without waiting. Returns the lock file's descriptor, which the caller owns:
// closing it releases the lock. On error nothing is held. FAILED_PRECONDITION when another process
// or another JobStore of this process holds the lock; UNAVAILABLE when the lock file cannot be
// opened, made private or locked.
absl::StatusOr<int> LockStore(const std::string& path);

// Creates the database file `path` empty with mode 0600 if it does not exist, so that SQLite (which
// would create it 0644 less the umask) opens a private file and gives its WAL and shared-memory
// files the same mode. An existing file is left untouched. UNAVAILABLE when it cannot be created.
absl::Status CreateDatabaseFile(const std::string& path);

// Tightens `path` and its -wal and -shm files, those that exist, to mode 0600 when they grant group
// or others any access (a store written before its files were private). Call it only once `path`
// is known to be a job store: a foreign file must be left alone. UNAVAILABLE when a file cannot be
// examined or changed.
absl::Status MakeStoreFilesPrivate(const std::string& path);

// fsyncs the directory of `path` (the current directory for a bare file name): SQLite syncs the
// directory when it creates the WAL but not when it creates the main file, so a new store's name
// survives a power loss only after this. UNAVAILABLE "job store PATH: cannot sync directory ...".
absl::Status SyncParentDirectory(const std::string& path);

}  // namespace store_internal
}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_STORE_FILES_H_
