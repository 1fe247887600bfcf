// What a coordinator is configured with (server/main.cc maps its flags onto these) and their check.
#ifndef DATTN_SERVER_COORDINATOR_OPTIONS_H_
#define DATTN_SERVER_COORDINATOR_OPTIONS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "engine/comm/tcp_store.h"
#include "server/job_store.h"
#include "server/tenant_quotas.h"

namespace dattn {
namespace server {

struct CoordinatorOptions {
  // Folder of the durable state (created 0700 if missing): the job store `data_dir`/jobs.db and
  // stored outputs in `data_dir`/outputs.
  std::string data_dir = "./dattn-data";
  // Folder of the model registry (model_registry.h): the copies JobService.ImportModel makes, which
  // the workers load at the same path (on several hosts, a shared file system). Empty:
  // `data_dir`/models.
  std::string model_dir;
  JobStoreOptions store;
  // The clock every age, interval and deadline is read from; not owned; nullptr: the real clock.
  const Clock* clock = nullptr;
  // A worker whose last heartbeat is older than this is DEAD and its jobs are recovered.
  absl::Duration dead_after = absl::Seconds(10);
  // What workers are told to use (RegisterWorkerResponse); should be well below dead_after.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // Most runs of one job that fail for its own reasons (coordinator.h, "Attempts"); >= 1.
  int max_attempts = 3;
  // Progress reports update the job in memory at once but are written (as "progress" events) at
  // most this often per job.
  absl::Duration progress_persist_interval = absl::Seconds(1);
  // DEAD workers stay in ListWorkers(include_dead) this long, then are forgotten.
  absl::Duration dead_worker_retention = absl::Minutes(10);
  // Passed to the scheduler (scheduler.h): waiting time after which a job that does not fit
  // reserves the workers it could use.
  absl::Duration starvation_bound = absl::Minutes(10);
  // How long blocked streams sleep between checks of their caller's cancellation (real time).
  absl::Duration stream_poll_interval = absl::Milliseconds(200);
  // Numeric IPv4 address the rings' rendezvous stores listen on (each on an ephemeral port).
  std::string rendezvous_host = "127.0.0.1";
  // Address workers are told to dial for the stores; empty: rendezvous_host (which must then not
  // be 0.0.0.0).
  std::string rendezvous_advertise;
  // How long the ranks of a ring wait for each other before the formation fails.
  absl::Duration ring_formation_timeout = absl::Seconds(30);
  // Longest wait for a peer once a ring is formed (RingInfo.comm_timeout_ms).
  absl::Duration ring_comm_timeout = absl::Seconds(120);
  // Mutual TLS of the rings' rendezvous stores (RingOptions::tls): the cluster CA, the
  // coordinator's certificate and key. Empty: plaintext (each store still requires its secret).
  comm::StoreTls rendezvous_tls;
  // How long the set of ready workers must stay unchanged before unchecked queued jobs are checked
  // against it (coordinator.h, "Unchecked jobs"); >= 0.
  absl::Duration feasibility_settle = absl::Seconds(5);
  // A store with no commit for this long gets a probe write (job_recorder.h); > 0.
  absl::Duration store_probe_interval = absl::Seconds(5);
  // Most WatchJob streams open at once (each holds a server thread while it waits); more get
  // RESOURCE_EXHAUSTED. >= 1.
  int max_watch_streams = 256;
  // Finished jobs, their history and outputs are deleted this long after they finished;
  // absl::InfiniteDuration() keeps them for ever. > 0.
  absl::Duration retention = absl::Hours(24 * 7);
  // Take Attend calls whose tensors are in a shared-memory region (AttendStart.shared_memory);
  // otherwise they get FAILED_PRECONDITION. The gRPC service takes them only from callers on this
  // host (loopback or a Unix socket).
  bool attend_shared_memory = false;
  // Per-tenant quotas on submits (tenant_quotas.h); zeros: none.
  QuotaOptions quotas;
};

// INVALID_ARGUMENT naming the first bad option and its value; OK otherwise.
absl::Status ValidateCoordinatorOptions(const CoordinatorOptions& options);

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_COORDINATOR_OPTIONS_H_
