#include "server/training_kind.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/limits.h"
#include "nlohmann/json.hpp"
#include "scheduler/types.h"

namespace dattn {
namespace server {
namespace {

const api::TrainingJobInfo& Info(const JobAnalysis& analysis) {
  // Only this kind makes the analyses it is handed back.
  return static_cast<const TrainingAnalysis&>(analysis).info;
}

std::string Rate(double tokens_per_second) {
  if (tokens_per_second >= 1e6) return absl::StrFormat("%.3gM tokens/s", tokens_per_second / 1e6);
  if (tokens_per_second >= 1e3) return absl::StrFormat("%.3gK tokens/s", tokens_per_second / 1e3);
  return absl::StrFormat("%.3g tokens/s", tokens_per_second);
}

std::string DescribeEvaluation(const v1::TrainingEvaluation& e) {
  std::string out = absl::StrCat("evaluation at step ", e.step(), ":");
  if (e.has_validation()) {
    absl::StrAppend(&out, absl::StrFormat(" validation loss %.4f", e.validation_loss()));
    if (e.bits_per_byte() > 0)
      absl::StrAppend(&out, absl::StrFormat(" (%.4f bits/byte)", e.bits_per_byte()));
  }
  if (e.retrieval_examples() > 0) {
    absl::StrAppend(&out, e.has_validation() ? "," : "",
                    absl::StrFormat(" retrieval %.1f%% exact of %d examples",
                                    100 * e.retrieval_accuracy(), e.retrieval_examples()));
  }
  return out;
}

class TrainingAttempt final : public AttemptResults {
 public:
  TrainingAttempt(const api::TrainingJobInfo& info, bool gpu) : info_(info), gpu_(gpu) {}

  void AddRank(int rank, const std::string& worker_id, const std::string&,
               const v1::TaskReport& report) override {
    ++ranks_done_;
    if (rank == 0) {
      result_ = report.training_result();
      has_result_ = report.has_training_result();
    }
    worker_ids_.push_back(worker_id);
  }

  int ranks_done() const override { return ranks_done_; }

  std::string Finish(const v1::TensorHeader*, v1::JobResult* result) override {
    v1::TrainingJobResult r = std::move(result_);
    r.set_data_parallel(info_.data_parallel);
    r.set_sequence_parallel(info_.sequence_parallel);
    r.set_parameters(info_.parameters);
    r.set_flops_per_step(info_.flops_per_step);
    std::string message =
        absl::StrCat(info_.world, info_.world == 1 ? " rank" : " ranks", " (", info_.data_parallel,
                     " x ", info_.sequence_parallel, ", ", gpu_ ? "GPU" : "CPU", ") trained ",
                     r.steps(), r.steps() == 1 ? " step" : " steps");
    if (!has_result_) {
      absl::StrAppend(&message, "; rank 0 reported no training figures");
    } else {
      absl::StrAppend(&message, absl::StrFormat(": loss %.4f", r.final_loss()));
      if (r.has_final_evaluation()) {
        absl::StrAppend(&message, "; ", DescribeEvaluation(r.final_evaluation()));
      }
      absl::StrAppend(&message, "; ", Rate(r.tokens_per_second()));
      if (r.mfu() > 0) absl::StrAppend(&message, absl::StrFormat(", MFU %.1f%%", 100 * r.mfu()));
      if (!r.final_checkpoint().empty()) {
        absl::StrAppend(&message, "; final checkpoint ", r.final_checkpoint());
      }
    }
    *result->mutable_training() = std::move(r);
    return message;
  }

 private:
  const api::TrainingJobInfo& info_;  // Lives in the job's analysis, which outlives the attempt.
  const bool gpu_;
  int ranks_done_ = 0;
  bool has_result_ = false;
  v1::TrainingJobResult result_;
  std::vector<std::string> worker_ids_;
};

}  // namespace

std::string DescribeTrainingProgress(const v1::TrainingProgress& p) {
  std::string out =
      absl::StrCat("step ", p.step(), " of ", p.steps_total(),
                   absl::StrFormat(": loss %.4f, lr %.3g", p.loss(), p.learning_rate()), ", ",
                   Rate(p.tokens_per_second()));
  if (p.mfu() > 0) absl::StrAppend(&out, absl::StrFormat(", MFU %.1f%%", 100 * p.mfu()));
  if (p.has_last_evaluation() && p.last_evaluation().has_validation()) {
    absl::StrAppend(
        &out, absl::StrFormat(", validation %.4f at step %d", p.last_evaluation().validation_loss(),
                              p.last_evaluation().step()));
  }
  if (p.checkpoints_size() > 0) {
    absl::StrAppend(&out, ", checkpoint at step ", p.checkpoints(p.checkpoints_size() - 1).step());
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const JobAnalysis>> TrainingKind::Analyze(
    const v1::JobSpec& spec, const std::string& path) const {
  if (spec.work_case() != v1::JobSpec::kTraining) {
    return absl::InvalidArgumentError(absl::StrCat(path, ".training: required"));
  }
  if (spec.recovery().lower_precision()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ".recovery.lower_precision: training jobs have no lower precision to fall back to "
        "(GPU ranks compute in bf16 on fp32 master weights already, CPU ranks in fp32 only)"));
  }
  absl::StatusOr<api::TrainingJobInfo> info =
      api::AnalyzeTrainingJob(spec.training(), path + ".training");
  if (!info.ok()) return info.status();
  auto analysis = std::make_shared<TrainingAnalysis>();
  analysis->info = *std::move(info);
  const api::TrainingJobInfo& i = analysis->info;
  const model::TrainerConfig& c = i.config;
  analysis->num_ranks = i.world;
  analysis->steps_total = c.steps;
  analysis->flops_per_rank_step = i.flops_per_step / i.world;
  // The master weights, gradients and optimizer are fp32 on every device (GPU workers compute in
  // bf16 from them): every worker that runs fp32 can hold a rank.
  analysis->dtype = "fp32";
  analysis->head_dim = c.model.head_dim();
  analysis->devices = i.variants;
  analysis->keeps_output = false;
  analysis->summary = absl::StrCat(
      "training of a ", i.parameters, "-parameter LongNet (d_model ", c.model.d_model, ", ",
      c.model.num_layers, " layers, ", c.model.num_heads, " heads) for ", c.steps,
      c.steps == 1 ? " step" : " steps", " of ", c.batch_size, " x ", c.seq_len, " tokens on ",
      i.world, i.world == 1 ? " rank" : " ranks", " (data ", i.data_parallel, " x sequence ",
      i.sequence_parallel, ")",
      i.checkpoint_root.empty() ? ", no checkpoints"
                                : absl::StrCat(", checkpoints under ", i.checkpoint_root, "/"));
  return std::shared_ptr<const JobAnalysis>(std::move(analysis));
}

std::vector<LadderRung> TrainingKind::Ladder(const v1::JobSpec& spec,
                                             const JobAnalysis& analysis) const {
  std::vector<LadderRung> rungs;
  if (spec.work_case() != v1::JobSpec::kTraining) return rungs;
  const v1::RecoveryPolicy& policy = spec.recovery();
  const bool split = !policy.has_split_batch() || policy.split_batch();
  const bool more = !policy.has_more_ranks() || policy.more_ranks();
  const api::TrainingJobInfo& info = Info(analysis);
  const int64_t batch = info.config.batch_size;
  const int64_t seq_len = info.config.seq_len;
  const int64_t m0 = info.config.micro_batches;
  const int d = info.data_parallel;
  const int s0 = info.sequence_parallel;
  // micro_batches lives in the trainer's config: each rung carries the config with it changed.
  nlohmann::json config = nlohmann::json::parse(spec.training().config_json(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) return rungs;
  for (int64_t s = s0; s * d <= api::kMaxRingRanks && seq_len % s == 0; s *= 2) {
    if (s != s0 && !more) break;
    for (int64_t m = m0; m <= batch && batch % m == 0 && (batch / m) % d == 0; m *= 2) {
      if (m != m0 && !split) break;
      if (s == s0 && m == m0) continue;
      LadderRung rung;
      rung.spec = spec;
      config["micro_batches"] = m;
      rung.spec.mutable_training()->set_config_json(config.dump());
      rung.spec.mutable_training()->set_sequence_parallel(static_cast<int32_t>(s));
      rung.change = absl::StrCat("micro_batches ", m, ", sequence_parallel ", s);
      rungs.push_back(std::move(rung));
      if (rungs.size() >= kMostRungs) return rungs;
    }
  }
  return rungs;
}

std::vector<LadderRung> TrainingKind::Shrinks(const v1::JobSpec& spec,
                                              const JobAnalysis& analysis) const {
  std::vector<LadderRung> rungs;
  if (spec.work_case() != v1::JobSpec::kTraining) return rungs;
  const v1::RecoveryPolicy& policy = spec.recovery();
  const bool shrink = !policy.has_shrink_ring() || policy.shrink_ring();
  const bool single = !policy.has_single_device() || policy.single_device();
  const bool split = !policy.has_split_batch() || policy.split_batch();
  const api::TrainingJobInfo& info = Info(analysis);
  const int64_t batch = info.config.batch_size;
  const int64_t m0 = info.config.micro_batches;
  const int d0 = info.data_parallel;
  const int s0 = info.sequence_parallel;
  nlohmann::json config = nlohmann::json::parse(spec.training().config_json(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) return rungs;
  struct Size {
    int d, s;
    int64_t m;
  };
  std::vector<Size> sizes;
  for (int s = s0; s >= 1; --s) {
    if (s0 % s != 0) continue;
    for (int d = d0; d >= 1; --d) {
      const int world = d * s;
      if (d0 % d != 0 || world >= d0 * s0 || !(world == 1 ? single : shrink)) continue;
      // M micro-batches, then M doubled (split_batch allowing) while the batch splits into whole
      // rows per group: the first that fits keeps the largest micro-batch a rank can hold.
      for (int64_t m = m0; m <= batch; m *= 2) {
        if (batch % m != 0 || (batch / m) % d != 0) continue;
        sizes.push_back({d, s, m});
        if (!split) break;
      }
    }
  }
  std::stable_sort(sizes.begin(), sizes.end(), [](const Size& a, const Size& b) {
    if (a.d * a.s != b.d * b.s) return a.d * a.s > b.d * b.s;
    if (a.s != b.s) return a.s > b.s;
    return a.m < b.m;
  });
  for (const Size& size : sizes) {
    if (rungs.size() >= kMostRungs) break;
    LadderRung rung;
    rung.spec = spec;
    config["micro_batches"] = size.m;
    rung.spec.mutable_training()->set_config_json(config.dump());
    rung.spec.mutable_training()->set_data_parallel(size.d);
    rung.spec.mutable_training()->set_sequence_parallel(size.s);
    rung.change = absl::StrCat("data_parallel ", size.d, ", sequence_parallel ", size.s,
                               ", micro_batches ", size.m);
    rungs.push_back(std::move(rung));
  }
  return rungs;
}

std::vector<v1::JobSpec> TrainingKind::Sizes(const v1::JobSpec& spec,
                                             const JobAnalysis& analysis) const {
  std::vector<v1::JobSpec> sizes;
  if (spec.work_case() != v1::JobSpec::kTraining || !spec.training().auto_data_parallel()) {
    return sizes;
  }
  // The analysis (at D = 1) has the parsed config.
  const api::TrainingJobInfo& info = Info(analysis);
  const int64_t group_rows = info.config.batch_size / info.config.micro_batches;
  const int64_t most = std::min<int64_t>(group_rows, api::kMaxRingRanks / info.sequence_parallel);
  for (int64_t d = most; d >= 1; --d) {
    if (group_rows % d != 0) continue;
    v1::JobSpec sized = spec;
    sized.mutable_training()->set_auto_data_parallel(false);
    sized.mutable_training()->set_data_parallel(static_cast<int32_t>(d));
    sizes.push_back(std::move(sized));
  }
  return sizes;
}

void TrainingKind::PlanRank(const JobAnalysis& analysis, size_t device, int rank,
                            v1::TaskAssignment* assignment) const {
  *assignment->mutable_training_plan() =
      api::PlanTrainingRank(Info(analysis), analysis.devices[device], rank, assignment->job_id());
}

OutputLayout TrainingKind::Output(const JobAnalysis&) const { return OutputLayout{}; }

v1::TensorHeader TrainingKind::ShardHeader(const JobAnalysis&, int) const {
  return v1::TensorHeader{};
}

std::unique_ptr<AttemptResults> TrainingKind::NewAttempt(const JobAnalysis& analysis,
                                                         size_t device) const {
  return std::make_unique<TrainingAttempt>(Info(analysis), analysis.devices[device].gpu);
}

void TrainingKind::DescribeRecovery(const JobAnalysis& analysis, size_t device,
                                    scheduler::RecoveryInput* input) const {
  const api::TrainingJobInfo& i = Info(analysis);
  input->num_ranks = i.world;
  input->surviving_ranks = 0;
  input->seq_len = i.config.seq_len;
  // Splitting the batch is the recovery ladder's (JobRunner::LadderStep, tried before this):
  // nothing is split in place, so an out of memory that reaches here fails with the planner's
  // numbers rather than being rerun as it was.
  input->micro_batch_size = 1;
  input->dtype = analysis.dtype;
  input->needs_gpu = analysis.devices[device].gpu;
  // A rerun of the whole gang continues from the newest complete checkpoint. Shrinking the
  // gang, or changing its precision, would change the run; they are not offered yet.
  input->allow_shrink = false;
  input->allow_single_device = false;
  input->allow_precision_fallback = false;
  input->allow_more_ranks = false;
  const int planned_ranks = i.world;
  const int64_t planned_bytes = analysis.devices[device].memory_per_rank_bytes;
  input->memory_per_rank = [planned_ranks, planned_bytes](int ranks) -> std::optional<int64_t> {
    if (ranks != planned_ranks) return std::nullopt;
    return planned_bytes;
  };
}

void TrainingKind::TakeProgress(const JobAnalysis& analysis, size_t device, int rank,
                                const v1::TaskReport& report, v1::Job* job,
                                std::vector<v1::JobEvent>* events) const {
  // Every rank computes the same figures; rank 0 reports them.
  // A report without figures (steps_total 0: the rank is still preparing) changes nothing.
  if (rank != 0 || report.progress().training().steps_total() == 0) return;
  const v1::TrainingProgress& next = report.progress().training();
  v1::TrainingProgress* current = job->mutable_progress()->mutable_training();
  if (next.resumed_from_step() > 0 && next.resumed_from_step() != current->resumed_from_step()) {
    v1::JobEvent event;
    event.set_kind("resumed");
    std::string path;
    for (const v1::TrainingCheckpoint& c : next.checkpoints()) {
      if (c.step() == next.resumed_from_step()) path = absl::StrCat(" (", c.path(), ")");
    }
    event.set_message(absl::StrCat("attempt ", job->attempt(),
                                   " continued from the checkpoint of step ",
                                   next.resumed_from_step(), path, ", restored in ",
                                   absl::StrFormat("%.2f", next.restore_seconds()), " s"));
    events->push_back(std::move(event));
  }
  int64_t newest_known = 0;
  for (const v1::TrainingCheckpoint& c : current->checkpoints()) {
    newest_known = std::max(newest_known, c.step());
  }
  for (const v1::TrainingCheckpoint& c : next.checkpoints()) {
    if (c.step() <= newest_known) continue;
    v1::JobEvent event;
    event.set_kind("checkpoint");
    event.set_message(absl::StrFormat("checkpoint of step %d committed: %s (%s in %.2f s)",
                                      c.step(), c.path(), scheduler::FormatBytes(c.bytes()),
                                      c.seconds()));
    events->push_back(std::move(event));
    metrics_->ObserveTrainingCheckpoint(c.seconds(), c.bytes());
  }
  if (next.has_last_evaluation() &&
      (!current->has_last_evaluation() ||
       next.last_evaluation().step() != current->last_evaluation().step())) {
    v1::JobEvent event;
    event.set_kind("evaluation");
    event.set_message(DescribeEvaluation(next.last_evaluation()));
    events->push_back(std::move(event));
    if (next.last_evaluation().has_validation()) {
      metrics_->SetTrainingValidationLoss(job->job_id(), next.last_evaluation().validation_loss());
    }
  }
  if (next.step() > 0) {
    const int64_t steps = std::max<int64_t>(0, next.step() - current->step());
    const int64_t tokens = std::max<int64_t>(0, next.tokens_seen() - current->tokens_seen());
    metrics_->ObserveTrainingProgress(job->job_id(), analysis.devices[device].gpu ? "gpu" : "cpu",
                                      next.loss(), next.tokens_per_second(), next.mfu(),
                                      next.step_seconds(), steps, tokens);
  }
  *current = next;
}

std::string TrainingKind::ProgressMessage(const v1::JobProgress& progress) const {
  if (!progress.has_training() || progress.training().step() == 0) {
    return WorkKind::ProgressMessage(progress);
  }
  return DescribeTrainingProgress(progress.training());
}

void TrainingKind::AttemptEnded(const std::string& job_id) const {
  metrics_->RemoveTrainingJob(job_id);
}

}  // namespace server
}  // namespace dattn
