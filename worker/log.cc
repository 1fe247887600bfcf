#include "worker/log.h"

#include <errno.h>
#include <unistd.h>

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dattn {
namespace worker {

void LogLine(absl::string_view message) {
  std::string line = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  absl::StrAppend(&line, " dattn-worker: ", message, "\n");
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr closed or broken: logging must never take the worker down.
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace worker
}  // namespace dattn
