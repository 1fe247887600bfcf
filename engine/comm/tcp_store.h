// A Store over TCP: one server process (or thread) holds the map, every rank is a client.
//
// The protocol is private to this file pair (length-prefixed binary frames on one connection per
// client, tcp_store_wire.h). The coordinator starts one server per ring attempt
// (server/ring_rendezvous.h); tests and single-host jobs start their own.
//
// Admission: a server started with a secret (TcpStoreServerOptions::secret, the ring attempt's 32
// random bytes) serves a connection only after its first frame, a hello, carried that secret; any
// other connection gets a DENIED answer and is closed, and the server keeps serving the others.
// Without a secret (the default) every connection is served. Without TLS the secret travels in
// plaintext: it keeps out a peer that does not know it (a stray or stale rank, a rank of another
// ring, a port scanner), not one that can read the traffic.
//
// TLS (StoreTls; empty: plaintext): mutual TLS 1.2 or later with OpenSSL. The server presents its
// certificate and requires a client certificate that verifies against the CA file (the cluster
// CA); the client verifies the server's certificate against the same CA and presents its own. The
// peer's name is not checked (neither a hostname nor a subject): the address is a numeric IP that
// the coordinator hands out, and any certificate of the cluster CA is trusted; what tells one ring
// from another is the secret, which TLS then keeps confidential. The files are read when a server
// starts or a client connects (TcpStoreServer::Start, TcpStore::Connect): a store lives for one
// ring attempt, so certificates renewed on disk are picked up by the next attempt; a client keeps
// the files' contents of its Connect for its reconnections. The handshake is part of a connection's
// admission and has the same deadline as the hello.
//
// Server: binds (by default) 127.0.0.1 on an ephemeral port, serves every connection on a thread of
// its own, and keeps the map in memory. Waits happen on the server, so a Get costs one round trip
// however long it waits. A connection's admission (its hello) has a deadline
// (admission_timeout): a peer that connects and sends nothing holds its thread no longer than that.
// A reply that the client does not read within reply_timeout ends its connection. Between requests
// a connection may stay idle for as long as the server lives. Destroying the server closes every
// connection: clients blocked in a wait get UNAVAILABLE at once, never a hang.
//
// Client: one connection, requests serialised by a mutex (thread-safe). Every connection starts
// with a hello (carrying TcpStoreOptions::secret, possibly empty) and its answer, within the
// request timeout. Every request has a deadline: a dead server turns into UNAVAILABLE or
// DEADLINE_EXCEEDED, never a hang. A broken connection is re-established (with a new hello) on the
// next request. A store that refuses the hello makes Connect, or the request that reconnected,
// fail with PERMISSION_DENIED at once (not retried: a wrong secret stays wrong).
#ifndef DATTN_ENGINE_COMM_TCP_STORE_H_
#define DATTN_ENGINE_COMM_TCP_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/comm/store.h"

namespace dattn {
namespace comm {

class StoreConnection;  // tcp_store.cc: one socket's reads and writes (plain or TLS), with
                        // deadlines.
class TlsContext;       // tcp_store.cc: the OpenSSL context built from a StoreTls.

// PEM files of the store's mutual TLS. All empty: plaintext. A server needs all three; a client
// needs ca_file, and cert_file with key_file to be admitted by a server (which requires a client
// certificate). Paths are read once, at TcpStoreServer::Start or TcpStore::Connect.
struct StoreTls {
  std::string ca_file;    // CA certificate(s) the peer's certificate must verify against.
  std::string cert_file;  // This side's certificate (chain), signed by the CA.
  std::string key_file;   // Its private key (unencrypted PEM).
  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // A numeric IPv4 address.
  int port = 0;                    // 0: an ephemeral port, see TcpStoreServer::port().
  // Bytes every connection's hello must carry; empty: none required (any peer is served).
  std::string secret;
  // Mutual TLS; empty: plaintext.
  StoreTls tls;
  // How long a new connection has to finish its TLS handshake and send its hello.
  absl::Duration admission_timeout = absl::Seconds(10);
  // How long a reply may take to be written (a client that stops reading ends its connection).
  absl::Duration reply_timeout = absl::Seconds(30);
  // Connections served at once: those still in admission (TLS handshake and hello, each up to
  // admission_timeout), and all together. Each holds a thread; a connection over either bound is
  // closed as soon as it is accepted, so a flood of connections (a port scan, a peer that never
  // says hello) cannot use up the server's threads or memory. The first bound is at least the
  // largest ring (api/limits.h: 256 ranks), so a ring forming at once is never refused.
  int max_admitting = 256;
  int max_connections = 2048;
};

class TcpStoreServer {
 public:
  // Starts serving on `host`:`port` without a secret (TcpStoreServerOptions' defaults otherwise).
  // UNAVAILABLE naming the address if the socket cannot be bound; INVALID_ARGUMENT if `host` is
  // not a numeric IPv4 address.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const std::string& host = "127.0.0.1", int port = 0);
  // Starts serving as `options` say; the same errors, and INVALID_ARGUMENT naming the file and
  // OpenSSL's reason when a TLS file cannot be read or the key does not match the certificate, or
  // for a connection bound < 1.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(TcpStoreServerOptions options);

  // Stops accepting, closes every client connection and joins every thread.
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const { return options_.host; }
  int port() const { return port_; }
  // Connections closed at once because max_admitting or max_connections was reached.
  int64_t refused_connections();
  // "host:port", what clients pass to TcpStore::Connect.
  std::string address() const;

 private:
  TcpStoreServer(TcpStoreServerOptions options, std::shared_ptr<TlsContext> tls, int port,
                 int listen_fd);
  void AcceptLoop();
  void Serve(int fd);
  // The TLS handshake, then the connection's hello and its answer, within admission_timeout; false
  // when the connection is to be closed.
  bool Admit(StoreConnection* conn);

  const TcpStoreServerOptions options_;
  const std::shared_ptr<TlsContext> tls_;  // Null: plaintext. Shared by the connection threads.
  const int port_;
  const int listen_fd_;

  absl::Mutex mu_;
  absl::CondVar changed_;  // Signalled on every Set/Add and on shutdown.
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  std::vector<int> client_fds_ ABSL_GUARDED_BY(mu_);  // Open client connections.
  int admitting_ ABSL_GUARDED_BY(mu_) = 0;            // Of those, not yet admitted.
  // One thread per open connection; a finished one is joined by the next accept (finished_).
  std::map<std::thread::id, std::thread> client_threads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> finished_ ABSL_GUARDED_BY(mu_);
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;  // Connections closed for the bounds above.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread accept_thread_;  // Set once by Start.
};

struct TcpStoreOptions {
  // How long Connect retries a refused or failed TCP connection (the server may start a moment
  // after the clients).
  absl::Duration connect_timeout = absl::Seconds(30);
  // Bounds every request that does not wait by itself (Set, Add, the hello) and is the margin added
  // to a wait's own timeout.
  absl::Duration request_timeout = absl::Seconds(30);
  // Sent in the hello of every connection: the secret of the ring attempt (RingInfo.store_secret).
  // Empty: the hello carries none, which only a server without a secret accepts.
  std::string secret;
  // Mutual TLS; empty: plaintext (which a TLS server refuses, as a TLS client a plaintext server).
  StoreTls tls;
};

class TcpStore final : public Store {
 public:
  // Connects to "host:port" and is admitted (the hello), as `options` say. INVALID_ARGUMENT for a
  // malformed address; UNAVAILABLE when no connection was made within connect_timeout or the
  // connection broke during the hello; DEADLINE_EXCEEDED when the hello got no answer within the
  // request timeout; PERMISSION_DENIED when the store refused the hello (wrong or missing secret)
  // or the TLS handshake (no client certificate, or one the store's CA did not sign);
  // UNAUTHENTICATED when the store's certificate does not verify against the CA; INVALID_ARGUMENT
  // naming the file when a TLS file cannot be read. None of these is retried.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& address,
                                                           TcpStoreOptions options);
  // Connect without a secret.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(
      const std::string& address, absl::Duration connect_timeout = absl::Seconds(30),
      absl::Duration request_timeout = absl::Seconds(30));

  ~TcpStore() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

  const std::string& address() const { return address_; }

 private:
  TcpStore(std::string address, std::string host, int port, TcpStoreOptions options,
           std::shared_ptr<TlsContext> tls);
  // Connects (retrying TCP connects until `deadline`) and sends the hello, unless connected.
  absl::Status EnsureConnectedLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one request and reads its reply; closes the connection on any transport error.
  absl::StatusOr<std::string> RoundTrip(uint8_t op, const std::string& key,
                                        const std::string& value, int64_t arg, absl::Duration wait);

  const std::string address_;
  const std::string host_;
  const int port_;
  const TcpStoreOptions options_;
  const std::shared_ptr<TlsContext> tls_;  // Null: plaintext.

  absl::Mutex mu_;  // Serialises requests on the one connection.
  std::unique_ptr<StoreConnection> conn_ ABSL_GUARDED_BY(mu_);  // Null: not connected.
};

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_TCP_STORE_H_
