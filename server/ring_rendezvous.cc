#include "server/ring_rendezvous.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "api/rendezvous.h"

namespace dattn {
namespace server {
namespace {

constexpr size_t kSecretBytes = 32;

// kSecretBytes from the kernel's CSPRNG (getrandom(2), which blocks only before the pool is
// initialised at boot).
absl::StatusOr<std::string> NewSecret() {
  std::string secret(kSecretBytes, '\0');
  size_t have = 0;
  while (have < secret.size()) {
    const ssize_t n = ::getrandom(secret.data() + have, secret.size() - have, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("cannot draw a ring secret: getrandom: ", std::strerror(errno)));
    }
    have += static_cast<size_t>(n);
  }
  return secret;
}

}  // namespace

absl::StatusOr<const Ring*> RingRendezvous::Start(const std::string& job_id, int attempt,
                                                  const std::string& backend, int size) {
  End(job_id, "");
  absl::StatusOr<std::string> secret = NewSecret();
  if (!secret.ok()) return secret.status();
  comm::TcpStoreServerOptions store_options;
  store_options.host = options_.host;
  store_options.port = 0;
  store_options.secret = *secret;
  store_options.tls = options_.tls;
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> store =
      comm::TcpStoreServer::Start(std::move(store_options));
  if (!store.ok()) return store.status();
  auto ring = std::make_unique<Ring>();
  ring->secret = *std::move(secret);
  ring->id = absl::StrCat(job_id, "/", attempt);
  ring->backend = backend;
  ring->size = size;
  const std::string& host = options_.advertise.empty() ? options_.host : options_.advertise;
  ring->address = absl::StrCat(host, ":", (*store)->port());
  ring->store = *std::move(store);
  const Ring* raw = ring.get();
  rings_[job_id] = std::move(ring);
  return raw;
}

const Ring* RingRendezvous::Find(const std::string& job_id) const {
  auto it = rings_.find(job_id);
  return it == rings_.end() ? nullptr : it->second.get();
}

void RingRendezvous::MarkFormed(const std::string& job_id, int rank, double seconds) {
  auto it = rings_.find(job_id);
  if (it == rings_.end()) return;
  Ring& ring = *it->second;
  if (!ring.formed.insert(rank).second) return;
  ring.formation_seconds = std::max(ring.formation_seconds, seconds);
  if (ring.is_formed() && !ring.counted) {
    metrics_->CountRingFormation(ring.backend, "formed", ring.formation_seconds);
    ring.counted = true;
  }
}

void RingRendezvous::End(const std::string& job_id, const std::string& unformed_outcome) {
  auto it = rings_.find(job_id);
  if (it == rings_.end()) return;
  Ring& ring = *it->second;
  if (!ring.counted && !unformed_outcome.empty()) {
    metrics_->CountRingFormation(ring.backend, unformed_outcome, -1);
    ring.counted = true;
  }
  if (ring.store != nullptr) retired_.push_back(std::move(ring.store));
  rings_.erase(it);
}

std::vector<std::unique_ptr<comm::TcpStoreServer>> RingRendezvous::TakeRetired() {
  std::vector<std::unique_ptr<comm::TcpStoreServer>> out;
  out.swap(retired_);
  return out;
}

v1::RingInfo RingRendezvous::Info(const std::string& job_id, int rank) const {
  v1::RingInfo info;
  const Ring* ring = Find(job_id);
  if (ring == nullptr) return info;
  info.set_ring_id(ring->id);
  info.set_rank(rank);
  info.set_size(ring->size);
  info.set_backend(ring->backend);
  info.set_store_address(ring->address);
  info.set_store_secret(ring->secret);
  info.set_formation_timeout_ms(absl::ToInt64Milliseconds(options_.formation_timeout));
  info.set_comm_timeout_ms(absl::ToInt64Milliseconds(options_.comm_timeout));
  return info;
}

std::optional<std::vector<int>> RingRendezvous::ProbeMissingRanks(const std::string& address,
                                                                  const std::string& secret,
                                                                  const comm::StoreTls& tls,
                                                                  const std::string& ring_id,
                                                                  int size) {
  comm::TcpStoreOptions connect;
  connect.connect_timeout = absl::Seconds(1);
  connect.request_timeout = absl::Seconds(1);
  connect.secret = secret;
  connect.tls = tls;
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> store = comm::TcpStore::Connect(address, connect);
  if (!store.ok()) return std::nullopt;
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::string> got =
        (*store)->Get(api::JoinedKey(ring_id, r), absl::ZeroDuration());
    if (got.ok()) continue;
    if (!absl::IsDeadlineExceeded(got.status())) return std::nullopt;
    missing.push_back(r);
  }
  return missing;
}

}  // namespace server
}  // namespace dattn
