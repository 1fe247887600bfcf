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

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/comm/tcp_store.h"

namespace dattn {
namespace model {
namespace testing {

// world: all W ranks; sp: the rank's sequence-parallel group (null when S == 1).
using RankBody =
    std::function<absl::Status(int rank, comm::Communicator& world, comm::Communicator* sp)>;

inline std::vector<absl::Status> RunRanks(int world_size, int sequence_parallel,
                                          const RankBody& body,
                                          absl::Duration timeout = absl::Seconds(60),
                                          const std::string& prefix = "test") {
  std::vector<absl::Status> results(static_cast<size_t>(world_size));
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
      absl::StatusOr<std::unique_ptr<comm::TcpStore>> client = comm::TcpStore::Connect(address);
      if (!client.ok()) {
        result = client.status();
        return;
      }
      std::shared_ptr<comm::Store> store(std::move(*client));
      comm::GlooOptions options;
      options.timeout = timeout;
      options.prefix = absl::StrCat(prefix, "/world");
      absl::StatusOr<std::unique_ptr<comm::Communicator>> world =
          comm::CreateGlooCommunicator(store, w, world_size, options);
      if (!world.ok()) {
        result = world.status();
        return;
      }
      std::unique_ptr<comm::Communicator> sp;
      if (sequence_parallel > 1) {
        const int group = w / sequence_parallel;
        options.prefix = absl::StrCat(prefix, "/sp", group);
        absl::StatusOr<std::unique_ptr<comm::Communicator>> made =
            comm::CreateGlooCommunicator(store, w % sequence_parallel, sequence_parallel, options);
        if (!made.ok()) {
          result = made.status();
          return;
        }
        sp = *std::move(made);
      }
      if (absl::Status ready = (*world)->Barrier(); !ready.ok()) {
        result = ready;
        return;
      }
      result = body(w, **world, sp.get());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace testing
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TESTING_GLOO_RANKS_H_
