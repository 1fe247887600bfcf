// The coordinator's log: one line per event on stderr, "dattn-coordinator: MESSAGE". Thread-safe
// (one fprintf per line).
#ifndef DATTN_SERVER_LOG_H_
#define DATTN_SERVER_LOG_H_

#include <cstdio>
#include <string>

namespace dattn {
namespace server {

inline void Log(const std::string& message) {
  std::fprintf(stderr, "dattn-coordinator: %s\n", message.c_str());
}

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_LOG_H_
