// Text -> value parsers shared by the CLI's flags and its job files.
//
// Every function returns INVALID_ARGUMENT with a message that quotes the bad text and says what was
// expected (e.g. "'2k' is not an integer"), but does not name where the text came from: the caller
// prefixes the flag ("--seq-len: ") or the job-file key. Names are case-insensitive and '-'/'_' are
// interchangeable. Thread-safe (no state).
#ifndef DATTN_CLIENT_PARSE_H_
#define DATTN_CLIENT_PARSE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dattn/v1/job.pb.h"

namespace dattn {
namespace client {

// A base-10 integer in [min, max]. Surrounding whitespace is ignored.
absl::StatusOr<int64_t> ParseInt(const std::string& text, int64_t min, int64_t max);
absl::StatusOr<uint64_t> ParseUint64(const std::string& text);

// A comma-separated list of integers, each in [min, max], at least one entry ("2048,4096").
absl::StatusOr<std::vector<int64_t>> ParseIntList(const std::string& text, int64_t min,
                                                  int64_t max);

// A finite number > 0.
absl::StatusOr<double> ParsePositiveDouble(const std::string& text);

// true/false, yes/no, on/off, 1/0.
absl::StatusOr<bool> ParseBool(const std::string& text);

// fp16|bf16|fp32|fp64 (also float16, half, bfloat16, float32, float, float64, double).
absl::StatusOr<v1::DType> ParseDType(const std::string& text);
// grouped|mixture.
absl::StatusOr<v1::AttentionMode> ParseMode(const std::string& text);
// modulo|blocked.
absl::StatusOr<v1::HeadOffsets> ParseHeadOffsets(const std::string& text);
// fwd|fwd-bwd (also forward, forward-backward).
absl::StatusOr<v1::Pass> ParsePass(const std::string& text);
// any|cpu|gpu.
absl::StatusOr<v1::DevicePreference> ParseDevice(const std::string& text);

// A comma-separated list of job states: queued, placed, running, succeeded, failed, cancelled, plus
// the groups "active" (queued, placed, running) and "ended" (succeeded, failed, cancelled).
// Duplicates are dropped; the order is the enum's.
absl::StatusOr<std::vector<v1::JobState>> ParseJobStates(const std::string& text);

// A registered model as the CLI names it: "NAME" (version 0: the newest) or "NAME:VERSION"
// (VERSION >= 1). The name itself is the coordinator's to check.
struct ModelRef {
  std::string name;
  int64_t version = 0;
};
absl::StatusOr<ModelRef> ParseModelRef(const std::string& text);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_PARSE_H_
