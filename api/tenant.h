// Tenant names, one rule for every place that reads one: JobSpec.tenant (validated by the
// coordinator, server/requests.cc), a token's tenant (security/tokens.h), and what an empty
// JobSpec.tenant means ("default": the job store's tenant column, queue fairness, quotas, who may
// see a job, the CLI's tables).
//
// Thread-safety: pure functions.
#ifndef DATTN_API_TENANT_H_
#define DATTN_API_TENANT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "api/limits.h"

namespace dattn {
namespace api {

inline constexpr char kDefaultTenant[] = "default";

// One of [A-Za-z0-9._-].
inline bool IsTenantChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// 1 .. kMaxTenantLength characters, each IsTenantChar.
inline bool IsTenantName(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > kMaxTenantLength) return false;
  for (char c : tenant) {
    if (!IsTenantChar(c)) return false;
  }
  return true;
}

// The tenant a JobSpec.tenant names: kDefaultTenant when empty.
inline std::string TenantOrDefault(absl::string_view tenant) {
  return std::string(tenant.empty() ? absl::string_view(kDefaultTenant) : tenant);
}

}  // namespace api
}  // namespace dattn

#endif  // DATTN_API_TENANT_H_
