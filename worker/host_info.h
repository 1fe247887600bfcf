// What the worker knows about its host: CPU model, total and available memory (Linux /proc).
//
// The Parse* functions take file contents so they can be tested on fixed text; the Read* functions
// read the live files. All are thread-safe (no shared state).
#ifndef DATTN_WORKER_HOST_INFO_H_
#define DATTN_WORKER_HOST_INFO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dattn {
namespace worker {

// The value of `field` ("MemTotal", "MemAvailable", ...) in /proc/meminfo text, converted to bytes
// (the file counts kB = 1024 bytes). NOT_FOUND naming the field if it is absent; INVALID_ARGUMENT
// if its value does not parse.
absl::StatusOr<int64_t> ParseMeminfoBytes(absl::string_view meminfo, absl::string_view field);

// The first "model name" of /proc/cpuinfo text (x86), else its "Hardware" line (some Arm kernels),
// else "cpu"; never empty.
std::string ParseCpuModel(absl::string_view cpuinfo);

// ParseMeminfoBytes on the live /proc/meminfo. UNAVAILABLE if the file cannot be read.
absl::StatusOr<int64_t> ReadMeminfoBytes(absl::string_view field);

// ParseCpuModel on the live /proc/cpuinfo; "cpu" if it cannot be read.
std::string ReadCpuModel();

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_HOST_INFO_H_
