#include "engine/comm/abort_all.h"

#include <thread>
#include <vector>

namespace dattn {
namespace comm {

void AbortAll(absl::Span<Communicator* const> comms, const std::string& reason) {
  std::vector<Communicator*> live;
  for (Communicator* c : comms) {
    if (c != nullptr) live.push_back(c);
  }
  if (live.size() == 1) {
    live[0]->Abort(reason);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(live.size());
  for (Communicator* c : live) threads.emplace_back([c, &reason] { c->Abort(reason); });
  for (std::thread& t : threads) t.join();
}

}  // namespace comm
}  // namespace dattn
