// absl::Time <-> google.protobuf.Timestamp, for the coordinator's records.
#ifndef DATTN_SERVER_PROTO_TIME_H_
#define DATTN_SERVER_PROTO_TIME_H_

#include <cstdint>

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace dattn {
namespace server {

inline google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  google::protobuf::Timestamp ts;
  const int64_t ns = absl::ToUnixNanos(t);
  int64_t seconds = ns / 1000000000;
  int64_t nanos = ns % 1000000000;
  if (nanos < 0) {
    nanos += 1000000000;
    --seconds;
  }
  ts.set_seconds(seconds);
  ts.set_nanos(static_cast<int32_t>(nanos));
  return ts;
}

inline absl::Time FromTimestamp(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_PROTO_TIME_H_
