#include "client/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace client {

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(int64_t bytes,
                                                                   const std::string& prefix) {
  std::random_device random;
  const uint64_t tag = (static_cast<uint64_t>(random()) << 32) ^ random();
  const std::string name = absl::StrCat("/dattn-", prefix, "-", getpid(), "-", absl::Hex(tag));
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("shm_open(", name, "): ", std::strerror(errno)));
  }
  void* data = MAP_FAILED;
  int err = posix_fallocate(fd, 0, bytes);
  if (err == 0) {
    data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) err = errno;
  }
  close(fd);
  if (data == MAP_FAILED) {
    shm_unlink(name.c_str());
    const std::string message = absl::StrCat("allocating ", bytes, " bytes of shared memory (",
                                             name, "): ", std::strerror(err));
    if (err == ENOSPC || err == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat(message, ": /dev/shm has no room; stream the tensors instead"));
    }
    return absl::InternalError(message);
  }
  return std::unique_ptr<SharedRegion>(new SharedRegion(name, static_cast<char*>(data), bytes));
}

SharedRegion::~SharedRegion() {
  munmap(data_, static_cast<size_t>(size_));
  shm_unlink(name_.c_str());
}

int64_t SharedRegion::Offset(v1::AttendTensor tensor, int64_t tensor_bytes, bool backward) {
  const int inputs = backward ? 4 : 3;
  const int t = tensor - v1::ATTEND_TENSOR_Q;  // 0 .. 7: q, k, v, dout, out, dq, dk, dv.
  return (t < 4 ? t : inputs + (t - 4)) * tensor_bytes;
}

v1::SharedMemoryRegion SharedRegion::Place(int64_t tensor_bytes, bool backward) const {
  v1::SharedMemoryRegion region;
  region.set_name(name_);
  region.set_byte_size(static_cast<uint64_t>((backward ? 8 : 4) * tensor_bytes));
  for (int t = v1::ATTEND_TENSOR_Q; t <= v1::ATTEND_TENSOR_DV; ++t) {
    const bool gradient = t == v1::ATTEND_TENSOR_DOUT || t > v1::ATTEND_TENSOR_OUT;
    if (gradient && !backward) continue;
    v1::SharedMemoryTensor* placed = region.add_tensors();
    placed->set_tensor(static_cast<v1::AttendTensor>(t));
    placed->set_offset(
        static_cast<uint64_t>(Offset(static_cast<v1::AttendTensor>(t), tensor_bytes, backward)));
  }
  return region;
}

}  // namespace client
}  // namespace dattn
