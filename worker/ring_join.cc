#include "worker/ring_join.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "api/rendezvous.h"
#include "engine/comm/tcp_store.h"

namespace dattn {
namespace worker {
namespace {

// Longest a rank waits between two checks of its cancellation while peers are missing.
constexpr absl::Duration kPollSlice = absl::Milliseconds(100);

absl::Status Prefixed(const absl::Status& s, const std::string& where) {
  return absl::Status(s.code(), absl::StrCat(where, s.message()));
}

absl::Status Validate(const v1::RingInfo& ring) {
  if (ring.ring_id().empty()) return absl::InvalidArgumentError("ring_id is empty");
  if (ring.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("ring size must be >= 2, got ", ring.size()));
  }
  if (ring.rank() < 0 || ring.rank() >= ring.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", ring.rank(), " is outside [0, ", ring.size(), ")"));
  }
  if (ring.store_address().empty()) return absl::InvalidArgumentError("store_address is empty");
  if (ring.formation_timeout_ms() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("formation_timeout_ms must be > 0, got ", ring.formation_timeout_ms()));
  }
  if (ring.comm_timeout_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm_timeout_ms must be >= 0, got ", ring.comm_timeout_ms()));
  }
  return absl::OkStatus();
}

// The communicator's own rendezvous (Gloo's address exchange, NCCL's unique id) goes through the
// ring's store and can block for the whole communicator timeout when a peer dies after the arrival
// barrier. This view of the store waits in slices and gives up with CANCELLED as soon as the task
// is cancelled, so neither a CancelTask nor the worker's Stop() waits for that timeout.
class CancellableStore : public comm::Store {
 public:
  CancellableStore(std::shared_ptr<comm::Store> store, std::function<bool()> cancelled)
      : store_(std::move(store)), cancelled_(std::move(cancelled)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return store_->Set(key, value);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return store_->Add(key, delta);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      absl::StatusOr<std::string> got = store_->Get(key, std::min(kPollSlice, left));
      if (!absl::IsDeadlineExceeded(got.status()) || left <= kPollSlice) return got;
      if (Cancelled()) return Cancel(key);
    }
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      absl::Status waited = store_->Wait(keys, std::min(kPollSlice, left));
      if (!absl::IsDeadlineExceeded(waited) || left <= kPollSlice) return waited;
      if (Cancelled()) return Cancel(absl::StrJoin(keys, ", "));
    }
  }

 private:
  bool Cancelled() const { return cancelled_ && cancelled_(); }
  static absl::Status Cancel(const std::string& what) {
    return absl::CancelledError(
        absl::StrCat("cancelled while forming the communicator (waiting for ", what, ")"));
  }

  std::shared_ptr<comm::Store> store_;
  std::function<bool()> cancelled_;
};

}  // namespace

absl::StatusOr<RingMembership> JoinRing(const v1::RingInfo& ring, TaskDevice* device,
                                        const RingJoinOptions& options) {
  const std::string where =
      absl::StrCat("ring ", ring.ring_id(), " rank ", ring.rank(), " of ", ring.size(), ": ");
  if (absl::Status s = Validate(ring); !s.ok()) return Prefixed(s, where);
  const std::vector<std::string> backends = device->ring_backends();
  if (std::find(backends.begin(), backends.end(), ring.backend()) == backends.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, "this worker's ", device->caps().name, " device forms ",
        backends.empty() ? std::string("no rings") : absl::StrJoin(backends, ", ") + " rings",
        ", not \"", ring.backend(), "\""));
  }
  auto cancelled = [&] { return options.is_cancelled && options.is_cancelled(); };
  const absl::Duration formation = absl::Milliseconds(ring.formation_timeout_ms());
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + formation;

  // The store already exists (the coordinator starts it before handing out the ranks): a refused
  // connection means the attempt is over, so there is no point in retrying for long. Tries are
  // short and the cancellation is checked between them: the coordinator ends an attempt (and its
  // store) when one of its ranks is refused, then cancels the others, and a rank that went on
  // retrying for seconds would keep its worker's slot busy and make the next attempt's rank there
  // refused in turn.
  comm::TcpStoreOptions connect;
  connect.request_timeout = std::min(formation, kPollSlice * 50);
  connect.secret = ring.store_secret();
  connect.tls = options.store_tls;
  const absl::Time connect_deadline = start + std::min(formation, absl::Seconds(5));
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> connected = absl::UnavailableError("not tried");
  for (;;) {
    connect.connect_timeout =
        std::max(absl::Milliseconds(1), std::min(kPollSlice * 2, connect_deadline - absl::Now()));
    connected = comm::TcpStore::Connect(ring.store_address(), connect);
    if (connected.ok() || absl::IsPermissionDenied(connected.status()) ||
        absl::IsUnauthenticated(connected.status()) ||
        absl::IsInvalidArgument(connected.status()) || absl::Now() >= connect_deadline) {
      break;
    }
    if (cancelled()) {
      return absl::CancelledError(
          absl::StrCat(where, "cancelled while reaching the ring's rendezvous store"));
    }
  }
  if (absl::IsPermissionDenied(connected.status()) || absl::IsUnauthenticated(connected.status()) ||
      absl::IsInvalidArgument(connected.status())) {
    // The store will not have this rank, or this rank cannot trust it: retrying cannot help.
    return Prefixed(connected.status(), where);
  }
  if (!connected.ok()) {
    return absl::UnavailableError(absl::StrCat(
        where, "cannot reach the ring's rendezvous store: ", connected.status().message()));
  }
  std::shared_ptr<comm::Store> store(std::move(*connected));
  if (absl::Status s = store->Set(api::JoinedKey(ring.ring_id(), ring.rank()), options.member_name);
      !s.ok()) {
    return Prefixed(s, where);
  }

  // Wait for every peer's arrival, a slice at a time, so that a cancel is seen promptly.
  std::vector<bool> arrived(ring.size(), false);
  arrived[ring.rank()] = true;
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < ring.size(); ++r) {
      if (arrived[r]) continue;
      absl::StatusOr<std::string> got =
          store->Get(api::JoinedKey(ring.ring_id(), r), absl::ZeroDuration());
      if (got.ok()) {
        arrived[r] = true;
      } else if (absl::IsDeadlineExceeded(got.status())) {
        missing.push_back(r);
      } else {
        return absl::UnavailableError(
            absl::StrCat(where, "the rendezvous store failed: ", got.status().message()));
      }
    }
    if (missing.empty()) break;
    if (cancelled()) {
      return absl::CancelledError(absl::StrCat(where, "cancelled while waiting for its peers"));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          where, "ring formation timed out after ", absl::FormatDuration(formation), ": rank",
          missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "), " of ", ring.size(),
          " never arrived at the rendezvous store ", ring.store_address()));
    }
    // Blocks in the store until the first missing rank arrives or the slice ends.
    absl::StatusOr<std::string> waited = store->Get(api::JoinedKey(ring.ring_id(), missing.front()),
                                                    std::min(kPollSlice, deadline - now));
    if (!waited.ok() && !absl::IsDeadlineExceeded(waited.status())) {
      return absl::UnavailableError(
          absl::StrCat(where, "the rendezvous store failed: ", waited.status().message()));
    }
  }

  const absl::Duration comm_timeout = ring.comm_timeout_ms() > 0
                                          ? absl::Milliseconds(ring.comm_timeout_ms())
                                          : options.default_comm_timeout;
  auto comm_store = std::make_shared<CancellableStore>(store, options.is_cancelled);
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      device->NewCommunicator(ring.backend(), comm_store, ring.rank(), ring.size(),
                              absl::StrCat(ring.ring_id(), "/comm"), comm_timeout);
  if (!comm.ok()) {
    if (cancelled()) {
      return absl::CancelledError(absl::StrCat(
          where, "cancelled while forming the communicator: ", comm.status().message()));
    }
    return Prefixed(comm.status(), where);
  }
  RingMembership membership;
  membership.store = std::move(store);
  membership.comm = std::move(*comm);
  membership.formation_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return membership;
}

}  // namespace worker
}  // namespace dattn
