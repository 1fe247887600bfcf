#include "server/tenant_quotas.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1767225600);

TEST(TenantQuotasTest, QueuedJobsPerTenant) {
  TenantQuotas quotas({/*max_queued_jobs=*/3, /*submits_per_second=*/0});
  EXPECT_TRUE(quotas.Admit("a", 2, 1, kStart).ok());
  absl::Status full = quotas.Admit("a", 3, 1, kStart);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("tenant \"a\" has 3 queued jobs, its quota (--tenant-max-queued-jobs 3)"));
  EXPECT_TRUE(quotas.Admit("b", 0, 1, kStart).ok());
}

TEST(TenantQuotasTest, SubmitRateIsATokenBucketPerTenant) {
  TenantQuotas quotas({0, /*submits_per_second=*/2});
  // A burst of 2, then one every 500 ms.
  EXPECT_TRUE(quotas.Admit("a", 0, 1, kStart).ok());
  EXPECT_TRUE(quotas.Admit("a", 0, 1, kStart).ok());
  absl::Status fast = quotas.Admit("a", 0, 1, kStart);
  EXPECT_EQ(fast.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(fast.message()), HasSubstr("quota of 2 a second"));
  EXPECT_THAT(std::string(fast.message()), HasSubstr("retry in 500 ms"));
  EXPECT_TRUE(quotas.Admit("b", 0, 1, kStart).ok()) << "one tenant's rate is not another's";
  EXPECT_FALSE(quotas.Admit("a", 0, 1, kStart + absl::Milliseconds(400)).ok());
  EXPECT_TRUE(quotas.Admit("a", 0, 1, kStart + absl::Milliseconds(500)).ok());
  // Idle time refills up to the burst, not beyond.
  const absl::Time later = kStart + absl::Hours(1);
  EXPECT_TRUE(quotas.Admit("a", 0, 1, later).ok());
  EXPECT_TRUE(quotas.Admit("a", 0, 1, later).ok());
  EXPECT_FALSE(quotas.Admit("a", 0, 1, later).ok());
}

TEST(TenantQuotasTest, AJobLargerThanTheRunningRanksQuotaIsRefused) {
  TenantQuotas quotas({0, /*submits_per_second=*/1, /*max_running_ranks=*/4});
  absl::Status large = quotas.Admit("a", 0, 5, kStart);
  EXPECT_EQ(large.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(large.message()),
              HasSubstr("tenant \"a\" may hold at most 4 ranks at once "
                        "(--tenant-max-running-ranks) and the job asks for 5"));
  // The refusal took no token: the next submit of a job that fits is admitted at once.
  EXPECT_TRUE(quotas.Admit("a", 0, 4, kStart).ok());
}

TEST(TenantQuotasTest, DeploymentsPerTenant) {
  QuotaOptions options;
  options.max_deployments = 2;
  TenantQuotas quotas(options);
  EXPECT_TRUE(quotas.Admit("a", 0, 1, kStart, 1).ok());
  absl::Status full = quotas.Admit("a", 0, 1, kStart, 2);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("tenant \"a\" has 2 deployments queued or serving, its quota "
                        "(--tenant-max-deployments 2)"));
  // Other jobs (-1) are not deployments: the quota does not apply to them.
  EXPECT_TRUE(quotas.Admit("a", 0, 1, kStart, -1).ok());
  EXPECT_TRUE(quotas.Admit("b", 0, 1, kStart, 0).ok());
}

TEST(TenantQuotasTest, ZeroTurnsAQuotaOff) {
  TenantQuotas quotas({0, 0, 0, 0});
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(quotas.Admit("a", 1000000, 4096, kStart, 1000).ok());
}

}  // namespace
}  // namespace server
}  // namespace dattn
