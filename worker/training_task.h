// One rank of a training job, run on a device: the worker's unit of training work, free of gRPC.
//
// RunTrainingTask takes a dattn.v1.TaskAssignment whose spec is a TrainingJobSpec and:
//   1. takes the rank's plan from the assignment (TrainingRankPlan: the coordinator analysed the
//      spec once, api/training_job.h) and parses its resolved trainer config;
//   2. admits the plan's bytes against the device's free memory (reserve_memory), as an attention
//      task does;
//   3. opens the training corpus (the config's data paths, read on this worker);
//   4. on W = D x S > 1 ranks: joins the ring (ring_join.h: the world's communicator over all W
//      ranks) and, with S > 1, forms its data-parallel group's own communicator over its S ranks
//      through the same rendezvous store (api::SequenceGroupPrefix), on which the model's
//      attention runs the ring engine (model/ring_sequence_attention.h);
//   5. makes the model on the device (TaskDevice::NewTrainableModel) and the trainer
//      (model/trainer.h) over the world's collective (TaskDevice::NewTrainerCollective): data-
//      parallel rank w / S, sequence rank w % S, ZeRO-1 over all W ranks;
//   6. continues from the job's newest complete checkpoint when its folder has one (a requeued or
//      restarted job), else starts fresh, from init_from's weights when given;
//   7. trains to the config's steps, reporting a TrainingProgress after every step, evaluation and
//      checkpoint, and writing checkpoints (every rank its shard, rank 0 the manifest last);
//   8. returns the run's TrainingJobResult.
//
// Cancellation is a collective stop, not an abort: once is_cancelled() says so, the ranks agree at
// the next step boundary, save a checkpoint (with a checkpoint folder) and end CANCELLED together,
// so that a cancelled or interrupted job keeps its work. Only when the ranks do not stop within
// `cancel_grace` (a peer hung, a step far longer than expected) are the communicators aborted,
// which ends the task at once without a checkpoint.
//
// Threads: `threads` of the config when > 0 (a resumed run reproduces the uninterrupted one bit
// for bit on the CPU only with the same count), else options.num_threads.
//
// Threading: RunTrainingTask blocks its calling thread for the whole task; callbacks run on that
// thread (the cancel watchdog, a thread of its own, only calls Abort on the communicators).
#ifndef DATTN_WORKER_TRAINING_TASK_H_
#define DATTN_WORKER_TRAINING_TASK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dattn/v1/training.pb.h"
#include "dattn/v1/worker.pb.h"
#include "engine/comm/communicator.h"
#include "engine/comm/tcp_store.h"
#include "model/trainer_config.h"
#include "worker/oom_retry.h"
#include "worker/task_device.h"

namespace dattn {
namespace worker {

struct TrainingTaskPlan {
  model::TrainerConfig config;  // "device" is "cpu" or "cuda".
  int rank = 0;                 // w
  int data_parallel = 1;        // D
  int sequence_parallel = 1;    // S
  int world = 1;                // W = D x S
  std::string checkpoint_dir;   // The job's own folder; empty: no checkpoints.
  std::string init_from;
  int64_t memory_bytes = 0;
  std::string memory_plan;
  double flops_per_step = 0;  // This rank's.
};

// The plan of `task` from its assignment, checked against the job and `caps`. INVALID_ARGUMENT for
// a task without training work or without its training_plan (a coordinator older than this
// worker), a plan whose degrees do not match the ring (ring.size != W, ring.rank != rank), a
// config that does not parse, or a device kind this worker is not ("cuda" on a CPU worker).
absl::StatusOr<TrainingTaskPlan> PlanTrainingTask(const v1::TaskAssignment& task,
                                                  const BackendCaps& caps);

struct TrainingTaskOptions {
  int num_threads = 1;  // CPU threads of the model when the config's "threads" is 0.
  // As AttentionTaskOptions: called once with the plan's bytes before anything is allocated;
  // returns the bytes this task may use (RESOURCE_EXHAUSTED when the plan exceeds them). Absent:
  // the device's FreeMemoryBytes().
  std::function<absl::StatusOr<int64_t>(int64_t planned_bytes)> reserve_memory;
  // Stored in the ring's store when this rank arrives.
  std::string member_name;
  absl::Duration default_comm_timeout = absl::Seconds(120);
  comm::StoreTls store_tls;
  std::function<void(v1::RankPhase)> on_phase;
  // Called once when making the model ran out of memory and was retried after releasing the
  // device's caches (oom_retry.h), with what happened.
  std::function<void(const OomRetry&)> on_out_of_memory_retry;
  // Called with every communicator of the rank once formed (the world's, then the group's) and
  // the seconds the world's formation took; with ({}, seconds) before they are destroyed.
  std::function<void(const std::vector<comm::Communicator*>&, double)> on_communicators;
  // Called once, just before the first step (after a resume).
  std::function<void()> on_started;
  // Called after every step, evaluation and checkpoint with the run's figures so far.
  std::function<void(const v1::TrainingProgress&)> on_progress;
  // Polled before each step; true stops the run (collectively) with a checkpoint and CANCELLED.
  std::function<bool()> is_cancelled;
  // How long after a cancel the ranks may take to stop together before the communicators are
  // aborted.
  absl::Duration cancel_grace = absl::Seconds(60);
};

struct TrainingTaskResult {
  v1::TrainingJobResult result;
  int64_t steps_done = 0;
  double ring_formation_seconds = 0;
};

// Runs `task` on `device` (not owned; must outlive the call). On failure, `last` (optional) holds
// the progress as last reported (its checkpoints, for the final report).
// Errors: PlanTrainingTask's; RESOURCE_EXHAUSTED when the memory plan exceeds what the device
// has; the corpus's (NOT_FOUND naming a missing data file, INVALID_ARGUMENT for a corpus the model
// cannot take); JoinRing's; the trainer's (Resume's DATA_LOSS naming a damaged checkpoint file,
// FAILED_PRECONDITION for a checkpoint of another run, ABORTED for a diverged run); init_from's
// (NOT_FOUND, DATA_LOSS, FAILED_PRECONDITION for another model config); CANCELLED after a cancel
// (saying at which step, and the checkpoint saved); the communicator's errors, prefixed with the
// ring and rank.
absl::StatusOr<TrainingTaskResult> RunTrainingTask(const v1::TaskAssignment& task,
                                                   TaskDevice* device,
                                                   const TrainingTaskOptions& options,
                                                   v1::TrainingProgress* last = nullptr);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_TRAINING_TASK_H_
