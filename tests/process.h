// Child processes for multi-process tests: start a binary, read what it printed, signal it, reap
// it.
//
// A Process owns one child. Its stdout and stderr go to files under the test's temp dir so that a
// failing test can print them. The destructor SIGKILLs and reaps a child still running, so a test
// that fails half-way leaves no stray daemon behind. Not thread-safe; one test thread drives it.
#ifndef DATTN_TESTS_PROCESS_H_
#define DATTN_TESTS_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dattn::testing {

struct ProcessOptions {
  std::vector<std::string> argv;           // argv[0] is the binary's path.
  std::map<std::string, std::string> env;  // Added to (or replacing in) the test's environment.
  std::string log_dir;                     // Where NAME.stdout / NAME.stderr go.
  std::string name;                        // Used for log file names and messages.
};

// The result of a child that ran to completion.
struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal.
  int signal = 0;      // The signal that killed it, or 0.
  std::string out;     // Everything it wrote to stdout.
  std::string err;     // Everything it wrote to stderr.
};

class Process {
 public:
  explicit Process(ProcessOptions options);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Starts the child; false (with the reason in *error) if fork/exec failed.
  bool Start(std::string* error);
  pid_t pid() const { return pid_; }
  bool running();

  void Signal(int sig);
  // Waits up to `timeout` for the child to exit; nullopt on timeout (the child keeps running).
  std::optional<ProcessResult> Wait(std::chrono::milliseconds timeout);
  // SIGKILL and reap.
  void Kill();

  std::string ReadStdout() const;
  std::string ReadStderr() const;
  // Polls stderr until it contains a match of the ECMAScript regex `pattern` (returns capture group
  // 1, or the whole match without groups) or the timeout passes or the child dies (nullopt).
  std::optional<std::string> WaitForStderr(const std::string& pattern,
                                           std::chrono::milliseconds timeout);
  const std::string& name() const { return options_.name; }

 private:
  ProcessOptions options_;
  pid_t pid_ = -1;
  std::optional<ProcessResult> finished_;
  std::string stdout_path_;
  std::string stderr_path_;
};

// Runs a command to completion (stdin closed) and returns what it printed; the child is killed if
// it outlives `timeout` (exit_code -1, signal SIGKILL).
ProcessResult RunCommand(const ProcessOptions& options, std::chrono::milliseconds timeout);

// The test's scratch directory ($TEST_TMPDIR, else /tmp), plus a unique subfolder for `name`.
std::string MakeTestDir(const std::string& name);

}  // namespace dattn::testing

#endif  // DATTN_TESTS_PROCESS_H_
