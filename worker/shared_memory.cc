#include "worker/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace worker {
namespace {

// The SIGBUS guard of copies into a mapping (see the header).
thread_local sigjmp_buf* volatile t_guard = nullptr;
struct sigaction g_previous;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  // Not a guarded copy: what would have happened without this handler.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

void InstallSigbusGuard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &g_previous);
  });
}

// memcpy that returns false instead of dying when `dst` faults with SIGBUS.
bool GuardedCopy(char* dst, const char* src, size_t n) {
  sigjmp_buf jump;
  if (sigsetjmp(jump, /*savemask=*/1) != 0) {
    t_guard = nullptr;
    return false;
  }
  t_guard = &jump;
  // The fences keep the compiler from moving the guard's stores across the copy (it could see
  // nothing reading them in between, but the signal handler does).
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "this host";
  return absl::StrCat("host ", name);
}

}  // namespace

absl::StatusOr<SharedMemoryFile> SharedMemoryFile::Open(const api::SharedMemoryLayout& layout) {
  if (absl::Status s = api::CheckSharedMemoryName(layout.name, "shared_memory.name"); !s.ok()) {
    return s;
  }
  const int fd = shm_open(layout.name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat(
          "shared memory ", layout.name, " on ", HostName(), ": this worker may not open it (",
          std::strerror(err), "): give the worker's user read and write permission"));
    }
    if (err == ENOENT) {
      return absl::FailedPreconditionError(
          absl::StrCat("shared memory ", layout.name, " does not exist on ", HostName(),
                       ": a call's shared memory must be on the host of every worker of its "
                       "ring (and must exist until the call ends)"));
    }
    return absl::InternalError(absl::StrCat("shm_open(", layout.name, "): ", std::strerror(err)));
  }
  SharedMemoryFile file(fd, layout.name);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat(", layout.name, "): ", std::strerror(errno)));
  }
  if (st.st_size < layout.byte_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", layout.name, " on ", HostName(), " is ", st.st_size,
                     " bytes; the call places its tensors in ", layout.byte_size, " bytes of it"));
  }
  void* map = mmap(nullptr, static_cast<size_t>(layout.byte_size), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mapping shared memory ", layout.name, " (",
                                            layout.byte_size, " bytes): ", std::strerror(errno)));
  }
  file.map_ = static_cast<char*>(map);
  file.map_size_ = layout.byte_size;
  InstallSigbusGuard();
  return file;
}

SharedMemoryFile::SharedMemoryFile(SharedMemoryFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      name_(std::move(other.name_)),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)) {}

SharedMemoryFile& SharedMemoryFile::operator=(SharedMemoryFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) munmap(map_, static_cast<size_t>(map_size_));
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
  }
  return *this;
}

SharedMemoryFile::~SharedMemoryFile() {
  if (map_ != nullptr) munmap(map_, static_cast<size_t>(map_size_));
  if (fd_ >= 0) close(fd_);
}

absl::Status SharedMemoryFile::Read(int64_t offset, int64_t length, char* dst) const {
  int64_t done = 0;
  while (done < length) {
    const ssize_t got = pread(fd_, dst + done, static_cast<size_t>(length - done),
                              static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::InternalError(absl::StrCat("reading shared memory ", name_, " at ",
                                              offset + done, ": ", std::strerror(errno)));
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(
          "shared memory ", name_, " ends at byte ", offset + done, ", inside bytes [", offset,
          ", ", offset + length, ") the call placed there: it shrank during the call"));
    }
    done += got;
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryFile::Write(int64_t offset, int64_t length, const char* src) const {
  if (offset < 0 || length < 0 || offset + length > map_size_) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + length,
                                              ") outside shared memory ", name_, "'s ", map_size_));
  }
  if (!GuardedCopy(map_ + offset, src, static_cast<size_t>(length))) {
    return absl::DataLossError(absl::StrCat("shared memory ", name_, " ends inside bytes [", offset,
                                            ", ", offset + length,
                                            ") the call placed there: it shrank during the call"));
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace dattn
