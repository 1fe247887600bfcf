// The keys of a ring attempt's rendezvous store that the coordinator and the workers share: the
// coordinator hosts the store and reads them to tell which ranks of a ring never arrived; a rank
// sets its own when it arrives (worker/ring_join.h describes the whole protocol).
#ifndef DATTN_API_RENDEZVOUS_H_
#define DATTN_API_RENDEZVOUS_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace api {

// The store key rank `rank` of ring `ring_id` sets to its worker's name when it arrives:
// "<ring_id>/joined/<rank>".
inline std::string JoinedKey(const std::string& ring_id, int rank) {
  return absl::StrCat(ring_id, "/joined/", rank);
}

}  // namespace api
}  // namespace dattn

#endif  // DATTN_API_RENDEZVOUS_H_
