// The NCCL communicator against communicator.h's contract, one process per GPU. Needs at least two
// GPUs; without them every multi-GPU test skips (saying why) and only the no-GPU behaviour is
// checked. Run on the GPU machine as a plain binary (scripts/gpu-check.sh); NCCL_NVLS_ENABLE=0 is
// set here.
#include "engine/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <signal.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/comm/multiprocess.h"
#include "engine/comm/tcp_store.h"
#include "gtest/gtest.h"

namespace dattn {
namespace comm {
namespace {

using multiprocess::ChildContext;

constexpr int64_t kTimeoutMs = 5000;

#define CHILD_CHECK(cond)                                                                        \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "rank %d: check failed at line %d: %s\n", ctx.rank, __LINE__, #cond); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

#define CHILD_OK(expr)                                                                           \
  do {                                                                                           \
    const absl::Status _s = (expr);                                                              \
    if (!_s.ok()) {                                                                              \
      std::fprintf(stderr, "rank %d: line %d: %s\n", ctx.rank, __LINE__, _s.ToString().c_str()); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

absl::StatusOr<std::unique_ptr<Communicator>> Join(const ChildContext& ctx,
                                                   std::shared_ptr<Store>* store_out = nullptr) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect(ctx.store_address);
  if (!store.ok()) return store.status();
  std::shared_ptr<Store> shared(std::move(*store));
  if (store_out != nullptr) *store_out = shared;
  NcclOptions options;
  options.device = ctx.rank;
  options.timeout = absl::Milliseconds(kTimeoutMs);
  return CreateNcclCommunicator(shared, ctx.rank, ctx.size, options);
}

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* d = nullptr;
  cudaMalloc(&d, host.size() * sizeof(T));
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

template <typename T>
std::vector<T> HostCopy(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

// Ring exchange on a user stream (stream-ordered, one host sync at the end), collectives, barrier,
// byte counters, argument errors.
int BasicsChild(const ChildContext& ctx) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Join(ctx);
  CHILD_OK(comm.status());
  Communicator& c = **comm;
  const int n = ctx.size, r = ctx.rank;
  CHILD_CHECK(c.device() == Device::kCuda && c.rank() == r && c.size() == n);
  cudaStream_t stream;
  CHILD_CHECK(cudaStreamCreate(&stream) == cudaSuccess);
  constexpr int64_t kCount = 1 << 16;
  std::vector<float> out(kCount);
  for (int64_t i = 0; i < kCount; ++i) out[i] = r * 1e6f + i;
  float* d_out = DeviceCopy(out);
  float* d_in = DeviceCopy(std::vector<float>(kCount, -1.0f));
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  absl::StatusOr<std::unique_ptr<Work>> work =
      c.StartGroup({P2POp::Send(right, d_out, kCount, DType::kFloat32),
                    P2POp::Recv(left, d_in, kCount, DType::kFloat32)},
                   Stream{stream});
  CHILD_OK(work.status());
  CHILD_OK((*work)->Wait(Stream{stream}));
  CHILD_OK(c.Synchronize(Stream{stream}));
  const std::vector<float> in = HostCopy(d_in, kCount);
  for (int64_t i = 0; i < kCount; i += 997) CHILD_CHECK(in[i] == left * 1e6f + i);
  const CommStats st = c.stats();
  CHILD_CHECK(st.p2p_bytes_sent == kCount * 4 && st.p2p_bytes_received == kCount * 4);
  CHILD_CHECK(st.p2p_bytes_sent_to[right] == kCount * 4);
  CHILD_CHECK(st.p2p_bytes_received_from[left] == kCount * 4);

  std::vector<double> mine = {double(r), r + 0.5};
  double* d_mine = DeviceCopy(mine);
  double* d_all = DeviceCopy(std::vector<double>(2 * n, -1));
  CHILD_OK(c.AllGather(d_mine, d_all, 2, DType::kFloat64, Stream{stream}));
  double* d_sum = DeviceCopy(std::vector<double>(2, 0));
  CHILD_OK(c.AllReduce(d_mine, d_sum, 2, DType::kFloat64, ReduceOp::kSum, Stream{stream}));
  CHILD_OK(c.Synchronize(Stream{stream}));
  const std::vector<double> all = HostCopy(d_all, 2 * n);
  for (int q = 0; q < n; ++q) CHILD_CHECK(all[2 * q] == q && all[2 * q + 1] == q + 0.5);
  const std::vector<double> sum = HostCopy(d_sum, 2);
  CHILD_CHECK(sum[0] == n * (n - 1) / 2.0 && sum[1] == sum[0] + 0.5 * n);
  CHILD_OK(c.Barrier());

  absl::StatusOr<std::unique_ptr<Work>> bad =
      c.StartGroup({P2POp::Send(r, d_out, 1, DType::kFloat32)}, Stream{stream});
  CHILD_CHECK(absl::IsInvalidArgument(bad.status()));
  CHILD_OK(c.health());
  cudaFree(d_out);
  cudaFree(d_in);
  cudaFree(d_mine);
  cudaFree(d_all);
  cudaFree(d_sum);
  cudaStreamDestroy(stream);
  std::fprintf(stderr, "rank %d: basics passed\n", r);
  return 0;
}
DATTN_REGISTER_CHILD("nccl_basics", BasicsChild);

// The victim is SIGKILLed with a ring exchange in flight; the survivors' Synchronize must fail
// within the timeout, then Shrink (aborting the stuck kernels) gives a working ring of survivors.
int DeadPeerChild(const ChildContext& ctx) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Join(ctx);
  CHILD_OK(comm.status());
  Communicator& c = **comm;
  const int n = ctx.size, r = ctx.rank, victim = n - 1;
  cudaStream_t stream;
  CHILD_CHECK(cudaStreamCreate(&stream) == cudaSuccess);
  constexpr int64_t kCount = 1 << 20;
  float* d_out = DeviceCopy(std::vector<float>(kCount, float(r)));
  float* d_in = DeviceCopy(std::vector<float>(kCount, 0.0f));
  absl::Status failure;
  absl::Duration took;
  int iter = 0;
  for (; iter < 50 && failure.ok(); ++iter) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<Work>> work =
        c.StartGroup({P2POp::Send((r + 1) % n, d_out, kCount, DType::kFloat32),
                      P2POp::Recv((r + n - 1) % n, d_in, kCount, DType::kFloat32)},
                     Stream{stream});
    if (r == victim && iter == 5) ::raise(SIGKILL);
    absl::Status s = work.status();
    if (s.ok()) s = (*work)->Wait(Stream{stream});
    if (s.ok()) s = c.Synchronize(Stream{stream});
    if (!s.ok()) {
      failure = s;
      took = absl::Now() - start;
    }
  }
  std::fprintf(stderr, "rank %d: iteration %d: %s after %s\n", r, iter, failure.ToString().c_str(),
               absl::FormatDuration(took).c_str());
  CHILD_CHECK(absl::IsDeadlineExceeded(failure) || absl::IsUnavailable(failure) ||
              absl::IsAborted(failure));
  CHILD_CHECK(took < absl::Milliseconds(kTimeoutMs + 2000));
  absl::StatusOr<std::unique_ptr<Communicator>> small = c.Shrink({victim});
  CHILD_OK(small.status());
  CHILD_CHECK((*small)->size() == n - 1 && (*small)->rank() == r);
  cudaStream_t s2;
  CHILD_CHECK(cudaStreamCreate(&s2) == cudaSuccess);
  double* d_one = DeviceCopy(std::vector<double>{1.0});
  CHILD_OK((*small)->AllReduce(d_one, d_one, 1, DType::kFloat64, ReduceOp::kSum, Stream{s2}));
  CHILD_OK((*small)->Synchronize(Stream{s2}));
  CHILD_CHECK(HostCopy(d_one, 1)[0] == n - 1);
  std::fprintf(stderr, "rank %d: survivors' ring of %d works\n", r, n - 1);
  return 0;
}
DATTN_REGISTER_CHILD("nccl_dead_peer", DeadPeerChild);

// Rank 0 waits on a receive that never comes; a watchdog thread's Abort ends the wait at once.
int AbortChild(const ChildContext& ctx) {
  std::shared_ptr<Store> store;
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Join(ctx, &store);
  CHILD_OK(comm.status());
  Communicator& c = **comm;
  cudaStream_t stream;
  CHILD_CHECK(cudaStreamCreate(&stream) == cudaSuccess);
  float* d_in = DeviceCopy(std::vector<float>(16, 0.0f));
  // One completed exchange first: NCCL connects a pair of ranks lazily, when both first post to
  // each other, so a receive from a peer that never posted could not even be issued.
  float* d_warm = DeviceCopy(std::vector<float>(16, 1.0f));
  {
    const int peer = 1 - ctx.rank;
    absl::StatusOr<std::unique_ptr<Work>> warm =
        c.StartGroup({P2POp::Send(peer, d_warm, 16, DType::kFloat32),
                      P2POp::Recv(peer, d_in, 16, DType::kFloat32)},
                     Stream{stream});
    CHILD_OK(warm.status());
    CHILD_OK((*warm)->Wait(Stream{stream}));
    CHILD_OK(c.Synchronize(Stream{stream}));
  }
  if (ctx.rank == 1) {
    CHILD_OK(store->Get("abort_done", absl::Seconds(30)).status());
    return 0;
  }
  absl::StatusOr<std::unique_ptr<Work>> work =
      c.StartGroup({P2POp::Recv(1, d_in, 16, DType::kFloat32)}, Stream{stream});
  CHILD_OK(work.status());
  CHILD_OK((*work)->Wait(Stream{stream}));
  std::thread watchdog([&] {
    absl::SleepFor(absl::Milliseconds(300));
    c.Abort("watchdog");
  });
  const absl::Time start = absl::Now();
  const absl::Status s = c.Synchronize(Stream{stream});
  watchdog.join();
  std::fprintf(stderr, "rank 0: %s after %s\n", s.ToString().c_str(),
               absl::FormatDuration(absl::Now() - start).c_str());
  CHILD_CHECK(absl::IsAborted(s));
  CHILD_CHECK(absl::Now() - start < absl::Milliseconds(kTimeoutMs));
  CHILD_CHECK(absl::IsFailedPrecondition(c.Shrink({1}).status()));
  CHILD_OK(store->Set("abort_done", "1"));
  return 0;
}
DATTN_REGISTER_CHILD("nccl_abort", AbortChild);

void RunOnGpus(const std::string& child, int want, int need) {
  const int gpus = CudaDeviceCount();
  if (gpus < need) GTEST_SKIP() << "needs " << need << " GPUs, found " << gpus;
  multiprocess::LaunchOptions launch;
  launch.child = child;
  launch.size = std::min(gpus, want);
  launch.timeout = absl::Seconds(120);
  absl::StatusOr<std::vector<multiprocess::ChildResult>> results =
      multiprocess::RunChildren(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  const std::string report = multiprocess::Describe(*results);
  for (const multiprocess::ChildResult& r : *results) {
    const bool victim = child == "nccl_dead_peer" && r.rank == launch.size - 1;
    if (victim) {
      EXPECT_TRUE(!r.exited && r.signal == SIGKILL) << report;
    } else {
      EXPECT_TRUE(r.exited && r.exit_code == 0) << report;
    }
  }
  if (::testing::Test::HasFailure() || std::getenv("DATTN_VERBOSE") != nullptr) {
    std::fprintf(stderr, "%s", report.c_str());
  }
}

TEST(NcclCommunicatorTest, ExchangeCollectivesAndCountersOnTwoToFourGpus) {
  RunOnGpus("nccl_basics", 4, 2);
}

TEST(NcclCommunicatorTest, KilledPeerBecomesAnErrorWithinTheTimeoutThenShrink) {
  RunOnGpus("nccl_dead_peer", 4, 2);
}

TEST(NcclCommunicatorTest, AbortEndsAStuckWait) { RunOnGpus("nccl_abort", 2, 2); }

TEST(NcclCommunicatorTest, WithoutAGpuCreationFailsCleanly) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start();
  ASSERT_TRUE(server.ok());
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect((*server)->address());
  ASSERT_TRUE(store.ok());
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateNcclCommunicator(std::shared_ptr<Store>(std::move(*store)), 0, 1, NcclOptions());
  EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
  EXPECT_NE(comm.status().message().find("device 0"), std::string::npos) << comm.status();
}

}  // namespace
}  // namespace comm
}  // namespace dattn
