#include "server/requests.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "api/limits.h"
#include "api/quote.h"
#include "api/tenant.h"

namespace dattn {
namespace server {
namespace {

using api::Quote;

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status ValidateTenantName(const std::string& tenant, const std::string& path) {
  if (tenant.size() > api::kMaxTenantLength) {
    return Invalid(path,
                   absl::StrCat("must be at most ", api::kMaxTenantLength, " characters, got ",
                                tenant.size(), " (", Quote(tenant), ")"));
  }
  for (size_t i = 0; i < tenant.size(); ++i) {
    if (!api::IsTenantChar(tenant[i])) {
      return Invalid(path, absl::StrCat("character ", i, " of ", Quote(tenant),
                                        " is not one of [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AnalyzedSpec> AnalyzeSpecAt(const v1::JobSpec& spec, const std::string& path,
                                           const WorkKinds& kinds) {
  if (spec.name().size() > api::kMaxJobNameLength) {
    return Invalid(path + ".name",
                   absl::StrCat("must be at most ", api::kMaxJobNameLength, " characters, got ",
                                spec.name().size(), " (", Quote(spec.name()), ")"));
  }
  if (absl::Status s = ValidateTenantName(spec.tenant(), path + ".tenant"); !s.ok()) return s;
  if (spec.priority() < api::kMinPriority || spec.priority() > api::kMaxPriority) {
    return Invalid(path + ".priority", absl::StrCat("must be ", api::kMinPriority, " .. ",
                                                    api::kMaxPriority, ", got ", spec.priority()));
  }
  if (spec.recovery().stall_seconds() < 0 ||
      spec.recovery().stall_seconds() > api::kMaxStallSeconds) {
    return Invalid(
        path + ".recovery.stall_seconds",
        absl::StrCat("must be 1 .. ", api::kMaxStallSeconds, " (0: the default, ",
                     api::kDefaultStallSeconds, "), got ", spec.recovery().stall_seconds()));
  }
  AnalyzedSpec out;
  out.kind = kinds.For(spec);
  if (out.kind == nullptr) {
    return Invalid(path, absl::StrCat("a job must say its work: one of ", kinds.Names(),
                                      spec.work_case() == v1::JobSpec::WORK_NOT_SET
                                          ? " (none is set)"
                                          : " (the one set is not run by this coordinator)"));
  }
  absl::StatusOr<std::shared_ptr<const JobAnalysis>> analysis = out.kind->Analyze(spec, path);
  if (!analysis.ok()) return analysis.status();
  // The known fields are within their bounds by now: what is left is fields this coordinator does
  // not know, kept (and stored) with the spec.
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > api::kMaxSpecBytes) {
    return Invalid(
        path, absl::StrCat("is ", bytes, " bytes serialized, more than the ", api::kMaxSpecBytes,
                           " a job spec may have (fields this coordinator does not "
                           "know count too)"));
  }
  out.analysis = *std::move(analysis);
  return out;
}

}  // namespace

absl::StatusOr<AnalyzedSpec> ValidateSubmitJobRequest(const v1::SubmitJobRequest& request,
                                                      const WorkKinds& kinds) {
  const std::string& key = request.idempotency_key();
  if (key.empty() || key.size() > api::kMaxIdempotencyKeyLength) {
    return Invalid("idempotency_key",
                   absl::StrCat("must be 1 .. ", api::kMaxIdempotencyKeyLength, " characters, got ",
                                key.size(), key.empty() ? "" : " (" + Quote(key) + ")"));
  }
  if (!request.has_spec()) return Invalid("spec", "required");
  return AnalyzeSpecAt(request.spec(), "spec", kinds);
}

absl::StatusOr<AnalyzedSpec> AnalyzeJobSpec(const v1::JobSpec& spec, const WorkKinds& kinds) {
  return AnalyzeSpecAt(spec, "spec", kinds);
}

absl::Status ValidateJobId(const std::string& job_id) {
  if (job_id.empty()) return Invalid("job_id", "required");
  if (job_id.size() > api::kMaxJobIdLength) {
    return Invalid("job_id",
                   absl::StrCat("must be at most ", api::kMaxJobIdLength, " characters, got ",
                                job_id.size(), " (", Quote(job_id), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateListJobsRequest(const v1::ListJobsRequest& request, const WorkKinds& kinds) {
  for (int i = 0; i < request.states_size(); ++i) {
    const int state = request.states(i);
    if (state == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(state)) {
      return Invalid(absl::StrCat("states[", i, "]"),
                     absl::StrCat("must be a job state (QUEUED .. CANCELLED), got ", state));
    }
  }
  if (absl::Status s = ValidateTenantName(request.tenant(), "tenant"); !s.ok()) return s;
  if (!request.kind().empty() && kinds.Named(request.kind()) == nullptr) {
    return Invalid("kind", absl::StrCat("must be one of ", kinds.Names(), " or empty, got ",
                                        Quote(request.kind())));
  }
  if (request.page_size() < 0 || request.page_size() > api::kMaxPageSize) {
    return Invalid("page_size",
                   absl::StrCat("must be 1 .. ", api::kMaxPageSize, " (0 means ",
                                api::kDefaultPageSize, "), got ", request.page_size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateCancelJobRequest(const v1::CancelJobRequest& request) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  if (request.reason().size() > api::kMaxCancelReasonLength) {
    return Invalid("reason", absl::StrCat("must be at most ", api::kMaxCancelReasonLength,
                                          " characters, got ", request.reason().size()));
  }
  return absl::OkStatus();
}

}  // namespace server
}  // namespace dattn
