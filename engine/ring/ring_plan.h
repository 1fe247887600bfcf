// The ring plan: what one rank computes, sends and receives, phase by phase, for one forward or
// backward call of sequence-parallel dilated attention (docs/RING.md explains the algorithm).
//
// Segments that lie in one shard (or whose selected rows all lie in one shard) are computed
// locally, without communication. A segment whose selected rows lie in several shards forms a group
// of its member ranks; a group exchanges only the packed dilated K/V rows of its members' chunks (a
// block), on one of three schedules chosen per group:
//   kRing       non-causal: each phase every member forwards the block it holds to the next member
//               (neighbours only, two receive buffers) while computing on it. Backward: dK/dV
//               accumulators ride along with the blocks and reach their owner on the last hop.
//   kShift      causal: at phase s a member sends its own block directly s+1 members ahead; only
//               earlier members' blocks ever move, and every member sends plus receives the same
//               number of blocks (the forwarding ring would load the late ranks twice: they compute
//               the most and would also relay the most). Backward: each partial dK/dV goes straight
//               back to the block's owner one phase later.
//   kAllGather  one phase moves every needed block at once (causal: only to later members), then
//               everything is computed; backward returns every partial dK/dV in one more phase.
//               Chosen when the cost model says it is faster and its buffers fit the limit.
// The plan is a pure function of (spec, global shape, rank, dtype, options): every rank derives the
// same groups and schedules, which is what makes its sends and its peers' receives match (ops
// between two ranks are posted in the same order on both sides: phase by phase, group by group,
// blocks before dK/dV). The byte counts below are what the communicator must count for this rank.
#ifndef DATTN_ENGINE_RING_RING_PLAN_H_
#define DATTN_ENGINE_RING_RING_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ring/ring_geometry.h"

namespace dattn {
namespace ring {

enum class ExchangeMode { kAuto, kRing, kAllGather };
const char* ExchangeModeName(ExchangeMode mode);  // "auto" | "ring" | "allgather"

enum class Schedule { kRing, kShift, kAllGather };
const char* ScheduleName(Schedule schedule);  // "ring" | "shift" | "allgather"

// The figures the ring-vs-all-gather choice uses. Estimates, not measurements of the call.
struct CostModel {
  double latency_s = 50e-6;            // Per message (posting, matching, first byte).
  double bandwidth_bytes_per_s = 2e9;  // Per rank and direction.
  double flops_per_s = 20e9;           // One rank's attention FLOP rate.
  // Bytes of receive buffers all-gather may use for one group on one rank (the ring needs two).
  int64_t allgather_memory_limit = int64_t{256} << 20;

  // Defaults for CPU ranks over Gloo on one host, and for H100 ranks over NVLink (docs/RING.md).
  static CostModel ForCpu();
  static CostModel ForCuda();
};

struct PlanOptions {
  ExchangeMode mode = ExchangeMode::kAuto;
  CostModel cost;
};

// A segment whose selected rows lie in two or more shards.
struct Group {
  int pattern = 0;
  int64_t segment = 0;
  std::vector<int> members;  // Ranks, ascending.
  // BlockElements of each member (same order): the ring simulation asks for them for every step.
  std::vector<int64_t> block_elements;
  Schedule schedule = Schedule::kRing;
  int64_t max_block_elements = 0;  // Largest member block (K+V elements).
  double ring_seconds = 0;         // Cost model estimates for the group's critical path.
  double allgather_seconds = 0;
};

enum class BufferKind {
  kKv,   // Packed K+V block, elements of the input dtype.
  kDkv,  // Packed dK+dV partial sums, elements of RingGeometry::dkv_dtype().
};

struct BufferSpec {
  BufferKind kind = BufferKind::kKv;
  int64_t elements = 0;
  int group = 0;
};

// One point-to-point op of a phase. `elements` is the exact block size (it may be less than the
// buffer, which is sized for the largest block it will hold).
struct Transfer {
  bool send = true;
  int peer = 0;
  int buffer = 0;
  int64_t elements = 0;
  BufferKind kind = BufferKind::kKv;
  int group = 0;
  int origin = 0;  // Rank whose chunk the block (or partial sum) belongs to.
};

// Attention of this rank's query rows in segments [segment_begin, segment_end) of `pattern` against
// the K/V rows of `origin`'s chunk of each segment.
struct ComputeStep {
  int group = -1;  // -1: local work (no exchange).
  int pattern = 0;
  int64_t segment_begin = 0;
  int64_t segment_end = 0;
  int origin = 0;
  int kv_buffer = -1;     // -1: the rank's own K/V tensors.
  int dkv_buffer = -1;    // Backward: -1 accumulates into the rank's own dK/dV tensors.
  bool zero_dkv = false;  // Backward: clear dkv_buffer first.
};

// After the phase's transfers complete: dst += src (packed dK/dV); dst -1 means the rank's own
// dK/dV rows of the group's segment.
struct AddStep {
  int group = 0;
  int dst_buffer = -1;
  int src_buffer = 0;
  int origin = 0;  // Rank whose block the partial sums belong to (this rank when dst_buffer is -1).
};

struct Phase {
  std::vector<Transfer> transfers;  // In posting order.
  std::vector<ComputeStep> computes;
  std::vector<AddStep> adds;
};

// Packs this rank's own block of `group` into `buffer` before phase 0.
struct PackStep {
  int group = 0;
  int buffer = 0;
};

struct RingPlan {
  bool backward = false;
  std::vector<Group> groups;  // Every group of the call, on every rank alike.
  std::vector<PackStep> packs;
  std::vector<BufferSpec> buffers;
  std::vector<Phase> phases;
  // This rank's traffic in bytes (what its communicator counts as p2p bytes for the call).
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  std::vector<int64_t> bytes_sent_to;        // Indexed by rank.
  std::vector<int64_t> bytes_received_from;  // Indexed by rank.
  int64_t buffer_bytes = 0;                  // Sum of all buffers.

  // One line per group and phase, for logs and test failures.
  std::string DebugString() const;
};

// The plan of this rank (geo.rank()) for a forward (backward = false) or backward call.
RingPlan PlanRing(const RingGeometry& geo, bool backward, const PlanOptions& options);

// Every group of the call with its schedule chosen: the same for every rank of the ring (it reads
// the geometry's spec and shape, never its rank). Planning all P ranks (the largest rank's memory,
// engine/rank_memory_plan.h) computes it once instead of P times: it alone costs O(P) per rank.
std::vector<Group> ScheduledGroups(const RingGeometry& geo, bool backward,
                                   const PlanOptions& options);
// PlanRing with `groups` from ScheduledGroups of a geometry of the same ring, call and options.
RingPlan PlanRing(const RingGeometry& geo, bool backward, const PlanOptions& options,
                  std::vector<Group> groups);

// PlanRing(geo, backward, options, groups).buffer_bytes without building the plan's phases (the
// same code, counting only the buffers): O(groups x log members) and no allocation instead of
// O(transfers). The memory planner asks it for one rank (PlanRankMemory).
int64_t RingBufferBytes(const RingGeometry& geo, bool backward, const std::vector<Group>& groups);
// RingBufferBytes of every rank of the ring at once (element r: rank r's), from `geo` of any rank:
// one pass over the groups, each member's part counted once, so O(sum of the groups' sizes)
// against P geometries and P passes over every group.
std::vector<int64_t> RingBufferBytesOfEveryRank(const RingGeometry& geo, bool backward,
                                                const std::vector<Group>& groups);

// Bytes of one element of a buffer kind under `geo`.
int64_t ElementBytes(const RingGeometry& geo, BufferKind kind);

}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_RING_PLAN_H_
