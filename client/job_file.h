// Job files for `dattn submit --file`: a YAML (or JSON) document with the same settings as the
// flags, and one section for the work: `attention:` or `training:`.
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
//   name: kjv-small
//   training:                    # data_parallel, sequence_parallel, device, checkpoint_dir,
//     data_parallel: 2           # init_from, and the trainer config: `config` (a mapping,
//     sequence_parallel: 2       # converted to JSON) or `config_file` (a JSON file, relative to
//     config_file: kjv.json      # the job file's folder)
//
// docs/CLI.md is the full reference; client/examples/attention-job.yaml and training-job.yaml are
// examples. Unknown keys are errors (a typo must not be silently ignored). `kind`, when present, is
// "attention" or "training" and must agree with the section. A trainer config written as a mapping
// becomes a JSON object (keys in the file's order; a JSON job file's come sorted): quoted scalars
// are strings; plain ones null, booleans, integers or numbers where YAML 1.2's core schema says so
// (null, ~, true, 42, 0x2a, 3e-4), else strings; it is checked no further (the coordinator does).
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
// parser, otherwise YAML is used. A relative `training.config_file` is taken relative to `base_dir`
// (the job file's folder; empty: the working directory); the file is not read here (BuildJobSpec
// reads it). INVALID_ARGUMENT, with the source, the key and (for YAML) the line, when the document
// does not parse, is not a mapping, has an unknown key, a value that its setting refuses, both an
// attention: and a training: section (or a `kind` the section contradicts), or both
// training.config and training.config_file; a JSON document, or a trainer config, nested more than
// 32 levels deep is refused as such, and so is a trainer config that YAML aliases blow up past
// 1 MiB of JSON. The result has only the settings the document gives, and `kind` when the document
// has a section or a `kind`.
absl::StatusOr<SubmitOptions> ParseJobFile(const std::string& text, const std::string& source,
                                           bool json, const std::string& base_dir = "");

// The largest job file ReadJobFile reads: a job file is a few hundred bytes of settings, so
// anything near this is a mistake (a data file given to --file), and reading it all would only
// cost memory.
inline constexpr int64_t kMaxJobFileBytes = int64_t{1} << 20;  // 1 MiB.

// Reads `path` and parses it, as JSON when the name ends in ".json" (any case), else as YAML, with
// the folder of `path` as the base of a relative training.config_file.
// NOT_FOUND when the file cannot be opened; INVALID_ARGUMENT naming the file for a directory or a
// file over kMaxJobFileBytes (with its size, when the file system knows it; a pipe is read only up
// to the limit); otherwise as ParseJobFile.
absl::StatusOr<SubmitOptions> ReadJobFile(const std::string& path);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_JOB_FILE_H_
