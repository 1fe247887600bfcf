// A Store over TCP: one server process (or thread) holds the map, every rank is a client.
//
// The protocol is private to this file pair (length-prefixed binary frames on one connection per
// client); it is meant for tests and for single-host jobs, not for the open network (no
// authentication). The coordinator offers its own Store in the service.
//
// Server: binds (by default) 127.0.0.1 on an ephemeral port, serves every connection on a thread of
// its own, and keeps the map in memory. Waits happen on the server, so a Get costs one round trip
// however long it waits. Destroying the server closes every connection: clients blocked in a wait
// get UNAVAILABLE at once, never a hang.
//
// Client: one connection, requests serialised by a mutex (thread-safe). Every request has a
// deadline: a dead server turns into UNAVAILABLE or DEADLINE_EXCEEDED, never a hang. A broken
// connection is re-established on the next request.
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

class TcpStoreServer {
 public:
  // Starts serving on `host`:`port` (port 0: an ephemeral port, see port()). `host` is a numeric
  // IPv4 address. UNAVAILABLE naming the address if the socket cannot be bound.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const std::string& host = "127.0.0.1", int port = 0);

  // Stops accepting, closes every client connection and joins every thread.
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // "host:port", what clients pass to TcpStore::Connect.
  std::string address() const;

 private:
  TcpStoreServer(std::string host, int port, int listen_fd);
  void AcceptLoop();
  void Serve(int fd);

  const std::string host_;
  const int port_;
  const int listen_fd_;

  absl::Mutex mu_;
  absl::CondVar changed_;  // Signalled on every Set/Add and on shutdown.
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  std::vector<int> client_fds_ ABSL_GUARDED_BY(mu_);  // Open client connections.
  std::vector<std::thread> client_threads_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread accept_thread_;  // Set once by Start.
};

class TcpStore final : public Store {
 public:
  // Connects to "host:port", retrying until `connect_timeout` passes (the server may start a moment
  // after the clients). `request_timeout` bounds every request that does not wait by itself (Set,
  // Add) and is the margin added to a wait's own timeout.
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
  TcpStore(std::string address, std::string host, int port, absl::Duration request_timeout);
  absl::Status EnsureConnectedLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one request and reads its reply; closes the connection on any transport error.
  absl::StatusOr<std::string> RoundTrip(uint8_t op, const std::string& key,
                                        const std::string& value, int64_t arg, absl::Duration wait);

  const std::string address_;
  const std::string host_;
  const int port_;
  const absl::Duration request_timeout_;

  absl::Mutex mu_;  // Serialises requests on the one connection.
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_TCP_STORE_H_
