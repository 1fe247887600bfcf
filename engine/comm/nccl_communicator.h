// The NCCL communicator: the Communicator contract (communicator.h) for GPU ranks, one GPU per
// rank.
//
// Rendezvous: rank 0 creates the NCCL unique id and publishes it in the Store under `prefix`; every
// rank reads it and joins with ncclCommInitRankConfig on a non-blocking communicator
// (config.blocking = 0), polling ncclCommGetAsyncError with a deadline instead of blocking inside
// NCCL.
//
// Ordering: StartGroup makes the communicator's own stream wait for `after` (an event), issues the
// sends and receives as one ncclGroupStart/End on that stream, and records a completion event;
// Work::Wait makes the consumer stream wait for it. No host synchronisation between compute and
// communication: the host only polls when it enqueues (a non-blocking group end) and in
// Synchronize. Collectives run on the caller's stream. Counts are elements
// (ncclFloat16/Bfloat16/Float32/Float64). Collective byte counters follow NCCL's ring algorithms:
// AllGather (size-1) * count elements per rank, AllReduce 2 (size-1)/size * count.
//
// Failures: Synchronize polls cudaStreamQuery and ncclCommGetAsyncError until the stream drains or
// the deadline passes. An asynchronous NCCL error (ncclRemoteError: a peer failed; ncclSystemError:
// a socket or system call failed) becomes UNAVAILABLE; running past the deadline (a dead peer on
// NVLink is seen by no one: its peers' kernels wait forever) becomes DEADLINE_EXCEEDED. Either way
// the communicator is broken but not yet released: the kernels that wait on the dead peer keep
// spinning until the caller either shrinks (ncclCommShrink with NCCL_SHRINK_ABORT, which terminates
// them) or aborts (ncclCommAbort) or destroys the communicator (which aborts a broken one). Every
// NCCL call on the handle is serialised by a mutex, so Abort may come from a watchdog thread.
//
// Threads: each call sets the CUDA device of the communicator on the calling thread first.
#ifndef DATTN_ENGINE_COMM_NCCL_COMMUNICATOR_H_
#define DATTN_ENGINE_COMM_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "engine/comm/store.h"

namespace dattn {
namespace comm {

struct NcclOptions {
  int device = 0;  // CUDA ordinal of this rank's GPU.
  absl::Duration timeout = absl::Seconds(60);
  // Store namespace of this ring; a new ring (or a new attempt) must use a new one.
  std::string prefix = "nccl";
};

// Joins the ring of `size` ranks as `rank` on GPU `options.device`. FAILED_PRECONDITION when CUDA
// finds no such device; DEADLINE_EXCEEDED when the ring does not form in time (the partial
// communicator is aborted). The store must outlive the call.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(std::shared_ptr<Store> store,
                                                                     int rank, int size,
                                                                     const NcclOptions& options);

// Number of CUDA devices this process can see; 0 (never an error) without a driver or GPU.
int CudaDeviceCount();

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_NCCL_COMMUNICATOR_H_
