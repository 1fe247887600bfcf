#include "worker/test_plans.h"

#include "api/attention_job.h"

namespace dattn {
namespace worker {

v1::TaskAssignment Planned(v1::TaskAssignment task, bool gpu) {
  absl::StatusOr<api::AttentionJobInfo> info =
      api::AnalyzeAttentionJob(task.spec().attention(), "spec.attention");
  if (!info.ok()) return task;
  for (const api::DeviceVariant& variant : info->variants) {
    if (variant.gpu == gpu && task.rank() >= 0 && task.rank() < info->num_ranks) {
      *task.mutable_attention_plan() = api::PlanAttentionRank(*info, variant, task.rank());
    }
  }
  return task;
}

}  // namespace worker
}  // namespace dattn
