// Files for the data and checkpoint code: read-only memory maps, a buffered writer with fsync,
// SHA-256 digests (OpenSSL's libcrypto), and the directory operations an atomic save needs.
//
// Errors from the operating system become a Status whose code comes from errno
// (absl::ErrnoToStatusCode: ENOENT is NOT_FOUND, EACCES PERMISSION_DENIED, ENOSPC
// RESOURCE_EXHAUSTED, ...) and whose message names the operation, the path and strerror's text.
//
// Threads: a MappedFile is read-only after Open; any number of threads may read it. An OutputFile
// and a Sha256 are used by one thread at a time. The free functions may be called from any thread.
#ifndef DATTN_MODEL_FILE_IO_H_
#define DATTN_MODEL_FILE_IO_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dattn {
namespace model {

// "<op> <path>: <strerror(err)>", with the code errno maps to.
absl::Status FileError(absl::string_view op, const std::string& path, int err);

// A whole regular file mapped read-only (MAP_PRIVATE, PROT_READ). An empty file is a valid, empty
// mapping. The file must not be truncated while mapped (reading a page past the new end raises
// SIGBUS); checkpoint and token files are written once and then only read. Move-only; the
// destructor unmaps.
class MappedFile {
 public:
  // NOT_FOUND, PERMISSION_DENIED, ... from open/fstat/mmap; FAILED_PRECONDITION naming the path
  // when it is not a regular file (a directory, a FIFO: mapping those is meaningless or blocks).
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  absl::string_view bytes() const {
    return absl::string_view(reinterpret_cast<const char*>(data_), static_cast<size_t>(size_));
  }
  const std::string& path() const { return path_; }

 private:
  void Reset();
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  bool mapped_ = false;
};

// A file written front to back through a 1 MiB buffer. Create truncates or creates the file (mode
// 0644). The file's content is complete only once Close has returned OK; a writer destroyed
// without Close closes the descriptor and leaves whatever was flushed (callers write to a
// temporary name and rename, so a partial file is never seen under its final name). After any
// error the writer refuses further writes with the same error. Move-only.
class OutputFile {
 public:
  static absl::StatusOr<OutputFile> Create(const std::string& path);

  OutputFile() = default;
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  // Appends `size` bytes.
  absl::Status Append(const void* data, int64_t size);
  absl::Status Append(absl::string_view bytes) { return Append(bytes.data(), bytes.size()); }
  // Flushes the buffer, then overwrites `size` bytes at `offset` (< the bytes written so far; used
  // to fill in a header once the data behind it is known). Later appends continue at the end.
  absl::Status WriteAt(int64_t offset, const void* data, int64_t size);
  // Bytes appended so far.
  int64_t size() const { return size_; }
  // Flushes, then fsyncs when `sync` (data and metadata reach the disk before it returns), then
  // closes. Closing twice is FAILED_PRECONDITION.
  absl::Status Close(bool sync);
  const std::string& path() const { return path_; }

 private:
  absl::Status Flush();
  std::string path_;
  int fd_ = -1;
  std::vector<char> buffer_;
  int64_t size_ = 0;
  absl::Status error_;
};

// SHA-256 over bytes given in pieces (OpenSSL EVP). A failure inside libcrypto (allocation) is kept
// and reported by Finish as INTERNAL.
class Sha256 {
 public:
  Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();

  void Update(const void* data, int64_t size);
  // The digest of everything given to Update. Call once.
  absl::StatusOr<std::array<uint8_t, 32>> Finish();

 private:
  void* ctx_ = nullptr;  // EVP_MD_CTX*, kept opaque so that users do not include OpenSSL headers.
  bool failed_ = false;
};

// 64 lower-case hexadecimal digits.
std::string HexDigest(const std::array<uint8_t, 32>& digest);
// The SHA-256 of bytes in memory, in hexadecimal.
absl::StatusOr<std::string> Sha256Hex(absl::string_view bytes);
// The SHA-256 of a whole file (mapped, not read into memory), in hexadecimal.
absl::StatusOr<std::string> Sha256FileHex(const std::string& path);

// The whole file read into a string: for small files (JSON) only.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t max_bytes);
// Writes `content` to `path` (created or truncated), fsyncs it when `sync`, closes it.
absl::Status WriteWholeFile(const std::string& path, absl::string_view content, bool sync);

// fsync on a directory (or a file) opened read-only: makes entries created, renamed or removed in
// a directory durable.
absl::Status FsyncPath(const std::string& path);

// "dir/name", without doubling a trailing slash of `dir`.
std::string JoinPath(absl::string_view dir, absl::string_view name);
// Everything before the last '/', or "." when there is none.
std::string ParentDir(absl::string_view path);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_FILE_IO_H_
