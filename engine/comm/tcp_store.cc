#include "engine/comm/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/comm/tcp_store_wire.h"

namespace dattn {
namespace comm {
namespace {

// Frames: tcp_store_wire.h.

std::string ErrnoText(int err) { return std::strerror(err); }

// Waits until fd is ready for `events` or the deadline passes. Returns false on timeout.
absl::StatusOr<bool> PollUntil(int fd, short events, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd, events, 0};
    // An infinite wait blocks in poll (-1); ToInt64Milliseconds saturates there and the + 1 that
    // keeps poll from waking just before the deadline would overflow. Finite waits beyond poll's
    // int range wake at INT_MAX ms and poll again.
    int ms = -1;
    if (left != absl::InfiniteDuration()) {
      ms = left >= absl::Milliseconds(INT_MAX - 1)
               ? INT_MAX
               : static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    }
    const int rv = ::poll(&p, 1, ms);
    if (rv > 0) return true;
    if (rv == 0) continue;
    if (errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("poll: ", ErrnoText(errno)));
  }
}

absl::Status SendAll(int fd, const char* data, size_t n, absl::Time deadline) {
  while (n > 0) {
    absl::StatusOr<bool> ready = PollUntil(fd, POLLOUT, deadline);
    if (!ready.ok()) return ready.status();
    if (!*ready) return absl::DeadlineExceededError("send timed out");
    const ssize_t rv = ::send(fd, data, n, MSG_NOSIGNAL);
    if (rv < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(absl::StrCat("send: ", ErrnoText(errno)));
    }
    data += rv;
    n -= static_cast<size_t>(rv);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, char* data, size_t n, absl::Time deadline) {
  while (n > 0) {
    absl::StatusOr<bool> ready = PollUntil(fd, POLLIN, deadline);
    if (!ready.ok()) return ready.status();
    if (!*ready) return absl::DeadlineExceededError("receive timed out");
    const ssize_t rv = ::recv(fd, data, n, 0);
    if (rv == 0) return absl::UnavailableError("connection closed by peer");
    if (rv < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", ErrnoText(errno)));
    }
    data += rv;
    n -= static_cast<size_t>(rv);
  }
  return absl::OkStatus();
}

// Server side: blocking reads on a socket that the server shuts down to stop us.
bool ReadExact(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t rv = ::recv(fd, data, n, 0);
    if (rv == 0) return false;
    if (rv < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += rv;
    n -= static_cast<size_t>(rv);
  }
  return true;
}

bool WriteExact(int fd, const std::string& data) {
  const char* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    const ssize_t rv = ::send(fd, p, n, MSG_NOSIGNAL);
    if (rv < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += rv;
    n -= static_cast<size_t>(rv);
  }
  return true;
}

absl::StatusOr<std::pair<std::string, int>> SplitAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("store address \"", address, "\" is not of the form host:port"));
  }
  return std::make_pair(address.substr(0, colon), port);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Server.

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host,
                                                                      int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store host \"", host, "\" is not a numeric IPv4 address"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, ": ", ErrnoText(err)));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto server = std::unique_ptr<TcpStoreServer>(new TcpStoreServer(host, ntohs(addr.sin_port), fd));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::TcpStoreServer(std::string host, int port, int listen_fd)
    : host_(std::move(host)), port_(port), listen_fd_(listen_fd) {}

TcpStoreServer::~TcpStoreServer() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // shutdown() wakes the threads blocked in accept() and recv() on these sockets.
    ::shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
    changed_.SignalAll();
  }
  accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    threads = std::move(client_threads_);
  }
  for (std::thread& t : threads) t.join();
  ::close(listen_fd_);
}

std::string TcpStoreServer::address() const { return absl::StrCat(host_, ":", port_); }

void TcpStoreServer::AcceptLoop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    client_fds_.push_back(fd);
    client_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  for (;;) {
    absl::StatusOr<StoreRequest> request =
        ReadStoreRequest([fd](char* data, size_t n) { return ReadExact(fd, data, n); });
    if (!request.ok()) break;  // Closed, or out of step: either way the connection ends.

    std::string reply;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      if (request->op == kStoreGet) {
        const absl::Time deadline =
            absl::Now() + absl::Milliseconds(std::max<int64_t>(request->arg, 0));
        while (!stopping_ && data_.count(request->key) == 0) {
          if (changed_.WaitWithDeadline(&mu_, deadline)) break;  // Timed out.
        }
        stop = stopping_;
      }
      bool changed = false;
      reply = ApplyStoreRequest(*std::move(request), &data_, &changed);
      if (changed) changed_.SignalAll();
    }
    if (stop) break;
    if (!WriteExact(fd, reply)) break;
  }
  absl::MutexLock lock(&mu_);
  client_fds_.erase(std::remove(client_fds_.begin(), client_fds_.end(), fd), client_fds_.end());
  ::close(fd);
}

// ---------------------------------------------------------------------------------------------------
// Client.

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& address,
                                                            absl::Duration connect_timeout,
                                                            absl::Duration request_timeout) {
  absl::StatusOr<std::pair<std::string, int>> hp = SplitAddress(address);
  if (!hp.ok()) return hp.status();
  auto store =
      std::unique_ptr<TcpStore>(new TcpStore(address, hp->first, hp->second, request_timeout));
  absl::MutexLock lock(&store->mu_);
  if (absl::Status s = store->EnsureConnectedLocked(absl::Now() + connect_timeout); !s.ok()) {
    return s;
  }
  return store;
}

TcpStore::TcpStore(std::string address, std::string host, int port, absl::Duration request_timeout)
    : address_(std::move(address)),
      host_(std::move(host)),
      port_(port),
      request_timeout_(request_timeout) {}

TcpStore::~TcpStore() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
}

absl::Status TcpStore::EnsureConnectedLocked(absl::Time deadline) {
  if (fd_ >= 0) return absl::OkStatus();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  if (::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store host \"", host_, "\" is not a numeric IPv4 address"));
  }
  std::string last_error = "no attempt";
  do {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      fd_ = fd;
      return absl::OkStatus();
    }
    last_error = ErrnoText(errno);
    ::close(fd);
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  return absl::UnavailableError(
      absl::StrCat("cannot connect to store at ", address_, ": ", last_error));
}

absl::StatusOr<std::string> TcpStore::RoundTrip(uint8_t op, const std::string& key,
                                                const std::string& value, int64_t arg,
                                                absl::Duration wait) {
  if (key.size() > kMaxStoreKeyBytes || value.size() > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store key (", key.size(), " bytes) or value (", value.size(),
        " bytes) exceeds the limits of ", kMaxStoreKeyBytes, " and ", kMaxStoreValueBytes));
  }
  const std::string frame = EncodeStoreRequest(StoreRequest{op, key, value, arg});

  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + wait + request_timeout_;
  absl::Status s = EnsureConnectedLocked(absl::Now() + request_timeout_);
  if (s.ok()) s = SendAll(fd_, frame.data(), frame.size(), deadline);
  uint8_t code = 0;
  uint32_t len = 0;
  std::string payload;
  if (s.ok()) s = RecvAll(fd_, reinterpret_cast<char*>(&code), 1, deadline);
  if (s.ok()) s = RecvAll(fd_, reinterpret_cast<char*>(&len), 4, deadline);
  if (s.ok() && len > kMaxStoreValueBytes) s = absl::UnavailableError("malformed reply");
  if (s.ok()) {
    payload.resize(len);
    s = RecvAll(fd_, payload.data(), len, deadline);
  }
  if (!s.ok()) {
    // The stream is out of step after a partial exchange: start over on the next request.
    ::close(fd_);
    fd_ = -1;
    return absl::Status(s.code(),
                        absl::StrCat("store ", address_, ", key \"", key, "\": ", s.message()));
  }
  if (code == kStoreNotFound) {
    return absl::DeadlineExceededError(absl::StrCat(
        "store ", address_, ": key \"", key, "\" not set within ", absl::FormatDuration(wait)));
  }
  if (code != kStoreOk)
    return absl::InvalidArgumentError(absl::StrCat("store ", address_, ": ", payload));
  return payload;
}

absl::Status TcpStore::Set(const std::string& key, const std::string& value) {
  return RoundTrip(kStoreSet, key, value, 0, absl::ZeroDuration()).status();
}

absl::StatusOr<std::string> TcpStore::Get(const std::string& key, absl::Duration timeout) {
  timeout = std::max(timeout, absl::ZeroDuration());
  return RoundTrip(kStoreGet, key, "", absl::ToInt64Milliseconds(timeout), timeout);
}

absl::StatusOr<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  absl::StatusOr<std::string> r = RoundTrip(kStoreAdd, key, "", delta, absl::ZeroDuration());
  if (!r.ok()) return r.status();
  int64_t value = 0;
  if (!absl::SimpleAtoi(*r, &value)) {
    return absl::InternalError(absl::StrCat("store ", address_, ": Add replied \"", *r, "\""));
  }
  return value;
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<std::string> r = Get(keys[i], deadline - absl::Now());
    if (r.ok()) continue;
    if (!absl::IsDeadlineExceeded(r.status())) return r.status();
    std::vector<std::string> missing = {keys[i]};
    for (size_t j = i + 1; j < keys.size(); ++j) {
      if (!Get(keys[j], absl::ZeroDuration()).ok()) missing.push_back(keys[j]);
    }
    return absl::DeadlineExceededError(absl::StrCat("store ", address_, ": keys not set within ",
                                                    absl::FormatDuration(timeout), ": \"",
                                                    absl::StrJoin(missing, "\", \""), "\""));
  }
  return absl::OkStatus();
}

}  // namespace comm
}  // namespace dattn
