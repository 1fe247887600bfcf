#include "worker/memory_limit_device.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cpu_device.h"

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

}  // namespace
}  // namespace worker
}  // namespace dattn
