#include "model/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {
namespace {

constexpr int64_t kWriteBuffer = int64_t{1} << 20;

// write() until done; EINTR retried, short writes continued.
absl::Status WriteAll(int fd, const std::string& path, const char* data, int64_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, static_cast<size_t>(std::min<int64_t>(size, 1 << 30)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError("write", path, errno);
    }
    data += n;
    size -= n;
  }
  return absl::OkStatus();
}

absl::Status PwriteAll(int fd, const std::string& path, const char* data, int64_t size,
                       int64_t offset) {
  while (size > 0) {
    const ssize_t n =
        ::pwrite(fd, data, static_cast<size_t>(std::min<int64_t>(size, 1 << 30)), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError("pwrite", path, errno);
    }
    data += n;
    size -= n;
    offset += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FileError(absl::string_view op, const std::string& path, int err) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(op, " ", path, ": ", strerror(err)));
}

// ---- MappedFile ----

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return FileError("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return FileError("stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<int64_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(file.size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return FileError("mmap", path, err);
    }
    file.data_ = static_cast<const uint8_t*>(p);
    file.mapped_ = true;
  }
  ::close(fd);  // The mapping keeps the file open.
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    mapped_ = other.mapped_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.mapped_ = false;
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
}

// ---- OutputFile ----

absl::StatusOr<OutputFile> OutputFile::Create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError("create", path, errno);
  OutputFile file;
  file.path_ = path;
  file.fd_ = fd;
  file.buffer_.reserve(kWriteBuffer);
  return file;
}

OutputFile::OutputFile(OutputFile&& other) noexcept { *this = std::move(other); }

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    buffer_ = std::move(other.buffer_);
    size_ = other.size_;
    error_ = std::move(other.error_);
    other.fd_ = -1;
  }
  return *this;
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status OutputFile::Append(const void* data, int64_t size) {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already closed"));
  if (size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": append of ", size, " bytes"));
  }
  const char* p = static_cast<const char*>(data);
  if (static_cast<int64_t>(buffer_.size()) + size > kWriteBuffer) {
    if (absl::Status s = Flush(); !s.ok()) return s;
  }
  if (size >= kWriteBuffer) {
    error_ = WriteAll(fd_, path_, p, size);
    if (!error_.ok()) return error_;
  } else {
    buffer_.insert(buffer_.end(), p, p + size);
  }
  size_ += size;
  return absl::OkStatus();
}

absl::Status OutputFile::Flush() {
  if (!error_.ok()) return error_;
  if (buffer_.empty()) return absl::OkStatus();
  error_ = WriteAll(fd_, path_, buffer_.data(), static_cast<int64_t>(buffer_.size()));
  buffer_.clear();
  return error_;
}

absl::Status OutputFile::WriteAt(int64_t offset, const void* data, int64_t size) {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already closed"));
  if (offset < 0 || size < 0 || offset + size > size_) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": write of ", size, " bytes at ", offset,
                                                   " is outside the ", size_, " bytes written"));
  }
  if (absl::Status s = Flush(); !s.ok()) return s;
  error_ = PwriteAll(fd_, path_, static_cast<const char*>(data), size, offset);
  return error_;
}

absl::Status OutputFile::Close(bool sync) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already closed"));
  absl::Status status = Flush();
  if (status.ok() && sync && ::fsync(fd_) != 0) status = FileError("fsync", path_, errno);
  if (::close(fd_) != 0 && status.ok()) status = FileError("close", path_, errno);
  fd_ = -1;
  if (!status.ok()) error_ = status;
  return status;
}

// ---- SHA-256 ----

Sha256::Sha256() {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) failed_ = true;
  ctx_ = ctx;
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::Update(const void* data, int64_t size) {
  if (failed_ || size <= 0) return;
  if (EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, static_cast<size_t>(size)) != 1) {
    failed_ = true;
  }
}

absl::StatusOr<std::array<uint8_t, 32>> Sha256::Finish() {
  std::array<uint8_t, 32> digest{};
  unsigned int length = 0;
  if (failed_ || EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest.data(), &length) != 1 ||
      length != digest.size()) {
    failed_ = true;
    return absl::InternalError("SHA-256: libcrypto failed");
  }
  failed_ = true;  // A second Finish would read a finalized context.
  return digest;
}

std::string HexDigest(const std::array<uint8_t, 32>& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(64);
  for (uint8_t b : digest) {
    text.push_back(kDigits[b >> 4]);
    text.push_back(kDigits[b & 15]);
  }
  return text;
}

absl::StatusOr<std::string> Sha256Hex(absl::string_view bytes) {
  Sha256 sha;
  sha.Update(bytes.data(), static_cast<int64_t>(bytes.size()));
  absl::StatusOr<std::array<uint8_t, 32>> digest = sha.Finish();
  if (!digest.ok()) return digest.status();
  return HexDigest(*digest);
}

absl::StatusOr<std::string> Sha256FileHex(const std::string& path) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return Sha256Hex(file->bytes());
}

// ---- Small files and directories ----

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  if (file->size() > max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": ", file->size(), " bytes, more than the ", max_bytes, " this file may have"));
  }
  return std::string(file->bytes());
}

absl::Status WriteWholeFile(const std::string& path, absl::string_view content, bool sync) {
  absl::StatusOr<OutputFile> file = OutputFile::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Append(content); !s.ok()) return s;
  return file->Close(sync);
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError("open", path, errno);
  absl::Status status;
  if (::fsync(fd) != 0) status = FileError("fsync", path, errno);
  ::close(fd);
  return status;
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string ParentDir(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

}  // namespace model
}  // namespace dattn
