#include "worker/memory_limit_device.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cpu_device.h"
#include "worker/oom_retry.h"

namespace dattn {
namespace worker {
namespace {

using ::testing::HasSubstr;

TEST(MemoryLimitDeviceTest, AllocationsFailWhereTheyHappenOnceTheLimitIsReached) {
  absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
  ASSERT_TRUE(host.ok()) << host.status();
  std::shared_ptr<TaskDevice> base = *std::move(host);
  std::unique_ptr<TaskDevice> device = NewMemoryLimitDevice(base, 1000);
  absl::StatusOr<DeviceBuffer> a = device->Allocate(600, "q");
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<DeviceBuffer> b = device->Allocate(600, "k");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("allocating k (600 B) failed"));
  EXPECT_THAT(b.status().message(), HasSubstr("--fault-device-memory-bytes"));
  absl::StatusOr<DeviceBuffer> c = device->Allocate(400, "v");  // Exactly up to the limit.
  ASSERT_TRUE(c.ok()) << c.status();
  a->reset();  // Freed: its bytes are free again.
  absl::StatusOr<DeviceBuffer> d = device->Allocate(600, "dout");
  EXPECT_TRUE(d.ok()) << d.status();
  // The free figure is the real device's: the coordinator sees what it would see without the fault.
  EXPECT_GT(device->FreeMemoryBytes().value(), 1000);
  // A buffer outliving the device still frees its count safely.
  device.reset();
  d->reset();
}

TEST(FailingAllocationsDeviceTest, TheNumberedAllocationsFailAndTheOthersPassThrough) {
  absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
  ASSERT_TRUE(host.ok()) << host.status();
  std::unique_ptr<TaskDevice> device = NewFailingAllocationsDevice(*std::move(host), 2, 2);
  std::vector<bool> ok;
  for (const char* what : {"q", "k", "v", "dout", "out"})
    ok.push_back(device->Allocate(64, what).ok());
  EXPECT_EQ(ok, (std::vector<bool>{true, false, false, true, true}));
  absl::StatusOr<DeviceBuffer> none =
      NewFailingAllocationsDevice(std::shared_ptr<TaskDevice>(std::move(device)), 1, 1)
          ->Allocate(100, "lse");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(), HasSubstr("allocating lse (100 B) failed: allocation 1"));
  EXPECT_THAT(none.status().message(), HasSubstr("--fault-allocation-failures 1:1"));
}

// The worker's retry step on its own: another error is not retried; a release that fails is
// reported without a retry.
TEST(OomRetryTest, OnlyOutOfMemoryIsRetriedAndOnlyOnce) {
  absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
  ASSERT_TRUE(host.ok()) << host.status();
  int calls = 0, undone = 0;
  OomRetry record;
  absl::Status s = RetryOnceOutOfMemory(
      host->get(), [&] { return ++calls, absl::InternalError("no"); }, [&] { ++undone; }, &record);
  EXPECT_EQ(s, absl::InternalError("no"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(undone, 0);
  EXPECT_EQ(record.retries, 0);

  class NoRelease : public ForwardingDevice {
   public:
    using ForwardingDevice::ForwardingDevice;
    absl::StatusOr<int64_t> ReleaseCaches() override {
      return absl::InternalError("an illegal memory access was encountered");
    }
  };
  NoRelease broken(*std::move(host));
  calls = 0;
  s = RetryOnceOutOfMemory(
      &broken, [&] { return ++calls, absl::ResourceExhaustedError("cudaMalloc"); },
      [&] { ++undone; }, &record);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("not retried: releasing the device's caches failed: an "
                                     "illegal memory access"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(undone, 1);
  EXPECT_EQ(record.retries, 0);
}

}  // namespace
}  // namespace worker
}  // namespace dattn
