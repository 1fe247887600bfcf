// The rendezvous store: a small key-value service that ranks use to find each other.
//
// Communicators exchange their addresses (Gloo) or the unique id (NCCL) through a Store before any
// point-to-point traffic flows. In tests the store is a TcpStore on loopback (tcp_store.h); in the
// service the coordinator provides one. Keys are opaque strings; a communicator puts all of its
// keys under a prefix of its own, so one store can serve many rings and many generations of one
// ring.
//
// Thread-safety: every implementation is safe to call from any number of threads at once.
// Errors: UNAVAILABLE when the store cannot be reached (the message names its address),
// DEADLINE_EXCEEDED when a wait runs out (the message names the keys still missing),
// INVALID_ARGUMENT for malformed requests (a key longer than the implementation allows).
#ifndef DATTN_ENGINE_COMM_STORE_H_
#define DATTN_ENGINE_COMM_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dattn {
namespace comm {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any earlier value, and wakes every waiter on the key.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, waiting up to `timeout` for some rank to set it.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;

  // Adds `delta` to the integer stored at `key` (an absent key counts as 0) and returns the sum.
  // The value is kept as decimal text, so Get sees it too. INVALID_ARGUMENT if the key holds text
  // that is not an integer, or if the sum overflows int64 (the key keeps its value).
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // Returns once every key in `keys` is set; DEADLINE_EXCEEDED after `timeout`, naming the keys
  // that are still missing.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_STORE_H_
