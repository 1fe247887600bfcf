#include "model/cuda/nccl_ranks.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/nccl_communicator.h"
#include "engine/comm/tcp_store.h"

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
  std::vector<absl::Status> results(static_cast<size_t>(world_size));
  if (world_size < 1 || sequence_parallel < 1 || world_size % sequence_parallel != 0) {
    for (absl::Status& r : results) {
      r = absl::InvalidArgumentError(absl::StrCat("RunNcclRanks: world size ", world_size,
                                                  " is not a multiple of the sequence-parallel "
                                                  "size ",
                                                  sequence_parallel));
    }
    return results;
  }
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  if (!server.ok()) {
    for (absl::Status& r : results) r = server.status();
    return results;
  }
  const std::string address = (*server)->address();
  std::vector<std::thread> threads;
  for (int w = 0; w < world_size; ++w) {
    threads.emplace_back([&, w] {
      absl::Status& result = results[static_cast<size_t>(w)];
      if (cudaSetDevice(w) != cudaSuccess) {
        cudaGetLastError();
        result = absl::InternalError(absl::StrCat("cudaSetDevice(", w, ") failed"));
        return;
      }
      absl::StatusOr<std::unique_ptr<comm::TcpStore>> client = comm::TcpStore::Connect(address);
      if (!client.ok()) {
        result = client.status();
        return;
      }
      std::shared_ptr<comm::Store> store(std::move(*client));
      comm::NcclOptions options;
      options.device = w;
      options.timeout = timeout;
      options.prefix = absl::StrCat(prefix, "/world");
      absl::StatusOr<std::unique_ptr<comm::Communicator>> world =
          comm::CreateNcclCommunicator(store, w, world_size, options);
      if (!world.ok()) {
        result = world.status();
        return;
      }
      std::unique_ptr<comm::Communicator> sp;
      if (sequence_parallel > 1) {
        options.prefix = absl::StrCat(prefix, "/sp", w / sequence_parallel);
        absl::StatusOr<std::unique_ptr<comm::Communicator>> made =
            comm::CreateNcclCommunicator(store, w % sequence_parallel, sequence_parallel, options);
        if (!made.ok()) {
          result = made.status();
          return;
        }
        sp = *std::move(made);
      }
      result = body(w, **world, sp.get());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
