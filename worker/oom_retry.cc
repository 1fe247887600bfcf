#include "worker/oom_retry.h"

#include "absl/strings/str_cat.h"
#include "engine/memory_plan.h"

namespace dattn {
namespace worker {

absl::Status RetryOnceOutOfMemory(TaskDevice* device, const std::function<absl::Status()>& attempt,
                                  const std::function<void()>& undo, OomRetry* record) {
  absl::Status first = attempt();
  if (!absl::IsResourceExhausted(first)) return first;
  record->first_error = std::string(first.message());
  undo();
  absl::StatusOr<int64_t> released = device->ReleaseCaches();
  if (!released.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        first.message(),
        " (not retried: releasing the device's caches failed: ", released.status().message(), ")"));
  }
  record->retries = 1;
  record->released_bytes = *released;
  absl::Status second = attempt();
  record->recovered = second.ok();
  if (!absl::IsResourceExhausted(second)) return second;
  return absl::ResourceExhaustedError(absl::StrCat(
      second.message(), " (retried once after releasing the device's caches, which gave back ",
      FormatBytes(*released), "; the first attempt: ", record->first_error, ")"));
}

}  // namespace worker
}  // namespace dattn
