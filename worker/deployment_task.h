// A rank of a deployment (JobSpec.deployment, docs/SERVING.md), run on a CPU or GPU worker: the
// worker's unit of serving, free of gRPC (the worker hands it a ServeChannel over its Serve
// stream). The model, its decoder and batch generator are a model::ServingModel made by the
// worker's device (options.new_serving_model: fp32 on a CPU, bf16 on a GPU), so this loop is the
// same on both.
//
// RunDeploymentTask takes a dattn.v1.TaskAssignment whose plan is a DeploymentRankPlan and:
//   1. with plan.ranks > 1, joins the deployment's ring (options.join_ring: the worker's
//   rendezvous,
//      ring_join.h; a Gloo communicator of plan.ranks ranks, this task's rank its assignment's);
//   2. opens the model folder (model/model_folder.h: a checkpoint's checksums verified), checks
//      that its model config is the one the coordinator planned with, reads its weights and has
//      the device make the serving model (options.new_serving_model): on a CPU the model in fp32,
//      whose attention is the ring's on a ring (model/ring_sequence_attention.h), on a GPU the
//      CUDA model in bf16 (one rank only);
//   3. the serving model's decoder serves the plan's max_context (on the ring: its rank's share
//      of each cache) and its BatchGenerator (model/batch_generator.h) max_batch sequences;
//   4. on ranks 1.. of a ring: calls options.on_following and follows rank 0 (Decoder::Follow)
//      until rank 0 releases it (it returns UNAVAILABLE: the deployment's attempt is over), the
//      ring breaks (the communicator's error) or it is cancelled (CANCELLED; the worker aborts the
//      communicator on a cancel, which ends the wait at once). The rest is rank 0's:
//   5. leads the ring (Decoder::Lead: every prefill, step and Score runs on every rank, keep-alives
//      while idle), opens the channel (options.open_channel) with its status (ready) and serves
//      until cancelled: GenerateRequests go to the generator's queue (at most max_queued waiting;
//      more are refused RESOURCE_EXHAUSTED), each of their tokens and their outcome go back as
//      ServeUpdates; ScoreRequests run between the generator's rounds (one forward pass); cancels
//      end their request at once, freeing its cache.
// It returns CANCELLED once is_cancelled() says so (the deployment was undeployed or its worker
// is stopping), after failing the requests in flight with UNAVAILABLE; UNAVAILABLE when the
// channel ends without a cancel (the coordinator went away: the deployment is placed again);
// FAILED_PRECONDITION / DATA_LOSS for a checkpoint that cannot serve (named); the model's errors.
//
// Threading: RunDeploymentTask blocks its calling thread for the whole task and does all model
// work on it; one more thread reads the channel. Callbacks run on the calling thread.
#ifndef DATTN_WORKER_DEPLOYMENT_TASK_H_
#define DATTN_WORKER_DEPLOYMENT_TASK_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "dattn/v1/worker.pb.h"
#include "engine/comm/communicator.h"
#include "model/config.h"
#include "model/serving_model.h"

namespace dattn {
namespace worker {

// The two directions of a deployment's Serve stream. Read blocks until work comes or the stream
// ends (false); Write returns false once the stream is broken. Read is called by one thread and
// Write by another, at the same time; Close (from the writing thread) ends both directions.
class ServeChannel {
 public:
  virtual ~ServeChannel() = default;
  virtual bool Read(v1::ServeWork* work) = 0;
  virtual bool Write(const v1::ServeUpdate& update) = 0;
  // Ends the stream (a Read in progress returns false) and returns its final status.
  virtual absl::Status Close() = 0;
};

struct DeploymentTaskOptions {
  int num_threads = 0;  // CPU threads of the model (0: every core).
  // Makes the serving model on the worker's device from the checkpoint's weights (host fp32, the
  // config's ParamLayout order): TaskDevice::NewServingModel. Null: the CPU's
  // (model::NewCpuServingModel with num_threads).
  std::function<absl::StatusOr<std::unique_ptr<model::ServingModel>>(
      const model::LongNetConfig& config, absl::Span<const float> params, int64_t max_context,
      int64_t max_batch, comm::Communicator* ring)>
      new_serving_model;
  std::function<bool()> is_cancelled;
  // With plan.ranks > 1: joins the ring and returns this rank's communicator (host memory), which
  // the caller owns and keeps until RunDeploymentTask returns (and aborts on a cancel).
  std::function<absl::StatusOr<comm::Communicator*>()> join_ring;
  // Ranks 1.. of a ring: called once the model is loaded, as the rank starts following rank 0.
  std::function<void()> on_following;
  // Opens the Serve stream once the model is loaded; `ready` is the first status it sends.
  std::function<absl::StatusOr<std::unique_ptr<ServeChannel>>(const v1::DeploymentStatus& ready)>
      open_channel;
  // The deployment's figures changed (readiness, queue, counts), at most every status_interval.
  std::function<void(const v1::DeploymentStatus&)> on_status;
  absl::Duration status_interval = absl::Seconds(1);
  // How long the loop sleeps when idle before it looks at is_cancelled again.
  absl::Duration idle_wait = absl::Milliseconds(20);
};

absl::Status RunDeploymentTask(const v1::TaskAssignment& assignment,
                               const DeploymentTaskOptions& options);

// What a request's client is told when it fails on the deployment: its own error (a bad token,
// its deadline, a non-finite logit, a decoder error), except that a communicator aborted under it
// (ABORTED: the worker aborts a ring's communicator when the task is cancelled, e.g. because
// another rank's worker was lost, and that may come before the ring's own error) is the
// deployment's failure, not the request's: UNAVAILABLE, retryable, as the ring's own errors are.
absl::Status RequestFailure(const absl::Status& error);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_DEPLOYMENT_TASK_H_
