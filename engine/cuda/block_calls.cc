#include "engine/cuda/block_calls.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/cuda/kernel_types.h"

namespace dattn {
namespace cuda {
namespace {

constexpr int64_t kAlign = 256;
constexpr int64_t kMaxSpanElements = (int64_t{1} << 31) - 1;

int64_t AlignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Selected rows of one block per head, summed over heads and blocks: how much of the output a call
// covers.
int64_t CoveredRows(const BlockCall& call) { return call.count * call.group.heads * call.rows; }

// Scratch bytes of one block (count = 1) of a call, before alignment: the unit the chunking divides
// the workspace limit by.
int64_t BytesPerBlock(const BlockCall& call, CallRole role, const PlanInputs& in, int64_t head_dim,
                      bool scaled_out) {
  BlockCall one = call;
  one.count = 1;
  const CallScratch s =
      LayoutCallScratch(one, role, in.backward, in.use_cudnn, in.dtype, head_dim,
                        in.use_cudnn ? ModeledLibraryWorkspace(one, in.backward, head_dim) : 0,
                        scaled_out, in.hopper);
  return s.total;
}

}  // namespace

std::string BlockCall::DebugString() const {
  return absl::StrCat("pattern ", pattern, " (w=", segment, " r=", rate, ") offset ", group.offset,
                      " heads ", group.head0, "+", group.head_step, "*[0,", group.heads, ") ",
                      count, " blocks x ", rows, " rows from flat ", first_flat, " step ",
                      block_step, steps_batches ? " (batch items)" : "");
}

std::vector<HeadGroup> PatternHeadGroups(const AttentionSpec& spec, int pattern,
                                         int64_t num_heads) {
  std::vector<HeadGroup> groups;
  const int64_t r = spec.dilation_rates[pattern];
  if (spec.mode == AttentionMode::kGrouped) {
    const dilation::HeadRange range = dilation::GroupHeads(num_heads, spec.num_patterns(), pattern);
    if (range.end > range.begin) {
      groups.push_back({pattern % r, range.begin, range.end - range.begin, 1});
    }
    return groups;
  }
  if (spec.head_offsets == HeadOffsets::kBlocked) {
    const int64_t block = num_heads / r + (num_heads % r != 0 ? 1 : 0);
    for (int64_t o = 0; o * block < num_heads; ++o) {
      const int64_t head0 = o * block;
      groups.push_back({o, head0, std::min(block, num_heads - head0), 1});
    }
    return groups;
  }
  for (int64_t o = 0; o < std::min(r, num_heads); ++o) {
    groups.push_back({o, o, (num_heads - o + r - 1) / r, r});
  }
  return groups;
}

CallView ViewOf(const BlockCall& call, int64_t seq_len, int64_t sb, int64_t sn, int64_t sh) {
  const int64_t b0 = call.first_flat / seq_len;
  const int64_t p0 = call.first_flat % seq_len;
  CallView view;
  view.base = b0 * sb + p0 * sn + call.group.head0 * sh;
  view.fold = call.steps_batches ? sb : call.block_step * sn;
  view.head = call.group.head_step * sh;
  view.seq = call.rate * sn;
  return view;
}

CallView RowViewOf(const BlockCall& call, const ProblemDims& dims) {
  return ViewOf(call, dims.seq_len, dims.seq_len * dims.num_heads, dims.num_heads, 1);
}

namespace {

// The calls of EnumerateBlockCalls, pattern by pattern: emit(call, copies) for each, where copies >
// 1 stands for that many calls one batch item (N flat positions) apart. CountBlockCalls sums the
// copies without building a call; EnumerateBlockCalls builds them.
template <typename Emit>
void ForEachBlockCall(const AttentionSpec& spec, const ProblemDims& dims, bool fold_batches,
                      Emit emit) {
  const int64_t n = dims.seq_len;
  for (int i = 0; i < spec.num_patterns(); ++i) {
    const int64_t w = spec.segment_lengths[i];
    const int64_t r = spec.dilation_rates[i];
    const int64_t full = w <= n ? n / w : 0;
    const int64_t partial = n - full * w;
    for (const HeadGroup& group : PatternHeadGroups(spec, i, dims.num_heads)) {
      BlockCall base;
      base.pattern = i;
      base.segment = w;
      base.rate = r;
      base.group = group;
      const int64_t full_rows = dilation::SelectedCount(w, group.offset, r);
      if (full > 0 && full_rows > 0) {
        BlockCall c = base;
        c.rows = full_rows;
        c.block_step = w;
        c.first_flat = group.offset;
        if (partial == 0 && (fold_batches || dims.batch == 1)) {
          c.count = dims.batch * full;
          emit(c, 1);
        } else {
          c.count = full;
          emit(c, dims.batch);  // One call per batch item.
        }
      }
      const int64_t partial_rows =
          partial > 0 ? dilation::SelectedCount(partial, group.offset, r) : 0;
      if (partial_rows > 0) {
        BlockCall c = base;
        c.rows = partial_rows;
        c.count = dims.batch;
        c.first_flat = full * w + group.offset;
        c.block_step = n;
        c.steps_batches = true;
        emit(c, 1);
      }
    }
  }
}

}  // namespace

int64_t CountBlockCalls(const AttentionSpec& spec, const ProblemDims& dims, bool fold_batches) {
  int64_t count = 0;
  ForEachBlockCall(spec, dims, fold_batches,
                   [&count](const BlockCall&, int64_t copies) { count += copies; });
  return count;
}

std::vector<BlockCall> EnumerateBlockCalls(const AttentionSpec& spec, const ProblemDims& dims,
                                           bool fold_batches) {
  std::vector<BlockCall> calls;
  ForEachBlockCall(spec, dims, fold_batches, [&](BlockCall c, int64_t copies) {
    for (int64_t b = 0; b < copies; ++b, c.first_flat += dims.seq_len) calls.push_back(c);
  });
  return calls;
}

bool NeedsScaledOut(const AttentionSpec& spec, bool backward, bool use_cudnn) {
  return backward && use_cudnn && spec.mode == AttentionMode::kGrouped && spec.num_patterns() > 1;
}

CallScratch LayoutCallScratch(const BlockCall& call, CallRole role, bool backward, bool use_cudnn,
                              DType dtype, int64_t head_dim, int64_t library_bytes, bool scaled_out,
                              bool hopper) {
  CallScratch s;
  const int64_t rows = call.count * call.group.heads * call.rows;
  const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
  auto take = [&s](int64_t bytes) {
    const int64_t at = s.total;
    s.total += AlignUp(bytes);
    return at;
  };
  s.stats = take(rows * 4);
  if (hopper) {
    if (backward) s.delta = take(HopperRowTermsFloats(call.count, call.group.heads, call.rows) * 4);
    return s;
  }
  if (backward) {
    s.delta = take(rows * 4);
    if (use_cudnn) s.dq_accum = take(rows * head_dim * 4);
    if (role == CallRole::kMerge) s.tile = take(3 * rows * head_dim * esize);
    if (use_cudnn && scaled_out) s.out_tile = take(rows * head_dim * esize);
  } else if (role == CallRole::kMerge) {
    s.tile = take(rows * head_dim * esize);
  }
  if (use_cudnn && library_bytes > 0) s.library = take(library_bytes);
  return s;
}

int64_t ModeledLibraryWorkspace(const BlockCall& call, bool backward, int64_t head_dim) {
  // Every forward and backward plan cuDNN 9.19 built on an H100 for D = 8..256, both modes, causal
  // or not, N up to 9.4M, asked for 256 bytes (docs/PERFORMANCE_HISTORY.md, "Memory planner"); the
  // backend uses the real figure and the planner this one.
  (void)call;
  (void)backward;
  (void)head_dim;
  return 256;
}

int64_t DefaultWorkspaceLimit(const ProblemDims& dims, DType dtype, bool backward,
                              bool hopper_backward) {
  const long double tensor = static_cast<long double>(dims.batch) * dims.seq_len * dims.num_heads *
                             dims.head_dim * DTypeSize(dtype);
  const long double five_percent = tensor * 0.05L;
  const int64_t floor = !backward         ? int64_t{4} << 20
                        : hopper_backward ? int64_t{1} << 20
                                          : int64_t{256} << 20;
  if (five_percent >= static_cast<long double>(std::numeric_limits<int64_t>::max() / 2)) {
    return std::numeric_limits<int64_t>::max() / 2;
  }
  return std::max(floor, static_cast<int64_t>(five_percent));
}

namespace {

// How PlanBlockCalls cuts a pass, decided once from the spec and the inputs (CountPlannedCalls
// decides it the same way).
struct Chunking {
  int direct_pattern = -1;  // CallPlan::direct_pattern.
  bool scaled_out = false;
  bool overlap = false;    // Calls overlap: two scratch slots.
  int64_t call_limit = 0;  // Scratch bytes one call may take.
};

Chunking ChunkingOf(const AttentionSpec& spec, const ProblemDims& dims, const PlanInputs& in) {
  Chunking k;
  // Mixture: the pattern covering the most (row, head) pairs writes directly.
  if (spec.mode == AttentionMode::kMixture) {
    std::vector<int64_t> covered(spec.num_patterns(), 0);
    ForEachBlockCall(spec, dims, in.fold_batches, [&](const BlockCall& c, int64_t copies) {
      covered[c.pattern] += copies * CoveredRows(c);
    });
    k.direct_pattern = 0;
    for (int i = 1; i < spec.num_patterns(); ++i) {
      if (covered[i] > covered[k.direct_pattern]) k.direct_pattern = i;
    }
  }
  const int64_t limit = in.workspace_limit > 0
                            ? in.workspace_limit
                            : DefaultWorkspaceLimit(dims, in.dtype, in.backward, in.hopper);
  k.scaled_out = NeedsScaledOut(spec, in.backward, in.use_cudnn);
  // Overlapping calls take two scratch slots, each within half the limit.
  k.overlap = in.overlap_calls && in.hopper;
  k.call_limit = k.overlap ? std::max<int64_t>(1, limit / 2) : limit;
  return k;
}

CallRole RoleOf(const AttentionSpec& spec, const Chunking& k, const BlockCall& c) {
  return spec.mode == AttentionMode::kGrouped || c.pattern == k.direct_pattern ? CallRole::kDirect
                                                                               : CallRole::kMerge;
}

// Blocks per planned call: what fits the call limit and, for cuDNN, 2^31 elements of span.
int64_t ChunkOf(const BlockCall& c, CallRole role, const Chunking& k, const PlanInputs& in,
                const ProblemDims& dims) {
  const int64_t per_block =
      std::max<int64_t>(1, BytesPerBlock(c, role, in, dims.head_dim, k.scaled_out));
  int64_t chunk = std::max<int64_t>(1, k.call_limit / per_block);
  if (in.use_cudnn) {
    const int64_t block_span = c.block_step * dims.num_heads * dims.head_dim;
    chunk =
        std::min(chunk, std::max<int64_t>(1, kMaxSpanElements / std::max<int64_t>(1, block_span)));
  }
  return chunk;
}

}  // namespace

int64_t CountPlannedCalls(const AttentionSpec& spec, const ProblemDims& dims,
                          const PlanInputs& in) {
  const Chunking k = ChunkingOf(spec, dims, in);
  constexpr int64_t kSaturated = std::numeric_limits<int64_t>::max() / 2;
  int64_t count = 0;
  ForEachBlockCall(spec, dims, in.fold_batches, [&](const BlockCall& c, int64_t copies) {
    const int64_t chunk = ChunkOf(c, RoleOf(spec, k, c), k, in, dims);
    // copies x pieces <= B x N (copies > 1 only for per-batch-item calls of N / w blocks).
    count = std::min(kSaturated, count + copies * ((c.count + chunk - 1) / chunk));
  });
  return count;
}

CallPlan PlanBlockCalls(const AttentionSpec& spec, const ProblemDims& dims, const PlanInputs& in) {
  CallPlan plan;
  const std::vector<BlockCall> all = EnumerateBlockCalls(spec, dims, in.fold_batches);
  const Chunking k = ChunkingOf(spec, dims, in);
  plan.direct_pattern = k.direct_pattern;
  auto emit = [&](const BlockCall& c) {
    const CallRole role = RoleOf(spec, k, c);
    const int64_t chunk = ChunkOf(c, role, k, in, dims);
    for (int64_t j0 = 0; j0 < c.count; j0 += chunk) {
      PlannedCall p;
      p.call = c;
      p.call.count = std::min(chunk, c.count - j0);
      p.call.first_flat = c.first_flat + j0 * c.block_step;
      p.role = role;
      const CallScratch s = LayoutCallScratch(
          p.call, role, in.backward, in.use_cudnn, in.dtype, dims.head_dim,
          in.use_cudnn ? ModeledLibraryWorkspace(p.call, in.backward, dims.head_dim) : 0,
          k.scaled_out, in.hopper);
      plan.slot_bytes = std::max(plan.slot_bytes, s.total);
      plan.calls.push_back(p);
    }
  };
  // The direct pattern first: the merges that follow need its result in place.
  for (const BlockCall& c : all) {
    if (plan.direct_pattern < 0 || c.pattern == plan.direct_pattern) emit(c);
  }
  if (plan.direct_pattern >= 0) {
    for (const BlockCall& c : all) {
      if (c.pattern != plan.direct_pattern) emit(c);
    }
  }
  if (k.overlap && plan.calls.size() >= 2) plan.slots = 2;
  plan.workspace_bytes = plan.slots * plan.slot_bytes;
  return plan;
}

}  // namespace cuda
}  // namespace dattn
