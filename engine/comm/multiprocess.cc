#include "engine/comm/multiprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/tcp_store.h"

namespace dattn {
namespace comm {
namespace multiprocess {
namespace {

std::map<std::string, ChildMain>& Registry() {
  static auto* registry = new std::map<std::string, ChildMain>();
  return *registry;
}

constexpr char kChildFlag[] = "--dattn_child=";
constexpr char kRankFlag[] = "--dattn_rank=";
constexpr char kSizeFlag[] = "--dattn_size=";
constexpr char kStoreFlag[] = "--dattn_store=";
constexpr char kArgFlag[] = "--dattn_arg=";

bool StartsWith(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

std::string LogDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string ChildContext::Arg(const std::string& key, const std::string& fallback) const {
  auto it = args.find(key);
  return it == args.end() ? fallback : it->second;
}

int64_t ChildContext::IntArg(const std::string& key, int64_t fallback) const {
  int64_t v = 0;
  auto it = args.find(key);
  return it != args.end() && absl::SimpleAtoi(it->second, &v) ? v : fallback;
}

bool RegisterChild(const std::string& name, ChildMain fn) {
  Registry()[name] = std::move(fn);
  return true;
}

std::optional<int> MaybeRunChild(int argc, char** argv) {
  ChildContext ctx;
  std::string name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (StartsWith(a, kChildFlag)) {
      name = a.substr(std::strlen(kChildFlag));
    } else if (StartsWith(a, kRankFlag)) {
      ctx.rank = std::atoi(a.c_str() + std::strlen(kRankFlag));
    } else if (StartsWith(a, kSizeFlag)) {
      ctx.size = std::atoi(a.c_str() + std::strlen(kSizeFlag));
    } else if (StartsWith(a, kStoreFlag)) {
      ctx.store_address = a.substr(std::strlen(kStoreFlag));
    } else if (StartsWith(a, kArgFlag)) {
      const std::string kv = a.substr(std::strlen(kArgFlag));
      const size_t eq = kv.find('=');
      ctx.args[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    }
  }
  if (name.empty()) return std::nullopt;
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    std::fprintf(stderr, "no child named \"%s\" is registered\n", name.c_str());
    return 2;
  }
  return it->second(ctx);
}

absl::StatusOr<std::vector<ChildResult>> RunChildren(const LaunchOptions& options) {
  if (Registry().count(options.child) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("no child named \"", options.child, "\""));
  }
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start();
  if (!server.ok()) return server.status();

  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) return absl::InternalError("readlink /proc/self/exe failed");
  exe[len] = '\0';

  std::vector<ChildResult> results(options.size);
  std::vector<pid_t> pids(options.size, -1);
  std::vector<std::string> logs(options.size);
  static int run_counter = 0;
  ++run_counter;
  for (int r = 0; r < options.size; ++r) {
    results[r].rank = r;
    logs[r] = absl::StrCat(LogDir(), "/dattn_child_", ::getpid(), "_", run_counter, "_",
                           options.child, "_", r, ".log");
    std::vector<std::string> args = {
        exe, absl::StrCat(kChildFlag, options.child), absl::StrCat(kRankFlag, r),
        absl::StrCat(kSizeFlag, options.size), absl::StrCat(kStoreFlag, (*server)->address())};
    for (const auto& [k, v] : options.args) args.push_back(absl::StrCat(kArgFlag, k, "=", v));
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (int q = 0; q < r; ++q) ::kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(pids[q], nullptr, 0);
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      const int fd = ::open(logs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(exe, argv.data());
      ::_exit(127);
    }
    pids[r] = pid;
  }

  const absl::Time deadline = absl::Now() + options.timeout;
  int running = options.size;
  bool timed_out = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < options.size; ++r) {
        if (pids[r] != pid) continue;
        ChildResult& res = results[r];
        res.exited = WIFEXITED(status);
        res.exit_code = res.exited ? WEXITSTATUS(status) : -1;
        res.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        res.killed_at_timeout = timed_out;
        pids[r] = -1;
        --running;
      }
      continue;
    }
    if (!timed_out && absl::Now() > deadline) {
      timed_out = true;
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGKILL);
      }
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (int r = 0; r < options.size; ++r) {
    results[r].log = ReadFile(logs[r]);
    ::unlink(logs[r].c_str());
  }
  return results;
}

std::string Describe(const std::vector<ChildResult>& results) {
  std::string out;
  for (const ChildResult& r : results) {
    absl::StrAppend(
        &out, "rank ", r.rank, ": ",
        r.exited ? absl::StrCat("exit ", r.exit_code) : absl::StrCat("killed by signal ", r.signal),
        r.killed_at_timeout ? " (killed at the timeout)" : "", "\n");
  }
  for (const ChildResult& r : results) {
    absl::StrAppend(&out, "---- rank ", r.rank, " log ----\n", r.log);
  }
  return out;
}

}  // namespace multiprocess
}  // namespace comm
}  // namespace dattn
