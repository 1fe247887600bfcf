// The `dattn` command-line client, as a function: client/main.cc calls it with the process's
// streams, tests call it in-process with string streams against a fake coordinator.
//
// Usage, flags and exit codes are documented in docs/CLI.md and `dattn --help`; the exit codes are
// those of client/exit_codes.h. RunCli never throws and never calls exit(); everything it prints
// goes to `out` (results) or `err` (errors, notices). With --json, `out` receives exactly one JSON
// document per command (JSON Lines for `watch`/`submit --watch`), and nothing else.
//
// Thread-safety: concurrent calls are safe as long as they use different streams.
#ifndef DATTN_CLIENT_CLI_H_
#define DATTN_CLIENT_CLI_H_

#include <functional>
#include <ostream>

#include "absl/time/time.h"

namespace dattn {
namespace client {

// What RunCli takes from the process around it; tests replace it.
struct CliEnvironment {
  // Reads an environment variable (DATTN_COORDINATOR); returns nullptr when unset.
  std::function<const char*(const char*)> getenv;
  // Whether `out` is a terminal: `watch` then draws a live progress line instead of event lines.
  bool out_is_tty = false;
  // How often the live progress line is redrawn while no event arrives.
  absl::Duration redraw_every = absl::Seconds(1);
};

// The real process: std::getenv, and a terminal check of stdout when `out` is std::cout.
CliEnvironment ProcessEnvironment(const std::ostream& out);

// Runs one `dattn` command line (argv[0] is the program name). Returns the exit code.
int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);
int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
           const CliEnvironment& env);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_CLI_H_
