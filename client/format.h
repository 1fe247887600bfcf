// Human-readable and JSON renderings of dattn.v1 messages for the CLI.
//
// Human output is for people and may change between versions; scripts use --json, whose shape is
// the protobuf JSON mapping of the API messages (proto field names, enum names, every field
// printed, int64 as strings). Times print in UTC. `now` arguments make ages and elapsed times
// testable. All functions are thread-safe (no state).
#ifndef DATTN_CLIENT_FORMAT_H_
#define DATTN_CLIENT_FORMAT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/printable.h"
#include "client/table.h"
#include "dattn/v1/admin.pb.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"
#include "dattn/v1/training.pb.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"

namespace dattn {
namespace client {

// Enum names without their prefix: "RUNNING", "READY", "fp32", "grouped", "fwd-bwd", "gpu".
std::string StateName(v1::JobState state);
std::string WorkerStateName(v1::WorkerState state);
std::string DTypeName(v1::DType dtype);
std::string ModeName(v1::AttentionMode mode);
std::string HeadOffsetsName(v1::HeadOffsets offsets);
std::string PassName(v1::Pass pass);
std::string DeviceName(v1::DevicePreference device);

bool IsTerminal(v1::JobState state);

// The kind of work of `spec`: "attention", "training", or "-" when none is set.
std::string WorkKindName(const v1::JobSpec& spec);

// Bytes per element of `dtype`; 0 for DTYPE_UNSPECIFIED.
int64_t DTypeSize(v1::DType dtype);

// An unset timestamp (0 seconds, 0 nanos) is absl::InfinitePast().
absl::Time ToTime(const google::protobuf::Timestamp& ts);

// "2024-05-01 12:00:03 UTC", or "-" when unset.
std::string FormatTimestamp(const google::protobuf::Timestamp& ts);
// "850ms", "12.3s", "3m12s", "1h02m", "2d03h"; negative durations print as "0s".
std::string HumanDuration(absl::Duration d);
// "512 B", "1.5 KiB", "8.0 MiB", "70.5 GiB".
std::string FormatBytes(int64_t bytes);
// A time in seconds with a readable unit: "850.0 us", "12.30 ms", "1.234 s".
std::string FormatSeconds(double seconds);
// "5/10", or "-" when the total is unknown (0).
std::string FormatProgress(const v1::JobProgress& progress);
// A count or rate with a unit prefix: "950", "12.3K", "4.56M", "1.23G".
std::string FormatCount(double value);
// A training evaluation: "step 20: validation loss 2.3100 (3.3326 bits/byte), retrieval 12.5%
// exact (40.0% of answer tokens) of 16 examples".
std::string FormatEvaluation(const v1::TrainingEvaluation& evaluation);
// A training job's figures in one line: "loss 2.3456, lr 0.0003, 12.3K tokens/s".
std::string TrainingFigures(const v1::TrainingProgress& progress);
// "[1, 4096, 8, 64]".
// "[#########-----------]" of `width` cells between the brackets; all dashes when total <= 0.
std::string ProgressBar(int64_t done, int64_t total, int width);

// `dattn status`: the job's fields, its spec, its result (SUCCEEDED jobs; a training job's with its
// loss curve) or a training job's latest figures, and, when the job carries them, its events. Every
// value goes through Printable (tables do so by themselves). `unicode`: draw the loss curve with
// Unicode block elements rather than ASCII (LossChart).
void PrintJob(const v1::Job& job, absl::Time now, bool unicode, std::ostream& out);
// The result block of a succeeded attention job: totals, checksums and the per-rank table.
void PrintAttentionResult(const v1::AttentionJobResult& result, v1::Pass pass, std::ostream& out);
// The result block of a succeeded training job (steps, final loss and evaluation, rate, MFU,
// parameters, parallelism, final checkpoint), then its loss curve (LossChart, 60 x 8).
void PrintTrainingResult(const v1::TrainingJobResult& result, const std::string& job_id,
                         bool unicode, std::ostream& out);
// A running (or stopped) training job's latest figures: step, loss, learning rate, gradient norm,
// tokens/s, MFU when known, last evaluation, newest checkpoint.
void PrintTrainingProgress(const v1::TrainingProgress& progress, const std::string& job_id,
                           std::ostream& out);

// A loss curve drawn in text, one line per element (no newlines, no trailing spaces): `height`
// rows of at most `width` columns (each column the mean loss of its share of the points, in order;
// non-finite losses left out), the highest and lowest values labelled on the left, an axis and the
// first and last steps below. `unicode`: the area under the curve in block elements
// (U+2581..U+2588, eighths of a row); otherwise one '*' per column at its row, in ASCII. Empty when
// no point is finite. Deterministic: the same points give the same lines.
std::vector<std::string> LossChart(const google::protobuf::RepeatedPtrField<v1::LossPoint>& points,
                                   int width, int height, bool unicode);

// `dattn list`: one row per job.
Table JobsTable(const std::vector<v1::Job>& jobs, absl::Time now);
// `dattn workers`: one row per worker.
Table WorkersTable(const std::vector<v1::Worker>& workers, absl::Time now);
// `dattn checkpoints`: one row per checkpoint (step, path, size, seconds to write, time).
Table CheckpointsTable(
    const google::protobuf::RepeatedPtrField<v1::TrainingCheckpoint>& checkpoints);
// A deployment's state: "serving" (loaded), "loading" (RUNNING, not yet loaded), else the job's.
std::string DeploymentState(const v1::Job& job);
// The model a deployment serves: "NAME:VERSION" (a registered model), "<training job> step N"
// ("(final)" for its final checkpoint), or the checkpoint folder it was given.
std::string DeploymentModel(const v1::Job& job);
// `dattn models`: one row per deployment (its state, the model it serves, its limits and what it
// served).
Table DeploymentsTable(const std::vector<v1::Job>& deployments, absl::Time now);
// `dattn models`: one row per complete checkpoint of each training job (newest job first, each
// job's steps newest first; "(final)" marks a succeeded job's final checkpoint).
Table TrainedModelsTable(const std::vector<v1::Job>& training_jobs);
// `dattn models` and `dattn models list`: one row per registered version ("NAME:VERSION", its size,
// weights, when and from what it was imported).
Table RegisteredModelsTable(const std::vector<v1::RegisteredModel>& models);
// `dattn status --events`: one row per event.
Table EventsTable(const google::protobuf::RepeatedPtrField<v1::JobEvent>& events);

// One line (no newline) describing an event, for `dattn watch` when stdout is not a terminal:
// "2024-05-01 12:00:03 UTC  #4  RUNNING  progress  50/100 steps  <message>". A training job's
// progress event without a message shows its figures instead (TrainingFigures). Kind and message go
// through Printable.
std::string EventLine(const v1::JobEvent& event);

// The protobuf JSON mapping of `message`: proto field names, enums by name, default-valued fields
// included. `pretty` indents it over several lines; otherwise it is one line. No trailing newline.
std::string ToJson(const google::protobuf::Message& message, bool pretty);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_FORMAT_H_
