// The training job as a work kind (work_kind.h): a LongNet language model trained on
// data_parallel x sequence_parallel ranks placed as one gang (docs/TRAINING_JOBS.md).
//
// Analysis: api/training_job.h (the trainer config and the service's fields checked, the memory of
// one rank's whole training step planned per device kind). Each rank's assignment carries its
// TrainingRankPlan (the resolved trainer config, its rank, the job's checkpoint folder).
// Progress: rank 0's reports carry progress.training (every rank computes the same figures); the
// kind keeps them in the job's live progress and records an event for every new checkpoint
// ("checkpoint"), evaluation ("evaluation") and resumed attempt ("resumed"); the message of a
// stored "progress" event carries the loss. Result: rank 0's TrainingJobResult, with the job's
// degrees. Recovery: a rerun of the whole gang, which continues from the job's newest complete
// checkpoint (the worker's training task resumes from it); no in-place recovery yet.
// Metrics: dattn_training_* (server/metrics.h).
//
// Thread-safety: as WorkKind; the AttemptResults it makes are not thread-safe.
#ifndef DATTN_SERVER_TRAINING_KIND_H_
#define DATTN_SERVER_TRAINING_KIND_H_

#include <memory>
#include <string>
#include <vector>

#include "api/training_job.h"
#include "server/metrics.h"
#include "server/work_kind.h"

namespace dattn {
namespace server {

struct TrainingAnalysis : JobAnalysis {
  api::TrainingJobInfo info;
};

class TrainingKind final : public WorkKind {
 public:
  // `metrics` (not owned, must outlive the kind) receives the training metrics.
  explicit TrainingKind(Metrics* metrics) : metrics_(metrics) {}

  const char* name() const override { return "training"; }
  v1::JobSpec::WorkCase work_case() const override { return v1::JobSpec::kTraining; }
  absl::StatusOr<std::shared_ptr<const JobAnalysis>> Analyze(
      const v1::JobSpec& spec, const std::string& path) const override;
  // With auto_data_parallel: D from min(batch_size / micro_batches, 256 / S) down to 1, the
  // divisors of batch_size / micro_batches, each with data_parallel = D and the flag cleared.
  // More micro-batches (doubling, while they divide the batch into whole rows per group), then
  // more sequence ranks (doubling, while S divides seq_len and D x S <= 256), each sequence
  // degree with every micro-batch count; as far as spec.recovery allows (both by default).
  std::vector<LadderRung> Ladder(const v1::JobSpec& spec,
                                 const JobAnalysis& analysis) const override;
  // Every D' x S' of fewer ranks than D x S (S' dividing S, D' dividing D), the most ranks
  // first, then the most sequence ranks (a long sequence's share stays small), then the fewest
  // micro-batches: M, then M doubled while the batch still splits into whole rows per group
  // (split_batch allowing), so that a rank's rows per micro-batch need not grow. World sizes of 2
  // or more as shrink_ring allows, 1 as single_device allows (both by default).
  std::vector<LadderRung> Shrinks(const v1::JobSpec& spec,
                                  const JobAnalysis& analysis) const override;
  std::vector<v1::JobSpec> Sizes(const v1::JobSpec& spec,
                                 const JobAnalysis& analysis) const override;
  void PlanRank(const JobAnalysis& analysis, size_t device, int rank,
                v1::TaskAssignment* assignment) const override;
  // Training jobs keep no output in the coordinator (their models are their checkpoints).
  OutputLayout Output(const JobAnalysis& analysis) const override;
  v1::TensorHeader ShardHeader(const JobAnalysis& analysis, int rank) const override;
  std::unique_ptr<AttemptResults> NewAttempt(const JobAnalysis& analysis,
                                             size_t device) const override;
  void DescribeRecovery(const JobAnalysis& analysis, size_t device,
                        scheduler::RecoveryInput* input) const override;
  void TakeProgress(const JobAnalysis& analysis, size_t device, int rank,
                    const v1::TaskReport& report, v1::Job* job,
                    std::vector<v1::JobEvent>* events) const override;
  std::string ProgressMessage(const v1::JobProgress& progress) const override;
  void AttemptEnded(const std::string& job_id) const override;
  bool KeepsStoredOutput(const v1::JobResult&) const override { return false; }
  const v1::Tensor* InlineOutput(const v1::JobResult&) const override { return nullptr; }
  void StripInlineOutput(v1::JobResult*) const override {}

 private:
  Metrics* const metrics_;
};

// One line for a training progress: "step 120 of 1000: loss 2.3456, lr 3.0e-04, 12.3K tokens/s".
std::string DescribeTrainingProgress(const v1::TrainingProgress& progress);

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_TRAINING_KIND_H_
