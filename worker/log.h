// One-line event logs of the worker process, on stderr: "2024-05-01T12:00:00.123Z dattn-worker:
// msg".
//
// A line is written with a single write(2) so that lines from concurrent threads never interleave.
// Thread-safe.
#ifndef DATTN_WORKER_LOG_H_
#define DATTN_WORKER_LOG_H_

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dattn {
namespace worker {

void LogLine(absl::string_view message);

// LogEvent("registered as ", id, " (heartbeat ", ms, " ms)").
template <typename... Args>
void LogEvent(const Args&... args) {
  LogLine(absl::StrCat(args...));
}

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_LOG_H_
