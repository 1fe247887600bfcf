// The tensors of a JobService.Attend call (dattn.v1.AttendTensor): their names, and the checks and
// layout of a call's shared-memory region (dattn.v1.SharedMemoryRegion):
// the coordinator checks the region when the call's job is analysed (api/attention_job.h), and
// each worker derives the same layout again before it opens the object (worker/shared_memory.h).
//
// Every error is INVALID_ARGUMENT and names the field path (prefixed by the caller's `path`) and
// the offending value. All functions are pure and thread-safe.
#ifndef DATTN_API_ATTEND_TENSORS_H_
#define DATTN_API_ATTEND_TENSORS_H_

#include <array>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dattn/v1/attention.pb.h"

namespace dattn {
namespace api {

// "q", "k", "v", "dout", "out", "dq", "dk", "dv" ("unspecified" otherwise).
const char* AttendTensorName(v1::AttendTensor tensor);

// Every region name starts with this; what follows is 1 .. kMaxSharedMemoryNameSuffix characters
// of [A-Za-z0-9_.-]. A worker opens no other name, so a call cannot make it read any other shared
// memory of its host.
inline constexpr absl::string_view kSharedMemoryPrefix = "/dattn-";
inline constexpr int kMaxSharedMemoryNameSuffix = 200;
// The largest region a call may name.
inline constexpr int64_t kMaxSharedMemoryBytes = int64_t{1} << 40;

// OK when `name` is a region name as above.
absl::Status CheckSharedMemoryName(absl::string_view name, const std::string& path);

// Where a call's tensors lie in its region: offset[t] for AttendTensor t (Q .. DV), -1 for a tensor
// the call does not use (dout, dq, dk, dv without backward).
struct SharedMemoryLayout {
  std::string name;
  int64_t byte_size = 0;
  std::array<int64_t, 9> offset;  // Indexed by v1::AttendTensor.
};

// Checks `region` (the message at `path`) for a call whose tensors are `tensor_bytes` each, with
// or without backward: the name, 1 <= byte_size <= kMaxSharedMemoryBytes, every tensor of the call
// exactly once and no other, each within byte_size, no two overlapping.
absl::StatusOr<SharedMemoryLayout> CheckSharedMemory(const v1::SharedMemoryRegion& region,
                                                     int64_t tensor_bytes, bool backward,
                                                     const std::string& path);

}  // namespace api
}  // namespace dattn

#endif  // DATTN_API_ATTEND_TENSORS_H_
