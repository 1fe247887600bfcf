// Multi-process tests on loopback: a test binary that re-executes itself as P rank processes.
//
// A test registers a child entry point by name (DATTN_REGISTER_CHILD) and calls RunChildren, which
// starts a TcpStoreServer on 127.0.0.1 (ephemeral port), fork+execs /proc/self/exe once per rank
// with the child's name, rank, size, the store address and free-form key=value arguments, and waits
// for every child (killing the rest with SIGKILL once the timeout passes). Each child's stdout and
// stderr go to a log file that the parent reads back, so a failure shows what every rank said.
//
// The binary's main must call MaybeRunChild first (multiprocess_main.cc does, then runs gtest).
// Children are real processes: a test can SIGKILL one mid-call and watch the others.
// Testing only; not thread-safe (one RunChildren at a time per process).
#ifndef DATTN_ENGINE_COMM_MULTIPROCESS_H_
#define DATTN_ENGINE_COMM_MULTIPROCESS_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dattn {
namespace comm {
namespace multiprocess {

struct ChildContext {
  int rank = 0;
  int size = 1;
  std::string store_address;                // "127.0.0.1:port"
  std::map<std::string, std::string> args;  // From LaunchOptions::args.

  // args[key] or `fallback`.
  std::string Arg(const std::string& key, const std::string& fallback = "") const;
  int64_t IntArg(const std::string& key, int64_t fallback) const;
};

// Returns the process exit code: 0 for success.
using ChildMain = std::function<int(const ChildContext&)>;

// Registers `fn` under `name` (at static-initialisation time, through the macro). Returns true.
bool RegisterChild(const std::string& name, ChildMain fn);

#define DATTN_REGISTER_CHILD(name, fn)            \
  static const bool dattn_child_registered_##fn = \
      ::dattn::comm::multiprocess::RegisterChild(name, fn)

// If argv asks for a child (--dattn_child=NAME), runs it and returns its exit code; otherwise
// nullopt (the caller goes on to run its tests).
std::optional<int> MaybeRunChild(int argc, char** argv);

struct LaunchOptions {
  std::string child;  // A registered name.
  int size = 1;
  std::map<std::string, std::string> args;
  absl::Duration timeout = absl::Seconds(60);  // For the whole run.
};

struct ChildResult {
  int rank = 0;
  bool exited = false;  // Exited normally (see exit_code); otherwise killed by `signal`.
  int exit_code = -1;
  int signal = 0;
  bool killed_at_timeout = false;
  std::string log;  // Its stdout and stderr.
};

// Runs one child per rank as described above. Errors: the store or a process could not be started.
// Children that fail are reported in the results, not as an error.
absl::StatusOr<std::vector<ChildResult>> RunChildren(const LaunchOptions& options);

// One line per rank ("rank 1: exit 0" / "rank 2: killed by signal 9") followed by each log.
std::string Describe(const std::vector<ChildResult>& results);

}  // namespace multiprocess
}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_MULTIPROCESS_H_
