// Validation of the JobService requests, and the analysis of a submitted spec by its work kind
// (work_kind.h).
//
// Every error names the request's field path and the offending value, so that it can be shown to a
// user unchanged: "spec.attention.shape.head_dim: must be >= 1, got 0". Codes: INVALID_ARGUMENT for
// a bad value; UNIMPLEMENTED for a valid request the system cannot run yet. Limits: api/limits.h.
//
// All functions are pure and may be called from any thread.
#ifndef DATTN_SERVER_REQUESTS_H_
#define DATTN_SERVER_REQUESTS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"
#include "server/work_kind.h"

namespace dattn {
namespace server {

// A valid spec: the kind that runs it and the kind's analysis.
struct AnalyzedSpec {
  const WorkKind* kind = nullptr;
  std::shared_ptr<const JobAnalysis> analysis;
};

// Checks every field of a submit request (idempotency key, name, tenant, priority) and has the
// spec's work analysed by its kind. INVALID_ARGUMENT for a spec whose work no kind of `kinds` runs.
absl::StatusOr<AnalyzedSpec> ValidateSubmitJobRequest(const v1::SubmitJobRequest& request,
                                                      const WorkKinds& kinds);

// The same checks on a spec alone (fields named from "spec."): for stored jobs after a restart.
absl::StatusOr<AnalyzedSpec> AnalyzeJobSpec(const v1::JobSpec& spec, const WorkKinds& kinds);

// Request checks of the other job RPCs (INVALID_ARGUMENT naming the field and value).
absl::Status ValidateJobId(const std::string& job_id);
absl::Status ValidateListJobsRequest(const v1::ListJobsRequest& request, const WorkKinds& kinds);
absl::Status ValidateCancelJobRequest(const v1::CancelJobRequest& request);

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_REQUESTS_H_
