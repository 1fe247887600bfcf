#include "worker/memory_limit_device.h"

#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/memory_plan.h"

namespace dattn {
namespace worker {
namespace {

class MemoryLimitDevice final : public ForwardingDevice {
 public:
  MemoryLimitDevice(std::shared_ptr<TaskDevice> base, int64_t limit)
      : ForwardingDevice(std::move(base)),
        limit_(limit),
        outstanding_(std::make_shared<std::atomic<int64_t>>(0)) {}

  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, const std::string& what) override {
    const int64_t before = outstanding_->fetch_add(bytes);
    if (before + bytes > limit_) {
      outstanding_->fetch_sub(bytes);
      return absl::ResourceExhaustedError(absl::StrCat(
          "allocating ", what, " (", FormatBytes(bytes), ") failed: ", FormatBytes(before),
          " of the device's ", FormatBytes(limit_), " are in use (--fault-device-memory-bytes)"));
    }
    absl::StatusOr<DeviceBuffer> buffer = base().Allocate(bytes, what);
    if (!buffer.ok()) {
      outstanding_->fetch_sub(bytes);
      return buffer.status();
    }
    // The count drops when the buffer is freed, whoever frees it and whenever (the buffer may
    // outlive this device's caller, so it holds the counter).
    void* data = buffer->release();
    auto deleter = buffer->get_deleter();
    std::shared_ptr<std::atomic<int64_t>> outstanding = outstanding_;
    return DeviceBuffer(data, [deleter, outstanding, bytes](void* p) mutable {
      deleter(p);
      outstanding->fetch_sub(bytes);
    });
  }

 private:
  const int64_t limit_;
  const std::shared_ptr<std::atomic<int64_t>> outstanding_;
};

class FailingAllocationsDevice final : public ForwardingDevice {
 public:
  FailingAllocationsDevice(std::shared_ptr<TaskDevice> base, int64_t first, int64_t count)
      : ForwardingDevice(std::move(base)), first_(first), count_(count) {}

  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, const std::string& what) override {
    const int64_t n = ++allocations_;
    if (n >= first_ && n - first_ < count_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "allocating ", what, " (", FormatBytes(bytes), ") failed: allocation ", n,
          " of this worker fails (--fault-allocation-failures ", first_, ":", count_, ")"));
    }
    return base().Allocate(bytes, what);
  }

 private:
  const int64_t first_;
  const int64_t count_;
  std::atomic<int64_t> allocations_{0};
};

}  // namespace

std::unique_ptr<TaskDevice> NewFailingAllocationsDevice(std::shared_ptr<TaskDevice> base,
                                                        int64_t first, int64_t count) {
  return std::make_unique<FailingAllocationsDevice>(std::move(base), first, count);
}

std::unique_ptr<TaskDevice> NewMemoryLimitDevice(std::shared_ptr<TaskDevice> base,
                                                 int64_t limit_bytes) {
  return std::make_unique<MemoryLimitDevice>(std::move(base), limit_bytes);
}

}  // namespace worker
}  // namespace dattn
