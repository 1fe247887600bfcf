// MeteredDevice (metered_device.h) on the host device with real Gloo rings of two ranks (threads of
// this process): a communicator broken by a silent peer is reported once, with its backend and
// code; this worker's own Abort, bad arguments and healthy communicators are not; a creation that
// fails is.
#include "worker/metered_device.h"

#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/comm/tcp_store.h"
#include "gtest/gtest.h"
#include "worker/cpu_device.h"

namespace dattn {
namespace worker {
namespace {

// What the callback was told: "backend CODE" -> times.
class Failures {
 public:
  CommunicatorFailureCallback Callback() {
    return [this](const std::string& backend, const absl::Status& status) {
      absl::MutexLock lock(&mu_);
      ++counts_[absl::StrCat(backend, " ", absl::StatusCodeToString(status.code()))];
    };
  }
  std::map<std::string, int> counts() {
    absl::MutexLock lock(&mu_);
    return counts_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, int> counts_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<TaskDevice> MeteredHost(Failures* failures) {
  absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
  EXPECT_TRUE(host.ok()) << host.status();
  return NewMeteredDevice(std::shared_ptr<TaskDevice>(*std::move(host)), failures->Callback());
}

absl::Status Exchange(comm::Communicator& comm, const comm::P2POp& op) {
  absl::StatusOr<std::unique_ptr<comm::Work>> work = comm.StartGroup({op}, comm::Stream{});
  if (!work.ok()) return work.status();
  return (*work)->Wait(comm::Stream{});
}

// Runs `body` on two ranks (threads), each with its own metered host device and a formed Gloo
// communicator; returns each rank's status.
std::vector<absl::Status> RunRing(
    Failures* failures, absl::Duration timeout,
    const std::function<absl::Status(int, comm::Communicator&)>& body) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  EXPECT_TRUE(server.ok()) << server.status();
  std::vector<absl::Status> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      std::unique_ptr<TaskDevice> device = MeteredHost(failures);
      absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
          comm::TcpStore::Connect((*server)->address());
      if (!store.ok()) {
        results[r] = store.status();
        return;
      }
      absl::StatusOr<std::unique_ptr<comm::Communicator>> comm = device->NewCommunicator(
          "gloo", std::shared_ptr<comm::Store>(*std::move(store)), r, 2, "metered", timeout);
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      // Every body starts on a fully connected ring (see gloo_communicator_test.cc).
      if (absl::Status ready = (*comm)->Barrier(); !ready.ok()) {
        results[r] = ready;
        return;
      }
      results[r] = body(r, **comm);
    });
  }
  for (std::thread& t : ranks) t.join();
  return results;
}

TEST(MeteredDeviceTest, ABrokenCommunicatorIsReportedOnceWithItsCode) {
  Failures failures;
  std::vector<absl::Status> results =
      RunRing(&failures, absl::Milliseconds(500), [](int r, comm::Communicator& comm) {
        float x = 0;
        if (r == 1) {
          absl::SleepFor(absl::Milliseconds(1200));  // Silent past rank 0's timeout.
          return absl::OkStatus();
        }
        absl::Status s = Exchange(comm, comm::P2POp::Recv(1, &x, 1, DType::kFloat32));
        if (!absl::IsDeadlineExceeded(s)) return absl::InternalError(s.ToString());
        // Broken and sticky: more failing calls are not more failures.
        (void)comm.Barrier();
        (void)Exchange(comm, comm::P2POp::Send(1, &x, 1, DType::kFloat32));
        return absl::OkStatus();
      });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
  // Rank 1 never saw an error while it slept and its communicator was destroyed healthy or broken
  // by rank 0's departure: either way rank 0's DEADLINE_EXCEEDED is reported exactly once.
  const std::map<std::string, int> counts = failures.counts();
  ASSERT_EQ(counts.count("gloo DEADLINE_EXCEEDED"), 1u) << ::testing::PrintToString(counts);
  EXPECT_EQ(counts.at("gloo DEADLINE_EXCEEDED"), 1);
}

TEST(MeteredDeviceTest, OwnAbortsBadArgumentsAndHealthyRingsAreNotFailures) {
  Failures failures;
  std::vector<absl::Status> results =
      RunRing(&failures, absl::Seconds(10), [](int r, comm::Communicator& comm) -> absl::Status {
        float x = 1;
        if (absl::Status s =
                comm.AllReduce(&x, &x, 1, DType::kFloat32, comm::ReduceOp::kSum, comm::Stream{});
            !s.ok()) {
          return s;
        }
        // A peer out of range: INVALID_ARGUMENT, the communicator stays healthy.
        absl::Status bad = Exchange(comm, comm::P2POp::Send(7, &x, 1, DType::kFloat32));
        if (!absl::IsInvalidArgument(bad) || !comm.health().ok()) {
          return absl::InternalError(absl::StrCat("bad peer: ", bad.ToString()));
        }
        if (absl::Status s = comm.Barrier(); !s.ok()) return s;
        // Rank 0 aborts its own communicator (what a cancel does), then uses it: ABORTED.
        if (r == 0) {
          comm.Abort("the task was cancelled");
          if (!absl::IsAborted(comm.Barrier())) return absl::InternalError("not aborted");
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
  EXPECT_TRUE(failures.counts().empty()) << ::testing::PrintToString(failures.counts());
}

TEST(MeteredDeviceTest, ACreationThatFailsIsReportedUnderTheBackendAskedFor) {
  Failures failures;
  std::unique_ptr<TaskDevice> device = MeteredHost(&failures);
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
      comm::TcpStore::Connect((*server)->address());
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm = device->NewCommunicator(
      "nccl", std::shared_ptr<comm::Store>(*std::move(store)), 0, 2, "p", absl::Seconds(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
  EXPECT_EQ(failures.counts(), (std::map<std::string, int>{{"nccl FAILED_PRECONDITION", 1}}));
  // Everything else passes through.
  absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(device->device_name(), (*host)->device_name());
  EXPECT_EQ(device->total_memory_bytes(), (*host)->total_memory_bytes());
  EXPECT_EQ(device->ring_backends(), (*host)->ring_backends());
  EXPECT_TRUE(device->Health().ok());
}

}  // namespace
}  // namespace worker
}  // namespace dattn
