// The ring rendezvous: a rendezvous store per attempt of every multi-rank job, and what the
// coordinator knows of each ring's formation.
//
// For each attempt of a job of P > 1 ranks the coordinator starts a store of its own (a TcpStore
// server on `host`, ephemeral port; ring id "JOB_ID/ATTEMPT") and hands every rank a RingInfo
// with the store's address (`advertise` or `host`), the ring's timeouts and the attempt's secret
// (32 bytes from the kernel's CSPRNG, new for every attempt; the store refuses a connection whose
// hello lacks it, so a rank of an earlier attempt or another ring cannot write into this one);
// ranks set api::JoinedKey when they arrive, wait for each other, then form their communicator
// through the same store (worker/ring_join.h). A rank reports its formation in every report once
// formed; the ring is formed when every rank has. When the attempt ends the store is retired, so a
// rank still waiting in it fails at once; retired stores are destroyed outside the coordinator's
// lock (TakeRetired), since that joins their threads. dattn_ring_formations_total counts each
// attempt once: "formed", or "timed_out" / "failed" when it ended unformed.
//
// Thread-safety: none of its own; the coordinator holds it ABSL_GUARDED_BY its mutex.
// ProbeMissingRanks is a static function that does network I/O and takes no lock.
#ifndef DATTN_SERVER_RING_RENDEZVOUS_H_
#define DATTN_SERVER_RING_RENDEZVOUS_H_

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dattn/v1/worker.pb.h"
#include "engine/comm/tcp_store.h"
#include "server/metrics.h"

namespace dattn {
namespace server {

// The ring of a multi-rank job's current attempt.
struct Ring {
  std::string id;       // JOB_ID/ATTEMPT.
  std::string backend;  // "gloo" | "nccl".
  int size = 0;
  std::string address;           // What workers dial.
  std::string secret;            // 32 random bytes every connection to the store presents.
  std::set<int> formed;          // Ranks that reported their communicator formed.
  double formation_seconds = 0;  // The longest of their formation times.
  bool counted = false;          // dattn_ring_formations_total has this ring.
  std::unique_ptr<comm::TcpStoreServer> store;
  bool is_formed() const { return static_cast<int>(formed.size()) == size; }
};

struct RingOptions {
  std::string host = "127.0.0.1";  // Numeric IPv4 address the stores listen on.
  std::string advertise;           // Address workers dial; empty: host.
  absl::Duration formation_timeout = absl::Seconds(30);
  absl::Duration comm_timeout = absl::Seconds(120);
  // Mutual TLS of every store (engine/comm/tcp_store.h): the cluster CA, and the coordinator's
  // certificate and key signed by it; read when each attempt's store starts, so renewed files are
  // picked up by the next attempt. Empty: plaintext. ProbeMissingRanks connects with the same
  // files.
  comm::StoreTls tls;
};

class RingRendezvous {
 public:
  // `metrics` (not owned) counts formations.
  RingRendezvous(RingOptions options, Metrics* metrics)
      : options_(std::move(options)), metrics_(metrics) {}
  RingRendezvous(const RingRendezvous&) = delete;
  RingRendezvous& operator=(const RingRendezvous&) = delete;

  // Starts the store of attempt `attempt` of job `job_id` (P = `size` ranks, communicator
  // `backend`) with a new secret. An earlier ring of the job must have ended. UNAVAILABLE when the
  // store cannot listen; INTERNAL when no random bytes could be drawn; INVALID_ARGUMENT when the
  // TLS files cannot be read.
  absl::StatusOr<const Ring*> Start(const std::string& job_id, int attempt,
                                    const std::string& backend, int size);
  const Ring* Find(const std::string& job_id) const;
  // Rank `rank` of the job's ring reported its communicator formed after `seconds`; the ring is
  // counted "formed" when every rank has.
  void MarkFormed(const std::string& job_id, int rank, double seconds);
  // Ends the job's ring, if it has one: its store is retired and, when it never formed and
  // `unformed_outcome` is not empty ("timed_out", "failed"), the formation is counted so.
  void End(const std::string& job_id, const std::string& unformed_outcome);
  // The stores of ended rings, for the caller to destroy without the coordinator's lock.
  std::vector<std::unique_ptr<comm::TcpStoreServer>> TakeRetired();
  // RingInfo of rank `rank` of the job's ring.
  v1::RingInfo Info(const std::string& job_id, int rank) const;

  // The ranks of ring `ring_id` (of `size`) whose arrival key is missing from the store at
  // `address` (whose secret is `secret`, reached with `tls`), or nullopt when the store cannot be
  // asked. A loopback round trip per rank.
  static std::optional<std::vector<int>> ProbeMissingRanks(const std::string& address,
                                                           const std::string& secret,
                                                           const comm::StoreTls& tls,
                                                           const std::string& ring_id, int size);

  const RingOptions& options() const { return options_; }

 private:
  const RingOptions options_;
  Metrics* const metrics_;
  absl::flat_hash_map<std::string, std::unique_ptr<Ring>> rings_;  // By job id.
  std::vector<std::unique_ptr<comm::TcpStoreServer>> retired_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_RING_RENDEZVOUS_H_
