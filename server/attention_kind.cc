#include "server/attention_kind.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/engine_convert.h"
#include "api/limits.h"

namespace dattn {
namespace server {
namespace {

const api::AttentionJobInfo& Info(const JobAnalysis& analysis) {
  // Only this kind makes the analyses it is handed back.
  return static_cast<const AttentionAnalysis&>(analysis).info;
}

class AttentionAttempt final : public AttemptResults {
 public:
  AttentionAttempt(const api::AttentionJobInfo& info, bool gpu, Metrics* metrics)
      : info_(info), gpu_(gpu), metrics_(metrics) {}

  void AddRank(int rank, const std::string& worker_id, const std::string& worker_name,
               const v1::TaskReport& report) override {
    v1::RankResult result = report.rank_result();
    result.set_rank(rank);
    result.set_worker_id(worker_id);
    if (result.ring_formation_seconds() <= 0) {
      result.set_ring_formation_seconds(report.ring_formation_seconds());
    }
    // The rank's share of the job's FLOPs: its rate times its step time, over every step.
    metrics_->ObserveRank(
        worker_name, result.seconds_per_step(),
        result.tflops() * 1e12 * result.seconds_per_step() * static_cast<double>(info_.iterations),
        result.tflops());
    ranks_.push_back(std::move(result));
  }

  int ranks_done() const override { return static_cast<int>(ranks_.size()); }

  std::string Finish(const v1::TensorHeader* output, v1::JobResult* result) override {
    v1::AttentionJobResult combined = CombineRankResults(info_, std::move(ranks_));
    ranks_.clear();
    if (output != nullptr) *combined.mutable_output_info() = *output;
    metrics_->ObserveAttentionJob(gpu_ ? "gpu" : "cpu", combined.tflops(),
                                  combined.seconds_per_step());
    metrics_->AddAttentionWork(info_.tokens,
                               info_.flops_per_step * static_cast<double>(info_.iterations));
    std::string message =
        absl::StrFormat("%d of %d ranks succeeded: %.6g s/step, %.4g TFLOP/s", info_.num_ranks,
                        info_.num_ranks, combined.seconds_per_step(), combined.tflops());
    if (output != nullptr) {
      absl::StrAppend(&message, "; output of ", scheduler::FormatBytes(output->total_bytes()),
                      " stored");
    }
    *result->mutable_attention() = std::move(combined);
    return message;
  }

 private:
  const api::AttentionJobInfo& info_;  // Lives in the job's analysis, which outlives the attempt.
  const bool gpu_;
  Metrics* const metrics_;
  std::vector<v1::RankResult> ranks_;
};

}  // namespace

v1::AttentionJobResult CombineRankResults(const api::AttentionJobInfo& info,
                                          std::vector<v1::RankResult> ranks) {
  std::sort(ranks.begin(), ranks.end(),
            [](const v1::RankResult& a, const v1::RankResult& b) { return a.rank() < b.rank(); });
  v1::AttentionJobResult result;
  for (v1::RankResult& rank : ranks) {
    result.set_seconds_per_step(std::max(result.seconds_per_step(), rank.seconds_per_step()));
    result.set_out_sum(result.out_sum() + rank.out_sum());
    result.set_out_sum_squares(result.out_sum_squares() + rank.out_sum_squares());
    result.set_grad_sum(result.grad_sum() + rank.grad_sum());
    result.set_grad_sum_squares(result.grad_sum_squares() + rank.grad_sum_squares());
    *result.add_ranks() = std::move(rank);
  }
  result.set_flops_per_step(info.flops_per_step);
  if (result.seconds_per_step() > 0) {
    result.set_tflops(info.flops_per_step / result.seconds_per_step() / 1e12);
  }
  return result;
}

absl::StatusOr<std::shared_ptr<const JobAnalysis>> AttentionKind::Analyze(
    const v1::JobSpec& spec, const std::string& path) const {
  if (spec.work_case() != v1::JobSpec::kAttention) {
    return absl::InvalidArgumentError(absl::StrCat(path, ".attention: required"));
  }
  absl::StatusOr<api::AttentionJobInfo> info =
      api::AnalyzeAttentionJob(spec.attention(), path + ".attention");
  if (!info.ok()) return info.status();
  auto analysis = std::make_shared<AttentionAnalysis>();
  analysis->info = *std::move(info);
  const api::AttentionJobInfo& i = analysis->info;
  analysis->num_ranks = i.num_ranks;
  analysis->steps_total = i.iterations;
  analysis->dtype = DTypeName(i.dtype);
  analysis->head_dim = i.head_dim;
  analysis->devices = i.variants;
  analysis->keeps_output = i.return_output;
  analysis->runs_once = i.streamed;
  analysis->flops_per_rank_step = i.flops_per_step / i.num_ranks;
  analysis->summary = absl::StrCat(
      "attention ", i.spec.DebugString(), " on (B, N, H, D) = (", i.batch, ", ", i.seq_len, ", ",
      i.num_heads, ", ", i.head_dim, ") ", DTypeName(i.dtype), ", ", i.num_ranks,
      i.num_ranks == 1 ? " rank, " : " ranks, ", i.iterations,
      i.backward ? " forward+backward" : " forward", i.iterations == 1 ? " step" : " steps",
      i.streamed ? ", on the caller's tensors (Attend)" : "",
      i.return_output
          ? absl::StrCat(", output of ", scheduler::FormatBytes(i.output_bytes), " kept")
          : "");
  return std::shared_ptr<const JobAnalysis>(std::move(analysis));
}

std::vector<LadderRung> AttentionKind::Ladder(const v1::JobSpec& spec,
                                              const JobAnalysis& analysis) const {
  std::vector<LadderRung> rungs;
  if (spec.work_case() != v1::JobSpec::kAttention || spec.attention().streamed()) return rungs;
  const v1::RecoveryPolicy& policy = spec.recovery();
  const bool more = policy.more_ranks();
  const bool lower = policy.lower_precision();
  const api::AttentionJobInfo& info = Info(analysis);
  const v1::AttentionJobSpec& job = spec.attention();
  std::vector<v1::DType> dtypes = {job.dtype()};
  // bf16 runs on GPUs only: an fp32 job that may not use them has nothing lower.
  if (lower && job.dtype() == v1::DTYPE_FP32 && job.device() != v1::DEVICE_PREFERENCE_CPU) {
    dtypes.push_back(v1::DTYPE_BF16);
  }
  for (v1::DType dtype : dtypes) {
    for (int64_t p = info.num_ranks; p <= api::kMaxRingRanks && info.seq_len % p == 0; p *= 2) {
      if (p != info.num_ranks && !more) break;
      if (p == info.num_ranks && dtype == job.dtype()) continue;
      LadderRung rung;
      rung.spec = spec;
      rung.spec.mutable_attention()->set_num_ranks(p);
      rung.spec.mutable_attention()->set_dtype(dtype);
      if (dtype != job.dtype())
        rung.spec.mutable_attention()->set_device(v1::DEVICE_PREFERENCE_GPU);
      rung.change =
          absl::StrCat(p, p == 1 ? " rank" : " ranks", dtype != job.dtype() ? ", bf16" : "");
      rungs.push_back(std::move(rung));
    }
  }
  return rungs;
}

std::vector<LadderRung> AttentionKind::Shrinks(const v1::JobSpec& spec,
                                               const JobAnalysis& analysis) const {
  std::vector<LadderRung> rungs;
  if (spec.work_case() != v1::JobSpec::kAttention || spec.attention().streamed()) return rungs;
  const v1::RecoveryPolicy& policy = spec.recovery();
  const api::AttentionJobInfo& info = Info(analysis);
  for (int p :
       FewerRanks(info.num_ranks, info.seq_len, policy.shrink_ring(), policy.single_device())) {
    LadderRung rung;
    rung.spec = spec;
    rung.spec.mutable_attention()->set_num_ranks(static_cast<int32_t>(p));
    rung.change = absl::StrCat(p, p == 1 ? " rank" : " ranks");
    rungs.push_back(std::move(rung));
  }
  return rungs;
}

void AttentionKind::PlanRank(const JobAnalysis& analysis, size_t device, int rank,
                             v1::TaskAssignment* assignment) const {
  *assignment->mutable_attention_plan() =
      api::PlanAttentionRank(Info(analysis), analysis.devices[device], rank);
}

OutputLayout AttentionKind::Output(const JobAnalysis& analysis) const {
  const api::AttentionJobInfo& i = Info(analysis);
  OutputLayout layout;
  layout.header.set_dtype(api::ToApiDType(i.dtype));
  for (int64_t d : {i.batch, i.seq_len, i.num_heads, i.head_dim}) layout.header.add_shape(d);
  layout.header.set_total_bytes(i.output_bytes);
  layout.ranks = i.num_ranks;
  layout.blocks = i.batch;
  layout.rank_block_bytes = i.output_bytes / i.batch / i.num_ranks;
  return layout;
}

v1::TensorHeader AttentionKind::ShardHeader(const JobAnalysis& analysis, int) const {
  const api::AttentionJobInfo& i = Info(analysis);
  v1::TensorHeader header;
  header.set_dtype(api::ToApiDType(i.dtype));
  for (int64_t d : {i.batch, i.seq_len / i.num_ranks, i.num_heads, i.head_dim}) {
    header.add_shape(d);
  }
  header.set_total_bytes(i.output_bytes / i.num_ranks);
  return header;
}

std::unique_ptr<AttemptResults> AttentionKind::NewAttempt(const JobAnalysis& analysis,
                                                          size_t device) const {
  return std::make_unique<AttentionAttempt>(Info(analysis), analysis.devices[device].gpu, metrics_);
}

void AttentionKind::DescribeRecovery(const JobAnalysis& analysis, size_t device,
                                     scheduler::RecoveryInput* input) const {
  const api::AttentionJobInfo& i = Info(analysis);
  input->num_ranks = i.num_ranks;
  input->surviving_ranks = 0;
  input->seq_len = i.seq_len;
  input->micro_batch_size = 1;
  input->dtype = DTypeName(i.dtype);
  input->needs_gpu = analysis.devices[device].gpu;
  // An attention job's shape, precision and ring size are what the user asked to measure: only a
  // rerun of the same job is a faithful recovery.
  input->allow_shrink = false;
  input->allow_single_device = false;
  input->allow_precision_fallback = false;
  input->allow_more_ranks = false;
  const int planned_ranks = i.num_ranks;
  const int64_t planned_bytes = analysis.devices[device].memory_per_rank_bytes;
  input->memory_per_rank = [planned_ranks, planned_bytes](int ranks) -> std::optional<int64_t> {
    if (ranks != planned_ranks) return std::nullopt;
    return planned_bytes;
  };
}

}  // namespace server
}  // namespace dattn
