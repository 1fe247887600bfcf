// The analysis of a training job's spec (dattn.v1 TrainingJobSpec), done once by the coordinator
// when the job is submitted (and again when a restarted coordinator reloads it), and the per-rank
// plan derived from it that travels in each rank's assignment, so that no worker analyses the spec
// again.
//
// AnalyzeTrainingJob parses the trainer configuration (config_json: the document dattn-train
// takes, model/trainer_config.h) and checks every rule of it and of the service's fields: the
// data-parallel and sequence-parallel degrees against the batch and the sequence, the checkpoint
// and init folders, the device. It derives the job's size (parameters, model FLOPs and tokens of a
// step) and the device kinds it may run on with the memory one rank needs on each: on CPU workers
// the planner of a CPU training rank (model/training_memory.h), on GPU workers the CUDA model's
// plan of a whole step (model/cuda/training_plan.h) with this rank's optimizer shard and, on a
// ring, the ring engine's exchange buffers (engine/rank_memory_plan.h).
//
// Every error names the field path (prefixed by the caller's `path`) and the offending value, e.g.
// "spec.training.sequence_parallel: must divide seq_len = 1000, got 3" or
// "spec.training.config_json: trainer config field \"optimizer.lr\": -1 must be finite and > 0".
// Codes: INVALID_ARGUMENT for a bad value; UNIMPLEMENTED for a valid job the system cannot run.
// All functions are pure and thread-safe.
#ifndef DATTN_API_TRAINING_JOB_H_
#define DATTN_API_TRAINING_JOB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "api/attention_job.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/worker.pb.h"
#include "model/trainer_config.h"

namespace dattn {
namespace api {

// TrainingJobSpec.config_json: at most this many bytes.
inline constexpr size_t kMaxTrainingConfigBytes = 16 << 10;
// TrainingJobSpec.checkpoint_dir and .init_from: at most this many characters.
inline constexpr size_t kMaxTrainingPathLength = 1024;
// The trainer configuration's "checkpoint.keep_last" in the service: every progress report lists
// the checkpoints kept, so their number is bounded.
inline constexpr int64_t kMaxKeptCheckpoints = 100;
// TrainingJobResult.loss_curve: at most this many points.
inline constexpr int kMaxLossCurvePoints = 2000;

// The trainer's view of a valid training job.
struct TrainingJobInfo {
  model::TrainerConfig config;  // Validated; "device" and "threads" as the user gave them.
  int data_parallel = 1;        // D.
  int sequence_parallel = 1;    // S.
  int world = 1;                // W = D x S.
  std::string checkpoint_root;  // TrainingJobSpec.checkpoint_dir; empty: none.
  std::string init_from;
  int64_t parameters = 0;
  int64_t micro_rows = 0;      // Rows of one micro-batch of one data-parallel group.
  double flops_per_step = 0;   // Model FLOPs of one step, every rank together.
  double tokens_per_step = 0;  // batch_size x seq_len.
  // Device kinds it may run on, in preference order (GPU before CPU for DEVICE_PREFERENCE_ANY);
  // never empty.
  std::vector<DeviceVariant> variants;
};

// Checks `job` (the message at `path`, e.g. "spec.training") and derives its info.
absl::StatusOr<TrainingJobInfo> AnalyzeTrainingJob(const v1::TrainingJobSpec& job,
                                                   const std::string& path);

// The job's own checkpoint folder: <checkpoint_root>/<job_id>; empty without a root.
std::string TrainingCheckpointDir(const TrainingJobInfo& info, const std::string& job_id);
// The same from the job's stored spec (a job already accepted: its config is not analysed again).
std::string TrainingCheckpointDir(const v1::TrainingJobSpec& job, const std::string& job_id);

// The plan of rank `rank` (0 <= rank < info.world) of job `job_id` on `variant` (one of
// info.variants): the resolved trainer config (device "cpu" or "cuda"), the degrees, the job's
// checkpoint folder, the memory reserved for it and its share of the FLOPs.
v1::TrainingRankPlan PlanTrainingRank(const TrainingJobInfo& info, const DeviceVariant& variant,
                                      int rank, const std::string& job_id);

// The rendezvous prefix of data-parallel group `group`'s own communicator in the ring's store
// (S > 1): "<ring_id>/sp/<group>", ring_id being the attempt's (RingInfo.ring_id). The world's
// communicator is formed under "<ring_id>/comm" (worker/ring_join.h).
std::string SequenceGroupPrefix(const std::string& ring_id, int group);

}  // namespace api
}  // namespace dattn

#endif  // DATTN_API_TRAINING_JOB_H_
