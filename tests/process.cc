#include "tests/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace dattn::testing {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ProcessResult FromWaitStatus(int status) {
  ProcessResult r;
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  return r;
}

}  // namespace

Process::Process(ProcessOptions options) : options_(std::move(options)) {
  if (options_.log_dir.empty()) options_.log_dir = MakeTestDir("proc");
  if (options_.name.empty()) options_.name = "child";
  stdout_path_ = options_.log_dir + "/" + options_.name + ".stdout";
  stderr_path_ = options_.log_dir + "/" + options_.name + ".stderr";
}

Process::~Process() {
  if (pid_ > 0 && !finished_) Kill();
}

bool Process::Start(std::string* error) {
  int out_fd = open(stdout_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0 || err_fd < 0) {
    *error = "cannot open log files in " + options_.log_dir + ": " + std::strerror(errno);
    if (out_fd >= 0) close(out_fd);
    if (err_fd >= 0) close(err_fd);
    return false;
  }
  // Build argv/envp before fork: only async-signal-safe calls are allowed in the child.
  std::vector<char*> argv;
  for (const std::string& a : options_.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env_map[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : options_.env) env_map[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) {
    *error = std::string("fork failed: ") + std::strerror(errno);
    close(out_fd);
    close(err_fd);
    return false;
  }
  if (pid == 0) {
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    // A new process group, so that a test can signal the child without signalling itself.
    setpgid(0, 0);
    execve(argv[0], argv.data(), envp.data());
    // Only async-signal-safe calls after fork: the reason is strerrordesc_np's constant text.
    const int exec_errno = errno;
    const char* parts[] = {"exec failed: ", argv[0], ": ", strerrordesc_np(exec_errno), "\n"};
    for (const char* part : parts) {
      if (part == nullptr) continue;
      ssize_t ignored = write(2, part, std::strlen(part));
      (void)ignored;
    }
    _exit(127);
  }
  close(out_fd);
  close(err_fd);
  pid_ = pid;
  finished_.reset();
  return true;
}

bool Process::running() {
  if (pid_ <= 0 || finished_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    finished_ = FromWaitStatus(status);
    return false;
  }
  return true;
}

void Process::Signal(int sig) {
  if (pid_ > 0 && !finished_) kill(pid_, sig);
}

std::optional<ProcessResult> Process::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!finished_) return std::nullopt;
  ProcessResult r = *finished_;
  r.out = ReadStdout();
  r.err = ReadStderr();
  return r;
}

void Process::Kill() {
  if (pid_ <= 0 || finished_) return;
  kill(pid_, SIGKILL);
  int status = 0;
  if (waitpid(pid_, &status, 0) == pid_) finished_ = FromWaitStatus(status);
}

std::string Process::ReadStdout() const { return Slurp(stdout_path_); }
std::string Process::ReadStderr() const { return Slurp(stderr_path_); }

std::optional<std::string> Process::WaitForStderr(const std::string& pattern,
                                                  std::chrono::milliseconds timeout) {
  const std::regex re(pattern);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::string text = ReadStderr();
    std::smatch m;
    if (std::regex_search(text, m, re)) return m.size() > 1 ? m[1].str() : m[0].str();
    if (!running() || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ProcessResult RunCommand(const ProcessOptions& options, std::chrono::milliseconds timeout) {
  static std::atomic<int> counter{0};
  ProcessOptions o = options;
  if (o.name.empty()) o.name = "cmd";
  o.name += "-" + std::to_string(counter++);
  Process p(o);
  std::string error;
  if (!p.Start(&error)) {
    ProcessResult r;
    r.err = error;
    return r;
  }
  std::optional<ProcessResult> r = p.Wait(timeout);
  if (!r) {
    p.Kill();
    ProcessResult killed;
    killed.signal = SIGKILL;
    killed.out = p.ReadStdout();
    killed.err = p.ReadStderr() + "\n[killed after timeout]";
    return killed;
  }
  return *r;
}

std::string MakeTestDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name + "-" +
                    std::to_string(getpid()) + "-" + std::to_string(counter++);
  mkdir(dir.c_str(), 0755);
  return dir;
}

}  // namespace dattn::testing
