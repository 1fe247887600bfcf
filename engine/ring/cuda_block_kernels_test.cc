// The CUDA block kernels against the float64 oracle on one GPU, without communication: P ranks are
// simulated in one process (as cpu_block_kernels_test does on CPUs). Each rank attends its query
// rows to every block its rows need, its own rows in place and other ranks' rows packed from their
// shards (PackKv), merging into its out / lse; backward, other ranks' partial dK/dV go into packed
// fp32 buffers that are then added into the owners' dk / dv (AddPackedToOwn). Outputs are poisoned
// first, inputs are fresh random values (DATTN_TEST_SEED reproduces). fp32 / fp16 / bf16, both
// modes, causal and not, P = 1..4, plus wider 16-bit cases that exercise cuDNN's batched calls and
// the padded / cut query tiles of ragged chunks. Skips without a GPU.
#include "engine/ring/cuda_block_kernels.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ring/ring_gpu_test_util.h"
#include "engine/ring/ring_test_util.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace ring {
namespace {

using testing::DeviceBuffer;
using testing::DeviceTensor;

struct Rank {
  RingGeometry geo;
  DeviceTensor q, k, v, dout, out, lse, dq, dk, dv;
};

class CudaBlockKernelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<CudaBlockKernels>> made = NewCudaBlockKernels({});
    if (made.ok()) {
      kernels_ = made->release();
    } else {
      skip_reason_ = std::string(made.status().message());
    }
  }
  static void TearDownTestSuite() {
    delete kernels_;
    kernels_ = nullptr;
  }
  void SetUp() override {
    if (kernels_ == nullptr) GTEST_SKIP() << skip_reason_;
  }

  void RunCase(const testing::RingCase& c) {
    SCOPED_TRACE(c.Describe());
    SCOPED_TRACE(testutil::ReproduceHint());
    absl::StatusOr<testing::FullProblem> full =
        testing::MakeProblem(c, testutil::CheckSeed(c.Describe()));
    ASSERT_TRUE(full.ok()) << full.status();
    BlockKernels& kernels = *kernels_;
    const RingShape shape{c.batch, c.seq_len(), c.heads, c.head_dim, c.ranks};
    std::vector<Rank> ranks;
    for (int r = 0; r < c.ranks; ++r) {
      absl::StatusOr<RingGeometry> geo = RingGeometry::Create(c.spec, shape, r, c.dtype);
      ASSERT_TRUE(geo.ok()) << geo.status();
      auto input = [&](const std::vector<double>& x) {
        return testing::ToDevice(c.dtype, c.ShardDims(), testing::ShardOf(c, x, r), 0);
      };
      auto poisoned = [&](DType t, const std::vector<int64_t>& dims) {
        return testing::PoisonedTensor(t, dims, 0);
      };
      ranks.push_back(Rank{*geo, input(full->q), input(full->k), input(full->v), input(full->dout),
                           poisoned(c.dtype, c.ShardDims()),
                           poisoned(DType::kFloat32, c.ShardLseDims()),
                           poisoned(c.dtype, c.ShardDims()), poisoned(c.dtype, c.ShardDims()),
                           poisoned(c.dtype, c.ShardDims())});
    }
    auto fwd_args = [&](Rank& rk) {
      return ForwardArgs{rk.q.view, rk.k.view, rk.v.view, rk.out.view, rk.lse.view};
    };
    auto bwd_args = [&](Rank& rk) {
      return BackwardArgs{rk.q.view,    rk.k.view,  rk.v.view,  rk.out.view, rk.lse.view,
                          rk.dout.view, rk.dq.view, rk.dk.view, rk.dv.view};
    };
    struct Need {
      int pattern;
      int64_t segment;
      int origin;
      std::unique_ptr<DeviceBuffer> kv, dkv;
    };
    const int64_t esize = static_cast<int64_t>(DTypeSize(c.dtype));
    std::vector<std::vector<Need>> needs(c.ranks);
    for (int r = 0; r < c.ranks; ++r) {
      const RingGeometry& geo = ranks[r].geo;
      for (int i = 0; i < geo.num_patterns(); ++i) {
        for (int64_t m = geo.FirstSegmentOf(i, r); m <= geo.LastSegmentOf(i, r); ++m) {
          for (int o : geo.Members(i, m)) {
            if (c.spec.causal && o > r) continue;
            Need n{i, m, o, nullptr, nullptr};
            if (o != r) {
              const int64_t e = geo.BlockElements(i, m, o);
              n.kv = std::make_unique<DeviceBuffer>(e * esize);
              n.dkv = std::make_unique<DeviceBuffer>(e * 4);
              ASSERT_TRUE(n.kv->ok() && n.dkv->ok());
              ASSERT_TRUE(
                  kernels.PackKv(ranks[o].geo, i, m, ranks[o].k.view, ranks[o].v.view, n.kv->get())
                      .ok());
            }
            needs[r].push_back(std::move(n));
          }
        }
      }
    }
    const double tol = testutil::SpecTolerance(c.dtype);
    for (int r = 0; r < c.ranks; ++r) {
      Rank& rk = ranks[r];
      ASSERT_TRUE(kernels.BeginForward(rk.geo, fwd_args(rk)).ok());
      std::vector<BlockTask> tasks;
      for (const Need& n : needs[r]) {
        tasks.push_back({n.pattern, n.segment, n.segment + 1, n.origin,
                         n.origin == r ? nullptr : n.kv->get(), nullptr, false});
      }
      absl::Status s = kernels.Forward(rk.geo, fwd_args(rk), tasks);
      ASSERT_TRUE(s.ok()) << s;
      s = kernels.EndForward(rk.geo, fwd_args(rk));
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(testutil::RelativelyNear(absl::StrCat("out rank ", r),
                                           testing::FromDevice(rk.out),
                                           testing::ShardOf(c, full->forward.out, r), tol));
      EXPECT_TRUE(testutil::LseNear(absl::StrCat("lse rank ", r), testing::FromDevice(rk.lse),
                                    testing::LseShardOf(c, full->forward.lse, r),
                                    testutil::GpuLseTolerance(c.dtype)));
    }
    for (Rank& rk : ranks) ASSERT_TRUE(kernels.BeginBackward(rk.geo, bwd_args(rk)).ok());
    for (int r = 0; r < c.ranks; ++r) {
      Rank& rk = ranks[r];
      std::vector<BlockTask> tasks;
      for (Need& n : needs[r]) {
        const bool own = n.origin == r;
        tasks.push_back({n.pattern, n.segment, n.segment + 1, n.origin, own ? nullptr : n.kv->get(),
                         own ? nullptr : n.dkv->get(), !own});
      }
      absl::Status s = kernels.Backward(rk.geo, bwd_args(rk), tasks);
      ASSERT_TRUE(s.ok()) << s;
      for (Need& n : needs[r]) {
        if (n.origin == r) continue;
        Rank& owner = ranks[n.origin];
        s = kernels.AddPackedToOwn(owner.geo, n.pattern, n.segment, n.dkv->get(), bwd_args(owner));
        ASSERT_TRUE(s.ok()) << s;
      }
    }
    for (int r = 0; r < c.ranks; ++r) {
      EXPECT_TRUE(testutil::RelativelyNear(absl::StrCat("dq rank ", r),
                                           testing::FromDevice(ranks[r].dq),
                                           testing::ShardOf(c, full->grads.dq, r), tol));
      EXPECT_TRUE(testutil::RelativelyNear(absl::StrCat("dk rank ", r),
                                           testing::FromDevice(ranks[r].dk),
                                           testing::ShardOf(c, full->grads.dk, r), tol));
      EXPECT_TRUE(testutil::RelativelyNear(absl::StrCat("dv rank ", r),
                                           testing::FromDevice(ranks[r].dv),
                                           testing::ShardOf(c, full->grads.dv, r), tol));
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // The wide two-rank cases on an instance of its own with these options; its counters after.
  CudaBlockKernelStats RunWideCasesWith(const CudaBlockKernelOptions& options) {
    absl::StatusOr<std::unique_ptr<CudaBlockKernels>> made = NewCudaBlockKernels(options);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return {};
    CudaBlockKernels* saved = kernels_;
    kernels_ = made->get();
    for (const testing::RingCase& c : testing::GpuWideCases(2)) RunCase(c);
    kernels_ = saved;
    return (*made)->stats();
  }

  static CudaBlockKernels* kernels_;
  static std::string skip_reason_;
};

CudaBlockKernels* CudaBlockKernelsTest::kernels_ = nullptr;
std::string CudaBlockKernelsTest::skip_reason_;

TEST_F(CudaBlockKernelsTest, OneRank) {
  for (const testing::RingCase& c : testing::GpuStandardCases(1)) RunCase(c);
}
TEST_F(CudaBlockKernelsTest, TwoRanks) {
  for (const testing::RingCase& c : testing::GpuStandardCases(2)) RunCase(c);
}
TEST_F(CudaBlockKernelsTest, ThreeRanks) {
  for (const testing::RingCase& c : testing::GpuStandardCases(3)) RunCase(c);
}
TEST_F(CudaBlockKernelsTest, FourRanks) {
  for (const testing::RingCase& c : testing::GpuStandardCases(4)) RunCase(c);
}
TEST_F(CudaBlockKernelsTest, WideOneRank) {
  for (const testing::RingCase& c : testing::GpuWideCases(1)) RunCase(c);
}
TEST_F(CudaBlockKernelsTest, WideTwoRanks) {
  for (const testing::RingCase& c : testing::GpuWideCases(2)) RunCase(c);
}
TEST_F(CudaBlockKernelsTest, WideFourRanks) {
  for (const testing::RingCase& c : testing::GpuWideCases(4)) RunCase(c);
}

// The fp16 / bf16 cases on the own kernel alone (as when cuDNN refuses every graph).
TEST_F(CudaBlockKernelsTest, OwnKernelForSixteenBitTypes) {
  CudaBlockKernelOptions options;
  options.use_cudnn = false;
  RunWideCasesWith(options);
}

// Whether device 0 runs our own Hopper kernels (compute capability 9.0).
bool HopperDevice() {
  int major = 0, minor = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess &&
         major == 9 && minor == 0;
}

// Grouped mode's local blocks of patterns with no shared segment on the rank run on our own Hopper
// kernel (on a compute capability 9.0 device) with the 1/G in its epilogue; with the option off
// they run on cuDNN and EndForward applies the 1/G. Both agree with the oracle.
TEST_F(CudaBlockKernelsTest, OwnHopperKernelForLocalGroupedBlocks) {
  const int64_t before = kernels_->stats().own_hopper_calls;
  for (const testing::RingCase& c : testing::GpuWideCases(2)) RunCase(c);
  EXPECT_EQ(kernels_->stats().own_hopper_calls > before, HopperDevice());

  CudaBlockKernelOptions options;
  options.own_hopper_forward = false;
  const CudaBlockKernelStats plain = RunWideCasesWith(options);
  EXPECT_EQ(plain.own_hopper_calls, 0);
}

// Local backward calls (both modes; mixture mode's gradients added in place) run on our own
// Hopper backward on a compute capability 9.0 device; with the option off they run on cuDNN. Both
// agree with the oracle (RunCase checks dq, dk, dv of every rank).
TEST_F(CudaBlockKernelsTest, OwnHopperBackwardForLocalBlocks) {
  const int64_t before = kernels_->stats().own_hopper_backward_calls;
  for (const testing::RingCase& c : testing::GpuWideCases(2)) RunCase(c);
  EXPECT_EQ(kernels_->stats().own_hopper_backward_calls > before, HopperDevice());

  CudaBlockKernelOptions options;
  options.own_hopper_backward = false;
  const CudaBlockKernelStats plain = RunWideCasesWith(options);
  EXPECT_EQ(plain.own_hopper_backward_calls, 0);
  // The forward's option is independent of the backward's.
  EXPECT_EQ(plain.own_hopper_calls > 0, HopperDevice());
}

TEST_F(CudaBlockKernelsTest, CudnnRanTheSixteenBitCalls) {
  for (const testing::RingCase& c : testing::GpuWideCases(2)) RunCase(c);
  const CudaBlockKernelStats st = kernels_->stats();
  EXPECT_GT(st.cudnn_calls, 0);
  EXPECT_GT(st.local_calls, 0);
  EXPECT_GT(st.shared_calls, 0);
  EXPECT_GT(st.padded_calls, 0);
  EXPECT_EQ(st.cudnn_fallbacks, 0) << kernels_->last_fallback_reason();
}

}  // namespace
}  // namespace ring
}  // namespace dattn
