#include "engine/comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/functional/function_ref.h"
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

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Deadlines of reads between requests on the server: none (a rank may stay idle for the whole
// run; the server's destructor shuts the socket down to end the wait).
constexpr absl::Time kNoDeadline = absl::InfiniteFuture();

// How long a refused connection waits for its peer to close first (StoreConnection::Linger).
constexpr absl::Duration kLinger = absl::Seconds(1);

// OpenSSL's queued errors of this thread, as text (and the queue emptied).
std::string SslErrors() {
  std::string out;
  char buf[256];
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("no detail from OpenSSL") : out;
}

// A BIO over the connection's non-blocking socket that sends with MSG_NOSIGNAL (OpenSSL's socket
// BIO write()s, and a peer gone away would raise SIGPIPE in the process). It does not own the
// descriptor.
int SocketBioWrite(BIO* bio, const char* data, int len) {
  BIO_clear_retry_flags(bio);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  for (;;) {
    const ssize_t rv = ::send(fd, data, static_cast<size_t>(len), MSG_NOSIGNAL);
    if (rv >= 0) return static_cast<int>(rv);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(bio);
    return -1;
  }
}

int SocketBioRead(BIO* bio, char* data, int len) {
  BIO_clear_retry_flags(bio);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  for (;;) {
    const ssize_t rv = ::recv(fd, data, static_cast<size_t>(len), 0);
    if (rv >= 0) return static_cast<int>(rv);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
    return -1;
  }
}

long SocketBioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int SocketBioCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

int SocketBioDestroy(BIO*) { return 1; }

// Built once, never freed (it is reachable from this static until exit).
BIO_METHOD* SocketBioMethod() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "dattn store socket");
    if (m == nullptr) return m;
    BIO_meth_set_write(m, SocketBioWrite);
    BIO_meth_set_read(m, SocketBioRead);
    BIO_meth_set_ctrl(m, SocketBioCtrl);
    BIO_meth_set_create(m, SocketBioCreate);
    BIO_meth_set_destroy(m, SocketBioDestroy);
    return m;
  }();
  return method;
}

}  // namespace

class TlsContext {
 public:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  ~TlsContext() { SSL_CTX_free(ctx_); }
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  SSL_CTX* get() const { return ctx_; }

 private:
  SSL_CTX* const ctx_;
};

namespace {

// The context of `tls` for a server (which presents its certificate and requires a client's) or a
// client (which verifies the server's and presents its own, if it has one); null for plaintext.
absl::StatusOr<std::shared_ptr<TlsContext>> NewTlsContext(const StoreTls& tls, bool server) {
  if (!tls.enabled()) return std::shared_ptr<TlsContext>();
  const char* side = server ? "the rendezvous store's TLS" : "TLS to the rendezvous store";
  if (tls.ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(side, " needs a CA file (the cluster CA)"));
  }
  if (tls.cert_file.empty() != tls.key_file.empty() || (server && tls.cert_file.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(side, " needs both a certificate and its key", server ? "" : ", or neither"));
  }
  ERR_clear_error();
  SSL_CTX* raw = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (raw == nullptr) {
    return absl::InternalError(absl::StrCat("SSL_CTX_new: ", SslErrors()));
  }
  auto ctx = std::make_shared<TlsContext>(raw);
  SSL_CTX_set_min_proto_version(raw, TLS1_2_VERSION);
  if (SSL_CTX_load_verify_locations(raw, tls.ca_file.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(side, ": cannot load the CA certificate(s) of ",
                                                   tls.ca_file, ": ", SslErrors()));
  }
  if (!tls.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(raw, tls.cert_file.c_str()) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(side, ": cannot load the certificate ", tls.cert_file, ": ", SslErrors()));
    }
    if (SSL_CTX_use_PrivateKey_file(raw, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(side, ": cannot load the key ", tls.key_file, ": ", SslErrors()));
    }
    if (SSL_CTX_check_private_key(raw) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(side, ": the key ", tls.key_file,
                                                     " does not match the certificate ",
                                                     tls.cert_file, ": ", SslErrors()));
    }
  }
  if (server) {
    SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    // One connection per rank for the store's lifetime: nothing to resume.
    SSL_CTX_set_session_cache_mode(raw, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(raw, 0);
  } else {
    SSL_CTX_set_verify(raw, SSL_VERIFY_PEER, nullptr);
  }
  return ctx;
}

}  // namespace

// One connected, non-blocking socket, plain or TLS; every read, write and handshake step waits in
// poll() up to its deadline. Used by one thread at a time (the client's mutex, or the server's
// thread of the connection). Owns the descriptor and the SSL object.
class StoreConnection {
 public:
  // `tls` (may be null: plaintext) outlives the connection.
  static absl::StatusOr<std::unique_ptr<StoreConnection>> New(int fd, TlsContext* tls) {
    auto conn = std::unique_ptr<StoreConnection>(new StoreConnection(fd));
    if (tls == nullptr) return conn;
    ERR_clear_error();
    conn->ssl_ = SSL_new(tls->get());
    BIO* bio = SocketBioMethod() != nullptr ? BIO_new(SocketBioMethod()) : nullptr;
    if (conn->ssl_ == nullptr || bio == nullptr) {
      if (bio != nullptr) BIO_free(bio);
      return absl::InternalError(absl::StrCat("cannot set up TLS: ", SslErrors()));
    }
    BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
    SSL_set_bio(conn->ssl_, bio, bio);  // The SSL object owns the BIO now.
    return conn;
  }

  ~StoreConnection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    ::close(fd_);
  }
  StoreConnection(const StoreConnection&) = delete;
  StoreConnection& operator=(const StoreConnection&) = delete;

  int fd() const { return fd_; }

  // The TLS handshake (nothing for plaintext). Errors: DEADLINE_EXCEEDED; UNAVAILABLE when the
  // peer closes the connection; UNAUTHENTICATED (client) when the server's certificate does not
  // verify; PERMISSION_DENIED for any other refusal (no certificate, one of another CA, not TLS).
  absl::Status Handshake(bool server, absl::Time deadline) {
    if (ssl_ == nullptr) return absl::OkStatus();
    absl::StatusOr<int> done = SslStep(
        [&] { return server ? SSL_accept(ssl_) : SSL_connect(ssl_); }, deadline, "TLS handshake");
    if (!done.ok() && !server && absl::IsPermissionDenied(done.status())) {
      const long verify = SSL_get_verify_result(ssl_);
      if (verify != X509_V_OK) {
        return absl::UnauthenticatedError(
            absl::StrCat("the store's certificate does not verify against the CA: ",
                         X509_verify_cert_error_string(verify)));
      }
    }
    return done.status();
  }

  // Ends a refused connection gently: sends FIN after whatever OpenSSL queued (the alert that says
  // why), then reads and drops what the peer still sends until it closes too or `deadline` passes.
  // Closing with unread bytes would reset the connection, and the peer might then see "connection
  // reset" instead of the refusal.
  void Linger(absl::Time deadline) {
    ::shutdown(fd_, SHUT_WR);
    char sink[4096];
    for (;;) {
      const ssize_t rv = ::recv(fd_, sink, sizeof(sink), 0);
      if (rv == 0) return;
      if (rv < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return;
        absl::StatusOr<bool> ready = PollUntil(fd_, POLLIN, deadline);
        if (!ready.ok() || !*ready) return;
      }
    }
  }

  // Once the connection is admitted, a TLS failure is a broken connection (UNAVAILABLE), no longer
  // a refusal (PERMISSION_DENIED).
  void MarkAdmitted() { admitted_ = true; }

  // UNAVAILABLE when the connection breaks or the peer closes it, DEADLINE_EXCEEDED when the
  // deadline passes first.
  absl::Status Write(const char* data, size_t n, absl::Time deadline) {
    while (n > 0) {
      size_t done = 0;
      if (ssl_ != nullptr) {
        absl::StatusOr<int> rv = SslStep(
            [&] { return SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(n, INT_MAX))); },
            deadline, "TLS write");
        if (!rv.ok()) return rv.status();
        done = static_cast<size_t>(*rv);
      } else {
        const ssize_t rv = ::send(fd_, data, n, MSG_NOSIGNAL);
        if (rv < 0) {
          if (errno == EINTR) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) {
            return absl::UnavailableError(absl::StrCat("send: ", ErrnoText(errno)));
          }
          absl::StatusOr<bool> ready = PollUntil(fd_, POLLOUT, deadline);
          if (!ready.ok()) return ready.status();
          if (!*ready) return absl::DeadlineExceededError("send timed out");
          continue;
        }
        done = static_cast<size_t>(rv);
      }
      data += done;
      n -= done;
    }
    return absl::OkStatus();
  }

  absl::Status Read(char* data, size_t n, absl::Time deadline) {
    while (n > 0) {
      size_t done = 0;
      if (ssl_ != nullptr) {
        absl::StatusOr<int> rv = SslStep(
            [&] { return SSL_read(ssl_, data, static_cast<int>(std::min<size_t>(n, INT_MAX))); },
            deadline, "TLS read");
        if (!rv.ok()) return rv.status();
        done = static_cast<size_t>(*rv);
      } else {
        const ssize_t rv = ::recv(fd_, data, n, 0);
        if (rv == 0) return absl::UnavailableError("connection closed by peer");
        if (rv < 0) {
          if (errno == EINTR) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) {
            return absl::UnavailableError(absl::StrCat("recv: ", ErrnoText(errno)));
          }
          absl::StatusOr<bool> ready = PollUntil(fd_, POLLIN, deadline);
          if (!ready.ok()) return ready.status();
          if (!*ready) return absl::DeadlineExceededError("receive timed out");
          continue;
        }
        done = static_cast<size_t>(rv);
      }
      data += done;
      n -= done;
    }
    return absl::OkStatus();
  }

 private:
  explicit StoreConnection(int fd) : fd_(fd) {}

  // Runs the SSL call `op` until it makes progress (returns > 0), waiting in poll() for what it
  // wants to read or write, up to `deadline`.
  absl::StatusOr<int> SslStep(absl::FunctionRef<int()> op, absl::Time deadline, const char* what) {
    for (;;) {
      ERR_clear_error();
      errno = 0;
      const int rv = op();
      if (rv > 0) return rv;
      const int err = SSL_get_error(ssl_, rv);
      const int saved_errno = errno;
      short events = 0;
      if (err == SSL_ERROR_WANT_READ) {
        events = POLLIN;
      } else if (err == SSL_ERROR_WANT_WRITE) {
        events = POLLOUT;
      } else if (err == SSL_ERROR_ZERO_RETURN) {
        return absl::UnavailableError(absl::StrCat(what, ": connection closed by peer"));
      } else if (err == SSL_ERROR_SYSCALL) {
        ERR_clear_error();
        return absl::UnavailableError(absl::StrCat(
            what, ": ",
            saved_errno == 0 ? std::string("connection closed by peer") : ErrnoText(saved_errno)));
      } else {
        const std::string reason = SslErrors();
        if (admitted_) return absl::UnavailableError(absl::StrCat(what, ": ", reason));
        return absl::PermissionDeniedError(absl::StrCat(what, " refused: ", reason));
      }
      absl::StatusOr<bool> ready = PollUntil(fd_, events, deadline);
      if (!ready.ok()) return ready.status();
      if (!*ready) return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
    }
  }

  const int fd_;
  SSL* ssl_ = nullptr;
  bool admitted_ = false;
};

namespace {

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
  TcpStoreServerOptions options;
  options.host = host;
  options.port = port;
  return Start(std::move(options));
}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    TcpStoreServerOptions options) {
  if (options.max_admitting < 1 || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store connection bounds must be >= 1, got max_admitting ",
                     options.max_admitting, " and max_connections ", options.max_connections));
  }
  const std::string& host = options.host;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
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
        absl::StrCat("cannot listen on ", host, ":", options.port, ": ", ErrnoText(err)));
  }
  absl::StatusOr<std::shared_ptr<TlsContext>> tls = NewTlsContext(options.tls, /*server=*/true);
  if (!tls.ok()) {
    ::close(fd);
    return tls.status();
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int bound_port = ntohs(addr.sin_port);
  auto server = std::unique_ptr<TcpStoreServer>(
      new TcpStoreServer(std::move(options), *std::move(tls), bound_port, fd));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options, std::shared_ptr<TlsContext> tls,
                               int port, int listen_fd)
    : options_(std::move(options)), tls_(std::move(tls)), port_(port), listen_fd_(listen_fd) {}

TcpStoreServer::~TcpStoreServer() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // shutdown() wakes the threads blocked in accept() and in poll() on these sockets.
    ::shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
    changed_.SignalAll();
  }
  accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, thread] : client_threads_) threads.push_back(std::move(thread));
    client_threads_.clear();
  }
  for (std::thread& t : threads) t.join();
  ::close(listen_fd_);
}

std::string TcpStoreServer::address() const { return absl::StrCat(options_.host, ":", port_); }

void TcpStoreServer::AcceptLoop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    // Threads of ended connections: joined here, so that their stacks do not pile up.
    for (const std::thread::id& id : finished_) {
      auto it = client_threads_.find(id);
      if (it == client_threads_.end()) continue;
      it->second.join();  // It has left Serve (it marked itself under mu_ as its last act).
      client_threads_.erase(it);
    }
    finished_.clear();
    if (admitting_ >= options_.max_admitting ||
        static_cast<int>(client_fds_.size()) >= options_.max_connections) {
      ++refused_;
      ::close(fd);
      continue;
    }
    int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    client_fds_.push_back(fd);
    ++admitting_;
    std::thread thread([this, fd] { Serve(fd); });
    const std::thread::id id = thread.get_id();
    client_threads_.emplace(id, std::move(thread));
  }
}

int64_t TcpStoreServer::refused_connections() {
  absl::MutexLock lock(&mu_);
  return refused_;
}

bool TcpStoreServer::Admit(StoreConnection* conn) {
  const absl::Time deadline = absl::Now() + options_.admission_timeout;
  // A refused handshake (no certificate, one of another CA, not TLS) or one that stalls ends here.
  if (!conn->Handshake(/*server=*/true, deadline).ok()) return false;
  if (!options_.secret.empty()) {
    absl::StatusOr<StoreRequest> hello =
        ReadStoreRequest([&](char* data, size_t n) { return conn->Read(data, n, deadline).ok(); });
    if (!hello.ok()) return false;  // Closed, stalled past the deadline, or out of step.
    bool admitted = false;
    const std::string reply = AdmitStoreConnection(*hello, options_.secret, &admitted);
    const absl::Status written =
        conn->Write(reply.data(), reply.size(), absl::Now() + options_.reply_timeout);
    if (!admitted || !written.ok()) return false;
  }
  conn->MarkAdmitted();
  return true;
}

void TcpStoreServer::Serve(int fd) {
  absl::StatusOr<std::unique_ptr<StoreConnection>> made = StoreConnection::New(fd, tls_.get());
  std::unique_ptr<StoreConnection> conn;
  bool open = false;
  if (made.ok()) {
    conn = *std::move(made);
    open = Admit(conn.get());
  }
  {
    absl::MutexLock lock(&mu_);
    --admitting_;  // A refused connection lingers below, counted in max_connections only.
  }
  if (conn != nullptr && !open) conn->Linger(absl::Now() + kLinger);
  while (open) {
    absl::StatusOr<StoreRequest> request = ReadStoreRequest(
        [&](char* data, size_t n) { return conn->Read(data, n, kNoDeadline).ok(); });
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
    open = conn->Write(reply.data(), reply.size(), absl::Now() + options_.reply_timeout).ok();
  }
  absl::MutexLock lock(&mu_);
  // Forgotten before it is closed, so that the destructor never shuts down a reused descriptor.
  client_fds_.erase(std::remove(client_fds_.begin(), client_fds_.end(), fd), client_fds_.end());
  if (conn != nullptr) {
    conn.reset();
  } else {
    ::close(fd);
  }
  finished_.push_back(std::this_thread::get_id());
}

// ---------------------------------------------------------------------------------------------------
// Client.

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& address,
                                                            absl::Duration connect_timeout,
                                                            absl::Duration request_timeout) {
  TcpStoreOptions options;
  options.connect_timeout = connect_timeout;
  options.request_timeout = request_timeout;
  return Connect(address, std::move(options));
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& address,
                                                            TcpStoreOptions options) {
  absl::StatusOr<std::pair<std::string, int>> hp = SplitAddress(address);
  if (!hp.ok()) return hp.status();
  absl::StatusOr<std::shared_ptr<TlsContext>> tls = NewTlsContext(options.tls, /*server=*/false);
  if (!tls.ok()) return tls.status();
  const absl::Duration connect_timeout = options.connect_timeout;
  auto store = std::unique_ptr<TcpStore>(
      new TcpStore(address, hp->first, hp->second, std::move(options), *std::move(tls)));
  absl::MutexLock lock(&store->mu_);
  if (absl::Status s = store->EnsureConnectedLocked(absl::Now() + connect_timeout); !s.ok()) {
    return s;
  }
  return store;
}

TcpStore::TcpStore(std::string address, std::string host, int port, TcpStoreOptions options,
                   std::shared_ptr<TlsContext> tls)
    : address_(std::move(address)),
      host_(std::move(host)),
      port_(port),
      options_(std::move(options)),
      tls_(std::move(tls)) {}

TcpStore::~TcpStore() {
  absl::MutexLock lock(&mu_);
  conn_.reset();
}

absl::Status TcpStore::EnsureConnectedLocked(absl::Time deadline) {
  if (conn_ != nullptr) return absl::OkStatus();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  if (::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store host \"", host_, "\" is not a numeric IPv4 address"));
  }
  std::string last_error = "no attempt";
  int fd = -1;
  do {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    last_error = ErrnoText(errno);
    ::close(fd);
    fd = -1;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to store at ", address_, ": ", last_error));
  }
  int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  SetNonBlocking(fd);
  absl::StatusOr<std::unique_ptr<StoreConnection>> made = StoreConnection::New(fd, tls_.get());
  if (!made.ok()) {
    ::close(fd);
    return made.status();
  }
  std::unique_ptr<StoreConnection> conn = *std::move(made);

  // The TLS handshake and the hello, answered within the request timeout; a refusal is final (no
  // retry).
  const absl::Time hello_deadline = absl::Now() + options_.request_timeout;
  if (absl::Status s = conn->Handshake(/*server=*/false, hello_deadline); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("the rendezvous store ", address_, ": ", s.message()));
  }
  const std::string frame = EncodeStoreRequest(StoreRequest{kStoreHello, "", options_.secret, 0});
  uint8_t code = 0;
  uint32_t len = 0;
  std::string payload;
  absl::Status s = conn->Write(frame.data(), frame.size(), hello_deadline);
  if (s.ok()) s = conn->Read(reinterpret_cast<char*>(&code), 1, hello_deadline);
  if (s.ok()) s = conn->Read(reinterpret_cast<char*>(&len), 4, hello_deadline);
  if (s.ok() && len > kMaxStoreKeyBytes) {
    s = absl::UnavailableError(tls_ == nullptr
                                   ? "the answer is not a store frame (does the store require TLS?)"
                                   : "the answer is not a store frame");
  }
  if (s.ok()) {
    payload.resize(len);
    s = conn->Read(payload.data(), len, hello_deadline);
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the rendezvous store ", address_,
                                               ": no answer to the hello: ", s.message()));
  }
  if (code == kStoreDenied) {
    return absl::PermissionDeniedError(
        absl::StrCat("the rendezvous store ", address_,
                     " refused this rank: wrong or missing ring secret (", payload, ")"));
  }
  if (code != kStoreOk) {
    return absl::UnavailableError(
        absl::StrCat("store ", address_, ": unexpected answer to the hello: ", payload));
  }
  conn->MarkAdmitted();
  conn_ = std::move(conn);
  return absl::OkStatus();
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
  const absl::Time deadline = absl::Now() + wait + options_.request_timeout;
  absl::Status s = EnsureConnectedLocked(absl::Now() + options_.request_timeout);
  // Refusals and bad TLS files are final: the caller sees them as they are.
  if (absl::IsPermissionDenied(s) || absl::IsUnauthenticated(s) || absl::IsInvalidArgument(s)) {
    return s;
  }
  if (s.ok()) s = conn_->Write(frame.data(), frame.size(), deadline);
  uint8_t code = 0;
  uint32_t len = 0;
  std::string payload;
  if (s.ok()) s = conn_->Read(reinterpret_cast<char*>(&code), 1, deadline);
  if (s.ok()) s = conn_->Read(reinterpret_cast<char*>(&len), 4, deadline);
  if (s.ok() && len > kMaxStoreValueBytes) s = absl::UnavailableError("malformed reply");
  if (s.ok()) {
    payload.resize(len);
    s = conn_->Read(payload.data(), len, deadline);
  }
  if (!s.ok()) {
    // The stream is out of step after a partial exchange: start over on the next request.
    conn_.reset();
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
