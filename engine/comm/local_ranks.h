// W ranks as threads of one process, joined through a TcpStore on a loopback port: the world
// communicator of all W and, with S > 1, each rank's sequence-parallel group (the S contiguous
// ranks [w / S * S, w / S * S + S), formed through the same store under another prefix, as the
// service forms them). What the in-process multi-rank tests (Gloo) and the multi-GPU prefill
// benchmark (NCCL) stand up without a launcher; the service's workers are separate processes that
// join through the coordinator's rendezvous instead.
//
// Thread-safety: RunLocalRanks blocks until every rank's body has returned; the bodies run
// concurrently, one thread each. Errors: each rank's status is its body's, or the first failure of
// its setup (on_thread, the store, a communicator, the barrier).
#ifndef DATTN_ENGINE_COMM_LOCAL_RANKS_H_
#define DATTN_ENGINE_COMM_LOCAL_RANKS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"
#include "engine/comm/store.h"

namespace dattn {
namespace comm {

// The rank's world communicator (all W ranks) and its sequence-parallel group's (null for S = 1);
// both borrowed for the body's duration.
using RankBody = std::function<absl::Status(int rank, Communicator& world, Communicator* sp)>;

struct LocalRanksOptions {
  // Store keys of the world go under "<prefix>/world", of group g under "<prefix>/sp<g>": distinct
  // prefixes keep successive calls apart.
  std::string prefix = "test";
  // Makes rank `rank` of a communicator of `size` ranks over `store` under `prefix` (e.g.
  // CreateGlooCommunicator, CreateNcclCommunicator with the rank's device). Required.
  std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
      std::shared_ptr<Store> store, int rank, int size, const std::string& prefix)>
      create;
  // Optional: run first on rank w's thread (e.g. cudaSetDevice(w)); an error is the rank's.
  std::function<absl::Status(int rank)> on_thread;
  // Whether the body waits for every rank's communicators (a world barrier) first.
  bool barrier_first = false;
};

// Runs `body` on W threads once their communicators are ready; returns each rank's status. W must
// be a multiple of S (INVALID_ARGUMENT for every rank otherwise).
std::vector<absl::Status> RunLocalRanks(int world_size, int sequence_parallel, const RankBody& body,
                                        const LocalRanksOptions& options);

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_LOCAL_RANKS_H_
