#include "model/cuda/nccl_ranks.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/comm/nccl_communicator.h"

namespace dattn {
namespace model {
namespace cuda {

bool HaveHopperGpus(int needed, std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < needed) {
    cudaGetLastError();
    *why = absl::StrCat("needs ", needed, " GPU", needed > 1 ? "s" : "",
                        "; cudaGetDeviceCount returned ", static_cast<int>(e), " (",
                        cudaGetErrorString(e), "), ", e == cudaSuccess ? n : 0, " devices");
    return false;
  }
  for (int d = 0; d < needed; ++d) {
    cudaDeviceProp props = {};
    if (cudaGetDeviceProperties(&props, d) != cudaSuccess || props.major < 9) {
      cudaGetLastError();
      *why = absl::StrCat("needs compute capability 9.0 (Hopper); device ", d, " is ", props.name,
                          " ", props.major, ".", props.minor);
      return false;
    }
  }
  return true;
}

std::vector<absl::Status> RunNcclRanks(int world_size, int sequence_parallel, const RankBody& body,
                                       const std::string& prefix, absl::Duration timeout) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  comm::LocalRanksOptions options;
  options.prefix = prefix;
  options.on_thread = [](int rank) -> absl::Status {
    if (cudaSetDevice(rank) != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("cudaSetDevice(", rank, ") failed"));
    }
    return absl::OkStatus();
  };
  options.create = [timeout](std::shared_ptr<comm::Store> store, int rank, int size,
                             const std::string& key_prefix) {
    comm::NcclOptions nccl;
    int device = 0;
    cudaGetDevice(&device);  // The rank's thread's, set by on_thread.
    nccl.device = device;
    nccl.timeout = timeout;
    nccl.prefix = key_prefix;
    return comm::CreateNcclCommunicator(std::move(store), rank, size, nccl);
  };
  return comm::RunLocalRanks(world_size, sequence_parallel, body, options);
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
