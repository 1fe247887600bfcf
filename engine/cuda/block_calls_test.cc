// The CUDA backend's call geometry against the oracle's independent derivation of the spec: every
// selected (batch, position, head) of every pattern is covered by exactly one block row, nothing
// else is, blocks stay inside one segment, views address the right elements for any strides, and
// the chunked plan keeps each call's scratch under the limit.
#include "engine/cuda/block_calls.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/attention_spec.h"
#include "engine/testing/oracle.h"
#include "gtest/gtest.h"

namespace dattn {
namespace cuda {
namespace {

AttentionSpec MakeSpec(std::vector<int64_t> w, std::vector<int64_t> r, AttentionMode mode,
                       HeadOffsets offsets = HeadOffsets::kModulo) {
  AttentionSpec spec;
  spec.segment_lengths = std::move(w);
  spec.dilation_rates = std::move(r);
  spec.mode = mode;
  spec.head_offsets = offsets;
  return spec;
}

// (pattern, b, p, h) -> times covered.
using Coverage = std::map<std::tuple<int, int64_t, int64_t, int64_t>, int>;

Coverage Expected(const AttentionSpec& spec, const ProblemDims& d) {
  Coverage c;
  for (int i = 0; i < spec.num_patterns(); ++i) {
    const std::vector<int64_t> offsets = oracle::PatternOffsets(spec, i, d.num_heads);
    for (int64_t h = 0; h < d.num_heads; ++h) {
      if (offsets[h] < 0) continue;
      for (const auto& segment : oracle::SelectedRows(d.seq_len, spec.segment_lengths[i],
                                                      spec.dilation_rates[i], offsets[h])) {
        for (int64_t p : segment) {
          for (int64_t b = 0; b < d.batch; ++b) c[{i, b, p, h}] = 1;
        }
      }
    }
  }
  return c;
}

// Walks every row of every call, checking block structure on the way.
Coverage Covered(const std::vector<BlockCall>& calls, const ProblemDims& d, bool fold_batches) {
  Coverage c;
  for (const BlockCall& call : calls) {
    for (int64_t j = 0; j < call.count; ++j) {
      const int64_t first = call.first_flat + j * call.block_step;
      const int64_t b = first / d.seq_len;
      const int64_t segment = (first % d.seq_len) / call.segment;
      for (int64_t s = 0; s < call.rows; ++s) {
        const int64_t flat = first + s * call.rate;
        EXPECT_EQ(flat / d.seq_len, b) << "block leaves its batch item: " << call.DebugString();
        EXPECT_EQ((flat % d.seq_len) / call.segment, segment)
            << "block leaves its segment: " << call.DebugString();
        for (int64_t k = 0; k < call.group.heads; ++k) {
          const int64_t h = call.group.head0 + k * call.group.head_step;
          EXPECT_LT(h, d.num_heads);
          c[{call.pattern, b, flat % d.seq_len, h}] += 1;
        }
      }
      if (!fold_batches && !call.steps_batches && d.batch > 1) {
        EXPECT_EQ((call.first_flat + (call.count - 1) * call.block_step) / d.seq_len,
                  call.first_flat / d.seq_len)
            << "a call folds batch items although the layout forbids it: " << call.DebugString();
      }
    }
  }
  return c;
}

struct Case {
  std::vector<int64_t> w, r;
  ProblemDims dims;
};

std::vector<Case> Cases() {
  return {
      {{4}, {1}, {1, 12, 2, 8}},                    // G = 1, r = 1: blockwise
      {{4, 8}, {1, 2}, {2, 16, 4, 8}},              // N a multiple of every segment, B > 1
      {{4, 8}, {1, 2}, {2, 13, 5, 8}},              // partial segments, H % G != 0
      {{5, 7, 3}, {2, 3, 2}, {3, 20, 6, 8}},        // rates that divide no segment
      {{64, 6}, {4, 5}, {2, 10, 3, 8}},             // a segment longer than N
      {{4, 4, 4, 4}, {1, 2, 4, 8}, {1, 16, 4, 8}},  // offsets past a short segment (r > w)
      {{3}, {2}, {2, 7, 9, 8}},
  };
}

TEST(BlockCallsTest, HeadGroupsMatchOracleOffsets) {
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    for (HeadOffsets offsets : {HeadOffsets::kModulo, HeadOffsets::kBlocked}) {
      if (mode == AttentionMode::kGrouped && offsets == HeadOffsets::kBlocked) continue;
      for (int64_t heads : {3, 4, 5, 7, 8, 16}) {
        const AttentionSpec spec = MakeSpec({8, 8, 8}, {1, 3, 4}, mode, offsets);
        for (int i = 0; i < spec.num_patterns(); ++i) {
          std::vector<int64_t> got(heads, -1);
          for (const HeadGroup& g : PatternHeadGroups(spec, i, heads)) {
            for (int64_t k = 0; k < g.heads; ++k) {
              const int64_t h = g.head0 + k * g.head_step;
              ASSERT_LT(h, heads);
              EXPECT_EQ(got[h], -1) << "head " << h << " in two groups";
              got[h] = g.offset;
            }
          }
          EXPECT_EQ(got, oracle::PatternOffsets(spec, i, heads))
              << AttentionModeName(mode) << " " << HeadOffsetsName(offsets) << " H=" << heads
              << " pattern " << i;
        }
      }
    }
  }
}

TEST(BlockCallsTest, CallsCoverEverySelectedRowOnce) {
  for (const Case& c : Cases()) {
    for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
      for (HeadOffsets offsets : {HeadOffsets::kModulo, HeadOffsets::kBlocked}) {
        if (mode == AttentionMode::kGrouped && offsets == HeadOffsets::kBlocked) continue;
        if (mode == AttentionMode::kGrouped &&
            c.dims.num_heads < static_cast<int64_t>(c.w.size())) {
          continue;
        }
        const AttentionSpec spec = MakeSpec(c.w, c.r, mode, offsets);
        for (bool fold : {true, false}) {
          SCOPED_TRACE(spec.DebugString() + " N=" + std::to_string(c.dims.seq_len) +
                       " B=" + std::to_string(c.dims.batch) + (fold ? " fold" : " no fold"));
          const std::vector<BlockCall> calls = EnumerateBlockCalls(spec, c.dims, fold);
          EXPECT_EQ(Covered(calls, c.dims, fold), Expected(spec, c.dims));
          EXPECT_EQ(CountBlockCalls(spec, c.dims, fold), static_cast<int64_t>(calls.size()));
        }
      }
    }
  }
}

TEST(BlockCallsTest, ViewsAddressTheSelectedElementsForAnyStrides) {
  const AttentionSpec spec = MakeSpec({5, 8}, {2, 3}, AttentionMode::kMixture);
  const ProblemDims d{3, 13, 4, 8};
  // A padded layout: every dimension has one unused element per row.
  const int64_t sd = 1, sh = d.head_dim + 1, sn = d.num_heads * sh + 1, sb = d.seq_len * sn + 1;
  for (const BlockCall& call : EnumerateBlockCalls(spec, d, /*fold_batches=*/false)) {
    const CallView v = ViewOf(call, d.seq_len, sb, sn, sh);
    for (int64_t j = 0; j < call.count; ++j) {
      for (int64_t k = 0; k < call.group.heads; ++k) {
        for (int64_t s = 0; s < call.rows; ++s) {
          const int64_t flat = call.first_flat + j * call.block_step + s * call.rate;
          const int64_t b = flat / d.seq_len, p = flat % d.seq_len;
          const int64_t h = call.group.head0 + k * call.group.head_step;
          ASSERT_EQ(v.base + j * v.fold + k * v.head + s * v.seq, b * sb + p * sn + h * sh)
              << call.DebugString() << " j=" << j << " k=" << k << " s=" << s;
        }
      }
    }
    (void)sd;
  }
  // Contiguous rows: the row view is the element view divided by D.
  for (const BlockCall& call : EnumerateBlockCalls(spec, d, /*fold_batches=*/true)) {
    const CallView rows = RowViewOf(call, d);
    const CallView elems = ViewOf(call, d.seq_len, d.seq_len * d.num_heads * d.head_dim,
                                  d.num_heads * d.head_dim, d.head_dim);
    EXPECT_EQ(rows.base * d.head_dim, elems.base);
    EXPECT_EQ(rows.fold * d.head_dim, elems.fold);
    EXPECT_EQ(rows.head * d.head_dim, elems.head);
    EXPECT_EQ(rows.seq * d.head_dim, elems.seq);
  }
}

TEST(BlockCallsTest, ChunkedPlanKeepsCoverageAndLimit) {
  const ProblemDims d{2, 96, 6, 16};
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    const AttentionSpec spec = MakeSpec({8, 16, 32}, {1, 2, 4}, mode);
    for (bool backward : {false, true}) {
      for (bool cudnn : {false, true}) {
        PlanInputs in;
        in.dtype = DType::kBFloat16;
        in.backward = backward;
        in.use_cudnn = cudnn;
        in.workspace_limit = 4096;
        const CallPlan plan = PlanBlockCalls(spec, d, in);
        std::vector<BlockCall> calls;
        int64_t max_scratch = 0;
        for (const PlannedCall& pc : plan.calls) {
          calls.push_back(pc.call);
          const CallScratch s =
              LayoutCallScratch(pc.call, pc.role, backward, cudnn, in.dtype, d.head_dim,
                                cudnn ? ModeledLibraryWorkspace(pc.call, backward, d.head_dim) : 0,
                                NeedsScaledOut(spec, backward, cudnn));
          if (pc.call.count > 1) {
            EXPECT_LE(s.total, in.workspace_limit) << pc.call.DebugString();
          }
          max_scratch = std::max(max_scratch, s.total);
          const bool direct =
              mode == AttentionMode::kGrouped || pc.call.pattern == plan.direct_pattern;
          EXPECT_EQ(pc.role, direct ? CallRole::kDirect : CallRole::kMerge);
        }
        EXPECT_EQ(plan.workspace_bytes, max_scratch);
        EXPECT_GT(plan.calls.size(), EnumerateBlockCalls(spec, d, true).size());
        EXPECT_EQ(Covered(calls, d, true), Expected(spec, d));
      }
    }
  }
}

// CountPlannedCalls is the size of the plan PlanBlockCalls builds, for segments that divide N and
// ones that do not (batch items unfolded), folded or not, every mode, pass, library and limit.
TEST(BlockCallsTest, CountPlannedCallsIsThePlansSize) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> patterns = {
      {{8, 16, 32}, {1, 2, 4}}, {{7, 20, 96}, {1, 3, 5}}, {{100}, {2}}};
  for (const ProblemDims& d : {ProblemDims{2, 96, 6, 16}, ProblemDims{3, 250, 4, 64}}) {
    for (const auto& [segments, rates] : patterns) {
      for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
        const AttentionSpec spec = MakeSpec(segments, rates, mode);
        for (int variant = 0; variant < 32; ++variant) {
          PlanInputs in;
          in.dtype = DType::kBFloat16;
          in.backward = variant & 1;
          in.use_cudnn = variant & 2;
          in.hopper = variant & 4;
          in.overlap_calls = variant & 8;
          in.fold_batches = variant & 16;
          for (int64_t limit : {int64_t{0}, int64_t{1}, int64_t{4096}, int64_t{1} << 20}) {
            in.workspace_limit = limit;
            EXPECT_EQ(CountPlannedCalls(spec, d, in),
                      static_cast<int64_t>(PlanBlockCalls(spec, d, in).calls.size()))
                << "variant " << variant << " limit " << limit << " N=" << d.seq_len;
          }
        }
      }
    }
  }
}

// Our Hopper backward's scratch: the gathered lse and two row terms per row, padded to whole
// 128-row tiles per (block, head); a merge call adds in place (no tile), and nothing of cuDNN's.
TEST(BlockCallsTest, HopperBackwardScratchIsTheRowTerms) {
  BlockCall call;
  call.group.heads = 3;
  call.rows = 200;
  call.count = 5;
  for (CallRole role : {CallRole::kDirect, CallRole::kMerge}) {
    const CallScratch s = LayoutCallScratch(call, role, /*backward=*/true, /*use_cudnn=*/false,
                                            DType::kBFloat16, 128, 0, false,
                                            /*hopper=*/true);
    EXPECT_EQ(s.stats, 0);
    EXPECT_EQ(s.delta, 3 * 200 * 5 * 4 / 256 * 256 + 256);  // after the 256-byte aligned lse
    EXPECT_EQ(s.total, s.delta + 2 * 3 * 5 * 256 * 4);      // 200 rows padded to 256
    EXPECT_EQ(s.tile, -1);
    EXPECT_EQ(s.dq_accum, -1);
    EXPECT_EQ(s.out_tile, -1);
    EXPECT_EQ(s.library, -1);
  }
}

// The default limits: 5% of one input, with floors of 4 MiB forward, 1 MiB for our Hopper
// backward and 256 MiB for cuDNN's backward.
TEST(BlockCallsTest, DefaultWorkspaceLimitsFollowTheKernels) {
  const ProblemDims big{1, 1 << 16, 16, 64};  // one bf16 input: 128 MiB, 5%: 6,710,886 bytes
  EXPECT_EQ(DefaultWorkspaceLimit(big, DType::kBFloat16, false), 6710886);
  EXPECT_EQ(DefaultWorkspaceLimit(big, DType::kBFloat16, true, /*hopper_backward=*/true), 6710886);
  EXPECT_EQ(DefaultWorkspaceLimit(big, DType::kBFloat16, true), int64_t{256} << 20);
  const ProblemDims small{1, 1024, 4, 64};
  EXPECT_EQ(DefaultWorkspaceLimit(small, DType::kBFloat16, false), int64_t{4} << 20);
  EXPECT_EQ(DefaultWorkspaceLimit(small, DType::kBFloat16, true, true), int64_t{1} << 20);
  EXPECT_EQ(DefaultWorkspaceLimit(small, DType::kBFloat16, true), int64_t{256} << 20);
}

TEST(BlockCallsTest, MixtureWritesTheWidestPatternFirst) {
  const ProblemDims d{1, 64, 4, 8};
  const AttentionSpec spec = MakeSpec({16, 8, 32}, {4, 1, 2}, AttentionMode::kMixture);
  PlanInputs in;
  const CallPlan plan = PlanBlockCalls(spec, d, in);
  EXPECT_EQ(plan.direct_pattern, 1);  // r = 1 selects every row
  ASSERT_FALSE(plan.calls.empty());
  bool seen_other = false;
  for (const PlannedCall& pc : plan.calls) {
    if (pc.call.pattern != plan.direct_pattern) seen_other = true;
    if (seen_other) {
      EXPECT_NE(pc.call.pattern, plan.direct_pattern) << "direct calls come first";
    }
  }
  const CallPlan grouped =
      PlanBlockCalls(MakeSpec({16, 8, 32}, {4, 1, 2}, AttentionMode::kGrouped), d, in);
  EXPECT_EQ(grouped.direct_pattern, -1);
}

TEST(BlockCallsTest, ScratchLayoutIsAlignedAndDisjoint) {
  BlockCall call;
  call.group.heads = 3;
  call.rows = 7;
  call.count = 5;
  for (bool backward : {false, true}) {
    for (bool cudnn : {false, true}) {
      for (CallRole role : {CallRole::kDirect, CallRole::kMerge}) {
        const CallScratch s = LayoutCallScratch(call, role, backward, cudnn, DType::kFloat16, 24,
                                                cudnn ? 1000 : 0, /*scaled_out=*/true);
        std::vector<std::pair<int64_t, int64_t>> parts;  // offset, bytes
        const int64_t rows = 3 * 7 * 5;
        parts.push_back({s.stats, rows * 4});
        if (backward) parts.push_back({s.delta, rows * 4});
        if (backward && cudnn) parts.push_back({s.dq_accum, rows * 24 * 4});
        if (role == CallRole::kMerge) parts.push_back({s.tile, (backward ? 3 : 1) * rows * 24 * 2});
        if (backward && cudnn) parts.push_back({s.out_tile, rows * 24 * 2});
        if (cudnn) parts.push_back({s.library, 1000});
        std::sort(parts.begin(), parts.end());
        int64_t end = 0;
        for (const auto& [offset, bytes] : parts) {
          ASSERT_GE(offset, 0);
          EXPECT_EQ(offset % 256, 0);
          EXPECT_GE(offset, end);
          end = offset + bytes;
        }
        EXPECT_GE(s.total, end);
        EXPECT_EQ(s.dq_accum >= 0, backward && cudnn);
        EXPECT_EQ(s.tile >= 0, role == CallRole::kMerge);
        EXPECT_EQ(s.out_tile >= 0, backward && cudnn);
      }
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace dattn
