// The settings of `dattn submit`, the table that ties each one to its flag and job-file key, and
// the construction of the JobSpec sent to the coordinator: an attention job (AttentionJobSpec) or a
// training job (TrainingJobSpec).
//
// A setting comes from a job file (client/job_file.h) and/or a flag; flags override the file. Both
// go through the same SubmitField::set, so a value is accepted or refused the same way wherever it
// is written. Only what is obviously wrong is checked here (malformed numbers, non-positive sizes,
// list lengths that differ, a relative checkpoint folder, a trainer config that is not a JSON
// object); the coordinator validates the spec fully (the trainer config's fields included) and its
// verdict is final.
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

// The two kinds of work `dattn submit` sends (JobSpec.work).
enum class JobKind { kAttention, kTraining };

// "attention", "training".
std::string JobKindName(JobKind kind);

// A training job's trainer config (TrainingJobSpec.config_json): given inline (a job file's
// `training.config` mapping, already converted to JSON) or as a file to read (`--train-config`, a
// job file's `training.config_file`). BuildJobSpec reads the file.
struct TrainingConfigSource {
  std::string json;    // The JSON object's text; empty when `path` is set.
  std::string path;    // The JSON file; a job file's relative path is already made relative to
                       // the job file's folder.
  std::string origin;  // Where it was given, for errors: "--train-config", "job.yaml:12:
                       // training.config_file".
};

// Every field is unset until a file or flag sets it; BuildJobSpec applies the defaults.
struct SubmitOptions {
  // JobSpec.
  std::optional<std::string> name;
  std::optional<std::string> tenant;
  std::optional<int32_t> priority;
  // SubmitJobRequest.
  std::optional<std::string> idempotency_key;
  // The job file's `kind:`, or the section it has (attention: or training:); flags do not set it.
  std::optional<JobKind> kind;
  std::string kind_source;  // With `kind`: "training: in job.yaml", "kind: attention in job.yaml".
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
  // AttentionJobSpec and TrainingJobSpec.
  std::optional<v1::DevicePreference> device;
  // TrainingJobSpec.
  std::optional<TrainingConfigSource> train_config;
  std::optional<int32_t> data_parallel;  // 0: "auto" (TrainingJobSpec.auto_data_parallel).
  std::optional<int32_t> sequence_parallel;
  std::optional<std::string> checkpoint_dir;
  std::optional<std::string> init_from;
  // JobSpec.recovery (RecoveryPolicy); unset: the kind's default.
  std::optional<bool> split_batch;
  std::optional<bool> more_ranks;
  std::optional<bool> lower_precision;
  std::optional<int32_t> stall_seconds;
  std::optional<bool> shrink_ring;
  std::optional<bool> single_device;
};

// Where a setting is written in a job file, as bits: a setting of both kinds of job (--device) has
// two.
enum SubmitSection : unsigned {
  kTopLevel = 1,          // name, tenant, priority, idempotency_key: any job.
  kAttentionSection = 2,  // Under `attention:`; only attention jobs take it.
  kTrainingSection = 4,   // Under `training:`; only training jobs take it.
};

// One submit setting. `set` parses `text` into `options`; its error message quotes the value but
// not where it came from (callers prefix the flag or the file key). `is_set` says whether
// `options` has it (a file or flag gave it).
struct SubmitField {
  std::string flag;        // Long flag, "--seq-len".
  std::string short_flag;  // "-n", or empty.
  std::string key;         // Job-file key, "seq_len".
  unsigned sections;       // SubmitSection bits: where the key lives in a job file.
  bool is_bool;            // A flag with a "--no-" form (--causal/--no-causal) rather than a value.
  bool is_list;            // The file may give a sequence ([2048, 4096]) instead of "2048,4096".
  std::string value_name;  // For help: "N", "LIST", "NAME".
  std::string help;
  std::function<absl::Status(const std::string& text, SubmitOptions* options)> set;
  std::function<bool(const SubmitOptions& options)> is_set;
};

// "--seq-len (attention.seq_len)", "--device (attention.device, training.device)": the flag and
// where a job file writes it, for messages.
std::string FieldName(const SubmitField& field);

// All submit settings, in the order `dattn submit --help` and docs/CLI.md list them.
const std::vector<SubmitField>& SubmitFields();

// Sets in `base` every field that is set in `over` (flags over a file).
void MergeSubmitOptions(const SubmitOptions& over, SubmitOptions* base);

// The kind of job `options` describe: the job file's (its `kind:` or section), else training when a
// training setting is given (--train-config, --data-parallel, ...), else attention.
// INVALID_ARGUMENT naming the settings when settings of the other kind are given too (--seq-len
// with a training job file, --seq-len with --train-config, ...).
absl::StatusOr<JobKind> JobKindOf(const SubmitOptions& options);

// The JobSpec for `options` (of the kind JobKindOf says), with defaults for what is unset.
// Attention: batch 1, mode grouped, head offsets unspecified (the server's default), causal false,
// scale unset (1/sqrt(head_dim)), dtype fp32, ranks 1, pass fwd, iterations 1, seed 0,
// return_output false, device any. Training: data_parallel 1, sequence_parallel 1, device any, no
// checkpoint_dir or init_from; config_json is the inline config, or the config file's text as it
// is (surrounding whitespace removed), read here. Both: priority 0.
// INVALID_ARGUMENT naming the setting (flag and file key) when seq_len, heads, head_dim, segments
// or rates (attention) or the trainer config (training) is missing, segments and rates differ in
// length, or the trainer config is not a JSON object; naming the file when it cannot be read or is
// larger than kMaxTrainingConfigFileBytes.
absl::StatusOr<v1::JobSpec> BuildJobSpec(const SubmitOptions& options);

// The largest trainer config file BuildJobSpec reads (the coordinator takes 16 KiB of config).
inline constexpr int64_t kMaxTrainingConfigFileBytes = int64_t{1} << 20;  // 1 MiB.

// A random RFC 4122 version-4 UUID ("3f2a...-4...-..."), the default idempotency key.
std::string RandomIdempotencyKey();

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_SUBMIT_OPTIONS_H_
