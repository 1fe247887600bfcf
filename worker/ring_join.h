// How a rank joins its ring: the rendezvous protocol between the ranks of one ring attempt.
//
// The coordinator hosts a rendezvous store for every ring attempt (a TcpStore server of its own)
// and hands each rank a RingInfo: the ring id, its rank, the ring's size, the communicator backend,
// the store's address, the attempt's secret and two timeouts. A rank then:
//   1. connects to the store (presenting the secret in its hello) and sets
//   "<ring_id>/joined/<rank>" (api/rendezvous.h) to its
//      worker's name (the coordinator reads these keys to tell which ranks never arrived);
//   2. waits, up to formation_timeout_ms, until every rank's key is set, polling its own
//      cancellation at least every 100 ms; a rank that never arrives fails the formation with
//      DEADLINE_EXCEEDED naming it;
//   3. forms the communicator through the same store under "<ring_id>/comm" (Gloo: every rank
//      publishes its address and connects a full mesh; NCCL: rank 0 publishes the unique id), with
//      comm_timeout_ms as the longest wait for a peer from then on.
// Step 2 separates "a peer never came" (the formation timeout, short) from "a peer is slow during
// the run" (the communicator timeout, long); the communicator's own rendezvous then finds every
// peer present.
//
// Errors carry "ring RING_ID rank R of P: " in front: INVALID_ARGUMENT for a malformed RingInfo;
// FAILED_PRECONDITION for a backend this device does not form rings with; PERMISSION_DENIED when
// the store refuses this rank (wrong or missing ring secret, or a TLS handshake without a
// certificate of the cluster CA); UNAUTHENTICATED when the store's certificate does not verify
// against options.store_tls's CA; INVALID_ARGUMENT when a TLS file cannot be read; UNAVAILABLE when
// the store cannot be reached or goes away (the coordinator ended the attempt); DEADLINE_EXCEEDED
// naming the ranks that did not arrive; CANCELLED when `is_cancelled` said so; the communicator's
// errors. Thread-safety: call from one thread; `is_cancelled` is called on it.
#ifndef DATTN_WORKER_RING_JOIN_H_
#define DATTN_WORKER_RING_JOIN_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dattn/v1/worker.pb.h"
#include "engine/comm/communicator.h"
#include "engine/comm/store.h"
#include "engine/comm/tcp_store.h"
#include "worker/task_device.h"

namespace dattn {
namespace worker {

struct RingMembership {
  std::shared_ptr<comm::Store> store;  // The communicator keeps using it (Shrink); keep it alive.
  std::unique_ptr<comm::Communicator> comm;
  double formation_seconds = 0;  // From connecting to the store to the formed communicator.
};

struct RingJoinOptions {
  std::string member_name;  // Stored under the joined key: who this rank is, for diagnostics.
  // Used when ring.comm_timeout_ms is 0.
  absl::Duration default_comm_timeout = absl::Seconds(120);
  // Mutual TLS to the ring's store (engine/comm/tcp_store.h); empty: plaintext. The files are read
  // at each join.
  comm::StoreTls store_tls;
  std::function<bool()> is_cancelled;
};

absl::StatusOr<RingMembership> JoinRing(const v1::RingInfo& ring, TaskDevice* device,
                                        const RingJoinOptions& options);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_RING_JOIN_H_
