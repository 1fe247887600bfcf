// The attention job as a work kind (work_kind.h): the engine run on inputs drawn from a seed, on
// one rank or a sequence-parallel ring, forward or forward + backward, timed.
//
// Analysis: api/attention_job.h (every field checked, the memory of the ring's largest rank planned
// per device kind). Each rank's assignment carries its AttentionRankPlan. Results: the per-rank
// results in rank order, the slowest rank's step time, the summed fp64 checksums and the whole
// job's effective TFLOP/s; with return_output, the output (B, N, H, D) is stored as the ranks'
// (B, N/P, H, D) shards. Recovery: only a rerun of the same job (the shape, precision and ring size
// are what the user asked to measure), so every in-place recovery is off.
//
// Thread-safety: as WorkKind; the AttemptResults it makes are not thread-safe.
#ifndef DATTN_SERVER_ATTENTION_KIND_H_
#define DATTN_SERVER_ATTENTION_KIND_H_

#include <memory>
#include <string>
#include <vector>

#include "api/attention_job.h"
#include "server/metrics.h"
#include "server/work_kind.h"

namespace dattn {
namespace server {

// The attention kind's analysis: the common part and the engine's view of the job.
struct AttentionAnalysis : JobAnalysis {
  api::AttentionJobInfo info;
};

// The job's result from its ranks' results (any order; one per rank): per-rank results in rank
// order, the slowest rank's step time, sums of the checksums, the nominal FLOPs of one step and
// the whole job's effective TFLOP/s (the whole problem's FLOPs over the slowest rank's step: ranks
// run in parallel).
v1::AttentionJobResult CombineRankResults(const api::AttentionJobInfo& info,
                                          std::vector<v1::RankResult> ranks);

class AttentionKind final : public WorkKind {
 public:
  // `metrics` (not owned, must outlive the kind) receives the attention metrics of finished jobs.
  explicit AttentionKind(Metrics* metrics) : metrics_(metrics) {}

  const char* name() const override { return "attention"; }
  v1::JobSpec::WorkCase work_case() const override { return v1::JobSpec::kAttention; }
  absl::StatusOr<std::shared_ptr<const JobAnalysis>> Analyze(
      const v1::JobSpec& spec, const std::string& path) const override;
  // Only what spec.recovery allows (nothing by default): more ranks (num_ranks doubled while it
  // divides seq_len, at most 256), then bf16 for an fp32 job that may run on GPUs, at each ring
  // size. Streamed jobs (Attend) have none: their call sizes them.
  std::vector<LadderRung> Ladder(const v1::JobSpec& spec,
                                 const JobAnalysis& analysis) const override;
  // Only what spec.recovery allows (nothing by default): num_ranks from P - 1 down to 2, those
  // dividing seq_len (shrink_ring; the 32 largest), then 1 (single_device). Streamed jobs have
  // none.
  std::vector<LadderRung> Shrinks(const v1::JobSpec& spec,
                                  const JobAnalysis& analysis) const override;
  void PlanRank(const JobAnalysis& analysis, size_t device, int rank,
                v1::TaskAssignment* assignment) const override;
  OutputLayout Output(const JobAnalysis& analysis) const override;
  v1::TensorHeader ShardHeader(const JobAnalysis& analysis, int rank) const override;
  std::unique_ptr<AttemptResults> NewAttempt(const JobAnalysis& analysis,
                                             size_t device) const override;
  void DescribeRecovery(const JobAnalysis& analysis, size_t device,
                        scheduler::RecoveryInput* input) const override;
  bool KeepsStoredOutput(const v1::JobResult& result) const override {
    return result.attention().has_output_info();
  }
  const v1::Tensor* InlineOutput(const v1::JobResult& result) const override {
    return result.attention().has_output() ? &result.attention().output() : nullptr;
  }
  void StripInlineOutput(v1::JobResult* result) const override {
    if (result->has_attention()) result->mutable_attention()->clear_output();
  }

 private:
  Metrics* const metrics_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_ATTENTION_KIND_H_
