// How the CUDA backend cuts one dilated-attention call into batched attentions over strided views.
//
// For pattern i (segment length w, rate r) and a set of heads that share one offset o, the selected
// rows of every full segment form one "block" of S = SelectedCount(w, o, r) rows; all full segments
// (of every batch item, when the layout allows) are folded into one batch dimension with a constant
// stride, and the partial last segments of all batch items form one more call. Each such batched
// attention is a BlockCall: fused attention (cuDNN) or our own kernel reads the rows in place
// through the strides, never gathering them. The plan also fixes the order of the calls, which
// calls write the outputs directly and which go through scratch, and the scratch each call needs:
// the memory planner and the backend use the same plan, so the planned workspace is what the
// backend allocates.
//
// Everything here is host-only arithmetic on the spec and the shape (no CUDA): pure functions,
// thread-safe, unit-tested without a GPU.
#ifndef DATTN_ENGINE_CUDA_BLOCK_CALLS_H_
#define DATTN_ENGINE_CUDA_BLOCK_CALLS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/attention_spec.h"
#include "engine/tensor.h"

namespace dattn {
namespace cuda {

struct ProblemDims {
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
};

// Heads that use one pattern with one offset: head0, head0 + head_step, ... (`heads` of them).
struct HeadGroup {
  int64_t offset = 0;
  int64_t head0 = 0;
  int64_t heads = 0;
  int64_t head_step = 1;
};

// The head groups of pattern `pattern`: grouped mode, the pattern's own group (offset i mod r_i);
// mixture mode, one group per distinct offset (modulo: heads o, o+r, ...; blocked: a contiguous
// run).
std::vector<HeadGroup> PatternHeadGroups(const AttentionSpec& spec, int pattern, int64_t num_heads);

// `count` blocks of `rows` selected rows each, for the heads of `group`. Block j's first selected
// row is at flat position first_flat + j * block_step (flat = b * N + p); row s of a block is
// `rate` positions after row s - 1. steps_batches: block j is batch item b0 + j at the same
// in-batch position (the partial-segment call; block_step == N). Otherwise blocks are consecutive
// segments, possibly running on into the next batch item, which is only planned when every tensor's
// batch stride equals N times its position stride.
struct BlockCall {
  int pattern = 0;
  int64_t segment = 0;  // w
  int64_t rate = 1;     // r
  HeadGroup group;
  int64_t rows = 0;
  int64_t count = 0;
  int64_t first_flat = 0;
  int64_t block_step = 0;
  bool steps_batches = false;

  std::string DebugString() const;
};

// Element offsets of a call's view into one (B, N, H, D) tensor with element strides (sb, sn, sh):
// element (j, k, s, d) of the call is at base + j * fold + k * head + s * seq + d * (channel
// stride).
struct CallView {
  int64_t base = 0;
  int64_t fold = 0;
  int64_t head = 0;
  int64_t seq = 0;
};
CallView ViewOf(const BlockCall& call, int64_t seq_len, int64_t sb, int64_t sn, int64_t sh);
// The same in row units of a contiguous (B, N, H) row space (row = (b * N + p) * H + h).
CallView RowViewOf(const BlockCall& call, const ProblemDims& dims);

// How many calls EnumerateBlockCalls returns, counted without building them (O(patterns x head
// groups)). A partial last segment unfolds the batch into one call per batch item and pattern
// head group, so the count can reach B x 64 x min(r, H): the memory plan refuses a problem above
// kMaxBlockCalls instead of building millions of calls (a 4M-item batch once asked the
// coordinator for 13 GB here).
inline constexpr int64_t kMaxBlockCalls = int64_t{1} << 18;
int64_t CountBlockCalls(const AttentionSpec& spec, const ProblemDims& dims, bool fold_batches);

// Every block call of the spec, pattern by pattern (no chunking, no ordering beyond that).
// fold_batches: whether full segments of different batch items may share one call.
std::vector<BlockCall> EnumerateBlockCalls(const AttentionSpec& spec, const ProblemDims& dims,
                                           bool fold_batches);

// What a call does with its result.
enum class CallRole {
  kDirect,  // Writes out (forward) or dq/dk/dv (backward) in place through strided views.
  kMerge,   // Writes a packed scratch tile that a kernel merges (forward, mixture) or adds
            // (backward).
};

// Byte offsets of one call's scratch inside the call workspace (each part 256-byte aligned).
struct CallScratch {
  int64_t stats = -1;  // fp32 [count, heads, rows]: forward stats, or the gathered lse (backward)
  int64_t delta = -1;  // fp32 [count, heads, rows]: backward row sums (own kernel), or cuDNN's
                       // softmax_sum tensor
  int64_t dq_accum = -1;  // fp32 [count, heads, rows, D]: cuDNN backward dQ accumulator
  int64_t tile = -1;      // io dtype [count, heads, rows, D] (forward merge) or three of them
                          // (dq, dk, dv; backward merge)
  int64_t out_tile = -1;  // io dtype [count, heads, rows, D]: G * out rows for cuDNN's backward in
                          // grouped mode (its row sums must see A, not A / G)
  int64_t library = -1;   // cuDNN plan workspace
  int64_t total = 0;
};

// Layout of the scratch of one call. library_bytes: the cuDNN plan's own workspace (0 for our
// kernel). scaled_out: a cuDNN backward call of grouped mode with G > 1 (needs out_tile).
// hopper: a call of our own Hopper kernels, whose merge calls combine into the outputs in place
// (no tile): forward (hopper_attention.h), the stats only (a merge call's hold the rows' lse so
// far); backward (hopper_backward.h), the gathered lse and its row terms (delta,
// HopperRowTermsFloats).
CallScratch LayoutCallScratch(const BlockCall& call, CallRole role, bool backward, bool use_cudnn,
                              DType dtype, int64_t head_dim, int64_t library_bytes,
                              bool scaled_out = false, bool hopper = false);

// Whether cuDNN backward calls of this spec need the G * out tile.
bool NeedsScaledOut(const AttentionSpec& spec, bool backward, bool use_cudnn);

// The planned library workspace the memory planner assumes for a cuDNN plan of this call (the
// backend uses the real figure, queried from the plan). Calibrated on an H100 with cuDNN 9.19: see
// docs/PERFORMANCE_HISTORY.md, "Memory planner".
int64_t ModeledLibraryWorkspace(const BlockCall& call, bool backward, int64_t head_dim);

struct PlanInputs {
  DType dtype = DType::kBFloat16;
  bool backward = false;
  bool use_cudnn = true;        // cuDNN fused attention (16-bit types only) vs our own kernel.
  bool fold_batches = true;     // see EnumerateBlockCalls
  int64_t workspace_limit = 0;  // bytes a call's scratch may use; 0: DefaultWorkspaceLimit
  // The calls run on our own Hopper kernels (see LayoutCallScratch); the backend still falls back
  // per call where a kernel cannot read a view, growing the workspace if need be.
  bool hopper = false;
  // Calls on our Hopper kernels: consecutive calls run on two streams, each with its own scratch
  // slot within half the workspace limit, so that one call's kernels fill the SMs the other's tail
  // leaves idle (CudaBackendOptions::overlap_calls).
  bool overlap_calls = false;
};

struct PlannedCall {
  BlockCall call;
  CallRole role = CallRole::kDirect;
};

struct CallPlan {
  std::vector<PlannedCall> calls;  // in execution order
  // Mixture mode: the pattern whose calls write the outputs directly (it covers the most rows); the
  // rows it does not select are cleared first and the other patterns are merged in. Grouped: -1.
  int direct_pattern = -1;
  // The largest scratch any call needs with the modeled library workspace (a multiple of 256).
  int64_t slot_bytes = 0;
  // Scratch slots the calls take in turn: 2 where calls overlap (PlanInputs::overlap_calls and
  // hopper, two calls or more), else 1.
  int slots = 1;
  // slots x slot_bytes: what the memory planner reports as workspace and the backend allocates up
  // front (growing the slots if a real plan needs more).
  int64_t workspace_bytes = 0;
};

// max(5% of one (B, N, H, D) input tensor, 4 MiB) forward (mixture mode's merge tiles: at
// N = 2^16 the 5% cut cost 1-2% against a 32 MiB one on an H100); max(5%, 256 MiB) backward on
// cuDNN (its fp32 dQ accumulator: cut finer, its calls get too small to fill the GPU);
// max(5%, 1 MiB) backward on our Hopper kernels (two floats per row: cutting costs a launch per
// 80 000 rows).
int64_t DefaultWorkspaceLimit(const ProblemDims& dims, DType dtype, bool backward,
                              bool hopper_backward = false);

// The calls of one forward or backward pass, chunked so that each call's scratch fits the limit
// (a single block may still exceed it) and, for cuDNN, so that no call spans 2^31 elements.
CallPlan PlanBlockCalls(const AttentionSpec& spec, const ProblemDims& dims, const PlanInputs& in);

// How many calls PlanBlockCalls returns (plan.calls.size()), counted without building them
// (O(block calls)); saturates far above kMaxBlockCalls. The chunking multiplies the block calls:
// tiny segments over a huge N cut into chunks of 2^31 elements once asked for tens of millions of
// calls (2 GB), so the memory plan refuses a pass of more than kMaxBlockCalls planned calls too.
int64_t CountPlannedCalls(const AttentionSpec& spec, const ProblemDims& dims, const PlanInputs& in);

// Whether in-batch position p is a selected row of pattern (w, r) with offset o.
inline bool IsSelected(int64_t p, int64_t w, int64_t r, int64_t o) {
  const int64_t local = p % w;
  return local >= o && (local - o) % r == 0;
}

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_BLOCK_CALLS_H_
