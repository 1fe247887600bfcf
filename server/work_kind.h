// A kind of work the coordinator runs (attention jobs, training jobs, deployments), behind one
// interface, so that adding a kind touches none of the coordinator's roles (job book, worker
// registry, ring rendezvous, dispatcher).
//
// A kind:
//   1. validates and analyses a job's spec, once, at submit (and again only when a restarted
//      coordinator reloads a stored job): the JobAnalysis it returns is kept with the job and says
//      what every role needs: ranks, device kinds with the memory one rank needs on each, what the
//      workers must run, whether ranks upload an output;
//   2. turns the analysis into each rank's plan, which travels in the rank's assignment, so the
//      worker never analyses the spec again;
//   3. combines the ranks' reports of one attempt into the job's result (AttemptResults), and
//      describes its stored output's layout;
//   4. says which recoveries apply to its jobs after a failure;
//   5. folds its own figures of the ranks' reports into the job (a training job's loss,
//      evaluations and checkpoints) and names the events they imply.
// The dispatcher turns JobAnalysis::devices into the scheduler's resource request.
//
// Kinds are immutable after construction and every method may be called from any thread.
#ifndef DATTN_SERVER_WORK_KIND_H_
#define DATTN_SERVER_WORK_KIND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/attention_job.h"
#include "dattn/v1/attention.pb.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/worker.pb.h"
#include "scheduler/recovery.h"

namespace dattn {
namespace server {

// One device kind a job may run on (GPU or CPU), with the memory one rank reserves there.
using DeviceOption = api::DeviceVariant;

// What the coordinator's roles need to know of a valid job, whatever its kind. Made by
// WorkKind::Analyze; immutable; kinds derive from it to keep their own details.
struct JobAnalysis {
  virtual ~JobAnalysis() = default;

  int num_ranks = 1;        // Ranks of one attempt: a gang placed together.
  int64_t steps_total = 1;  // JobProgress.steps_total.
  std::string dtype;        // Element type the workers must run ("fp32", "bf16", ...).
  int64_t head_dim = 0;     // Head dimension the workers must run; 0: any.
  // Device kinds it may run on, in preference order; never empty.
  std::vector<DeviceOption> devices;
  // Ranks upload an output shard (WorkerRegistry.UploadOutput) before they report success.
  bool keeps_output = false;
  // The job can run only once: its inputs were in its caller's stream (a JobService.Attend call).
  // It is never requeued (a failure, a lost worker, a refusal, a restart or a shutdown fails it)
  // and its ranks' outputs go to the call (attend_relay.h), not to the ResultStore.
  bool runs_once = false;
  std::string summary;  // One line for the "submitted" event.
  // The planner's FLOPs of one step of one rank (0: unknown): sets the default stall limit
  // (StallLimit).
  double flops_per_rank_step = 0;
  // The job has no steps: its rank stays until cancelled (a deployment). Never recovered as
  // stalled (StallLimit), and a coordinator's drain does not wait for it (JobBook::AnyActiveRun).
  bool resident = false;
};

// How long a RUNNING job may go without finishing a step before it is recovered as stalled:
// never for a resident job (a deployment has no steps); else RecoveryPolicy.stall_seconds when
// set, else the larger of api::kDefaultStallSeconds and ten times one step at
// kStallFloorFlopsPerSecond (a rate every device exceeds), so that a job whose steps are long by
// design is not taken for a stalled one.
inline constexpr double kStallFloorFlopsPerSecond = 1e10;
absl::Duration StallLimit(const v1::JobSpec& spec, const JobAnalysis& analysis);

// How a stored output is laid out over its ranks' shards: `blocks` blocks, each the concatenation
// of every rank's next `rank_block_bytes` in rank order (an attention output (B, N, H, D) is B
// blocks of N/P rows per rank).
struct OutputLayout {
  v1::TensorHeader header;  // The whole output.
  int ranks = 1;
  int64_t blocks = 1;
  int64_t rank_block_bytes = 0;
};

// The most specs WorkKind::Ladder or WorkKind::Shrinks lists: each is analysed (a memory plan)
// under the coordinator's lock.
inline constexpr size_t kMostRungs = 32;

// A ring of `ranks` that lost a worker (WorkKind::Shrinks): the smaller rank counts that divide
// `length` (an attention job's N, a deployment's max_context), largest first: those of 2 or more
// when `shrink` (the kMostRungs largest), then 1 when `single`.
std::vector<int> FewerRanks(int ranks, int64_t length, bool shrink, bool single);

// One rung of the out-of-memory ladder (WorkKind::Ladder): a complete spec to try instead of the
// job's, and what it changes ("micro_batches 2", "sequence_parallel 4", "bf16"), for events.
struct LadderRung {
  v1::JobSpec spec;
  std::string change;
};

// One attempt's results: the reports of its ranks, combined once every rank has succeeded. Not
// thread-safe; the coordinator calls it under its lock.
class AttemptResults {
 public:
  virtual ~AttemptResults() = default;
  // Rank `rank` succeeded with `report` (rank_result set) on worker `worker_id` (named
  // `worker_name`). Once per rank.
  virtual void AddRank(int rank, const std::string& worker_id, const std::string& worker_name,
                       const v1::TaskReport& report) = 0;
  virtual int ranks_done() const = 0;
  // Every rank succeeded: the job's result (with the stored output's header when the job kept
  // one) and the message of its "succeeded" event. Records the kind's metrics of a finished job.
  virtual std::string Finish(const v1::TensorHeader* output, v1::JobResult* result) = 0;
};

class WorkKind {
 public:
  virtual ~WorkKind() = default;

  // The kind's name: JobSpec's `work` field ("attention"), the store's kind column and the
  // metrics' kind label.
  virtual const char* name() const = 0;
  virtual v1::JobSpec::WorkCase work_case() const = 0;

  // Validates the kind's part of `spec` (the message at `path`, e.g. "spec") and analyses it.
  // INVALID_ARGUMENT naming the field and value; UNIMPLEMENTED for a valid job that cannot run yet.
  virtual absl::StatusOr<std::shared_ptr<const JobAnalysis>> Analyze(
      const v1::JobSpec& spec, const std::string& path) const = 0;

  // A spec that asks to be sized to the cluster (a training job's auto_data_parallel): the specs
  // to try, largest first, each a complete spec of a fixed size; the coordinator keeps the first
  // whose gang the ready workers can hold. Empty (the default): the spec is run as it is. Called
  // on a spec Analyze accepted, with that analysis.
  virtual std::vector<v1::JobSpec> Sizes(const v1::JobSpec& spec,
                                         const JobAnalysis& analysis) const;

  // The out-of-memory ladder (docs/ARCHITECTURE.md, "Failure handling"): the specs to try, in
  // order, when `spec` fits no ready workers as asked, as far as spec.recovery (with the kind's
  // defaults) allows: more micro-batches, then more ranks, then a lower precision. The coordinator
  // runs the first that fits. Called on a spec Analyze accepted, with that analysis. Default:
  // none.
  virtual std::vector<LadderRung> Ladder(const v1::JobSpec& spec,
                                         const JobAnalysis& analysis) const;

  // Ring shrink (docs/ARCHITECTURE.md, "Failure handling"): the specs of fewer ranks to try, in
  // order (most ranks first), when a ring failure requeued `spec` and the ready workers can no
  // longer hold it, as far as spec.recovery.shrink_ring (sizes of 2 ranks or more) and
  // single_device (one rank) allow with the kind's defaults. Each is exact: the same results
  // within rounding. The coordinator runs the first that fits. Called on a spec Analyze accepted,
  // with that analysis. Default: none.
  virtual std::vector<LadderRung> Shrinks(const v1::JobSpec& spec,
                                          const JobAnalysis& analysis) const;

  // Fills `assignment`'s plan for rank `rank` on analysis.devices[device].
  virtual void PlanRank(const JobAnalysis& analysis, size_t device, int rank,
                        v1::TaskAssignment* assignment) const = 0;

  // With analysis.keeps_output: the whole output's layout, and the header rank `rank`'s shard must
  // carry.
  virtual OutputLayout Output(const JobAnalysis& analysis) const = 0;
  virtual v1::TensorHeader ShardHeader(const JobAnalysis& analysis, int rank) const = 0;

  // A new attempt's result accumulator, on analysis.devices[device].
  virtual std::unique_ptr<AttemptResults> NewAttempt(const JobAnalysis& analysis,
                                                     size_t device) const = 0;

  // Which recoveries apply after a failure: fills `input`'s job description and allow_* switches
  // and memory function (scheduler/recovery.h); the caller fills the failure and attempts.
  virtual void DescribeRecovery(const JobAnalysis& analysis, size_t device,
                                scheduler::RecoveryInput* input) const = 0;

  // A report of rank `rank` (any state) may carry the kind's own figures (a training job's
  // progress.training): folds them into `job` (its live progress) and appends the events they
  // imply to `events` (a training job's "checkpoint", "evaluation", "resumed"), which the caller
  // records durably. Called under the coordinator's lock: must be quick. Default: nothing.
  virtual void TakeProgress(const JobAnalysis& analysis, size_t device, int rank,
                            const v1::TaskReport& report, v1::Job* job,
                            std::vector<v1::JobEvent>* events) const;
  // The message of a stored "progress" event. Default: "D of T steps".
  virtual std::string ProgressMessage(const v1::JobProgress& progress) const;
  // The job's attempt stopped running (the job ended, or went back to the queue): the kind drops
  // what it keeps of a running attempt (its per-job metric series). Default: nothing.
  virtual void AttemptEnded(const std::string& job_id) const;

  // Stored results. Whether a finished job's result names an output kept in the ResultStore (its
  // attempt's shards then stay with the job).
  virtual bool KeepsStoredOutput(const v1::JobResult& result) const = 0;
  // A job stored before outputs moved out of band carries its output tensor in its result: that
  // tensor (ReadOutput streams it), or nullptr.
  virtual const v1::Tensor* InlineOutput(const v1::JobResult& result) const = 0;
  // Drops such a tensor from a result (views and listings carry none).
  virtual void StripInlineOutput(v1::JobResult* result) const = 0;
};

// The kinds the coordinator runs, found by a spec's `work` or by name. Owns them.
class WorkKinds {
 public:
  void Add(std::unique_ptr<WorkKind> kind);
  // The kind of `spec`'s work, or nullptr when no kind handles it (or no work is set).
  const WorkKind* For(const v1::JobSpec& spec) const;
  // The kind called `name`, or nullptr.
  const WorkKind* Named(const std::string& name) const;
  // "attention" or "attention, training": for messages.
  std::string Names() const;
  // Every kind, in the order added (the first is the default where a stored job names none).
  std::vector<const WorkKind*> All() const;

 private:
  std::vector<std::unique_ptr<WorkKind>> kinds_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_WORK_KIND_H_
