// Sequence-parallel dilated attention on CPU ranks that are real processes talking Gloo over
// loopback.
//
// Every rank derives the full inputs from one seed, runs the ring on its shard, and checks its out,
// lse, dq, dk, dv against the float64 oracle's answer on the whole sequence, sliced to its shard,
// with docs/ENGINE.md's tolerances; it also checks that the bytes its communicator counted equal
// the plan's. A rank that is SIGKILLed mid-call must turn into an error on the others within the
// communicator's timeout, after which the survivors shrink the ring and compute correctly again.
#include "engine/ring/ring_attention.h"

#include <signal.h>

#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/comm/multiprocess.h"
#include "engine/comm/tcp_store.h"
#include "engine/ring/cpu_block_kernels.h"
#include "engine/ring/ring_test_util.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace ring {
namespace {

using comm::multiprocess::ChildContext;
using testutil::HostTensor;

absl::StatusOr<std::unique_ptr<comm::Communicator>> Join(const std::string& store_address, int rank,
                                                         int size, absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> store = comm::TcpStore::Connect(store_address);
  if (!store.ok()) return store.status();
  comm::GlooOptions options;
  options.timeout = timeout;
  return comm::CreateGlooCommunicator(std::shared_ptr<comm::Store>(std::move(*store)), rank, size,
                                      options);
}

// Runs forward and backward of one case on this rank and checks everything; returns "" or failures.
std::string RunAndCheck(const testing::RingCase& c, uint64_t seed, comm::Communicator& comm,
                        BlockKernels& kernels, ExchangeMode mode) {
  const int r = comm.rank();
  absl::StatusOr<testing::FullProblem> full = testing::MakeProblem(c, seed);
  if (!full.ok()) return full.status().ToString();
  auto shard = [&](const std::vector<double>& x) {
    return HostTensor::FromValues(c.dtype, c.ShardDims(), testing::ShardOf(c, x, r));
  };
  HostTensor q = shard(full->q), k = shard(full->k), v = shard(full->v), dout = shard(full->dout);
  HostTensor out(c.dtype, c.ShardDims()), lse(c.dtype, c.ShardLseDims());
  HostTensor dq(c.dtype, c.ShardDims()), dk(c.dtype, c.ShardDims()), dv(c.dtype, c.ShardDims());
  RingOptions options;
  options.mode = mode;
  RingAttention ring(&comm, &kernels, options);
  std::string failures;
  auto check = [&](const ::testing::AssertionResult& a) {
    if (!a) absl::StrAppend(&failures, "  ", a.message(), "\n");
  };

  const comm::CommStats before = comm.stats();
  const ForwardArgs fwd{q.view(), k.view(), v.view(), out.view(), lse.view()};
  if (absl::Status s = ring.Forward(c.spec, c.seq_len(), fwd); !s.ok()) return s.ToString();
  const comm::CommStats mid = comm.stats();
  const BackwardArgs bwd{q.view(),    k.view(),  v.view(),  out.view(), lse.view(),
                         dout.view(), dq.view(), dk.view(), dv.view()};
  if (absl::Status s = ring.Backward(c.spec, c.seq_len(), bwd); !s.ok()) return s.ToString();
  const comm::CommStats after = comm.stats();

  const double tol = c.Tolerance();
  check(testutil::RelativelyNear("out", out.ToDoubles(), testing::ShardOf(c, full->forward.out, r),
                                 tol));
  check(
      testutil::LseNear("lse", lse.ToDoubles(), testing::LseShardOf(c, full->forward.lse, r), tol));
  check(
      testutil::RelativelyNear("dq", dq.ToDoubles(), testing::ShardOf(c, full->grads.dq, r), tol));
  check(
      testutil::RelativelyNear("dk", dk.ToDoubles(), testing::ShardOf(c, full->grads.dk, r), tol));
  check(
      testutil::RelativelyNear("dv", dv.ToDoubles(), testing::ShardOf(c, full->grads.dv, r), tol));

  // The bytes counted by the communicator are the plan's, pass by pass and peer by peer.
  absl::StrAppend(&failures, testing::CountedBytesMatchPlan(ring, c, q.view(), comm.size(), before,
                                                            mid, after));
  return failures;
}

ExchangeMode ParseMode(const std::string& s) {
  return s == "allgather" ? ExchangeMode::kAllGather
         : s == "auto"    ? ExchangeMode::kAuto
                          : ExchangeMode::kRing;
}

// Child: every standard case for this ring size, in the exchange modes given.
int CasesChild(const ChildContext& ctx) {
  uint64_t seed = 0;
  if (!absl::SimpleAtoi(ctx.Arg("seed"), &seed)) {
    std::fprintf(stderr, "rank %d: bad seed \"%s\"\n", ctx.rank, ctx.Arg("seed").c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      Join(ctx.store_address, ctx.rank, ctx.size, absl::Seconds(20));
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", ctx.rank, comm.status().ToString().c_str());
    return 3;
  }
  std::unique_ptr<BlockKernels> kernels = NewCpuBlockKernels({1});
  int failed = 0, run = 0;
  for (const std::string mode : {"ring", "allgather", "auto"}) {
    for (const testing::RingCase& c : testing::StandardCases(ctx.size)) {
      const std::string failures = RunAndCheck(c, seed + run, **comm, *kernels, ParseMode(mode));
      ++run;
      if (!failures.empty()) {
        ++failed;
        std::fprintf(stderr, "rank %d FAILED %s [%s]\n%s", ctx.rank, c.Describe().c_str(),
                     mode.c_str(), failures.c_str());
      }
    }
  }
  std::fprintf(stderr, "rank %d: %d of %d cases passed (seed %llu)\n", ctx.rank, run - failed, run,
               static_cast<unsigned long long>(seed));
  return failed == 0 ? 0 : 1;
}
DATTN_REGISTER_CHILD("ring_cases", CasesChild);

void RunRanks(int p) {
  comm::multiprocess::LaunchOptions launch;
  launch.child = "ring_cases";
  launch.size = p;
  launch.args["seed"] = absl::StrCat(testutil::CheckSeed("ring") % 1000000007ULL);
  launch.timeout = absl::Seconds(90);
  absl::StatusOr<std::vector<comm::multiprocess::ChildResult>> results =
      comm::multiprocess::RunChildren(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  bool ok = true;
  for (const auto& r : *results) ok = ok && r.exited && r.exit_code == 0;
  EXPECT_TRUE(ok) << testutil::ReproduceHint() << "\n" << comm::multiprocess::Describe(*results);
}

TEST(RingAttentionTest, OneRankMatchesTheOracle) { RunRanks(1); }
TEST(RingAttentionTest, TwoRanksMatchTheOracleOnEveryShard) { RunRanks(2); }
TEST(RingAttentionTest, ThreeRanksMatchTheOracleOnEveryShard) { RunRanks(3); }
TEST(RingAttentionTest, FourRanksMatchTheOracleOnEveryShard) { RunRanks(4); }

// ---- A rank SIGKILLed in the middle of a call.

constexpr int64_t kTimeoutMs = 2000;

testing::RingCase DeadPeerCase(int ranks, bool causal) {
  testing::RingCase c;
  c.name = "dead-peer";
  c.spec.segment_lengths = {16, 1 << 20};
  c.spec.dilation_rates = {1, 2};
  c.spec.causal = causal;
  c.ranks = ranks;
  c.dtype = DType::kFloat32;
  return c;
}

int DeadPeerChild(const ChildContext& ctx) {
  const bool in_backward = ctx.Arg("kill_in") == "backward";
  const bool causal = ctx.Arg("causal") == "1";
  // "stop": the victim freezes (SIGSTOP) instead of dying: its sockets stay open, so only the
  // timeout can tell; a survivor then kills it (as a worker's watchdog would).
  const bool freeze = ctx.Arg("how") == "stop";
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> side = comm::TcpStore::Connect(ctx.store_address);
  if (!side.ok()) return 3;
  const int victim = static_cast<int>(ctx.IntArg("victim", 1));
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      Join(ctx.store_address, ctx.rank, ctx.size, absl::Milliseconds(kTimeoutMs));
  if (!comm.ok()) return 3;
  std::unique_ptr<BlockKernels> kernels = NewCpuBlockKernels({1});
  const testing::RingCase c = DeadPeerCase(ctx.size, causal);
  const int r = ctx.rank;
  absl::StatusOr<testing::FullProblem> full = testing::MakeProblem(c, 7);
  if (!full.ok()) return 3;
  auto shard = [&](const std::vector<double>& x) {
    return HostTensor::FromValues(c.dtype, c.ShardDims(), testing::ShardOf(c, x, r));
  };
  HostTensor q = shard(full->q), k = shard(full->k), v = shard(full->v), dout = shard(full->dout);
  HostTensor out(c.dtype, c.ShardDims()), lse(c.dtype, c.ShardLseDims());
  HostTensor dq(c.dtype, c.ShardDims()), dk(c.dtype, c.ShardDims()), dv(c.dtype, c.ShardDims());
  int call = 0;
  bool in_pass_backward = false;
  RingOptions options;
  options.mode = ExchangeMode::kRing;
  // Dies in the third call, after posting the transfers of phase 1: its peers have ops in flight.
  options.phase_hook = [&](int phase) {
    if (r == victim && call == 2 && phase == 1 && in_pass_backward == in_backward) {
      if (!freeze) ::raise(SIGKILL);
      (void)(*side)->Set("victim_pid", absl::StrCat(::getpid()));
      ::raise(SIGSTOP);
    }
  };
  RingAttention ring(comm->get(), kernels.get(), options);
  const ForwardArgs fwd{q.view(), k.view(), v.view(), out.view(), lse.view()};
  const BackwardArgs bwd{q.view(),    k.view(),  v.view(),  out.view(), lse.view(),
                         dout.view(), dq.view(), dk.view(), dv.view()};
  // A survivor may finish the call in which the victim dies (if it already had everything it
  // needed from it); then its next call fails. Either way no call may outlast the timeout by much.
  absl::Status failure;
  absl::Duration took;
  int failed_call = -1;
  for (; call < 10 && failure.ok(); ++call) {
    for (bool backward : {false, true}) {
      in_pass_backward = backward;
      const absl::Time start = absl::Now();
      absl::Status s = backward ? ring.Backward(c.spec, c.seq_len(), bwd)
                                : ring.Forward(c.spec, c.seq_len(), fwd);
      if (!s.ok()) {
        failure = s;
        took = absl::Now() - start;
        failed_call = call;
        break;
      }
    }
  }
  if (failed_call != 2 && failed_call != 3) {
    std::fprintf(stderr, "rank %d: failed in call %d, not in the kill call or the next\n", r,
                 failed_call);
    return 4;
  }
  std::fprintf(stderr, "rank %d: %s (after %s)\n", r, failure.ToString().c_str(),
               absl::FormatDuration(took).c_str());
  if (!(absl::IsUnavailable(failure) || absl::IsDeadlineExceeded(failure) ||
        absl::IsAborted(failure))) {
    return 5;
  }
  if (failure.message().find("rank ") == std::string::npos) return 6;
  if (took > absl::Milliseconds(kTimeoutMs + 1500)) return 7;
  if (freeze && r == 0) {
    absl::StatusOr<std::string> pid = (*side)->Get("victim_pid", absl::Seconds(5));
    int victim_pid = 0;
    if (!pid.ok() || !absl::SimpleAtoi(*pid, &victim_pid)) return 10;
    ::kill(victim_pid, SIGKILL);
  }
  // The survivors shrink the ring and the smaller ring computes correctly.
  absl::StatusOr<std::unique_ptr<comm::Communicator>> small = (*comm)->Shrink({victim});
  if (!small.ok()) {
    std::fprintf(stderr, "shrink: %s\n", small.status().ToString().c_str());
    return 8;
  }
  const std::string failures = RunAndCheck(DeadPeerCase((*small)->size(), causal), 11, **small,
                                           *kernels, ExchangeMode::kRing);
  if (!failures.empty()) {
    std::fprintf(stderr, "after shrink: %s\n", failures.c_str());
    return 9;
  }
  std::fprintf(stderr, "rank %d: survivors' ring of %d is correct\n", r, (*small)->size());
  return 0;
}
DATTN_REGISTER_CHILD("ring_dead_peer", DeadPeerChild);

void KillOneRank(bool in_backward, bool causal, const std::string& how = "kill") {
  comm::multiprocess::LaunchOptions launch;
  launch.child = "ring_dead_peer";
  launch.size = 3;
  launch.args["how"] = how;
  launch.args["kill_in"] = in_backward ? "backward" : "forward";
  launch.args["causal"] = causal ? "1" : "0";
  launch.args["victim"] = "1";
  launch.timeout = absl::Seconds(40);
  absl::StatusOr<std::vector<comm::multiprocess::ChildResult>> results =
      comm::multiprocess::RunChildren(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  const std::string report = comm::multiprocess::Describe(*results);
  EXPECT_TRUE(!(*results)[1].exited && (*results)[1].signal == SIGKILL) << report;
  for (int r : {0, 2}) {
    EXPECT_TRUE((*results)[r].exited && (*results)[r].exit_code == 0) << report;
  }
  if (::testing::Test::HasFailure() || std::getenv("DATTN_VERBOSE") != nullptr) {
    std::fprintf(stderr, "%s", report.c_str());
  }
}

TEST(RingAttentionTest, RankKilledInForwardBecomesAnErrorThenSurvivorsShrink) {
  KillOneRank(false, false);
}

TEST(RingAttentionTest, RankKilledInCausalBackwardBecomesAnErrorThenSurvivorsShrink) {
  KillOneRank(true, true);
}

TEST(RingAttentionTest, FrozenRankBecomesDeadlineExceededWithinTheTimeout) {
  KillOneRank(false, false, "stop");
}

// ---- Argument errors, with ranks as threads of this process.

TEST(RingAttentionTest, RejectsAShardThatIsNotNOverP) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok());
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      Join((*server)->address(), 0, 1, absl::Seconds(5));
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::unique_ptr<BlockKernels> kernels = NewCpuBlockKernels({1});
  testing::RingCase c = DeadPeerCase(1, false);
  HostTensor q(c.dtype, c.ShardDims()), out(c.dtype, c.ShardDims());
  HostTensor lse(c.dtype, c.ShardLseDims());
  q.Fill(0.5);
  RingAttention ring(comm->get(), kernels.get());
  const ForwardArgs fwd{q.view(), q.view(), q.view(), out.view(), lse.view()};
  absl::Status s = ring.Forward(c.spec, c.seq_len() + 1, fwd);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("N / P"), std::string::npos) << s;
  AttentionSpec bad = c.spec;
  bad.dilation_rates = {0, 1};
  EXPECT_TRUE(absl::IsInvalidArgument(ring.Forward(bad, c.seq_len(), fwd)));
  HostTensor q16(DType::kFloat16, c.ShardDims());
  const ForwardArgs half{q16.view(), q16.view(), q16.view(), out.view(), lse.view()};
  EXPECT_TRUE(absl::IsInvalidArgument(ring.Forward(c.spec, c.seq_len(), half)));
  // Nothing was broken by the rejected calls.
  EXPECT_TRUE(ring.Forward(c.spec, c.seq_len(), fwd).ok());
}

TEST(RingAttentionTest, RanksThatDisagreeOnTheCallFailTogether) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok());
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
          Join((*server)->address(), r, 2, absl::Seconds(5));
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      std::unique_ptr<BlockKernels> kernels = NewCpuBlockKernels({1});
      testing::RingCase c = DeadPeerCase(2, /*causal=*/r == 1);  // Rank 1 thinks it is causal.
      HostTensor q(c.dtype, c.ShardDims()), out(c.dtype, c.ShardDims());
      HostTensor lse(c.dtype, c.ShardLseDims());
      q.Fill(0.25);
      RingAttention ring(comm->get(), kernels.get());
      results[r] = ring.Forward(c.spec, c.seq_len(),
                                ForwardArgs{q.view(), q.view(), q.view(), out.view(), lse.view()});
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(results[r])) << results[r];
    EXPECT_NE(results[r].message().find(absl::StrCat("rank ", 1 - r)), std::string::npos)
        << results[r];
  }
}

// Under ExchangeMode::kAuto each rank picks a group's schedule from its own cost model: a rank
// whose model differs would post all-gather transfers against its peers' ring ones.
TEST(RingAttentionTest, RanksWhoseCostModelsChooseDifferentSchedulesFailTogether) {
  constexpr int kRanks = 3;
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok());
  // Rank 1 sees messages as expensive and compute as free, so all-gather (one message instead of
  // P - 1) wins; the others may not give all-gather any memory, so they keep the ring.
  auto options_for = [](int r) {
    RingOptions options;
    options.mode = ExchangeMode::kAuto;
    CostModel cost = CostModel::ForCpu();
    if (r == 1) {
      cost.latency_s = 1.0;
      cost.flops_per_s = 1e18;
    } else {
      cost.allgather_memory_limit = 0;
    }
    options.cost = cost;
    return options;
  };
  std::vector<absl::Status> results(kRanks);
  std::vector<std::vector<Schedule>> chosen(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
          Join((*server)->address(), r, kRanks, absl::Seconds(3));
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      std::unique_ptr<BlockKernels> kernels = NewCpuBlockKernels({1});
      testing::RingCase c = DeadPeerCase(kRanks, /*causal=*/false);
      HostTensor q(c.dtype, c.ShardDims()), out(c.dtype, c.ShardDims());
      HostTensor lse(c.dtype, c.ShardLseDims());
      q.Fill(0.25);
      RingAttention ring(comm->get(), kernels.get(), options_for(r));
      absl::StatusOr<RingPlan> plan = ring.Plan(c.spec, c.seq_len(), q.view(), false);
      if (plan.ok()) {
        for (const Group& g : plan->groups) chosen[r].push_back(g.schedule);
      }
      results[r] = ring.Forward(c.spec, c.seq_len(),
                                ForwardArgs{q.view(), q.view(), q.view(), out.view(), lse.view()});
    });
  }
  for (auto& t : threads) t.join();
  // The case must really make the ranks choose differently, or it tests nothing.
  ASSERT_FALSE(chosen[0].empty());
  ASSERT_EQ(chosen[0], chosen[2]);
  ASSERT_NE(chosen[0], chosen[1]);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(results[r])) << "rank " << r << ": " << results[r];
    EXPECT_NE(results[r].message().find(absl::StrCat("rank ", r == 1 ? 0 : 1)), std::string::npos)
        << results[r];
  }
}

}  // namespace
}  // namespace ring
}  // namespace dattn
