// Job files for `dattn submit --file`: a YAML (or JSON) document with the same settings as the
// flags.
//
//   name: longnet-32k            # top level: name, tenant, priority, idempotency_key, kind
//   tenant: research
//   attention:                   # every attention flag, by its long name ('-' or '_' both work)
//     seq_len: 32768
//     heads: 16
//     head_dim: 64
//     segments: [2048, 4096]     # a list, or the flag's text "2048,4096"
//     rates: [1, 2]
//     dtype: bf16
//
// docs/CLI.md is the full reference; client/examples/attention-job.yaml is an example. Unknown keys
// are errors (a typo must not be silently ignored). `kind`, when present, must be "attention".
// Thread-safe (no state).
#ifndef DATTN_CLIENT_JOB_FILE_H_
#define DATTN_CLIENT_JOB_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/submit_options.h"

namespace dattn {
namespace client {

// Parses `text`. `source` names the document in errors ("job.yaml"); `json` selects the strict JSON
// parser, otherwise YAML is used. INVALID_ARGUMENT, with the source, the key and (for YAML) the
// line, when the document does not parse, is not a mapping, has an unknown key, or a value that its
// setting refuses; a JSON document nested more than 32 levels deep is refused as such. The result
// has only the settings the document gives.
absl::StatusOr<SubmitOptions> ParseJobFile(const std::string& text, const std::string& source,
                                           bool json);

// The largest job file ReadJobFile reads: a job file is a few hundred bytes of settings, so
// anything near this is a mistake (a data file given to --file), and reading it all would only
// cost memory.
inline constexpr int64_t kMaxJobFileBytes = int64_t{1} << 20;  // 1 MiB.

// Reads `path` and parses it, as JSON when the name ends in ".json" (any case), else as YAML.
// NOT_FOUND when the file cannot be opened; INVALID_ARGUMENT naming the file for a directory or a
// file over kMaxJobFileBytes (with its size, when the file system knows it; a pipe is read only up
// to the limit); otherwise as ParseJobFile.
absl::StatusOr<SubmitOptions> ReadJobFile(const std::string& path);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_JOB_FILE_H_
