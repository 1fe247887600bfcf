// AbortAll against a model of NCCL's abort: each communicator has a kernel spinning on a dead peer
// until that communicator's abort flag is raised, and an abort returns only once the whole device
// is idle (ncclCommAbort -> commFree -> cudaFreeHost). Aborting one after another would wait for
// ever at the first; the model gives up after a deadline and records that it had to.
#include "engine/comm/abort_all.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dattn {
namespace comm {
namespace {

// The device the communicators share: which of them still has a kernel running.
class FakeDevice {
 public:
  explicit FakeDevice(int comms) : spinning_(comms, true) {}
  // Raises `index`'s abort flag (its kernel returns), then waits for every kernel, at most
  // `deadline`. False when the device never went idle.
  bool AbortAndWaitIdle(int index, absl::Duration deadline) {
    absl::MutexLock lock(&mu_);
    spinning_[index] = false;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (bool s : spinning_) {
        if (s) return false;
      }
      return true;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&idle), deadline);
  }

 private:
  absl::Mutex mu_;
  std::vector<bool> spinning_ ABSL_GUARDED_BY(mu_);
};

class SpinningComm final : public Communicator {
 public:
  SpinningComm(FakeDevice* device, int index) : device_(device), index_(index) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Device device() const override { return Device::kCuda; }
  const char* name() const override { return "spinning"; }
  absl::Duration timeout() const override { return absl::Seconds(1); }
  absl::StatusOr<std::unique_ptr<Work>> StartGroup(absl::Span<const P2POp>, Stream) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status AllGather(const void*, void*, int64_t, DType, Stream) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status AllReduce(const void*, void*, int64_t, DType, ReduceOp, Stream) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status Barrier() override { return absl::UnimplementedError("not in this test"); }
  absl::Status Synchronize(Stream) override { return health(); }
  void Abort(const std::string& reason) override {
    const bool idle = device_->AbortAndWaitIdle(index_, absl::Seconds(2));
    absl::MutexLock lock(&mu_);
    aborts_++;
    hung_ = hung_ || !idle;
    if (health_.ok()) health_ = absl::AbortedError(reason);
  }
  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return health_;
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(absl::Span<const int>) override {
    return absl::UnimplementedError("not in this test");
  }
  CommStats stats() const override { return CommStats(); }

  int aborts() const {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }
  bool hung() const {
    absl::MutexLock lock(&mu_);
    return hung_;
  }

 private:
  FakeDevice* const device_;
  const int index_;
  mutable absl::Mutex mu_;
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
  bool hung_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
};

TEST(AbortAllTest, EveryAbortFlagIsRaisedBeforeAnyAbortWaitsForTheDevice) {
  for (int n : {2, 3}) {
    FakeDevice device(n);
    std::vector<std::unique_ptr<SpinningComm>> owned;
    std::vector<Communicator*> comms;
    for (int i = 0; i < n; ++i) {
      owned.push_back(std::make_unique<SpinningComm>(&device, i));
      comms.push_back(owned.back().get());
    }
    comms.push_back(nullptr);  // skipped
    const absl::Time start = absl::Now();
    AbortAll(comms, "peer died");
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << n << " communicators";
    for (const auto& c : owned) {
      EXPECT_EQ(c->aborts(), 1);
      EXPECT_FALSE(c->hung()) << "an abort waited for a kernel of another communicator";
      EXPECT_EQ(c->health().code(), absl::StatusCode::kAborted);
      EXPECT_EQ(c->health().message(), "peer died");
    }
  }
}

TEST(AbortAllTest, OneCommunicatorAndNone) {
  FakeDevice device(1);
  SpinningComm one(&device, 0);
  AbortAll({&one}, "cancelled");
  EXPECT_EQ(one.aborts(), 1);
  EXPECT_FALSE(one.hung());
  AbortAll({}, "nothing");
  Communicator* none = nullptr;
  AbortAll({none}, "nothing");
}

}  // namespace
}  // namespace comm
}  // namespace dattn
