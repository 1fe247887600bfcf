// A POSIX shared-memory object holding an Attend call's tensors (AttendStart.shared_memory;
// docs/ATTEND.md, "Shared memory"): made by the caller, read and written by the call's workers.
//
// Create() makes a new object with a fresh "/dattn-PREFIX-PID-RANDOM" name (mode 0600, so only
// this user's processes, the workers included when they run as this user, can open it), allocates
// all of its memory at once (so that a full /dev/shm fails here, not as a fault when it is
// written) and maps it. The destructor unmaps and removes it. Not thread-safe; move-only by
// unique_ptr.
#ifndef DATTN_CLIENT_SHARED_REGION_H_
#define DATTN_CLIENT_SHARED_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dattn/v1/attention.pb.h"

namespace dattn {
namespace client {

class SharedRegion {
 public:
  // RESOURCE_EXHAUSTED when /dev/shm has no room for `bytes`; INTERNAL naming the call and errno's
  // text for another failure.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(int64_t bytes,
                                                              const std::string& prefix);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  const std::string& name() const { return name_; }
  char* data() const { return data_; }
  int64_t size() const { return size_; }

  // Where a call's tensors of `tensor_bytes` bytes each lie when placed one after the other from
  // offset 0: q, k, v, (dout with backward,) out, (dq, dk, dv with backward).
  static int64_t Offset(v1::AttendTensor tensor, int64_t tensor_bytes, bool backward);
  // That placement, as AttendStart.shared_memory names it.
  v1::SharedMemoryRegion Place(int64_t tensor_bytes, bool backward) const;

 private:
  SharedRegion(std::string name, char* data, int64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  std::string name_;
  char* data_;
  int64_t size_;
};

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_SHARED_REGION_H_
