// Deployments (JobSpec.deployment, docs/SERVING.md): a LongNet model from a checkpoint, resident
// on one GPU (bf16) or on a ring of `ranks` CPU workers (one by default, fp32), serving
// JobService.Generate and Score until cancelled; on a ring rank 0 serves and the others follow it
// (model/decoder.h, "A ring of S ranks"). The spec's `device` picks the variants Analyze plans: a
// GPU one (one rank, a model the CUDA model runs: model/cuda/serving_plan.h's memory) first, a
// CPU one (below) second.
//
// A deployment is a job like any other for the coordinator's roles: validated and analysed once
// (Analyze: the resolved model config, max_context, max_batch, max_queued, and the memory its rank
// reserves), placed by the scheduler against that memory, requeued when its worker is lost, and
// ended by CancelJob (`dattn undeploy`). It differs in two ways: it has no steps (JobAnalysis::
// resident: it is never taken for a stalled job) and it never succeeds; while RUNNING, its rank's
// progress reports carry a DeploymentStatus (readiness, queue, counts), which TakeProgress keeps
// in the job and turns into a "ready" event.
//
// The memory a rank reserves on CPU workers (fp32): the parameters and the model's gradient
// buffer (2 P), its share (max_context / ranks tokens) of the forward pass of a max_context-token
// prompt or Score (LongNetLM::BufferElements) and on a ring the engine's exchange buffers
// (forward), max_batch caches (KvCacheGeometry::ElementsPerSequence of rank 0's share, the
// largest) and the decoder's step buffers for max_batch rows (with the ring's gathered partial
// softmaxes).
//
// The spec's model_config_json is filled at submit (ResolveDeployment, from the checkpoint the
// spec names or a training job's final one); Analyze refuses a spec without it.
#ifndef DATTN_SERVER_DEPLOYMENT_KIND_H_
#define DATTN_SERVER_DEPLOYMENT_KIND_H_

#include <memory>
#include <string>
#include <vector>

#include "api/limits.h"
#include "model/config.h"
#include "server/metrics.h"
#include "server/work_kind.h"

namespace dattn {
namespace server {

// DeploymentSpec defaults and bounds (the CLI shows the defaults too).
using api::kDefaultMaxBatch;
using api::kDefaultMaxContext;
using api::kDefaultMaxQueued;
using api::kMaxDeploymentBatch;
using api::kMaxDeploymentContext;
using api::kMaxDeploymentQueued;

struct DeploymentAnalysis : JobAnalysis {
  model::LongNetConfig config;
  int64_t parameters = 0;
  int64_t max_context = 0;
  int max_batch = 0;
  int max_queued = 0;
  int ranks = 1;                         // The ring's size (num_ranks).
  int64_t cache_bytes_per_sequence = 0;  // Every rank's share together.
};

class DeploymentKind final : public WorkKind {
 public:
  // `metrics` (not owned, must outlive the kind) receives the deployments' gauges.
  explicit DeploymentKind(Metrics* metrics) : metrics_(metrics) {}
  const char* name() const override { return "deployment"; }
  v1::JobSpec::WorkCase work_case() const override { return v1::JobSpec::kDeployment; }
  absl::StatusOr<std::shared_ptr<const JobAnalysis>> Analyze(
      const v1::JobSpec& spec, const std::string& path) const override;
  void PlanRank(const JobAnalysis& analysis, size_t device, int rank,
                v1::TaskAssignment* assignment) const override;
  // ranks from R - 1 down to 2, those dividing max_context (shrink_ring; the 32 largest), then 1
  // (single_device); both allowed by default. Each rank then keeps more of every sequence's
  // cache: the memory plan decides where it fits.
  std::vector<LadderRung> Shrinks(const v1::JobSpec& spec,
                                  const JobAnalysis& analysis) const override;
  OutputLayout Output(const JobAnalysis&) const override { return OutputLayout{}; }
  v1::TensorHeader ShardHeader(const JobAnalysis&, int) const override { return {}; }
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

// The deployment's analysis (the kind made it), or nullptr for another kind's.
const DeploymentAnalysis* AsDeployment(const JobAnalysis& analysis);

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_DEPLOYMENT_KIND_H_
