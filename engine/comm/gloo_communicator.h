// The Gloo communicator: the Communicator contract (communicator.h) for CPU ranks, over TCP.
//
// Rendezvous: every rank publishes its listening address in the Store under `prefix` and connects a
// full mesh of TCP pairs (Debian's libgloo, tcp transport). Point-to-point ops are Gloo unbound
// buffers; ops between two ranks are matched by a per-direction sequence number (the slot), which
// is what makes "matched in posting order" hold. Collectives are built here from the same
// point-to-point ops (ring all-gather; ring reduce-scatter + all-gather for all-reduce), so that
// every wait is abortable, has a deadline and names its peer. Collective byte counters follow those
// ring algorithms: AllGather sends (size-1) * count elements per rank; AllReduce 2 * (size-1)
// chunks of about count/size elements.
//
// Failures: Gloo reports a peer that closed its socket as an exception on the pending ops of that
// pair, and a wait that runs past its timeout as an exception after which Gloo closes every pair of
// the context. Both are caught here and become UNAVAILABLE / DEADLINE_EXCEEDED naming the peer; the
// communicator then closes all its connections (so no late message can land in a caller's buffer)
// and stays broken. Abort interrupts waits at once (ABORTED). Shrink builds a fresh Gloo context
// over the survivors through the same Store, under a key prefix derived from this one and the
// exclude list (so survivors of different failures never meet).
//
// Process-wide effect: creating a communicator sets SIGPIPE to ignored if it is at its default,
// since a write to a dead peer's socket must become an error, not kill the process.
#ifndef DATTN_ENGINE_COMM_GLOO_COMMUNICATOR_H_
#define DATTN_ENGINE_COMM_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "engine/comm/store.h"

namespace dattn {
namespace comm {

struct GlooOptions {
  // Numeric address (or resolvable name) of the interface this rank listens on for its peers.
  std::string hostname = "127.0.0.1";
  // Longest wait for a peer, rendezvous included; must be positive. absl::InfiniteDuration() (or
  // anything over a year) waits a year, which stands for no timeout.
  absl::Duration timeout = absl::Seconds(30);
  // Store namespace of this communicator; ranks of one ring use the same prefix, and a new ring (or
  // a new attempt after a failure) must use a new one.
  std::string prefix = "gloo";
};

// Joins the ring of `size` ranks as `rank`. Blocks until every rank has joined or the timeout
// passes (DEADLINE_EXCEEDED naming the ranks that did not arrive, when the store can tell). The
// store is shared with the communicator (Shrink uses it again) and must outlive it.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(std::shared_ptr<Store> store,
                                                                     int rank, int size,
                                                                     const GlooOptions& options);

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_GLOO_COMMUNICATOR_H_
