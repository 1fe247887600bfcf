#include "server/result_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dattn {
namespace server {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(const std::string& what, const std::string& path) {
  const int err = errno;
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(err)));
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return Errno("cannot create", path);
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const bool ok = ::fsync(fd) == 0;
  absl::Status status = ok ? absl::OkStatus() : Errno("cannot sync", path);
  ::close(fd);
  return status;
}

int64_t DirBytes(const fs::path& dir) {
  std::error_code ec;
  int64_t bytes = 0;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) bytes += static_cast<int64_t>(it->file_size(ec));
  }
  return bytes;
}

// pread of exactly `n` bytes; false on a short read or an error.
bool ReadAt(int fd, char* out, int64_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, static_cast<size_t>(n), offset);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return false;
    }
    out += got;
    n -= got;
    offset += got;
  }
  return true;
}

}  // namespace

ResultStore::ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(part_.c_str());
}

absl::Status ResultStore::ShardWriter::Append(int64_t offset, const std::string& data) {
  if (finished_ || fd_ < 0) return absl::FailedPreconditionError("the shard is already stored");
  if (offset != written_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk at offset ", offset, " after ", written_,
                                                   " bytes: chunks must arrive in order"));
  }
  if (static_cast<int64_t>(data.size()) > size_ - written_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk of ", data.size(), " bytes at offset ",
                                                   offset, " runs past the shard's ", size_,
                                                   " bytes"));
  }
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", part_);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  written_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::Status ResultStore::ShardWriter::Finish() {
  if (finished_) return absl::OkStatus();
  if (written_ != size_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shard ended after ", written_, " of its ", size_, " bytes"));
  }
  if (::fsync(fd_) != 0) return Errno("cannot sync", part_);
  ::close(fd_);
  fd_ = -1;
  if (::rename(part_.c_str(), path_.c_str()) != 0) return Errno("cannot rename", part_);
  finished_ = true;
  return SyncDir(fs::path(path_).parent_path().string());
}

absl::StatusOr<std::unique_ptr<ResultStore>> ResultStore::Open(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the outputs folder ", dir, ": ", ec.message()));
  }
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  return std::unique_ptr<ResultStore>(new ResultStore(dir));
}

std::string ResultStore::ShardPath(const std::string& job_id, int attempt, int rank) const {
  return absl::StrCat(dir_, "/", job_id, "/", attempt, "/rank-", rank, ".bin");
}

absl::StatusOr<std::unique_ptr<ResultStore::ShardWriter>> ResultStore::BeginShard(
    const std::string& job_id, int attempt, int rank, int64_t bytes) {
  const std::string job_dir = absl::StrCat(dir_, "/", job_id);
  const std::string attempt_dir = absl::StrCat(job_dir, "/", attempt);
  if (absl::Status s = MakeDir(job_dir); !s.ok()) return s;
  if (absl::Status s = MakeDir(attempt_dir); !s.ok()) return s;
  const std::string path = ShardPath(job_id, attempt, rank);
  const std::string part = path + ".part";
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", part);
  return std::unique_ptr<ShardWriter>(new ShardWriter(part, path, fd, bytes));
}

bool ResultStore::HasShard(const std::string& job_id, int attempt, int rank, int64_t bytes) const {
  std::error_code ec;
  const uintmax_t size = fs::file_size(ShardPath(job_id, attempt, rank), ec);
  return !ec && static_cast<int64_t>(size) == bytes;
}

absl::Status ResultStore::Read(const std::string& job_id, int attempt, const OutputLayout& layout,
                               int64_t max_chunk,
                               const std::function<bool(const v1::TensorChunk&)>& emit) const {
  // Open every shard first: a deletion meanwhile does not cut the stream short.
  std::vector<int> fds;
  struct Closer {
    std::vector<int>* fds;
    ~Closer() {
      for (int fd : *fds) ::close(fd);
    }
  } closer{&fds};
  const int64_t shard_bytes = layout.blocks * layout.rank_block_bytes;
  for (int r = 0; r < layout.ranks; ++r) {
    const std::string path = ShardPath(job_id, attempt, r);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size != shard_bytes) {
      if (fd >= 0) ::close(fd);
      return absl::DataLossError(absl::StrCat("the output of job ", job_id, " is incomplete: ",
                                              path, " is missing or not ", shard_bytes, " bytes"));
    }
    fds.push_back(fd);
  }
  v1::TensorChunk head;
  *head.mutable_header() = layout.header;
  if (!emit(head)) return absl::CancelledError("the reader went away");
  const int64_t chunk = std::max<int64_t>(1, max_chunk);
  std::string buffer;
  int64_t offset = 0;  // In the whole tensor.
  for (int64_t b = 0; b < layout.blocks; ++b) {
    for (int r = 0; r < layout.ranks; ++r) {
      for (int64_t done = 0; done < layout.rank_block_bytes;) {
        const int64_t n = std::min(chunk, layout.rank_block_bytes - done);
        buffer.resize(static_cast<size_t>(n));
        if (!ReadAt(fds[r], buffer.data(), n, b * layout.rank_block_bytes + done)) {
          return absl::DataLossError(absl::StrCat("cannot read ", ShardPath(job_id, attempt, r),
                                                  ": ", std::strerror(errno)));
        }
        v1::TensorChunk out;
        out.set_offset(offset);
        out.set_data(buffer);
        if (!emit(out)) return absl::CancelledError("the reader went away");
        done += n;
        offset += n;
      }
    }
  }
  return absl::OkStatus();
}

int64_t ResultStore::Discard(const std::string& job_id, int keep) {
  const fs::path job_dir = fs::path(dir_) / job_id;
  std::error_code ec;
  if (!fs::exists(job_dir, ec)) return 0;
  int64_t freed = 0;
  if (keep < 0) {
    freed = DirBytes(job_dir);
    fs::remove_all(job_dir, ec);
    return freed;
  }
  for (fs::directory_iterator it(job_dir, ec), end; !ec && it != end; it.increment(ec)) {
    int attempt = 0;
    if (absl::SimpleAtoi(it->path().filename().string(), &attempt) && attempt == keep) continue;
    freed += DirBytes(it->path());
    std::error_code rm;
    fs::remove_all(it->path(), rm);
  }
  return freed;
}

int64_t ResultStore::Bytes(const std::string& job_id, int attempt) const {
  return DirBytes(fs::path(dir_) / job_id / std::to_string(attempt));
}

std::vector<std::string> ResultStore::Jobs() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec)) out.push_back(it->path().filename().string());
  }
  return out;
}

}  // namespace server
}  // namespace dattn
