// Routes JobService.Generate and Score calls to their deployment's rank, over the Serve stream
// that rank holds open to the coordinator (WorkerRegistry.Serve; docs/SERVING.md).
//
// Per deployment (job id) there is at most one stream. Serve() runs for the stream's life on the
// gRPC handler's thread: it reads the rank's ServeUpdates there and hands each to the call it
// belongs to; a thread of its own writes the calls' ServeWork. Call() runs a client's request:
// it gives the request an id, queues its work, hands every update of it to the caller until the
// final one (done, a score, or an error), and returns the outcome. A caller that goes away
// (is_cancelled) sends the rank a cancel, so the sequence's memory is freed at once.
//
// When a stream ends (the deployment was undeployed, its worker stopped or was lost, the
// coordinator shuts down) every call on it ends UNAVAILABLE (the deployment is placed again
// unless it was undeployed; a retry then finds it serving again or NOT_FOUND/FAILED_PRECONDITION).
// A second stream for the same deployment (a new attempt) replaces the first. Whatever ends a
// stream from outside (Close, Shutdown, a newer stream) calls its end_stream before its calls
// learn that it ended, so a call that returned UNAVAILABLE finds its stream already ending.
//
// Thread-safety: every method may be called from any thread. Waits are bounded: a call looks at
// is_cancelled at least every 100 ms; Serve's writer at least every 100 ms.
#ifndef DATTN_SERVER_DEPLOYMENT_ROUTER_H_
#define DATTN_SERVER_DEPLOYMENT_ROUTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "dattn/v1/worker.pb.h"

namespace dattn {
namespace server {

class DeploymentRouter {
 public:
  using ReadFn = std::function<bool(v1::ServeUpdate*)>;
  using WriteFn = std::function<bool(const v1::ServeWork&)>;
  using CancelledFn = std::function<bool()>;
  // Returns false when the caller has gone away (the call then ends CANCELLED).
  using UpdateFn = std::function<bool(const v1::ServeUpdate&)>;

  DeploymentRouter() = default;
  DeploymentRouter(const DeploymentRouter&) = delete;
  DeploymentRouter& operator=(const DeploymentRouter&) = delete;
  ~DeploymentRouter();

  // Serves `job_id`'s stream (its first message, the rank's hello, already read) until it ends
  // (read returns false, is_cancelled, Close or Shutdown). Status updates on it are skipped: a
  // rank's figures reach its job through its task reports. Returns OK when the stream ended by
  // either side, UNAVAILABLE after Shutdown.
  // `end_stream` (thread-safe, non-blocking: ServerContext::TryCancel) makes a blocked read
  // return; Close, Shutdown and a newer stream of the same deployment call it.
  absl::Status Serve(const std::string& job_id, const ReadFn& read, const WriteFn& write,
                     const CancelledFn& is_cancelled, const std::function<void()>& end_stream);

  // Whether `job_id` has a stream now.
  bool Serving(const std::string& job_id) const;

  // Runs one request on `job_id`'s rank (see above). FAILED_PRECONDITION when the deployment has
  // no stream (not serving yet, or ended); UNAVAILABLE when its stream ends first; CANCELLED when
  // the caller went away; else the rank's outcome (OK, or its error with its code).
  // `on_queued` (optional) is called with the request's id once its work is queued for the rank;
  // false from it ends the call as a caller that went away does.
  absl::Status Call(const std::string& job_id, v1::ServeWork work, const UpdateFn& on_update,
                    const CancelledFn& is_cancelled,
                    const std::function<bool(int64_t)>& on_queued = nullptr);

  // Ends `job_id`'s stream (its job ended); its calls end UNAVAILABLE.
  void Close(const std::string& job_id);
  // Ends every stream and refuses new ones (the coordinator is shutting down).
  void Shutdown();

 private:
  struct Pending;
  struct Channel;
  std::shared_ptr<Channel> Find(const std::string& job_id) const;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_DEPLOYMENT_ROUTER_H_
