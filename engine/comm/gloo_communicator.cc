#include "engine/comm/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace dattn {
namespace comm {
namespace {

// Gloo slots: the channel in the top byte (user point-to-point vs. the collectives built here), a
// per-direction sequence number below. Both ends count the same ops, so the numbers agree.
constexpr int kChannelP2P = 0;
constexpr int kChannelCollective = 1;
constexpr int kChannels = 2;
uint64_t Slot(int channel, uint64_t seq) {
  return (static_cast<uint64_t>(channel + 1) << 56) | (seq & ((uint64_t{1} << 56) - 1));
}

// The longest wait handed to Gloo or the steady clock: a year stands for "no timeout" (an infinite
// absl::Duration would overflow the clocks' time points, so that every wait timed out at once).
constexpr absl::Duration kLongestWait = absl::Hours(24 * 365);

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(
      std::max<int64_t>(0, absl::ToInt64Milliseconds(std::min(d, kLongestWait))));
}

// gloo::rendezvous::Store over our Store. Gloo signals errors by exception only; the adapter keeps
// the real Status so that the caller can return it with its code.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(comm::Store* store, std::string prefix, absl::Duration timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(Key(key), std::string(data.begin(), data.end())));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_->Get(Key(key), timeout_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { WaitFor(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    WaitFor(keys, std::min(timeout_, absl::Milliseconds(timeout.count())));
  }

  const absl::Status& error() const { return error_; }

 private:
  std::string Key(const std::string& key) const { return absl::StrCat(prefix_, "/", key); }

  void WaitFor(const std::vector<std::string>& keys, absl::Duration timeout) {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(Key(k));
    Check(store_->Wait(full, timeout));
  }

  void Check(const absl::Status& s) {
    if (s.ok()) return;
    if (error_.ok()) error_ = s;
    throw ::gloo::IoException(std::string(s.message()));
  }

  comm::Store* const store_;
  const std::string prefix_;
  const absl::Duration timeout_;
  absl::Status error_;
};

// State shared between the communicator and its Work objects.
struct GlooState {
  GlooState(std::shared_ptr<gloo::rendezvous::Context> ctx, int r, int n, absl::Duration t)
      : context(std::move(ctx)), rank(r), size(n), timeout(t) {
    absl::MutexLock lock(&mu);
    stats.p2p_bytes_sent_to.assign(n, 0);
    stats.p2p_bytes_received_from.assign(n, 0);
    for (int c = 0; c < kChannels; ++c) {
      send_seq[c].assign(n, 0);
      recv_seq[c].assign(n, 0);
    }
  }

  // Breaks the communicator (the first error sticks), interrupts every wait and closes every
  // connection, so that no late message lands in a buffer its owner has reclaimed.
  void Break(const absl::Status& why) {
    bool close = false;
    {
      absl::MutexLock lock(&mu);
      if (error.ok()) error = why;
      for (gloo::transport::UnboundBuffer* buf : inflight) {
        buf->abortWaitRecv();
        buf->abortWaitSend();
      }
      close = !closed;
      closed = true;
    }
    if (close) {
      try {
        context->closeConnections();
      } catch (const std::exception&) {
        // Already closing; nothing else to release.
      }
    }
  }

  absl::Status Health() const {
    absl::MutexLock lock(&mu);
    return error;
  }

  const std::shared_ptr<gloo::rendezvous::Context> context;
  const int rank;
  const int size;
  const absl::Duration timeout;

  mutable absl::Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
  std::set<gloo::transport::UnboundBuffer*> inflight ABSL_GUARDED_BY(mu);
  CommStats stats ABSL_GUARDED_BY(mu);
  // Only the driving thread touches these.
  std::vector<uint64_t> send_seq[kChannels];
  std::vector<uint64_t> recv_seq[kChannels];
};

std::string Describe(const P2POp& op) {
  return op.kind == P2POp::Kind::kSend
             ? absl::StrCat("send of ", op.bytes(), " bytes to rank ", op.peer)
             : absl::StrCat("recv of ", op.bytes(), " bytes from rank ", op.peer);
}

class GlooWork final : public Work {
 public:
  struct Item {
    P2POp op;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };

  GlooWork(std::shared_ptr<GlooState> state, std::vector<Item> items)
      : state_(std::move(state)), items_(std::move(items)) {}

  ~GlooWork() override {
    if (!waited_) {
      state_->Break(absl::AbortedError(absl::StrCat(
          "gloo rank ", state_->rank, ": a group of point-to-point ops was abandoned unwaited")));
    }
    Unregister();
  }

  // Hands every op to Gloo; on failure breaks the communicator and returns its error.
  absl::Status Post(int channel) {
    for (Item& item : items_) {
      const bool send = item.op.kind == P2POp::Kind::kSend;
      uint64_t& seq = (send ? state_->send_seq : state_->recv_seq)[channel][item.op.peer];
      try {
        if (send) {
          item.buffer->send(item.op.peer, Slot(channel, seq));
        } else {
          item.buffer->recv(item.op.peer, Slot(channel, seq));
        }
        ++seq;
      } catch (const std::exception& e) {
        state_->Break(absl::UnavailableError(absl::StrCat(
            "gloo rank ", state_->rank, ": posting ", Describe(item.op), " failed: ", e.what())));
        return state_->Health();
      }
    }
    return absl::OkStatus();
  }

  absl::Status Wait(Stream consumer) override {
    if (waited_) return result_;
    waited_ = true;
    if (consumer.handle != nullptr) {
      result_ = absl::InvalidArgumentError("gloo communicator: Wait takes the host stream only");
      state_->Break(result_);
      return result_;
    }
    result_ = WaitAll();
    Unregister();
    return result_;
  }

 private:
  absl::Status WaitAll() {
    // On Gloo's clock (steady), and Gloo's waits rounded up to whole milliseconds, so that a
    // timeout Gloo reports is never before our deadline: with the remaining time truncated, Gloo
    // gave up up to a millisecond early and the timeout came out as UNAVAILABLE (seen in 2 of 80
    // runs of SilentPeerTimesOutNamingItAndTheErrorSticks).
    using Clock = std::chrono::steady_clock;
    const Clock::time_point deadline =
        Clock::now() + absl::ToChronoNanoseconds(std::min(state_->timeout, kLongestWait));
    for (Item& item : items_) {
      const auto left =
          std::max(std::chrono::milliseconds(0),
                   std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
      bool completed = false;
      try {
        completed = item.op.kind == P2POp::Kind::kSend ? item.buffer->waitSend(left)
                                                       : item.buffer->waitRecv(left);
      } catch (const std::exception& e) {
        absl::Status s;
        if (Clock::now() >= deadline) {
          s = absl::DeadlineExceededError(
              absl::StrCat("gloo rank ", state_->rank, ": ", Describe(item.op),
                           " did not complete within ", absl::FormatDuration(state_->timeout)));
        } else {
          s = absl::UnavailableError(absl::StrCat("gloo rank ", state_->rank, ": ",
                                                  Describe(item.op), " failed: ", e.what()));
        }
        state_->Break(s);
        return state_->Health();
      }
      if (!completed) {
        // Interrupted by Abort (or by a failure seen on another thread).
        absl::Status h = state_->Health();
        return h.ok() ? absl::AbortedError("gloo wait interrupted") : h;
      }
    }
    return state_->Health();
  }

  void Unregister() {
    absl::MutexLock lock(&state_->mu);
    for (Item& item : items_) state_->inflight.erase(item.buffer.get());
  }

  std::shared_ptr<GlooState> state_;
  std::vector<Item> items_;
  bool waited_ = false;
  absl::Status result_;
};

template <typename T>
void ReduceInto(T* dst, const T* src, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
      break;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
      break;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);
      break;
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, GlooOptions options,
                   std::shared_ptr<GlooState> state)
      : store_(std::move(store)), options_(std::move(options)), state_(std::move(state)) {}

  ~GlooCommunicator() override {
    try {
      state_->context->closeConnections();
    } catch (const std::exception&) {
      // Nothing left to release.
    }
  }

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "gloo"; }
  absl::Duration timeout() const override { return state_->timeout; }

  absl::StatusOr<std::unique_ptr<Work>> StartGroup(absl::Span<const P2POp> ops,
                                                   Stream after) override {
    if (after.handle != nullptr) {
      return absl::InvalidArgumentError("gloo communicator: operations take the host stream only");
    }
    return Post(ops, kChannelP2P);
  }

  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype,
                         Stream stream) override {
    if (absl::Status s = CheckCollective(count, stream, "AllGather"); !s.ok()) return s;
    const int n = state_->size, r = state_->rank;
    const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
    char* out = static_cast<char*>(recv);
    if (bytes > 0) std::memmove(out + r * bytes, send, bytes);
    CountCall();
    // Ring: at step t pass on the chunk that originated t ranks to the left.
    for (int t = 0; t + 1 < n; ++t) {
      const int send_chunk = (r - t + n) % n, recv_chunk = (r - t - 1 + n) % n;
      const P2POp ops[] = {P2POp::Send((r + 1) % n, out + send_chunk * bytes, count, dtype),
                           P2POp::Recv((r - 1 + n) % n, out + recv_chunk * bytes, count, dtype)};
      if (absl::Status s = PostAndWait(ops); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                         Stream stream) override {
    if (absl::Status s = CheckCollective(count, stream, "AllReduce"); !s.ok()) return s;
    if (dtype == DType::kFloat32) {
      return RingAllReduce<float>(static_cast<const float*>(send), static_cast<float*>(recv), count,
                                  dtype, op);
    }
    if (dtype == DType::kFloat64) {
      return RingAllReduce<double>(static_cast<const double*>(send), static_cast<double*>(recv),
                                   count, dtype, op);
    }
    return absl::InvalidArgumentError(absl::StrCat("gloo communicator: AllReduce of ",
                                                   DTypeName(dtype),
                                                   " is not supported (fp32 and fp64 are)"));
  }

  absl::Status Barrier() override {
    if (absl::Status s = state_->Health(); !s.ok()) return s;
    CountCall();
    // Dissemination barrier: after round k every rank has heard, directly or not, from 2^(k+1)
    // ranks; ceil(log2 size) rounds.
    const int n = state_->size, r = state_->rank;
    float token_out = 0, token_in = 0;
    for (int d = 1; d < n; d *= 2) {
      const P2POp ops[] = {P2POp::Send((r + d) % n, &token_out, 1, DType::kFloat32),
                           P2POp::Recv((r - d + n) % n, &token_in, 1, DType::kFloat32)};
      if (absl::Status s = PostAndWait(ops); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Synchronize(Stream stream) override {
    if (stream.handle != nullptr) {
      return absl::InvalidArgumentError(
          "gloo communicator: Synchronize takes the host stream only");
    }
    return state_->Health();
  }

  void Abort(const std::string& reason) override {
    state_->Break(absl::AbortedError(
        absl::StrCat("gloo rank ", state_->rank, ": communicator aborted: ", reason)));
  }

  absl::Status health() const override { return state_->Health(); }

  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(absl::Span<const int> exclude) override {
    absl::StatusOr<int> new_rank = ShrunkRank(exclude, state_->rank, state_->size);
    if (!new_rank.ok()) return new_rank.status();
    std::vector<int> sorted(exclude.begin(), exclude.end());
    std::sort(sorted.begin(), sorted.end());
    GlooOptions options = options_;
    options.prefix = absl::StrCat(options_.prefix, "/shrink[", absl::StrJoin(sorted, ","), "]");
    return CreateGlooCommunicator(store_, *new_rank, state_->size - static_cast<int>(sorted.size()),
                                  options);
  }

  CommStats stats() const override {
    absl::MutexLock lock(&state_->mu);
    return state_->stats;
  }

 private:
  absl::Status CheckCollective(int64_t count, Stream stream, const char* what) {
    if (stream.handle != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("gloo communicator: ", what, " takes the host stream only"));
    }
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gloo communicator: ", what, " count ", count, " is negative"));
    }
    return state_->Health();
  }

  void CountCall() {
    absl::MutexLock lock(&state_->mu);
    ++state_->stats.collective_calls;
  }

  absl::Status PostAndWait(absl::Span<const P2POp> ops) {
    absl::StatusOr<std::unique_ptr<Work>> work = Post(ops, kChannelCollective);
    if (!work.ok()) return work.status();
    return (*work)->Wait(Stream{});
  }

  template <typename T>
  absl::Status RingAllReduce(const T* send, T* recv, int64_t count, DType dtype, ReduceOp op) {
    const int n = state_->size, r = state_->rank;
    if (send != recv && count > 0) std::memmove(recv, send, count * sizeof(T));
    CountCall();
    if (n == 1 || count == 0) return absl::OkStatus();
    auto begin = [&](int c) { return count * c / n; };
    auto length = [&](int c) { return begin(c + 1) - begin(c); };
    std::vector<T> incoming(static_cast<size_t>(length(n - 1) + 1));
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    // Reduce-scatter: after n-1 steps chunk (r+1) mod n holds the full reduction on rank r.
    for (int t = 0; t + 1 < n; ++t) {
      const int sc = (r - t + n) % n, rc = (r - t - 1 + n) % n;
      const P2POp ops[] = {P2POp::Send(right, recv + begin(sc), length(sc), dtype),
                           P2POp::Recv(left, incoming.data(), length(rc), dtype)};
      if (absl::Status s = PostAndWait(ops); !s.ok()) return s;
      ReduceInto(recv + begin(rc), incoming.data(), length(rc), op);
    }
    // All-gather of the reduced chunks: each is computed once, so every rank ends bit-identical.
    for (int t = 0; t + 1 < n; ++t) {
      const int sc = (r + 1 - t + n) % n, rc = (r - t + n) % n;
      const P2POp ops[] = {P2POp::Send(right, recv + begin(sc), length(sc), dtype),
                           P2POp::Recv(left, recv + begin(rc), length(rc), dtype)};
      if (absl::Status s = PostAndWait(ops); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Work>> Post(absl::Span<const P2POp> ops, int channel) {
    if (absl::Status s = ValidateP2POps(ops, state_->rank, state_->size); !s.ok()) return s;
    std::vector<GlooWork::Item> items;
    items.reserve(ops.size());
    {
      absl::MutexLock lock(&state_->mu);
      if (!state_->error.ok()) return state_->error;
      for (const P2POp& op : ops) {
        if (op.count == 0) continue;  // Nothing moves; both ends skip it alike.
        GlooWork::Item item{op, nullptr};
        try {
          item.buffer =
              state_->context->createUnboundBuffer(op.data, static_cast<size_t>(op.bytes()));
        } catch (const std::exception& e) {
          for (GlooWork::Item& it : items) state_->inflight.erase(it.buffer.get());
          return absl::InternalError(absl::StrCat("gloo rank ", state_->rank, ": buffer for ",
                                                  Describe(op), ": ", e.what()));
        }
        state_->inflight.insert(item.buffer.get());
        const bool send = op.kind == P2POp::Kind::kSend;
        CommStats& st = state_->stats;
        if (channel == kChannelP2P) {
          ++st.p2p_ops;
          (send ? st.p2p_bytes_sent : st.p2p_bytes_received) += op.bytes();
          (send ? st.p2p_bytes_sent_to : st.p2p_bytes_received_from)[op.peer] += op.bytes();
        } else {
          (send ? st.collective_bytes_sent : st.collective_bytes_received) += op.bytes();
        }
        items.push_back(std::move(item));
      }
    }
    auto work = std::make_unique<GlooWork>(state_, std::move(items));
    if (absl::Status s = work->Post(channel); !s.ok()) {
      // The ops already posted die with the (now broken) communicator.
      (void)work->Wait(Stream{});
      return s;
    }
    return std::unique_ptr<Work>(std::move(work));
  }

  const std::shared_ptr<Store> store_;
  const GlooOptions options_;
  const std::shared_ptr<GlooState> state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(std::shared_ptr<Store> store,
                                                                     int rank, int size,
                                                                     const GlooOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("gloo communicator: null store");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo communicator: rank ", rank, " is outside [0, ", size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo communicator: timeout ", absl::FormatDuration(options.timeout), " is not positive"));
  }
  {
    // A write to a dead peer's socket must be an error, not a fatal signal.
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  }
  GlooStoreAdapter adapter(store.get(), options.prefix, options.timeout);
  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(ToChrono(options.timeout));
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    const std::string where = absl::StrCat("gloo rendezvous of rank ", rank, " of ", size,
                                           " (prefix \"", options.prefix, "\")");
    if (!adapter.error().ok()) {
      return absl::Status(adapter.error().code(),
                          absl::StrCat(where, ": ", adapter.error().message()));
    }
    return absl::UnavailableError(absl::StrCat(where, " failed: ", e.what()));
  }
  auto state = std::make_shared<GlooState>(std::move(context), rank, size, options.timeout);
  return std::unique_ptr<Communicator>(
      std::make_unique<GlooCommunicator>(std::move(store), options, std::move(state)));
}

}  // namespace comm
}  // namespace dattn
