// The communicator: how the ranks of one ring talk to each other.
//
// Two implementations: NCCL for GPUs (nccl_communicator.h) and Gloo over TCP for CPUs
// (gloo_communicator.h). Both meet the same contract, so the ring algorithm (engine/ring) is
// written once against this interface.
//
// Ordering. Every operation takes a Stream. For NCCL it is a cudaStream_t: the operation starts
// after the work already queued on that stream, and nothing waits on the host (stream-ordered). For
// Gloo the stream must be the host stream (Stream{}): operations start at once and complete on the
// host. Point-to-point operations go through StartGroup, which returns a Work handle; Work::Wait
// makes the results visible to a consumer stream (NCCL: an event wait, no host blocking; Gloo:
// blocks the host until done). Ops between the same two ranks in the same direction are matched in
// the order they were posted, across groups and calls: every rank must post its ops in an order
// that its peers agree on (the ring plan guarantees this).
//
// Failure. A communicator is healthy until its first error (a peer that closes its connection, an
// asynchronous NCCL error, a wait that runs past the timeout, Abort). From then on it is broken and
// stays broken: every later call returns the same sticky error (see health()), and the only useful
// operations are Shrink (on the survivors) and destruction. No call waits longer than the
// communicator's timeout for a peer: a dead peer becomes DEADLINE_EXCEEDED or UNAVAILABLE (naming
// the peer rank whose operation failed), never a hang. Errors are:
//   INVALID_ARGUMENT   a bad argument (peer out of range or equal to rank(), negative count, a
//   dtype
//                      the implementation cannot reduce); the communicator stays healthy.
//   UNAVAILABLE        a peer closed its connection or the transport failed.
//   DEADLINE_EXCEEDED  a wait ran past the timeout.
//   ABORTED            Abort() was called (the message holds its reason).
//   INTERNAL           an unexpected library error (the message holds the library's text and code).
//
// Threads. One thread at a time drives a communicator (posts, waits, collectives); Abort, health
// and stats may be called from any thread at any time (a watchdog thread aborts a stuck ring this
// way).
#ifndef DATTN_ENGINE_COMM_COMMUNICATOR_H_
#define DATTN_ENGINE_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/tensor.h"

namespace dattn {
namespace comm {

// A device stream: cudaStream_t for NCCL; null (the host) for Gloo.
struct Stream {
  void* handle = nullptr;
};

enum class ReduceOp { kSum, kMax, kMin };
const char* ReduceOpName(ReduceOp op);

// One point-to-point operation of a group. `count` elements of `dtype` at `data` (device memory for
// NCCL, host memory for Gloo). The memory must stay valid, and a send buffer unchanged, until the
// group's Work has been waited for (or the communicator destroyed).
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  int peer = 0;
  void* data = nullptr;
  int64_t count = 0;
  DType dtype = DType::kFloat32;

  static P2POp Send(int peer, const void* data, int64_t count, DType dtype) {
    return {Kind::kSend, peer, const_cast<void*>(data), count, dtype};
  }
  static P2POp Recv(int peer, void* data, int64_t count, DType dtype) {
    return {Kind::kRecv, peer, data, count, dtype};
  }
  int64_t bytes() const { return count * static_cast<int64_t>(DTypeSize(dtype)); }
};

// Traffic counted by a communicator since its creation, in bytes of payload handed to the transport
// (headers and retransmissions excluded). p2p_* count StartGroup's ops when they are posted;
// collective_* count what this rank's part of each collective puts on the wire under the
// implementation's algorithm (documented per implementation).
struct CommStats {
  int64_t p2p_bytes_sent = 0;
  int64_t p2p_bytes_received = 0;
  int64_t p2p_ops = 0;
  std::vector<int64_t> p2p_bytes_sent_to;        // Indexed by peer rank.
  std::vector<int64_t> p2p_bytes_received_from;  // Indexed by peer rank.
  int64_t collective_calls = 0;
  int64_t collective_bytes_sent = 0;
  int64_t collective_bytes_received = 0;
};

// An in-flight group of point-to-point operations. Not thread-safe; owned by the caller.
class Work {
 public:
  virtual ~Work() = default;
  // Makes the group's results visible to work queued on `consumer` from now on. Gloo: blocks until
  // every op of the group has completed or failed (at most the communicator's timeout). NCCL:
  // queues an event wait on `consumer` and returns; errors surface in Communicator::Synchronize. A
  // failed wait breaks the communicator. Waiting twice returns the first result.
  virtual absl::Status Wait(Stream consumer) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where buffers passed to this communicator live.
  virtual Device device() const = 0;
  // "gloo" or "nccl".
  virtual const char* name() const = 0;
  // The longest any wait for a peer may take.
  virtual absl::Duration timeout() const = 0;

  // Posts every op of `ops` together (NCCL: one ncclGroupStart/End on the communicator's own
  // stream, after the work queued on `after`; Gloo: all posted before any is waited for). On
  // success the returned Work must be waited for before the buffers are reused. Destroying a Work
  // that was not waited for breaks the communicator (its buffers might otherwise still be written).
  virtual absl::StatusOr<std::unique_ptr<Work>> StartGroup(absl::Span<const P2POp> ops,
                                                           Stream after) = 0;

  // recv[r * count .. (r+1) * count) := rank r's send[0 .. count), for every rank r. `recv` holds
  // size() * count elements and must not overlap `send`. Ordered on `stream` (see above).
  virtual absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype,
                                 Stream stream) = 0;

  // recv := op over all ranks of send (count elements; send == recv allowed). Every rank gets
  // bit-identical results.
  virtual absl::Status AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                                 ReduceOp op, Stream stream) = 0;

  // Returns when every rank has entered Barrier (host-blocking in both implementations).
  virtual absl::Status Barrier() = 0;

  // Host-blocks until the work queued on `stream` has finished, polling for asynchronous errors, at
  // most timeout(); on timeout the communicator breaks with DEADLINE_EXCEEDED. Gloo: returns
  // health().
  virtual absl::Status Synchronize(Stream stream) = 0;

  // Breaks the communicator with ABORTED(reason) and interrupts every wait in progress on any
  // thread. NCCL: the communicator is released (ncclCommAbort), so Shrink is no longer possible.
  // Idempotent; the first reason sticks. Thread-safe.
  virtual void Abort(const std::string& reason) = 0;

  // OK while healthy; the sticky error once broken. Thread-safe.
  virtual absl::Status health() const = 0;

  // A new communicator over the ranks not in `exclude` (ranks keep their order and are renumbered
  // 0..size()-|exclude|-1). Every survivor must call it with the same list; the excluded ranks must
  // not. Works on a healthy or a broken communicator (the usual case: a peer died); this one stays
  // as it was. FAILED_PRECONDITION after Abort (NCCL) or when the caller is in `exclude`.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Shrink(absl::Span<const int> exclude) = 0;

  // Counters since creation. Thread-safe.
  virtual CommStats stats() const = 0;
};

// Shared argument checks: INVALID_ARGUMENT naming the op index and the bad field.
absl::Status ValidateP2POps(absl::Span<const P2POp> ops, int rank, int size);

// The survivors' new rank, or FAILED_PRECONDITION/INVALID_ARGUMENT for a bad exclude list (a rank
// out of range, repeated, the caller itself, or every rank).
absl::StatusOr<int> ShrunkRank(absl::Span<const int> exclude, int rank, int size);

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_COMMUNICATOR_H_
