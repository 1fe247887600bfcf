#include "server/deployment_kind.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/rank_memory_plan.h"
#include "model/cuda/serving_plan.h"
#include "model/decoder.h"
#include "model/longnet.h"
#include "model/longnet_params.h"
#include "scheduler/types.h"

namespace dattn {
namespace server {
namespace {

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

class DeploymentAttempt final : public AttemptResults {
 public:
  void AddRank(int, const std::string&, const std::string&, const v1::TaskReport&) override {
    ++ranks_done_;
  }
  int ranks_done() const override { return ranks_done_; }
  std::string Finish(const v1::TensorHeader*, v1::JobResult*) override {
    return "the deployment's rank ended";
  }

 private:
  int ranks_done_ = 0;
};

}  // namespace

const DeploymentAnalysis* AsDeployment(const JobAnalysis& analysis) {
  return dynamic_cast<const DeploymentAnalysis*>(&analysis);
}

absl::StatusOr<std::shared_ptr<const JobAnalysis>> DeploymentKind::Analyze(
    const v1::JobSpec& spec, const std::string& path) const {
  if (spec.work_case() != v1::JobSpec::kDeployment) {
    return Invalid(path + ".deployment", "required");
  }
  const v1::DeploymentSpec& d = spec.deployment();
  const std::string at = path + ".deployment";
  if (d.checkpoint().empty()) {
    return Invalid(at + ".checkpoint",
                   "required (or model: a registered model; or training_job_id: its final "
                   "checkpoint)");
  }
  if (d.model_config_json().empty()) {
    return Invalid(at + ".model_config_json",
                   "empty: the coordinator reads it from the checkpoint at submit");
  }
  absl::StatusOr<model::LongNetConfig> config = model::ParseConfigJson(d.model_config_json());
  if (!config.ok()) {
    return Invalid(at + ".model_config_json",
                   absl::StrCat("the checkpoint's model: ", config.status().message()));
  }
  const int64_t max_context = d.max_context() == 0 ? kDefaultMaxContext : d.max_context();
  if (max_context < 1 || max_context > kMaxDeploymentContext) {
    return Invalid(at + ".max_context",
                   absl::StrCat("must be 1 .. ", kMaxDeploymentContext, " (0: ", kDefaultMaxContext,
                                "), got ", d.max_context()));
  }
  const int max_batch = d.max_batch() == 0 ? kDefaultMaxBatch : d.max_batch();
  if (max_batch < 1 || max_batch > kMaxDeploymentBatch) {
    return Invalid(at + ".max_batch", absl::StrCat("must be 1 .. ", kMaxDeploymentBatch, " (0: ",
                                                   kDefaultMaxBatch, "), got ", d.max_batch()));
  }
  const int max_queued = d.max_queued() == 0 ? kDefaultMaxQueued : d.max_queued();
  if (max_queued < 1 || max_queued > kMaxDeploymentQueued) {
    return Invalid(at + ".max_queued", absl::StrCat("must be 1 .. ", kMaxDeploymentQueued, " (0: ",
                                                    kDefaultMaxQueued, "), got ", d.max_queued()));
  }
  const int ranks = d.ranks() == 0 ? 1 : d.ranks();
  if (ranks < 1 || ranks > api::kMaxDeploymentRanks) {
    return Invalid(at + ".ranks", absl::StrCat("must be 1 .. ", api::kMaxDeploymentRanks,
                                               " (0: 1), got ", d.ranks()));
  }
  if (max_context % ranks != 0) {
    return Invalid(at + ".ranks",
                   absl::StrCat(ranks, " ranks must divide max_context ", max_context,
                                " (a prompt is split evenly over the ring)"));
  }
  absl::StatusOr<model::KvCacheGeometry> geometry =
      model::KvCacheGeometry::Make(*config, max_context);
  if (!geometry.ok()) return Invalid(at + ".max_context", std::string(geometry.status().message()));
  // The largest share of a sequence's cache: rank 0's (it holds row 0 of every slot).
  absl::StatusOr<model::KvCacheGeometry> share =
      model::KvCacheGeometry::Make(*config, max_context, ranks, 0);
  if (!share.ok()) return Invalid(at + ".max_context", std::string(share.status().message()));
  absl::StatusOr<model::ParamLayout> layout = model::BuildParamLayout(*config);
  if (!layout.ok())
    return Invalid(at + ".model_config_json", std::string(layout.status().message()));
  auto a = std::make_shared<DeploymentAnalysis>();
  a->config = *config;
  a->parameters = layout->total();
  a->max_context = max_context;
  a->max_batch = max_batch;
  a->max_queued = max_queued;
  a->ranks = ranks;
  a->cache_bytes_per_sequence = geometry->ElementsPerSequence() * 4;
  const model::LongNetConfig& c = *config;
  const int64_t weights = 2 * a->parameters * 4;
  // A rank's share of a max_context-token prompt or Score (and on a ring the engine's exchange
  // buffers of its largest rank, forward only).
  const int64_t shard = max_context / ranks;
  const int64_t prefill = model::LongNetLM<float>::BufferElements(c, {}, 1, shard) * 4;
  int64_t ring = 0;
  if (ranks > 1) {
    RankProblem problem;
    problem.spec = c.attention_spec();
    problem.batch = 1;
    problem.seq_len = max_context;
    problem.num_heads = c.num_heads;
    problem.head_dim = c.head_dim();
    problem.ranks = ranks;
    problem.dtype = DType::kFloat32;
    problem.backward = false;
    absl::StatusOr<RankMemoryPlan> plan = PlanLargestRankMemory(problem, BackendKind::kCpu, 1);
    if (!plan.ok()) return Invalid(at + ".ranks", std::string(plan.status().message()));
    ring = plan->ring_bytes;
  }
  const int64_t cache_share = share->ElementsPerSequence() * 4;
  const int64_t caches = max_batch * cache_share;
  // The decoder's step buffers, and on a ring the all-gathered partial softmaxes of a layer.
  const int64_t step =
      int64_t{max_batch} * (20 * c.d_model + 3 * c.ffn_dim + c.vocab_size) * 4 +
      (ranks > 1 ? int64_t{ranks + 1} * max_batch * static_cast<int64_t>(geometry->slots().size()) *
                       (c.head_dim() + 2) * 8
                 : 0);
  // Which devices may run it: the spec's preference.
  const v1::DevicePreference preference = d.device();
  if (preference != v1::DEVICE_PREFERENCE_ANY && preference != v1::DEVICE_PREFERENCE_CPU &&
      preference != v1::DEVICE_PREFERENCE_GPU) {
    return Invalid(at + ".device", absl::StrCat("unknown device preference ", preference));
  }
  const bool want_gpu = preference != v1::DEVICE_PREFERENCE_CPU;
  const bool want_cpu = preference != v1::DEVICE_PREFERENCE_GPU;
  std::vector<api::DeviceVariant> variants;
  if (want_gpu) {
    // bf16 on one GPU or a ring of them over NCCL (model/cuda/serving_plan.h: model, prefill
    // arena, ring buffers, caches, step buffers of the largest rank).
    absl::StatusOr<model::cuda::ServingMemoryPlan> plan =
        model::cuda::PlanCudaServingMemory(c, max_context, max_batch, ranks);
    if (plan.ok()) {
      api::DeviceVariant gpu;
      gpu.gpu = true;
      gpu.ring_backend = "nccl";
      gpu.memory_per_rank_bytes = plan->total_bytes;
      gpu.memory_plan =
          absl::StrCat("GPU, bf16: ", plan->DebugString(), " (", max_batch, " caches of ",
                       plan->cache_bytes_per_sequence, " bytes",
                       ranks > 1 ? absl::StrCat(", 1/", ranks, " of each sequence's") : "", ")",
                       ranks > 1 ? absl::StrCat(" on each of ", ranks, " GPUs") : "");
      variants.push_back(gpu);
    } else if (!want_cpu) {
      return Invalid(
          at + ".model_config_json",
          absl::StrCat("the model does not run on GPU workers: ", plan.status().message()));
    }
  }
  api::DeviceVariant cpu;
  cpu.gpu = false;
  cpu.ring_backend = "gloo";
  cpu.memory_per_rank_bytes = weights + prefill + ring + caches + step;
  cpu.memory_plan = absl::StrCat(
      "weights and gradient buffer ", scheduler::FormatBytes(weights), " + prefill of ", shard,
      " tokens ", scheduler::FormatBytes(prefill),
      ranks > 1 ? absl::StrCat(" + ring buffers ", scheduler::FormatBytes(ring)) : "", " + ",
      max_batch, " caches of ", scheduler::FormatBytes(cache_share),
      ranks > 1 ? absl::StrCat(" (1/", ranks, " of ",
                               scheduler::FormatBytes(a->cache_bytes_per_sequence), ")")
                : "",
      " + step buffers ", scheduler::FormatBytes(step), ranks > 1 ? " on each of " : "",
      ranks > 1 ? absl::StrCat(ranks, " ranks") : "");
  if (want_cpu) {
    cpu.memory_plan = absl::StrCat("CPU, fp32: ", cpu.memory_plan);
    variants.push_back(cpu);
  }
  a->devices = variants;
  a->num_ranks = ranks;
  a->steps_total = 1;
  a->dtype = "fp32";
  a->head_dim = 0;
  a->keeps_output = false;
  a->resident = true;
  a->summary = absl::StrCat(
      "deployment of ", d.checkpoint(), ": a ", a->parameters, "-parameter LongNet (d_model ",
      c.d_model, ", ", c.num_layers, " layers, vocabulary ", c.vocab_size, "), context ",
      max_context, ", ", max_batch, " sequences at once",
      ranks > 1 ? absl::StrCat(", on a ring of ", ranks, " workers") : "", "; ",
      absl::StrJoin(variants, "; or ", [](std::string* out, const api::DeviceVariant& v) {
        out->append(v.memory_plan);
      }));
  return std::shared_ptr<const JobAnalysis>(std::move(a));
}

void DeploymentKind::PlanRank(const JobAnalysis& analysis, size_t device, int,
                              v1::TaskAssignment* assignment) const {
  const DeploymentAnalysis& a = *AsDeployment(analysis);
  const v1::DeploymentSpec& d = assignment->spec().deployment();
  v1::DeploymentRankPlan* plan = assignment->mutable_deployment_plan();
  plan->set_checkpoint(d.checkpoint());
  plan->set_model_config_json(d.model_config_json());
  plan->set_max_context(a.max_context);
  plan->set_max_batch(a.max_batch);
  plan->set_max_queued(a.max_queued);
  plan->set_ranks(a.ranks);
  plan->set_memory_bytes(analysis.devices[device].memory_per_rank_bytes);
  plan->set_memory_plan(analysis.devices[device].memory_plan);
}

std::unique_ptr<AttemptResults> DeploymentKind::NewAttempt(const JobAnalysis&, size_t) const {
  return std::make_unique<DeploymentAttempt>();
}

std::vector<LadderRung> DeploymentKind::Shrinks(const v1::JobSpec& spec,
                                                const JobAnalysis& analysis) const {
  std::vector<LadderRung> rungs;
  if (spec.work_case() != v1::JobSpec::kDeployment) return rungs;
  const v1::RecoveryPolicy& policy = spec.recovery();
  const bool shrink = !policy.has_shrink_ring() || policy.shrink_ring();
  const bool single = !policy.has_single_device() || policy.single_device();
  const DeploymentAnalysis& a = *AsDeployment(analysis);
  for (int r : FewerRanks(a.ranks, a.max_context, shrink, single)) {
    LadderRung rung;
    rung.spec = spec;
    rung.spec.mutable_deployment()->set_ranks(r);
    rung.change = absl::StrCat(r, r == 1 ? " rank" : " ranks");
    rungs.push_back(std::move(rung));
  }
  return rungs;
}

void DeploymentKind::DescribeRecovery(const JobAnalysis& analysis, size_t device,
                                      scheduler::RecoveryInput* input) const {
  const int ranks = AsDeployment(analysis)->ranks;
  input->num_ranks = ranks;
  input->surviving_ranks = 0;
  input->seq_len = 1;
  input->micro_batch_size = 1;
  input->dtype = analysis.dtype;
  input->needs_gpu = analysis.devices[device].gpu;
  // A deployment is placed again whole (its requests in flight failed UNAVAILABLE: retryable).
  input->allow_shrink = false;
  input->allow_single_device = false;
  input->allow_precision_fallback = false;
  input->allow_more_ranks = false;
  const int64_t planned = analysis.devices[device].memory_per_rank_bytes;
  input->memory_per_rank = [planned, ranks](int asked) -> std::optional<int64_t> {
    if (asked != ranks) return std::nullopt;
    return planned;
  };
}

void DeploymentKind::TakeProgress(const JobAnalysis&, size_t, int, const v1::TaskReport& report,
                                  v1::Job* job, std::vector<v1::JobEvent>* events) const {
  if (!report.progress().has_deployment()) return;
  const v1::DeploymentStatus& next = report.progress().deployment();
  v1::DeploymentStatus* current = job->mutable_progress()->mutable_deployment();
  if (next.ready() && !current->ready()) {
    v1::JobEvent event;
    event.set_kind("ready");
    event.set_message(absl::StrFormat(
        "serving the checkpoint of step %d: %d parameters, loaded in %.2f s; %s of cache a "
        "sequence",
        next.checkpoint_step(), next.parameters(), next.load_seconds(),
        scheduler::FormatBytes(next.cache_bytes_per_sequence())));
    events->push_back(std::move(event));
  }
  *current = next;
  metrics_->SetDeployment(job->job_id(), next);
}

void DeploymentKind::AttemptEnded(const std::string& job_id) const {
  metrics_->RemoveDeployment(job_id);
}

std::string DeploymentKind::ProgressMessage(const v1::JobProgress& progress) const {
  const v1::DeploymentStatus& s = progress.deployment();
  if (!s.ready()) return "loading";
  return absl::StrCat("serving: ", s.running(), " running, ", s.queued(), " queued, ",
                      s.requests_done(), " requests done, ", s.tokens_generated(),
                      " tokens generated");
}

}  // namespace server
}  // namespace dattn
