// The settings of `dattn submit`, the table that ties each one to its flag and job-file key, and
// the construction of the JobSpec sent to the coordinator.
//
// A setting comes from a job file (client/job_file.h) and/or a flag; flags override the file. Both
// go through the same SubmitField::set, so a value is accepted or refused the same way wherever it
// is written. Only what is obviously wrong is checked here (malformed numbers, non-positive sizes,
// list lengths that differ); the coordinator validates the spec fully and its verdict is final.
#ifndef DATTN_CLIENT_SUBMIT_OPTIONS_H_
#define DATTN_CLIENT_SUBMIT_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dattn/v1/job.pb.h"

namespace dattn {
namespace client {

// Every field is unset until a file or flag sets it; BuildJobSpec applies the defaults.
struct SubmitOptions {
  // JobSpec.
  std::optional<std::string> name;
  std::optional<std::string> tenant;
  std::optional<int32_t> priority;
  // SubmitJobRequest.
  std::optional<std::string> idempotency_key;
  // AttentionJobSpec.
  std::optional<int64_t> seq_len;
  std::optional<int64_t> batch;
  std::optional<int64_t> heads;
  std::optional<int64_t> head_dim;
  std::optional<std::vector<int64_t>> segments;
  std::optional<std::vector<int64_t>> rates;
  std::optional<v1::AttentionMode> mode;
  std::optional<v1::HeadOffsets> head_offsets;
  std::optional<bool> causal;
  std::optional<double> scale;
  std::optional<v1::DType> dtype;
  std::optional<int32_t> ranks;
  std::optional<v1::Pass> pass;
  std::optional<int32_t> iterations;
  std::optional<uint64_t> seed;
  std::optional<bool> return_output;
  std::optional<v1::DevicePreference> device;
};

// One submit setting. `set` parses `text` into `options`; its error message quotes the value but
// not where it came from (callers prefix the flag or the file key).
struct SubmitField {
  std::string flag;        // Long flag, "--seq-len".
  std::string short_flag;  // "-n", or empty.
  std::string key;         // Job-file key, "seq_len".
  bool in_attention;       // The key lives in the file's `attention:` section (else top level).
  bool is_bool;            // A flag with a "--no-" form (--causal/--no-causal) rather than a value.
  bool is_list;            // The file may give a sequence ([2048, 4096]) instead of "2048,4096".
  std::string value_name;  // For help: "N", "LIST", "NAME".
  std::string help;
  std::function<absl::Status(const std::string& text, SubmitOptions* options)> set;
};

// All submit settings, in the order `dattn submit --help` and docs/CLI.md list them.
const std::vector<SubmitField>& SubmitFields();

// Sets in `base` every field that is set in `over` (flags over a file).
void MergeSubmitOptions(const SubmitOptions& over, SubmitOptions* base);

// The JobSpec for `options`, with defaults for what is unset: batch 1, mode grouped, head offsets
// unspecified (the server's default), causal false, scale unset (1/sqrt(head_dim)), dtype fp32,
// ranks 1, pass fwd, iterations 1, seed 0, return_output false, device any, priority 0.
// INVALID_ARGUMENT naming the setting (flag and file key) when seq_len, heads, head_dim, segments
// or rates is missing, or segments and rates differ in length.
absl::StatusOr<v1::JobSpec> BuildJobSpec(const SubmitOptions& options);

// A random RFC 4122 version-4 UUID ("3f2a...-4...-..."), the default idempotency key.
std::string RandomIdempotencyKey();

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_SUBMIT_OPTIONS_H_
