// In-process multi-rank tests of the model layer: one thread per rank, a local TcpStore server, a
// Gloo communicator per rank over loopback (engine/comm/gloo_communicator.h), as the engine's own
// tests build them. Testing only.
//
// RunRanks(W, S, fn) starts W threads; rank w joins the world communicator of all W ranks and,
// when S > 1, the communicator of its sequence-parallel group (the S contiguous ranks
// [w / S * S, w / S * S + S), formed through the same store under another prefix, as the service
// forms them). fn runs on every rank once every communicator is ready (a barrier first); its
// status is that rank's result. A failure to join is returned as that rank's status.
#ifndef DATTN_MODEL_TESTING_GLOO_RANKS_H_
#define DATTN_MODEL_TESTING_GLOO_RANKS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/comm/local_ranks.h"

namespace dattn {
namespace model {
namespace testing {

// world: all W ranks; sp: the rank's sequence-parallel group (null when S == 1).
using RankBody = comm::RankBody;

inline std::vector<absl::Status> RunRanks(int world_size, int sequence_parallel,
                                          const RankBody& body,
                                          absl::Duration timeout = absl::Seconds(60),
                                          const std::string& prefix = "test") {
  comm::LocalRanksOptions options;
  options.prefix = prefix;
  options.barrier_first = true;
  options.create = [timeout](std::shared_ptr<comm::Store> store, int rank, int size,
                             const std::string& key_prefix) {
    comm::GlooOptions gloo;
    gloo.timeout = timeout;
    gloo.prefix = key_prefix;
    return comm::CreateGlooCommunicator(std::move(store), rank, size, gloo);
  };
  return comm::RunLocalRanks(world_size, sequence_parallel, body, options);
}

}  // namespace testing
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TESTING_GLOO_RANKS_H_
