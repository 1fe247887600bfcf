// The CPU block kernels against the float64 oracle, without any communication: P ranks are
// simulated in one process. Each rank attends its query rows to every block its rows need (its own
// rows in place, other ranks' rows packed from their shards), all in one call (so blocks that write
// the same output rows meet in one call), and the merged result must equal the oracle's shard.
// Backward: partial dK/dV of other ranks' rows go into packed buffers that are then added into the
// owners' dk/dv.
#include "engine/ring/cpu_block_kernels.h"

#include <cmath>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/ring/ring_test_util.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace ring {
namespace {

using testutil::HostTensor;
using testutil::Layout;

struct Rank {
  RingGeometry geo;
  HostTensor q, k, v, dout, out, lse, dq, dk, dv;
};

void RunCase(const testing::RingCase& c, Layout layout, int threads) {
  SCOPED_TRACE(c.Describe() + " layout " + testutil::LayoutName(layout));
  SCOPED_TRACE(testutil::ReproduceHint());
  absl::StatusOr<testing::FullProblem> full = testing::MakeProblem(c, testutil::CheckSeed(c.name));
  ASSERT_TRUE(full.ok()) << full.status();
  std::unique_ptr<BlockKernels> kernels = NewCpuBlockKernels({threads});
  const RingShape shape{c.batch, c.seq_len(), c.heads, c.head_dim, c.ranks};
  std::vector<Rank> ranks;
  for (int r = 0; r < c.ranks; ++r) {
    absl::StatusOr<RingGeometry> geo = RingGeometry::Create(c.spec, shape, r, c.dtype);
    ASSERT_TRUE(geo.ok()) << geo.status();
    auto input = [&](const std::vector<double>& x) {
      return HostTensor::FromValues(c.dtype, c.ShardDims(), testing::ShardOf(c, x, r), layout);
    };
    ranks.push_back(Rank{*geo, input(full->q), input(full->k), input(full->v), input(full->dout),
                         HostTensor(c.dtype, c.ShardDims()), HostTensor(c.dtype, c.ShardLseDims()),
                         HostTensor(c.dtype, c.ShardDims()), HostTensor(c.dtype, c.ShardDims()),
                         HostTensor(c.dtype, c.ShardDims())});
  }
  auto fwd_args = [&](Rank& rk) {
    return ForwardArgs{rk.q.view(), rk.k.view(), rk.v.view(), rk.out.view(), rk.lse.view()};
  };
  auto bwd_args = [&](Rank& rk) {
    return BackwardArgs{rk.q.view(),    rk.k.view(),  rk.v.view(),  rk.out.view(), rk.lse.view(),
                        rk.dout.view(), rk.dq.view(), rk.dk.view(), rk.dv.view()};
  };
  // Every (pattern, segment, origin) block rank r needs; packed buffers for other origins.
  struct Need {
    int pattern;
    int64_t segment;
    int origin;
    std::vector<double> kv, dkv;  // double storage keeps any dtype aligned.
  };
  auto needs_of = [&](int r) {
    std::vector<Need> needs;
    const RingGeometry& geo = ranks[r].geo;
    for (int i = 0; i < geo.num_patterns(); ++i) {
      for (int64_t m = geo.FirstSegmentOf(i, r); m <= geo.LastSegmentOf(i, r); ++m) {
        for (int o : geo.Members(i, m)) {
          if (c.spec.causal && o > r) continue;
          Need n{i, m, o, {}, {}};
          if (o != r) {
            const int64_t e = geo.BlockElements(i, m, o);
            n.kv.resize(e);
            n.dkv.assign(e, 0.0);
            EXPECT_TRUE(
                kernels
                    ->PackKv(ranks[o].geo, i, m, ranks[o].k.view(), ranks[o].v.view(), n.kv.data())
                    .ok());
          }
          needs.push_back(std::move(n));
        }
      }
    }
    return needs;
  };
  std::vector<std::vector<Need>> needs;
  for (int r = 0; r < c.ranks; ++r) needs.push_back(needs_of(r));

  for (int r = 0; r < c.ranks; ++r) {
    Rank& rk = ranks[r];
    ASSERT_TRUE(kernels->BeginForward(rk.geo, fwd_args(rk)).ok());
    std::vector<BlockTask> tasks;
    for (const Need& n : needs[r]) {
      tasks.push_back({n.pattern, n.segment, n.segment + 1, n.origin,
                       n.origin == r ? nullptr : n.kv.data(), nullptr, false});
    }
    ASSERT_TRUE(kernels->Forward(rk.geo, fwd_args(rk), tasks).ok());
    ASSERT_TRUE(kernels->EndForward(rk.geo, fwd_args(rk)).ok());
    EXPECT_TRUE(testutil::RelativelyNear(absl::StrCat("out rank ", r), rk.out.ToDoubles(),
                                         testing::ShardOf(c, full->forward.out, r), c.Tolerance()));
    EXPECT_TRUE(testutil::LseNear(absl::StrCat("lse rank ", r), rk.lse.ToDoubles(),
                                  testing::LseShardOf(c, full->forward.lse, r), c.Tolerance()));
  }
  for (Rank& rk : ranks) ASSERT_TRUE(kernels->BeginBackward(rk.geo, bwd_args(rk)).ok());
  for (int r = 0; r < c.ranks; ++r) {
    Rank& rk = ranks[r];
    std::vector<BlockTask> tasks;
    for (Need& n : needs[r]) {
      const bool own = n.origin == r;
      tasks.push_back({n.pattern, n.segment, n.segment + 1, n.origin, own ? nullptr : n.kv.data(),
                       own ? nullptr : n.dkv.data(), !own});
    }
    ASSERT_TRUE(kernels->Backward(rk.geo, bwd_args(rk), tasks).ok());
    for (Need& n : needs[r]) {
      if (n.origin == r) continue;
      Rank& owner = ranks[n.origin];
      ASSERT_TRUE(
          kernels->AddPackedToOwn(owner.geo, n.pattern, n.segment, n.dkv.data(), bwd_args(owner))
              .ok());
    }
  }
  for (int r = 0; r < c.ranks; ++r) {
    EXPECT_TRUE(testutil::RelativelyNear(absl::StrCat("dq rank ", r), ranks[r].dq.ToDoubles(),
                                         testing::ShardOf(c, full->grads.dq, r), c.Tolerance()));
    EXPECT_TRUE(testutil::RelativelyNear(absl::StrCat("dk rank ", r), ranks[r].dk.ToDoubles(),
                                         testing::ShardOf(c, full->grads.dk, r), c.Tolerance()));
    EXPECT_TRUE(testutil::RelativelyNear(absl::StrCat("dv rank ", r), ranks[r].dv.ToDoubles(),
                                         testing::ShardOf(c, full->grads.dv, r), c.Tolerance()));
  }
}

TEST(CpuBlockKernelsTest, BlocksMergeToTheOracleOnEveryShard) {
  for (int p : {1, 2, 3, 4}) {
    for (const testing::RingCase& c : testing::StandardCases(p)) RunCase(c, Layout::kContiguous, 2);
  }
}

TEST(CpuBlockKernelsTest, StridedInputsAndOneThread) {
  for (const testing::RingCase& c : testing::StandardCases(3)) {
    RunCase(c, Layout::kInterleaved, 1);
  }
}

// Tiles smaller than a block: a long segment over two shards with r = 1 (256 rows per chunk and
// head, two query and key tiles each), plus D not a multiple of the vector width.
TEST(CpuBlockKernelsTest, BlocksLongerThanOneTile) {
  for (bool causal : {false, true}) {
    testing::RingCase c;
    c.name = "long";
    c.spec.segment_lengths = {512, 64};
    c.spec.dilation_rates = {1, 2};
    c.spec.mode = AttentionMode::kMixture;
    c.spec.causal = causal;
    c.batch = 1;
    c.heads = 2;
    c.head_dim = 5;
    c.shard_len = 256;
    c.ranks = 2;
    c.dtype = DType::kFloat32;
    RunCase(c, Layout::kPadded, 2);
  }
}

}  // namespace
}  // namespace ring
}  // namespace dattn

namespace dattn {
namespace ring {
namespace {

// NaN in an input propagates like ordinary attention (docs/ENGINE.md): a NaN key on rank 0 inside a
// segment that spans both ranks must turn into NaN output rows on rank 1 too (a block merge that
// dropped the NaN would leave them finite: a silent wrong answer), exactly where the oracle has
// NaN.
TEST(CpuBlockKernelsTest, NanInAnotherRanksKeyPropagates) {
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    testing::RingCase c;
    c.name = "nan";
    c.spec.segment_lengths = {32, 8};
    c.spec.dilation_rates = {1, 2};
    c.spec.mode = mode;
    c.batch = 1;
    c.heads = 2;
    c.head_dim = 4;
    c.shard_len = 16;
    c.ranks = 2;
    absl::StatusOr<testing::FullProblem> full = testing::MakeProblem(c, 11);
    ASSERT_TRUE(full.ok()) << full.status();
    const oracle::Shape shape = c.FullShape();
    full->k[shape.Index(0, 3, 0, 1)] = std::numeric_limits<double>::quiet_NaN();
    absl::StatusOr<oracle::ForwardResult> ref =
        oracle::Forward(c.spec, shape, full->q, full->k, full->v);
    ASSERT_TRUE(ref.ok()) << ref.status();

    std::unique_ptr<BlockKernels> kernels = NewCpuBlockKernels({1});
    const RingShape ring_shape{c.batch, c.seq_len(), c.heads, c.head_dim, c.ranks};
    std::vector<RingGeometry> geos;
    std::vector<HostTensor> q, k, v, out, lse;
    for (int r = 0; r < c.ranks; ++r) {
      absl::StatusOr<RingGeometry> geo = RingGeometry::Create(c.spec, ring_shape, r, c.dtype);
      ASSERT_TRUE(geo.ok()) << geo.status();
      geos.push_back(*geo);
      auto shard = [&](const std::vector<double>& x) {
        return HostTensor::FromValues(c.dtype, c.ShardDims(), testing::ShardOf(c, x, r),
                                      Layout::kContiguous);
      };
      q.push_back(shard(full->q));
      k.push_back(shard(full->k));
      v.push_back(shard(full->v));
      out.emplace_back(c.dtype, c.ShardDims());
      lse.emplace_back(c.dtype, c.ShardLseDims());
    }
    int nan_rows_rank1 = 0;
    for (int r = 0; r < c.ranks; ++r) {
      const ForwardArgs args{q[r].view(), k[r].view(), v[r].view(), out[r].view(), lse[r].view()};
      std::vector<std::vector<double>> packed;
      std::vector<BlockTask> tasks;
      for (int i = 0; i < geos[r].num_patterns(); ++i) {
        for (int64_t m = geos[r].FirstSegmentOf(i, r); m <= geos[r].LastSegmentOf(i, r); ++m) {
          for (int o : geos[r].Members(i, m)) {
            const double* kv = nullptr;
            if (o != r) {
              packed.emplace_back(geos[o].BlockElements(i, m, o));
              ASSERT_TRUE(
                  kernels->PackKv(geos[o], i, m, k[o].view(), v[o].view(), packed.back().data())
                      .ok());
              kv = packed.back().data();
            }
            tasks.push_back({i, m, m + 1, o, kv, nullptr, false});
          }
        }
      }
      ASSERT_TRUE(kernels->BeginForward(geos[r], args).ok());
      ASSERT_TRUE(kernels->Forward(geos[r], args, tasks).ok());
      ASSERT_TRUE(kernels->EndForward(geos[r], args).ok());
      const std::vector<double> got = out[r].ToDoubles();
      const std::vector<double> want = testing::ShardOf(c, ref->out, r);
      ASSERT_EQ(got.size(), want.size());
      for (size_t x = 0; x < got.size(); ++x) {
        ASSERT_EQ(std::isnan(got[x]), std::isnan(want[x]))
            << AttentionModeName(mode) << " rank " << r << " element " << x << ": got " << got[x]
            << ", oracle " << want[x];
        if (r == 1 && std::isnan(got[x])) ++nan_rows_rank1;
      }
    }
    EXPECT_GT(nan_rows_rank1, 0)
        << "the NaN never reached rank 1: the case does not test the merge";
  }
}

}  // namespace
}  // namespace ring
}  // namespace dattn
