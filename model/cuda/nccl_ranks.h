// Several NCCL ranks in one process, one thread and one GPU each: what the multi-GPU tests and the
// prefill benchmark use to stand up a world and its sequence-parallel groups without a launcher.
// (The service's workers are separate processes that join through the coordinator's rendezvous;
// this is the in-process equivalent over a TcpStore on a loopback port.)
//
// Thread-safety: RunNcclRanks blocks until every rank's body has returned; the bodies run
// concurrently, rank w on GPU w (cudaSetDevice(w) on its thread). NVLink multicast (NVLS) is turned
// off for the process (NCCL_NVLS_ENABLE=0), as the GPU machines require.
#ifndef DATTN_MODEL_CUDA_NCCL_RANKS_H_
#define DATTN_MODEL_CUDA_NCCL_RANKS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "engine/comm/local_ranks.h"

namespace dattn {
namespace model {
namespace cuda {

// The rank's world communicator (all W ranks) and its sequence-parallel group's (null for S = 1);
// both borrowed for the body's duration.
using RankBody = comm::RankBody;

// W threads, rank w on GPU w (comm::RunLocalRanks over NCCL communicators): joins the world (and
// its group of the S contiguous ranks [w / S * S, w / S * S + S) as rank w % S), then runs `body`.
// Returns each rank's status: the body's, or its failure to join (each collective call and the
// joins wait at most `timeout`). `prefix` keeps the store keys of successive calls apart. W must be
// a multiple of S and at most the GPUs seen.
std::vector<absl::Status> RunNcclRanks(int world_size, int sequence_parallel, const RankBody& body,
                                       const std::string& prefix,
                                       absl::Duration timeout = absl::Seconds(120));

// Whether this process sees at least `needed` CUDA devices and devices 0..needed-1 are Hopper or
// newer (compute capability >= 9.0); if not, false and why in *why (the count CUDA reported).
bool HaveHopperGpus(int needed, std::string* why);

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_NCCL_RANKS_H_
