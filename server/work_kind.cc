#include "server/work_kind.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/limits.h"

namespace dattn {
namespace server {

std::vector<v1::JobSpec> WorkKind::Sizes(const v1::JobSpec&, const JobAnalysis&) const {
  return {};
}

std::vector<LadderRung> WorkKind::Ladder(const v1::JobSpec&, const JobAnalysis&) const {
  return {};
}

std::vector<LadderRung> WorkKind::Shrinks(const v1::JobSpec&, const JobAnalysis&) const {
  return {};
}

std::vector<int> FewerRanks(int ranks, int64_t length, bool shrink, bool single) {
  std::vector<int> counts;
  for (int r = ranks - 1; r >= 2 && shrink && counts.size() < kMostRungs; --r) {
    if (length % r == 0) counts.push_back(r);
  }
  if (single && ranks > 1) counts.push_back(1);
  return counts;
}

void WorkKind::TakeProgress(const JobAnalysis&, size_t, int, const v1::TaskReport&, v1::Job*,
                            std::vector<v1::JobEvent>*) const {}

std::string WorkKind::ProgressMessage(const v1::JobProgress& progress) const {
  return absl::StrCat(progress.steps_done(), " of ", progress.steps_total(), " steps");
}

void WorkKind::AttemptEnded(const std::string&) const {}

void WorkKinds::Add(std::unique_ptr<WorkKind> kind) { kinds_.push_back(std::move(kind)); }

const WorkKind* WorkKinds::For(const v1::JobSpec& spec) const {
  for (const auto& kind : kinds_) {
    if (kind->work_case() == spec.work_case()) return kind.get();
  }
  return nullptr;
}

const WorkKind* WorkKinds::Named(const std::string& name) const {
  for (const auto& kind : kinds_) {
    if (name == kind->name()) return kind.get();
  }
  return nullptr;
}

std::vector<const WorkKind*> WorkKinds::All() const {
  std::vector<const WorkKind*> out;
  for (const auto& kind : kinds_) out.push_back(kind.get());
  return out;
}

std::string WorkKinds::Names() const {
  std::vector<std::string> names;
  for (const auto& kind : kinds_) names.push_back(kind->name());
  return absl::StrJoin(names, ", ");
}

absl::Duration StallLimit(const v1::JobSpec& spec, const JobAnalysis& analysis) {
  if (analysis.resident) return absl::InfiniteDuration();
  if (spec.recovery().stall_seconds() > 0) return absl::Seconds(spec.recovery().stall_seconds());
  const double step = analysis.flops_per_rank_step / kStallFloorFlopsPerSecond;
  return std::max(absl::Seconds(api::kDefaultStallSeconds), absl::Seconds(10 * step));
}

}  // namespace server
}  // namespace dattn
