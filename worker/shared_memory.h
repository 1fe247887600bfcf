// An Attend call's shared-memory region (dattn.v1.SharedMemoryRegion, checked into an
// api::SharedMemoryLayout), opened by a rank's worker for the length of its task: the rank reads
// its shard of q, k, v (and dout) from it and writes its shard of out (and dq, dk, dv) into it.
//
// Reads use pread on the object's descriptor (they run in parallel). Writes copy into a shared
// mapping of the object instead, because tmpfs serializes writes to one object (pwrite holds the
// inode's lock: about 4 GB/s for all the ranks of a call together), while copies into the mapping
// run in parallel. A caller that shrinks its object during the call cannot crash the worker: a
// read comes up short, and a copy that touches a page past the object's new end raises SIGBUS,
// which a handler installed once per process turns into a jump back out of that copy (DATA_LOSS
// naming the region); SIGBUS anywhere else is handled as before the handler. Nothing of the
// caller's memory stays mapped after the task.
//
// Thread-safety: Read and Write may be called from many threads at once (pread and pwrite take
// their offset). Move-only; closes the descriptor when destroyed.
#ifndef DATTN_WORKER_SHARED_MEMORY_H_
#define DATTN_WORKER_SHARED_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "api/attend_tensors.h"

namespace dattn {
namespace worker {

class SharedMemoryFile {
 public:
  // Opens the region `layout.name` of this host read-write. FAILED_PRECONDITION naming the region
  // and this host when no such object exists here (the caller is on another host, or removed it)
  // or when it is smaller than layout.byte_size; PERMISSION_DENIED when this worker may not open
  // it; INVALID_ARGUMENT for a name that is not a region name (api/attend_tensors.h).
  static absl::StatusOr<SharedMemoryFile> Open(const api::SharedMemoryLayout& layout);

  SharedMemoryFile(SharedMemoryFile&& other) noexcept;
  SharedMemoryFile& operator=(SharedMemoryFile&& other) noexcept;
  ~SharedMemoryFile();

  // Bytes [offset, offset + length) of the region (within layout.byte_size) into `dst`, or from
  // `src` into the region. DATA_LOSS naming the region and the range when the object ends before
  // it (it shrank during the call); INTERNAL with errno's text for another failure.
  absl::Status Read(int64_t offset, int64_t length, char* dst) const;
  absl::Status Write(int64_t offset, int64_t length, const char* src) const;

  const std::string& name() const { return name_; }

 private:
  SharedMemoryFile(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  int fd_ = -1;
  std::string name_;
  char* map_ = nullptr;  // The first map_size_ bytes of the object, shared, read-write.
  int64_t map_size_ = 0;
};

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_SHARED_MEMORY_H_
