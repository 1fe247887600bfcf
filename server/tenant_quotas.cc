#include "server/tenant_quotas.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dattn {
namespace server {

absl::Status TenantQuotas::Admit(const std::string& tenant, int64_t queued, int num_ranks,
                                 absl::Time now, int64_t deployments) {
  if (options_.max_running_ranks > 0 && num_ranks > options_.max_running_ranks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant \"", tenant, "\" may hold at most ", options_.max_running_ranks,
                     " ranks at once (--tenant-max-running-ranks) and the job asks for ", num_ranks,
                     ": it could never start; ask for fewer ranks"));
  }
  if (options_.max_queued_jobs > 0 && queued >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant \"", tenant, "\" has ", queued,
                     " queued jobs, its quota (--tenant-max-queued-jobs ", options_.max_queued_jobs,
                     "): wait until some start, or cancel some"));
  }
  if (options_.max_deployments > 0 && deployments >= options_.max_deployments) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant \"", tenant, "\" has ", deployments,
                     " deployments queued or serving, its quota (--tenant-max-deployments ",
                     options_.max_deployments, "): undeploy one first (dattn cancel)"));
  }
  if (options_.submits_per_second > 0) {
    const double rate = options_.submits_per_second;
    const double burst = std::max(1.0, rate);
    auto [it, inserted] = buckets_.try_emplace(tenant);
    Bucket& bucket = it->second;
    if (inserted) {
      bucket.tokens = burst;
      bucket.last = now;
    }
    const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - bucket.last));
    bucket.tokens = std::min(burst, bucket.tokens + elapsed * rate);
    bucket.last = now;
    if (bucket.tokens < 1) {
      const double wait_ms = std::ceil((1 - bucket.tokens) / rate * 1000);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "tenant \"%s\" submits faster than its quota of %g a second "
          "(--tenant-submits-per-second): retry in %.0f ms (with the same idempotency key)",
          tenant, rate, wait_ms));
    }
    bucket.tokens -= 1;
  }
  return absl::OkStatus();
}

}  // namespace server
}  // namespace dattn
