// The Gloo communicator against communicator.h's contract: ranks as threads of this process for the
// functional checks, ranks as processes (one SIGKILLed mid-exchange) for the dead-peer check.
#include "engine/comm/gloo_communicator.h"

#include <signal.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/comm/multiprocess.h"
#include "engine/comm/tcp_store.h"
#include "gtest/gtest.h"

namespace dattn {
namespace comm {
namespace {

using RankFn = std::function<absl::Status(int rank, Communicator& comm)>;

// Runs fn on `size` threads, each with its own store client and communicator, once every rank has
// joined; returns each rank's status (a failure to join the ring is returned as that rank's
// status).
std::vector<absl::Status> RunRanks(int size, const RankFn& fn,
                                   absl::Duration timeout = absl::Seconds(10),
                                   const std::string& prefix = "test") {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start();
  EXPECT_TRUE(server.ok()) << server.status();
  std::vector<absl::Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect((*server)->address());
      if (!store.ok()) {
        results[r] = store.status();
        return;
      }
      GlooOptions options;
      options.timeout = timeout;
      options.prefix = prefix;
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          CreateGlooCommunicator(std::shared_ptr<Store>(std::move(*store)), r, size, options);
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      // A rank's rendezvous can return while a peer's is still connecting to it; a test body that
      // aborts or leaves at once would then reset that peer's connection and fail its rendezvous
      // (seen: 1 run in 40, "connect ...: Connection reset by peer" in AbandonedWork...). The
      // barrier starts every body on a fully connected ring.
      if (absl::Status ready = (*comm)->Barrier(); !ready.ok()) {
        results[r] = ready;
        return;
      }
      results[r] = fn(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

void ExpectAllOk(const std::vector<absl::Status>& results) {
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

absl::Status Exchange(Communicator& comm, std::vector<P2POp> ops) {
  absl::StatusOr<std::unique_ptr<Work>> work = comm.StartGroup(ops, Stream{});
  if (!work.ok()) return work.status();
  return (*work)->Wait(Stream{});
}

absl::Status Expect(bool cond, const std::string& what) {
  return cond ? absl::OkStatus() : absl::InternalError(what);
}

TEST(GlooCommunicatorTest, RingExchangeMovesDataAndCountsBytes) {
  constexpr int kSize = 3;
  constexpr int64_t kCount = 1000;
  ExpectAllOk(RunRanks(kSize, [](int r, Communicator& comm) -> absl::Status {
    if (comm.rank() != r || comm.size() != kSize || comm.device() != Device::kCpu) {
      return absl::InternalError("wrong identity");
    }
    std::vector<double> out(kCount), in(kCount, -1);
    for (int64_t i = 0; i < kCount; ++i) out[i] = r * 1e6 + i;
    const int right = (r + 1) % kSize, left = (r + kSize - 1) % kSize;
    if (absl::Status s = Exchange(comm, {P2POp::Send(right, out.data(), kCount, DType::kFloat64),
                                         P2POp::Recv(left, in.data(), kCount, DType::kFloat64)});
        !s.ok()) {
      return s;
    }
    for (int64_t i = 0; i < kCount; ++i) {
      if (in[i] != left * 1e6 + i) return absl::InternalError(absl::StrCat("bad element ", i));
    }
    const CommStats st = comm.stats();
    const int64_t bytes = kCount * 8;
    if (st.p2p_bytes_sent != bytes || st.p2p_bytes_received != bytes || st.p2p_ops != 2 ||
        st.p2p_bytes_sent_to[right] != bytes || st.p2p_bytes_received_from[left] != bytes ||
        st.p2p_bytes_sent_to[left] != (kSize == 2 ? bytes : 0)) {
      return absl::InternalError("byte counters disagree with the exchange");
    }
    return comm.health();
  }));
}

TEST(GlooCommunicatorTest, OpsBetweenTwoRanksMatchInPostingOrder) {
  ExpectAllOk(RunRanks(2, [](int r, Communicator& comm) -> absl::Status {
    std::vector<float> a(16), b(16), c(3);
    if (r == 0) {
      std::fill(a.begin(), a.end(), 1.0f);
      std::fill(b.begin(), b.end(), 2.0f);
      std::fill(c.begin(), c.end(), 3.0f);
      // One group with two sends, then a second group.
      if (absl::Status s = Exchange(comm, {P2POp::Send(1, a.data(), 16, DType::kFloat32),
                                           P2POp::Send(1, b.data(), 16, DType::kFloat32)});
          !s.ok()) {
        return s;
      }
      return Exchange(comm, {P2POp::Send(1, c.data(), 3, DType::kFloat32)});
    }
    // The receiver posts all three at once, in the same order.
    if (absl::Status s = Exchange(comm, {P2POp::Recv(0, a.data(), 16, DType::kFloat32),
                                         P2POp::Recv(0, b.data(), 16, DType::kFloat32),
                                         P2POp::Recv(0, c.data(), 3, DType::kFloat32)});
        !s.ok()) {
      return s;
    }
    return Expect(a[15] == 1.0f && b[0] == 2.0f && c[2] == 3.0f, "messages matched out of order");
  }));
}

TEST(GlooCommunicatorTest, AllGatherAllReduceAndBarrier) {
  for (int size : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("size ", size));
    ExpectAllOk(RunRanks(size, [size](int r, Communicator& comm) -> absl::Status {
      std::vector<float> mine = {float(r), float(r) + 0.5f};
      std::vector<float> all(2 * size, -1.0f);
      if (absl::Status s = comm.AllGather(mine.data(), all.data(), 2, DType::kFloat32, Stream{});
          !s.ok()) {
        return s;
      }
      for (int q = 0; q < size; ++q) {
        if (all[2 * q] != q || all[2 * q + 1] != q + 0.5f) return absl::InternalError("allgather");
      }
      // 7 elements over up to 3 ranks: uneven chunks.
      std::vector<double> x(7), sum(7), mx(7);
      for (int i = 0; i < 7; ++i) x[i] = (r + 1) * 0.1 * (i + 1) + (r == 1 ? 10 : 0);
      if (absl::Status s =
              comm.AllReduce(x.data(), sum.data(), 7, DType::kFloat64, ReduceOp::kSum, Stream{});
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              comm.AllReduce(x.data(), mx.data(), 7, DType::kFloat64, ReduceOp::kMax, Stream{});
          !s.ok()) {
        return s;
      }
      for (int i = 0; i < 7; ++i) {
        double want_sum = 0, want_max = -1e300;
        for (int q = 0; q < size; ++q) {
          const double v = (q + 1) * 0.1 * (i + 1) + (q == 1 ? 10 : 0);
          want_sum += v;
          want_max = std::max(want_max, v);
        }
        if (std::fabs(sum[i] - want_sum) > 1e-12 || mx[i] != want_max) {
          return absl::InternalError(absl::StrCat("allreduce element ", i));
        }
      }
      // In place, and every rank bit-identical: gather the sums and compare bits.
      if (absl::Status s =
              comm.AllReduce(x.data(), x.data(), 7, DType::kFloat64, ReduceOp::kMin, Stream{});
          !s.ok()) {
        return s;
      }
      std::vector<double> gathered(7 * size);
      if (absl::Status s = comm.AllGather(sum.data(), gathered.data(), 7, DType::kFloat64, {});
          !s.ok()) {
        return s;
      }
      for (int q = 0; q < size; ++q) {
        if (std::memcmp(&gathered[7 * q], sum.data(), 7 * sizeof(double)) != 0) {
          return absl::InternalError("allreduce results differ between ranks");
        }
      }
      absl::Status bad =
          comm.AllReduce(x.data(), x.data(), 7, DType::kFloat16, ReduceOp::kSum, Stream{});
      if (!absl::IsInvalidArgument(bad)) return absl::InternalError("fp16 allreduce accepted");
      return comm.Barrier();
    }));
  }
}

TEST(GlooCommunicatorTest, BarrierHoldsEveryRankUntilTheLastArrives) {
  constexpr int kSize = 4;
  std::atomic<int64_t> last_arrival{0};
  ExpectAllOk(RunRanks(kSize, [&](int r, Communicator& comm) -> absl::Status {
    absl::SleepFor(absl::Milliseconds(60 * r));
    last_arrival = std::max<int64_t>(last_arrival, absl::ToUnixMicros(absl::Now()));
    if (absl::Status s = comm.Barrier(); !s.ok()) return s;
    return Expect(absl::ToUnixMicros(absl::Now()) >= last_arrival.load(),
                  absl::StrCat("rank ", r, " left the barrier early"));
  }));
}

TEST(GlooCommunicatorTest, SilentPeerTimesOutNamingItAndTheErrorSticks) {
  std::vector<absl::Status> results = RunRanks(
      2,
      [](int r, Communicator& comm) -> absl::Status {
        float x = 0;
        if (r == 1) {
          absl::SleepFor(absl::Milliseconds(1200));
          // Rank 0 gave up and closed its connections: our next op fails too.
          absl::Status s = Exchange(comm, {P2POp::Send(0, &x, 1, DType::kFloat32)});
          return Expect(!s.ok() && !comm.health().ok(), "op to a broken peer succeeded");
        }
        const absl::Time start = absl::Now();
        absl::Status s = Exchange(comm, {P2POp::Recv(1, &x, 1, DType::kFloat32)});
        const absl::Duration took = absl::Now() - start;
        if (!absl::IsDeadlineExceeded(s)) return absl::InternalError(s.ToString());
        if (s.message().find("rank 1") == std::string::npos) {
          return absl::InternalError(absl::StrCat("peer not named: ", s.message()));
        }
        if (took < absl::Milliseconds(400) || took > absl::Milliseconds(1100)) {
          return absl::InternalError(absl::StrCat("timed out after ", absl::FormatDuration(took)));
        }
        if (comm.health() != s) return absl::InternalError("error not sticky");
        absl::StatusOr<std::unique_ptr<Work>> again =
            comm.StartGroup({P2POp::Send(1, &x, 1, DType::kFloat32)}, Stream{});
        if (again.ok() || again.status() != s) return absl::InternalError("later op not refused");
        return Expect(comm.Barrier() == s, "barrier on a broken communicator");
      },
      absl::Milliseconds(500));
  ExpectAllOk(results);
}

TEST(GlooCommunicatorTest, AbortInterruptsAWaitOnAnotherThread) {
  ExpectAllOk(RunRanks(2, [](int r, Communicator& comm) -> absl::Status {
    float x = 0;
    if (r == 1) {
      absl::SleepFor(absl::Milliseconds(800));
      return absl::OkStatus();
    }
    std::thread watchdog([&] {
      absl::SleepFor(absl::Milliseconds(150));
      comm.Abort("watchdog says so");
    });
    const absl::Time start = absl::Now();
    absl::Status s = Exchange(comm, {P2POp::Recv(1, &x, 1, DType::kFloat32)});
    watchdog.join();
    if (!absl::IsAborted(s) || s.message().find("watchdog says so") == std::string::npos) {
      return absl::InternalError(s.ToString());
    }
    comm.Abort("second reason");  // Idempotent: the first reason sticks.
    if (comm.health() != s) return absl::InternalError("abort reason not sticky");
    return Expect(absl::Now() - start < absl::Seconds(2), "abort took too long");
  }));
}

TEST(GlooCommunicatorTest, BadArgumentsLeaveTheCommunicatorHealthy) {
  ExpectAllOk(RunRanks(2, [](int r, Communicator& comm) -> absl::Status {
    float x = 0;
    const std::vector<std::vector<P2POp>> bad = {
        {P2POp::Send(2, &x, 1, DType::kFloat32)},
        {P2POp::Send(r, &x, 1, DType::kFloat32)},
        {P2POp::Recv(1 - r, &x, -1, DType::kFloat32)},
        {P2POp::Recv(1 - r, nullptr, 4, DType::kFloat32)},
    };
    for (const auto& ops : bad) {
      absl::StatusOr<std::unique_ptr<Work>> w = comm.StartGroup(ops, Stream{});
      if (!absl::IsInvalidArgument(w.status())) return absl::InternalError(w.status().ToString());
    }
    int dummy = 0;
    if (!absl::IsInvalidArgument(comm.StartGroup({}, Stream{&dummy}).status())) {
      return absl::InternalError("device stream accepted");
    }
    if (!absl::IsFailedPrecondition(comm.Shrink({r}).status())) {
      return absl::InternalError("shrinking away oneself accepted");
    }
    // Still healthy: a real exchange works.
    float y = 0;
    x = 1.0f + r;
    if (absl::Status s = Exchange(comm, {P2POp::Send(1 - r, &x, 1, DType::kFloat32),
                                         P2POp::Recv(1 - r, &y, 1, DType::kFloat32)});
        !s.ok()) {
      return s;
    }
    return Expect(y == 2.0f - r, "exchange after bad arguments");
  }));
}

// An infinite timeout means none (it overflowed the steady clock's time point, and every wait
// timed out at once).
TEST(GlooCommunicatorTest, InfiniteTimeoutMeansNoTimeout) {
  ExpectAllOk(RunRanks(
      2,
      [](int r, Communicator& comm) -> absl::Status {
        float x = 1.0f + r, y = 0;
        if (absl::Status s = Exchange(comm, {P2POp::Send(1 - r, &x, 1, DType::kFloat32),
                                             P2POp::Recv(1 - r, &y, 1, DType::kFloat32)});
            !s.ok()) {
          return s;
        }
        return Expect(y == 2.0f - r, "exchange");
      },
      absl::InfiniteDuration()));
}

TEST(GlooCommunicatorTest, AbandonedWorkBreaksTheCommunicator) {
  ExpectAllOk(RunRanks(2, [](int r, Communicator& comm) -> absl::Status {
    float x = 0;
    if (r == 1) {
      absl::SleepFor(absl::Milliseconds(300));
      return absl::OkStatus();
    }
    {
      absl::StatusOr<std::unique_ptr<Work>> w =
          comm.StartGroup({P2POp::Recv(1, &x, 1, DType::kFloat32)}, Stream{});
      if (!w.ok()) return w.status();
    }  // Destroyed unwaited.
    return Expect(absl::IsAborted(comm.health()), comm.health().ToString());
  }));
}

TEST(GlooCommunicatorTest, ShrinkLeavesAWorkingRingOfSurvivors) {
  std::atomic<int> left{0};
  ExpectAllOk(RunRanks(3, [&](int r, Communicator& comm) -> absl::Status {
    if (r == 1) {
      ++left;
      return absl::OkStatus();  // This rank leaves; its communicator is destroyed.
    }
    while (left.load() == 0) absl::SleepFor(absl::Milliseconds(5));
    absl::StatusOr<std::unique_ptr<Communicator>> small = comm.Shrink({1});
    if (!small.ok()) return small.status();
    const int want_rank = r == 0 ? 0 : 1;
    if ((*small)->size() != 2 || (*small)->rank() != want_rank) {
      return absl::InternalError("wrong shrunk identity");
    }
    double v = r, sum = 0;
    if (absl::Status s = (*small)->AllReduce(&v, &sum, 1, DType::kFloat64, ReduceOp::kSum, {});
        !s.ok()) {
      return s;
    }
    return Expect(sum == 2.0, absl::StrCat("sum over survivors ", sum));
  }));
}

TEST(GlooCommunicatorTest, RendezvousWithAMissingRankTimesOut) {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start();
  ASSERT_TRUE(server.ok());
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect((*server)->address());
  ASSERT_TRUE(store.ok());
  GlooOptions options;
  options.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateGlooCommunicator(std::shared_ptr<Store>(std::move(*store)), 0, 2, options);
  EXPECT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(
      absl::IsInvalidArgument(CreateGlooCommunicator(nullptr, 0, 1, GlooOptions()).status()));
}

// ---- A rank process SIGKILLed mid-exchange: the others return an error within the timeout, then
// ---- shrink to a working ring of survivors.

constexpr int64_t kTimeoutMs = 2000;

int DeadPeerChild(const multiprocess::ChildContext& ctx) {
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect(ctx.store_address);
  if (!store.ok()) return 3;
  GlooOptions options;
  options.timeout = absl::Milliseconds(kTimeoutMs);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(
      std::shared_ptr<Store>(std::move(*store)), ctx.rank, ctx.size, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "create: %s\n", comm.status().ToString().c_str());
    return 3;
  }
  const int n = ctx.size, r = ctx.rank;
  std::vector<float> out(4096, float(r)), in(4096);
  absl::Status failure;
  absl::Time failed_at;
  absl::Time last_ok = absl::Now();
  for (int iter = 0; iter < 1000; ++iter) {
    if (r == 1 && iter == 20) ::raise(SIGKILL);  // Dies with ops of its peers in flight.
    absl::Status s =
        Exchange(**comm, {P2POp::Send((r + 1) % n, out.data(), 4096, DType::kFloat32),
                          P2POp::Recv((r + n - 1) % n, in.data(), 4096, DType::kFloat32)});
    if (!s.ok()) {
      failure = s;
      failed_at = absl::Now();
      break;
    }
    last_ok = absl::Now();
  }
  std::fprintf(stderr, "rank %d: %s after %s\n", r, failure.ToString().c_str(),
               absl::FormatDuration(failed_at - last_ok).c_str());
  const bool expected_code =
      absl::IsUnavailable(failure) || absl::IsDeadlineExceeded(failure) || absl::IsAborted(failure);
  if (failure.ok() || !expected_code) return 4;
  if (failure.message().find("rank ") == std::string::npos) return 5;
  if (failed_at - last_ok > absl::Milliseconds(kTimeoutMs + 1000)) return 6;
  // Survivors go on without rank 1.
  absl::StatusOr<std::unique_ptr<Communicator>> small = (*comm)->Shrink({1});
  if (!small.ok()) {
    std::fprintf(stderr, "shrink: %s\n", small.status().ToString().c_str());
    return 7;
  }
  double v = 1, sum = 0;
  absl::Status s = (*small)->AllReduce(&v, &sum, 1, DType::kFloat64, ReduceOp::kSum, {});
  std::fprintf(stderr, "rank %d: survivors' sum %g (%s)\n", r, sum, s.ToString().c_str());
  return s.ok() && sum == n - 1 ? 0 : 8;
}
DATTN_REGISTER_CHILD("gloo_dead_peer", DeadPeerChild);

TEST(GlooCommunicatorTest, KilledPeerProcessBecomesAnErrorWithinTheTimeout) {
  multiprocess::LaunchOptions launch;
  launch.child = "gloo_dead_peer";
  launch.size = 3;
  launch.timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<multiprocess::ChildResult>> results =
      multiprocess::RunChildren(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  const std::string report = multiprocess::Describe(*results);
  EXPECT_TRUE(!(*results)[1].exited && (*results)[1].signal == SIGKILL) << report;
  for (int r : {0, 2}) {
    EXPECT_TRUE((*results)[r].exited && (*results)[r].exit_code == 0) << report;
    EXPECT_FALSE((*results)[r].killed_at_timeout) << report;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << report;
  if (::testing::Test::HasFailure() || std::getenv("DATTN_VERBOSE") != nullptr) {
    std::fprintf(stderr, "%s", report.c_str());
  }
}

}  // namespace
}  // namespace comm
}  // namespace dattn
