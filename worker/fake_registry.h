// A fake coordinator for worker tests: an in-process WorkerRegistry that records every call and
// lets the test push commands and choose answers.
//
// Behaviour (what the real coordinator is expected to do, reduced to what tests need):
//   RegisterWorker: ids "w-<instance>-<n>" (n counts registrations), heartbeat_interval_ms = 100.
//   Heartbeat: reregister=true for an id it never issued (a restarted coordinator); drain as set.
//   StreamAssignments: NOT_FOUND for an unknown id; otherwise writes pushed commands in order until
//     the call is cancelled or ShutDown(), or (SetCloseStreamsWhileDrained) it ends OK while
//     drained with nothing to send, as the coordinator ends a drained, idle worker's stream.
//   ReportTask: NOT_FOUND for an unknown worker id; stop=true for tasks named in StopTaskOnReport.
//   UploadOutput: keeps each task's shard.
// Thread-safe; fields below mu_ are for tests to read under mu_ (or through WaitFor's predicate).
#ifndef DATTN_WORKER_FAKE_REGISTRY_H_
#define DATTN_WORKER_FAKE_REGISTRY_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dattn/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace dattn {
namespace worker {

class FakeRegistry final : public v1::WorkerRegistry::Service {
 public:
  explicit FakeRegistry(int instance = 1) : instance_(instance) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status StreamAssignments(grpc::ServerContext* context,
                                 const v1::StreamAssignmentsRequest* request,
                                 grpc::ServerWriter<v1::WorkerCommand>* writer) override;
  grpc::Status ReportTask(grpc::ServerContext* context, const v1::TaskReport* request,
                          v1::ReportTaskResponse* response) override;
  // Keeps the shard (header and bytes, by task) in uploads_; stop=true for tasks named in
  // StopTaskOnReport; FAILED_PRECONDITION for chunks out of order or past the header's size.
  grpc::Status UploadOutput(grpc::ServerContext* context,
                            grpc::ServerReader<v1::UploadOutputRequest>* reader,
                            v1::UploadOutputResponse* response) override;

  void Push(v1::WorkerCommand command);
  void SetDrain(bool drain);
  void SetCloseStreamsWhileDrained(bool close);
  void StopTaskOnReport(const std::string& task_id);
  // Called (without mu_, on the RPC's thread) with each final report (SUCCEEDED, FAILED,
  // CANCELLED) after it is recorded and before the RPC answers: what a coordinator does on a final
  // report (free the slot, place the next rank) happens at that point.
  void SetOnFinalReport(std::function<void(const v1::TaskReport&)> on_final);
  // Ends open streams and refuses to block in new ones.
  void ShutDown();

  // Waits up to `timeout` for `pred` (called with mu_ held) to hold.
  bool WaitFor(const std::function<bool()>& pred, absl::Duration timeout = absl::Seconds(10));

  // The reports of one task, in arrival order.
  std::vector<v1::TaskReport> ReportsOf(const std::string& task_id);
  std::vector<v1::TaskReport> ReportsOfLocked(const std::string& task_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasFinalLocked(const std::string& task_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasStateLocked(const std::string& task_id, v1::TaskState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::vector<v1::RegisterWorkerRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::TaskReport> reports_ ABSL_GUARDED_BY(mu_);
  int streams_opened_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_ended_ ABSL_GUARDED_BY(mu_) = 0;
  struct Upload {
    v1::TensorHeader header;
    std::string data;
  };
  std::map<std::string, Upload> uploads_ ABSL_GUARDED_BY(mu_);  // By task id.

 private:
  const int instance_;
  absl::CondVar cv_;
  std::set<std::string> known_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::WorkerCommand> commands_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> stop_tasks_ ABSL_GUARDED_BY(mu_);
  bool drain_ ABSL_GUARDED_BY(mu_) = false;
  bool close_streams_while_drained_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(const v1::TaskReport&)> on_final_ ABSL_GUARDED_BY(mu_);
};

// A fake coordinator process: a FakeRegistry served at `address` until destruction.
class FakeCoordinator {
 public:
  explicit FakeCoordinator(const std::string& address, int instance = 1);
  ~FakeCoordinator();
  FakeRegistry& registry() { return registry_; }
  bool ok() const { return server_ != nullptr; }

 private:
  FakeRegistry registry_;
  std::unique_ptr<grpc::Server> server_;
};

// A unix socket path for a FakeCoordinator (or a worker's health endpoint) in a fresh directory
// under /tmp, not TEST_TMPDIR: a socket path must fit in 107 characters, and concurrent runs of a
// test (same pid inside their sandboxes) must not share a socket. Each socket lives in a directory
// of its own, removed (with the socket) when the test binary exits.
std::string TestSocketPath(const char* name);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_FAKE_REGISTRY_H_
