// Per-tenant quotas on submits: how many of a tenant's jobs may wait in the queue, how fast a
// tenant may submit (a token bucket: `submits_per_second` a second, bursts of as many), how many
// deployments it may keep (queued or serving), and no job larger than the tenant's quota on
// running ranks. A refusal
// is RESOURCE_EXHAUSTED naming the tenant, the quota, its value and the flag that sets it. Only a
// submit that would create a job is counted: a retry of an accepted job (same tenant, same
// idempotency key) is answered whatever the quotas say, so nothing accepted is lost.
//
// Every tenant gets the same quotas (the coordinator's flags); 0 turns one off.
//
// Thread-safety: none of its own; the coordinator calls it under its mutex. No I/O: times come
// from the caller (the coordinator's clock).
#ifndef DATTN_SERVER_TENANT_QUOTAS_H_
#define DATTN_SERVER_TENANT_QUOTAS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace dattn {
namespace server {

struct QuotaOptions {
  // Most QUEUED jobs of one tenant (--tenant-max-queued-jobs); 0: no limit.
  int64_t max_queued_jobs = 0;
  // Submits a second of one tenant, and the burst (--tenant-submits-per-second); 0: no limit.
  double submits_per_second = 0;
  // Most ranks one tenant's jobs hold at once (--tenant-max-running-ranks); 0: no limit. The
  // scheduler holds jobs back to keep it (scheduler.h); a job asking for more can never start and
  // is refused here.
  int max_running_ranks = 0;
  // Most deployments of one tenant queued or running at once (--tenant-max-deployments); 0: no
  // limit. A deployment holds its worker's memory for as long as it serves.
  int64_t max_deployments = 0;
};

class TenantQuotas {
 public:
  explicit TenantQuotas(QuotaOptions options) : options_(options) {}

  // Whether `tenant`, with `queued` jobs QUEUED now, may create one more of `num_ranks` ranks at
  // `now`; takes one token of its bucket when it may. `deployments`: for a new deployment, the
  // tenant's deployments queued or running now; -1 for any other job.
  absl::Status Admit(const std::string& tenant, int64_t queued, int num_ranks, absl::Time now,
                     int64_t deployments = -1);

  const QuotaOptions& options() const { return options_; }

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time last;
  };

  const QuotaOptions options_;
  std::map<std::string, Bucket> buckets_;  // Tenants seen; a bucket is a few bytes.
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_TENANT_QUOTAS_H_
