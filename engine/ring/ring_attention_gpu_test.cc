// Sequence-parallel dilated attention on GPU ranks: one process per GPU, NCCL between them, the
// CUDA block kernels on each. Needs P GPUs for a ring of P; skips (saying why) with fewer.
//
// Every rank derives the full inputs from one seed, runs the ring forward and backward on its shard
// and checks its out, lse, dq, dk, dv (1) against the float64 oracle's answer on the whole
// sequence, sliced to its shard, and (2) against the single-GPU CUDA backend run on the whole
// sequence on the same GPU, sliced likewise, both within docs/ENGINE.md's tolerances (fp32 1e-5,
// fp16 2e-3, bf16 1e-2); outputs are poisoned before each call. It also checks that the bytes its
// communicator counted equal the plan's, call by call and peer by peer. A rank SIGKILLed mid-call
// must turn into an error on the others within the timeout; the survivors then shrink the ring and
// compute correctly again. NCCL_NVLS_ENABLE=0 is set (NVLink multicast stays off).
#include "engine/ring/ring_attention.h"

#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/multiprocess.h"
#include "engine/comm/nccl_communicator.h"
#include "engine/comm/tcp_store.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/ring/cuda_block_kernels.h"
#include "engine/ring/ring_gpu_test_util.h"
#include "engine/ring/ring_test_util.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace ring {
namespace {

using comm::multiprocess::ChildContext;
using testing::DeviceTensor;

absl::StatusOr<std::unique_ptr<comm::Communicator>> Join(const std::string& store_address, int rank,
                                                         int size, absl::Duration timeout,
                                                         const std::string& prefix = "nccl") {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> store = comm::TcpStore::Connect(store_address);
  if (!store.ok()) return store.status();
  comm::NcclOptions options;
  options.device = rank;
  options.timeout = timeout;
  options.prefix = prefix;
  return comm::CreateNcclCommunicator(std::shared_ptr<comm::Store>(std::move(*store)), rank, size,
                                      options);
}

struct Tensors {
  DeviceTensor q, k, v, dout, out, lse, dq, dk, dv;
  ForwardArgs Fwd() const { return {q.view, k.view, v.view, out.view, lse.view}; }
  BackwardArgs Bwd() const {
    return {q.view, k.view, v.view, out.view, lse.view, dout.view, dq.view, dk.view, dv.view};
  }
};

// Inputs from the problem (the shard of `rank`, or everything when rank < 0), outputs poisoned.
Tensors MakeTensors(const testing::RingCase& c, const testing::FullProblem& p, int rank,
                    int device) {
  std::vector<int64_t> dims = c.ShardDims(), lse_dims = c.ShardLseDims();
  if (rank < 0) {
    dims = {c.batch, c.seq_len(), c.heads, c.head_dim};
    lse_dims = {c.batch, c.heads, c.seq_len()};
  }
  auto in = [&](const std::vector<double>& x) {
    return testing::ToDevice(c.dtype, dims, rank < 0 ? x : testing::ShardOf(c, x, rank), device);
  };
  auto poisoned = [&](DType t, const std::vector<int64_t>& d) {
    return testing::PoisonedTensor(t, d, device);
  };
  return Tensors{in(p.q),
                 in(p.k),
                 in(p.v),
                 in(p.dout),
                 poisoned(c.dtype, dims),
                 poisoned(DType::kFloat32, lse_dims),
                 poisoned(c.dtype, dims),
                 poisoned(c.dtype, dims),
                 poisoned(c.dtype, dims)};
}

// Runs forward and backward of one case on this rank and checks everything; returns "" or the
// failures. `reference`: the single-GPU backend to compare with (nullptr: the oracle only).
std::string RunAndCheck(const testing::RingCase& c, uint64_t seed, comm::Communicator& comm,
                        CudaBlockKernels& kernels, CudaAttentionBackend* reference,
                        ExchangeMode mode) {
  const int r = comm.rank();
  int device = 0;
  cudaGetDevice(&device);
  absl::StatusOr<testing::FullProblem> full = testing::MakeProblem(c, seed);
  if (!full.ok()) return full.status().ToString();
  Tensors t = MakeTensors(c, *full, r, device);
  RingOptions options;
  options.mode = mode;
  RingAttention ring(&comm, &kernels, options);
  std::string failures;
  auto check = [&](const ::testing::AssertionResult& a) {
    if (!a) absl::StrAppend(&failures, "  ", a.message(), "\n");
  };
  const comm::CommStats before = comm.stats();
  if (absl::Status s = ring.Forward(c.spec, c.seq_len(), t.Fwd()); !s.ok()) return s.ToString();
  const comm::CommStats mid = comm.stats();
  if (absl::Status s = ring.Backward(c.spec, c.seq_len(), t.Bwd()); !s.ok()) return s.ToString();
  const comm::CommStats after = comm.stats();

  const double tol = testutil::SpecTolerance(c.dtype), lse_tol = testutil::GpuLseTolerance(c.dtype);
  const std::vector<double> out = testing::FromDevice(t.out), lse = testing::FromDevice(t.lse);
  const std::vector<double> dq = testing::FromDevice(t.dq), dk = testing::FromDevice(t.dk),
                            dv = testing::FromDevice(t.dv);
  check(testutil::RelativelyNear("out vs oracle", out, testing::ShardOf(c, full->forward.out, r),
                                 tol));
  check(testutil::LseNear("lse vs oracle", lse, testing::LseShardOf(c, full->forward.lse, r),
                          lse_tol));
  check(testutil::RelativelyNear("dq vs oracle", dq, testing::ShardOf(c, full->grads.dq, r), tol));
  check(testutil::RelativelyNear("dk vs oracle", dk, testing::ShardOf(c, full->grads.dk, r), tol));
  check(testutil::RelativelyNear("dv vs oracle", dv, testing::ShardOf(c, full->grads.dv, r), tol));

  if (reference != nullptr) {
    Tensors whole = MakeTensors(c, *full, -1, device);
    absl::Status s = reference->Forward(c.spec, whole.Fwd());
    if (s.ok()) s = reference->Backward(c.spec, whole.Bwd());
    if (s.ok()) s = reference->Synchronize();
    if (!s.ok()) return absl::StrCat(failures, "  single-GPU reference: ", s.ToString(), "\n");
    check(testutil::RelativelyNear("out vs single GPU", out,
                                   testing::ShardOf(c, testing::FromDevice(whole.out), r), tol));
    check(testutil::LseNear("lse vs single GPU", lse,
                            testing::LseShardOf(c, testing::FromDevice(whole.lse), r), lse_tol));
    check(testutil::RelativelyNear("dq vs single GPU", dq,
                                   testing::ShardOf(c, testing::FromDevice(whole.dq), r), tol));
    check(testutil::RelativelyNear("dk vs single GPU", dk,
                                   testing::ShardOf(c, testing::FromDevice(whole.dk), r), tol));
    check(testutil::RelativelyNear("dv vs single GPU", dv,
                                   testing::ShardOf(c, testing::FromDevice(whole.dv), r), tol));
  }

  // The bytes counted by the communicator are the plan's, pass by pass and peer by peer.
  absl::StrAppend(&failures, testing::CountedBytesMatchPlan(ring, c, t.q.view, comm.size(), before,
                                                            mid, after));
  return failures;
}

// Child: every GPU case for this ring size.
int CasesChild(const ChildContext& ctx) {
  uint64_t seed = 0;
  if (!absl::SimpleAtoi(ctx.Arg("seed"), &seed)) return 2;
  if (cudaSetDevice(ctx.rank) != cudaSuccess) return 3;
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      Join(ctx.store_address, ctx.rank, ctx.size, absl::Seconds(30));
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", ctx.rank, comm.status().ToString().c_str());
    return 3;
  }
  CudaBlockKernelOptions kopt;
  kopt.device = ctx.rank;
  kopt.sync_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<CudaBlockKernels>> kernels = NewCudaBlockKernels(kopt);
  CudaBackendOptions bopt;
  bopt.device = ctx.rank;
  absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> backend = NewCudaBackend(bopt);
  if (!kernels.ok() || !backend.ok()) {
    std::fprintf(stderr, "rank %d: %s / %s\n", ctx.rank, kernels.status().ToString().c_str(),
                 backend.status().ToString().c_str());
    return 3;
  }
  const std::string which = ctx.Arg("cases", "standard");
  struct Run {
    testing::RingCase c;
    ExchangeMode mode;
    const char* mode_name;
  };
  std::vector<Run> runs;
  if (which == "standard") {
    for (const testing::RingCase& c : testing::GpuStandardCases(ctx.size)) {
      runs.push_back({c, ExchangeMode::kRing, "ring"});
      if (c.dtype == DType::kFloat32) runs.push_back({c, ExchangeMode::kAllGather, "allgather"});
    }
  } else {
    for (const testing::RingCase& c : testing::GpuWideCases(ctx.size)) {
      runs.push_back({c, ExchangeMode::kAuto, "auto"});
    }
  }
  int failed = 0, n = 0;
  const absl::Time start = absl::Now();
  for (const Run& run : runs) {
    const std::string failures =
        RunAndCheck(run.c, seed + n, **comm, **kernels, backend->get(), run.mode);
    ++n;
    if (!failures.empty()) {
      ++failed;
      std::fprintf(stderr, "rank %d FAILED %s [%s]\n%s", ctx.rank, run.c.Describe().c_str(),
                   run.mode_name, failures.c_str());
    }
  }
  const CudaBlockKernelStats st = (*kernels)->stats();
  std::fprintf(stderr,
               "rank %d: %d of %d cases passed (seed %llu) in %s; cudnn %lld, own kernel %lld, "
               "fallbacks %lld (%s), local %lld, shared %lld, padded %lld\n",
               ctx.rank, n - failed, n, static_cast<unsigned long long>(seed),
               absl::FormatDuration(absl::Now() - start).c_str(),
               static_cast<long long>(st.cudnn_calls), static_cast<long long>(st.kernel_calls),
               static_cast<long long>(st.cudnn_fallbacks),
               (*kernels)->last_fallback_reason().c_str(), static_cast<long long>(st.local_calls),
               static_cast<long long>(st.shared_calls), static_cast<long long>(st.padded_calls));
  return failed == 0 ? 0 : 1;
}
DATTN_REGISTER_CHILD("gpu_ring_cases", CasesChild);

int GpuCount() { return comm::CudaDeviceCount(); }

void RunRanks(int p, const std::string& cases) {
  const int gpus = GpuCount();
  if (gpus < p) GTEST_SKIP() << "a ring of " << p << " needs " << p << " GPUs, found " << gpus;
  comm::multiprocess::LaunchOptions launch;
  launch.child = "gpu_ring_cases";
  launch.size = p;
  launch.args["seed"] = absl::StrCat(testutil::CheckSeed("gpu ring") % 1000000007ULL);
  launch.args["cases"] = cases;
  launch.timeout = absl::Seconds(240);
  absl::StatusOr<std::vector<comm::multiprocess::ChildResult>> results =
      comm::multiprocess::RunChildren(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  bool ok = true;
  for (const auto& r : *results) ok = ok && r.exited && r.exit_code == 0;
  const std::string report = comm::multiprocess::Describe(*results);
  EXPECT_TRUE(ok) << testutil::ReproduceHint() << "\n" << report;
  if (ok) {
    // The summary line of every rank (cases, time, which engine ran the calls).
    for (const auto& r : *results) {
      const size_t at = r.log.rfind("cases passed");
      if (at != std::string::npos) {
        const size_t line = r.log.rfind('\n', at);
        const size_t end = r.log.find('\n', at);
        std::fprintf(
            stderr, "%s\n",
            r.log.substr(line == std::string::npos ? 0 : line + 1, end - line - 1).c_str());
      }
    }
  }
}

TEST(RingAttentionGpuTest, OneGpuMatchesTheOracleAndTheBackend) { RunRanks(1, "standard"); }
TEST(RingAttentionGpuTest, TwoGpusMatchTheOracleAndTheBackend) { RunRanks(2, "standard"); }
TEST(RingAttentionGpuTest, ThreeGpusMatchTheOracleAndTheBackend) { RunRanks(3, "standard"); }
TEST(RingAttentionGpuTest, FourGpusMatchTheOracleAndTheBackend) { RunRanks(4, "standard"); }
TEST(RingAttentionGpuTest, WideCasesOnTwoGpus) { RunRanks(2, "wide"); }
TEST(RingAttentionGpuTest, WideCasesOnFourGpus) { RunRanks(4, "wide"); }

// ---- A rank SIGKILLed in the middle of a call.

constexpr int64_t kTimeoutMs = 5000;

testing::RingCase DeadPeerCase(int ranks, bool causal) {
  testing::RingCase c;
  c.name = "dead-peer";
  c.spec.segment_lengths = {64, 1 << 20};
  c.spec.dilation_rates = {1, 2};
  c.spec.causal = causal;
  c.ranks = ranks;
  c.batch = 1;
  c.heads = 4;
  c.head_dim = 64;
  c.shard_len = 256;
  c.dtype = DType::kBFloat16;
  return c;
}

int DeadPeerChild(const ChildContext& ctx) {
  const bool in_backward = ctx.Arg("kill_in") == "backward";
  const bool causal = ctx.Arg("causal") == "1";
  const int victim = static_cast<int>(ctx.IntArg("victim", 1));
  if (cudaSetDevice(ctx.rank) != cudaSuccess) return 3;
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      Join(ctx.store_address, ctx.rank, ctx.size, absl::Milliseconds(kTimeoutMs));
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", ctx.rank, comm.status().ToString().c_str());
    return 3;
  }
  CudaBlockKernelOptions kopt;
  kopt.device = ctx.rank;
  kopt.sync_timeout = absl::Milliseconds(kTimeoutMs);
  absl::StatusOr<std::unique_ptr<CudaBlockKernels>> kernels = NewCudaBlockKernels(kopt);
  if (!kernels.ok()) return 3;
  const testing::RingCase c = DeadPeerCase(ctx.size, causal);
  const int r = ctx.rank;
  absl::StatusOr<testing::FullProblem> full = testing::MakeProblem(c, 7);
  if (!full.ok()) return 3;
  Tensors t = MakeTensors(c, *full, r, r);
  int call = 0;
  bool in_pass_backward = false;
  RingOptions options;
  options.mode = ExchangeMode::kRing;
  // Dies in the third call, after posting the transfers of phase 1: its peers have ops in flight.
  options.phase_hook = [&](int phase) {
    if (r == victim && call == 2 && phase == 1 && in_pass_backward == in_backward) {
      ::raise(SIGKILL);
    }
  };
  RingAttention ring(comm->get(), kernels->get(), options);
  absl::Status failure;
  absl::Duration took;
  int failed_call = -1;
  for (; call < 10 && failure.ok(); ++call) {
    for (bool backward : {false, true}) {
      in_pass_backward = backward;
      const absl::Time start = absl::Now();
      absl::Status s = backward ? ring.Backward(c.spec, c.seq_len(), t.Bwd())
                                : ring.Forward(c.spec, c.seq_len(), t.Fwd());
      if (!s.ok()) {
        failure = s;
        took = absl::Now() - start;
        failed_call = call;
        break;
      }
    }
  }
  std::fprintf(stderr, "rank %d: call %d: %s (after %s)\n", r, failed_call,
               failure.ToString().c_str(), absl::FormatDuration(took).c_str());
  if (failed_call != 2 && failed_call != 3) return 4;
  if (!(absl::IsUnavailable(failure) || absl::IsDeadlineExceeded(failure) ||
        absl::IsAborted(failure))) {
    return 5;
  }
  if (failure.message().find("rank ") == std::string::npos) return 6;
  if (took > absl::Milliseconds(kTimeoutMs + 2500)) return 7;
  // The survivors shrink the ring (aborting the kernels stuck on the dead peer) and the smaller
  // ring computes correctly on the same kernels.
  const absl::Time shrink_start = absl::Now();
  absl::StatusOr<std::unique_ptr<comm::Communicator>> small = (*comm)->Shrink({victim});
  if (!small.ok()) {
    std::fprintf(stderr, "rank %d: shrink: %s\n", r, small.status().ToString().c_str());
    return 8;
  }
  std::fprintf(stderr, "rank %d: shrunk to %d ranks in %s\n", r, (*small)->size(),
               absl::FormatDuration(absl::Now() - shrink_start).c_str());
  const std::string failures = RunAndCheck(DeadPeerCase((*small)->size(), causal), 11, **small,
                                           **kernels, nullptr, ExchangeMode::kRing);
  if (!failures.empty()) {
    std::fprintf(stderr, "rank %d: after shrink: %s\n", r, failures.c_str());
    return 9;
  }
  std::fprintf(stderr, "rank %d: survivors' ring of %d is correct\n", r, (*small)->size());
  return 0;
}
DATTN_REGISTER_CHILD("gpu_ring_dead_peer", DeadPeerChild);

void KillOneRank(bool in_backward, bool causal) {
  const int gpus = GpuCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  comm::multiprocess::LaunchOptions launch;
  launch.child = "gpu_ring_dead_peer";
  launch.size = std::min(gpus, 3);
  launch.args["kill_in"] = in_backward ? "backward" : "forward";
  launch.args["causal"] = causal ? "1" : "0";
  launch.args["victim"] = "1";
  launch.timeout = absl::Seconds(90);
  absl::StatusOr<std::vector<comm::multiprocess::ChildResult>> results =
      comm::multiprocess::RunChildren(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  const std::string report = comm::multiprocess::Describe(*results);
  EXPECT_TRUE(!(*results)[1].exited && (*results)[1].signal == SIGKILL) << report;
  for (const auto& r : *results) {
    if (r.rank == 1) continue;
    EXPECT_TRUE(r.exited && r.exit_code == 0) << report;
  }
  std::fprintf(stderr, "%s", report.c_str());
}

TEST(RingAttentionGpuTest, RankKilledInForwardBecomesAnErrorThenSurvivorsShrink) {
  KillOneRank(false, false);
}

TEST(RingAttentionGpuTest, RankKilledInCausalBackwardBecomesAnErrorThenSurvivorsShrink) {
  KillOneRank(true, true);
}

}  // namespace
}  // namespace ring
}  // namespace dattn
