#include "worker/metered_device.h"

#include <atomic>
#include <utility>
#include <vector>

namespace dattn {
namespace worker {
namespace {

// Reports `comm`'s failure once, when it is first seen broken by other than an abort.
class FailureLatch {
 public:
  FailureLatch(std::string backend, CommunicatorFailureCallback on_failure)
      : backend_(std::move(backend)), on_failure_(std::move(on_failure)) {}

  void Check(const comm::Communicator& comm) {
    if (reported_.load()) return;
    const absl::Status health = comm.health();
    if (health.ok() || health.code() == absl::StatusCode::kAborted) return;
    if (!reported_.exchange(true) && on_failure_) on_failure_(backend_, health);
  }

 private:
  const std::string backend_;
  const CommunicatorFailureCallback on_failure_;
  std::atomic<bool> reported_{false};
};

class MeteredWork final : public comm::Work {
 public:
  MeteredWork(std::unique_ptr<comm::Work> work, comm::Communicator* comm,
              std::shared_ptr<FailureLatch> latch)
      : work_(std::move(work)), comm_(comm), latch_(std::move(latch)) {}

  absl::Status Wait(comm::Stream consumer) override {
    absl::Status status = work_->Wait(consumer);
    if (!status.ok()) latch_->Check(*comm_);
    return status;
  }

 private:
  std::unique_ptr<comm::Work> work_;
  comm::Communicator* const comm_;  // The wrapped communicator; outlives its Work.
  std::shared_ptr<FailureLatch> latch_;
};

class MeteredCommunicator final : public comm::Communicator {
 public:
  MeteredCommunicator(std::unique_ptr<comm::Communicator> comm,
                      CommunicatorFailureCallback on_failure)
      : comm_(std::move(comm)),
        on_failure_(on_failure),
        latch_(std::make_shared<FailureLatch>(comm_->name(), std::move(on_failure))) {}
  ~MeteredCommunicator() override { latch_->Check(*comm_); }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  Device device() const override { return comm_->device(); }
  const char* name() const override { return comm_->name(); }
  absl::Duration timeout() const override { return comm_->timeout(); }

  absl::StatusOr<std::unique_ptr<comm::Work>> StartGroup(absl::Span<const comm::P2POp> ops,
                                                         comm::Stream after) override {
    absl::StatusOr<std::unique_ptr<comm::Work>> work = comm_->StartGroup(ops, after);
    if (!work.ok()) {
      latch_->Check(*comm_);
      return work.status();
    }
    return std::unique_ptr<comm::Work>(new MeteredWork(*std::move(work), comm_.get(), latch_));
  }
  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype,
                         comm::Stream stream) override {
    return Checked(comm_->AllGather(send, recv, count, dtype, stream));
  }
  absl::Status AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                         comm::ReduceOp op, comm::Stream stream) override {
    return Checked(comm_->AllReduce(send, recv, count, dtype, op, stream));
  }
  absl::Status Barrier() override { return Checked(comm_->Barrier()); }
  absl::Status Synchronize(comm::Stream stream) override {
    return Checked(comm_->Synchronize(stream));
  }
  void Abort(const std::string& reason) override { comm_->Abort(reason); }
  absl::Status health() const override { return comm_->health(); }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Shrink(
      absl::Span<const int> exclude) override {
    absl::StatusOr<std::unique_ptr<comm::Communicator>> shrunk = comm_->Shrink(exclude);
    if (!shrunk.ok()) return shrunk.status();
    return std::unique_ptr<comm::Communicator>(
        new MeteredCommunicator(*std::move(shrunk), on_failure_));
  }
  comm::CommStats stats() const override { return comm_->stats(); }

 private:
  absl::Status Checked(absl::Status status) {
    if (!status.ok()) latch_->Check(*comm_);
    return status;
  }

  std::unique_ptr<comm::Communicator> comm_;
  const CommunicatorFailureCallback on_failure_;
  std::shared_ptr<FailureLatch> latch_;
};

class MeteredDevice final : public ForwardingDevice {
 public:
  MeteredDevice(std::shared_ptr<TaskDevice> device, CommunicatorFailureCallback on_failure)
      : ForwardingDevice(std::move(device)), on_failure_(std::move(on_failure)) {}

  absl::StatusOr<std::unique_ptr<comm::Communicator>> NewCommunicator(
      const std::string& backend, std::shared_ptr<comm::Store> store, int rank, int size,
      const std::string& prefix, absl::Duration timeout) override {
    absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
        base().NewCommunicator(backend, std::move(store), rank, size, prefix, timeout);
    if (!comm.ok()) {
      const absl::StatusCode code = comm.status().code();
      if (code != absl::StatusCode::kCancelled && code != absl::StatusCode::kAborted &&
          on_failure_) {
        on_failure_(backend, comm.status());
      }
      return comm.status();
    }
    return std::unique_ptr<comm::Communicator>(
        new MeteredCommunicator(*std::move(comm), on_failure_));
  }

 private:
  const CommunicatorFailureCallback on_failure_;
};

}  // namespace

std::unique_ptr<TaskDevice> NewMeteredDevice(std::shared_ptr<TaskDevice> device,
                                             CommunicatorFailureCallback on_failure) {
  return std::unique_ptr<TaskDevice>(new MeteredDevice(std::move(device), std::move(on_failure)));
}

}  // namespace worker
}  // namespace dattn
