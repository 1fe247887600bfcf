#include "engine/comm/local_ranks.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/comm/tcp_store.h"

namespace dattn {
namespace comm {

std::vector<absl::Status> RunLocalRanks(int world_size, int sequence_parallel, const RankBody& body,
                                        const LocalRanksOptions& options) {
  std::vector<absl::Status> results(static_cast<size_t>(std::max(world_size, 0)));
  if (world_size < 1 || sequence_parallel < 1 || world_size % sequence_parallel != 0 ||
      !options.create) {
    for (absl::Status& r : results) {
      r = absl::InvalidArgumentError(
          absl::StrCat("RunLocalRanks: ", world_size, " ranks in groups of ", sequence_parallel,
                       options.create ? "" : ", and no create function"));
    }
    return results;
  }
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start();
  if (!server.ok()) {
    for (absl::Status& r : results) r = server.status();
    return results;
  }
  const std::string address = (*server)->address();
  std::vector<std::thread> threads;
  for (int w = 0; w < world_size; ++w) {
    threads.emplace_back([&, w] {
      absl::Status& result = results[static_cast<size_t>(w)];
      if (options.on_thread) {
        if (absl::Status s = options.on_thread(w); !s.ok()) {
          result = s;
          return;
        }
      }
      absl::StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Connect(address);
      if (!client.ok()) {
        result = client.status();
        return;
      }
      std::shared_ptr<Store> store(std::move(*client));
      absl::StatusOr<std::unique_ptr<Communicator>> world =
          options.create(store, w, world_size, absl::StrCat(options.prefix, "/world"));
      if (!world.ok()) {
        result = world.status();
        return;
      }
      std::unique_ptr<Communicator> sp;
      if (sequence_parallel > 1) {
        absl::StatusOr<std::unique_ptr<Communicator>> made =
            options.create(store, w % sequence_parallel, sequence_parallel,
                           absl::StrCat(options.prefix, "/sp", w / sequence_parallel));
        if (!made.ok()) {
          result = made.status();
          return;
        }
        sp = *std::move(made);
      }
      if (options.barrier_first) {
        if (absl::Status ready = (*world)->Barrier(); !ready.ok()) {
          result = ready;
          return;
        }
      }
      result = body(w, **world, sp.get());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace comm
}  // namespace dattn
