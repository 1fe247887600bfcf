#include "engine/rank_memory_plan.h"

#include <algorithm>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/ring/ring_geometry.h"
#include "engine/ring/ring_plan.h"

namespace dattn {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The tile sizes of engine/ring/cpu_block_kernels.cc (kTileQ, kTileK, kMaxTileElements): rows of
// one query and one key tile, capped so that a tile of rows holds at most 2^20 elements.
int64_t CpuRingTileRows(int64_t head_dim) {
  return std::max<int64_t>(1, std::min<int64_t>(128, (int64_t{1} << 20) / head_dim));
}

absl::Status Overflow(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("rank memory plan: ", what, " overflows int64"));
}

// The shard's tensors and workspace on one device, without the ring's buffers.
absl::StatusOr<MemoryPlan> PlanShard(const RankProblem& p, BackendKind backend, int cpu_threads) {
  const int64_t shard_len = p.seq_len / p.ranks;
  if (backend == BackendKind::kCuda) {
    // One rank runs the CUDA backend, whose backward runs on our Hopper kernels. A ring rank's
    // local backward calls run on them too (engine/ring/cuda_block_kernels.h), but its shared
    // segments' packed calls run on cuDNN with gathered tiles and an fp32 dQ accumulator that this
    // plan does not model; the cuDNN backward's workspace for the shard stays their bound.
    absl::StatusOr<cuda::CudaMemoryPlan> c =
        cuda::PlanCudaMemory(p.spec, p.batch, shard_len, p.num_heads, p.head_dim, p.dtype,
                             p.backward, /*workspace_limit_bytes=*/0,
                             /*hopper_kernels=*/p.ranks == 1);
    if (!c.ok()) return c.status();
    MemoryPlan plan;
    plan.inputs_bytes = c->inputs_bytes;
    plan.outputs_bytes = c->outputs_bytes;
    plan.lse_bytes = c->lse_bytes;
    plan.workspace_bytes = c->workspace_bytes;
    return plan;
  }
  const int threads = cpu_threads > 0
                          ? cpu_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  PlanOptions options;
  options.backend = BackendKind::kCpu;
  options.dtype = p.dtype;
  options.backward = p.backward;
  options.num_threads = threads;
  absl::StatusOr<MemoryPlan> plan = PlanAttentionMemory(
      p.spec, ProblemShape{p.batch, shard_len, p.num_heads, p.head_dim}, options);
  if (!plan.ok()) return plan.status();
  if (p.ranks > 1) {
    // A ring rank runs the ring's block kernels, not the single-device backend.
    const int64_t per_thread = CpuRingKernelScratchBytes(p.dtype, p.head_dim);
    if (per_thread > kMax / threads) return Overflow("ring kernel scratch");
    plan->workspace_bytes = per_thread * threads;
  }
  return plan;
}

ring::PlanOptions RingPlanOptions(BackendKind backend) {
  ring::PlanOptions options;
  options.mode = ring::ExchangeMode::kAuto;
  options.cost =
      backend == BackendKind::kCuda ? ring::CostModel::ForCuda() : ring::CostModel::ForCpu();
  return options;
}

// A rank's ring bytes from its exchange buffers' bytes in the forward and (when planned) the
// backward call, which allocate and free their own: the larger of the two, plus the agreement
// check's P + 1 fingerprints.
int64_t RankRingBytes(const RankProblem& p, int64_t forward, int64_t backward) {
  const int64_t agreement = 8 * (static_cast<int64_t>(p.ranks) + 1);
  return (p.backward ? std::max(forward, backward) : forward) + agreement;
}

// Bytes of the ring's exchange buffers on `rank`: RankRingBytes of its calls' buffers.
absl::StatusOr<int64_t> RingBytes(const RankProblem& p, int rank, BackendKind backend) {
  if (p.ranks == 1) return int64_t{0};
  ring::RingShape shape{p.batch, p.seq_len, p.num_heads, p.head_dim, p.ranks};
  absl::StatusOr<ring::RingGeometry> geo = ring::RingGeometry::Create(p.spec, shape, rank, p.dtype);
  if (!geo.ok()) return geo.status();
  const ring::PlanOptions options = RingPlanOptions(backend);
  const int64_t forward = ring::RingBufferBytes(
      *geo, /*backward=*/false, ring::ScheduledGroups(*geo, /*backward=*/false, options));
  const int64_t backward =
      p.backward ? ring::RingBufferBytes(*geo, /*backward=*/true,
                                         ring::ScheduledGroups(*geo, /*backward=*/true, options))
                 : 0;
  return RankRingBytes(p, forward, backward);
}

absl::Status CheckProblem(const RankProblem& p) {
  if (p.ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank memory plan: ring size must be >= 1, got ", p.ranks));
  }
  if (p.seq_len < 1 || p.seq_len % p.ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank memory plan: ", p.ranks, " ranks must divide the sequence length ", p.seq_len));
  }
  return absl::OkStatus();
}

}  // namespace

std::string RankMemoryPlan::DebugString() const {
  const MemoryPlan& s = shard;
  return absl::StrCat(
      "inputs ", FormatBytes(s.inputs_bytes), " + outputs ", FormatBytes(s.outputs_bytes),
      " + lse ", FormatBytes(s.lse_bytes), " + workspace ", FormatBytes(s.workspace_bytes),
      ring_bytes > 0 ? absl::StrCat(" + ring buffers ", FormatBytes(ring_bytes)) : std::string(),
      " = ", FormatBytes(total_bytes()));
}

int64_t CpuRingKernelScratchBytes(DType dtype, int64_t head_dim) {
  const int64_t d = std::max<int64_t>(1, head_dim);
  const int64_t t = CpuRingTileRows(d);
  // Scores and probabilities (2 t^2), accumulator, dQ and dO tiles (3 t d), row max and sum (2 t),
  // dK and dV tiles (2 t d), one transposition tile (t d): Scratch<T>::Size in
  // cpu_block_kernels.cc.
  const int64_t elements = 2 * t * t + 6 * t * d + 2 * t;
  return elements * static_cast<int64_t>(
                        DTypeSize(dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32));
}

absl::StatusOr<RankMemoryPlan> PlanRankMemory(const RankProblem& problem, int rank,
                                              BackendKind backend, int cpu_threads) {
  if (absl::Status s = CheckProblem(problem); !s.ok()) return s;
  if (rank < 0 || rank >= problem.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank memory plan: rank ", rank, " is outside [0, ", problem.ranks, ")"));
  }
  absl::StatusOr<MemoryPlan> shard = PlanShard(problem, backend, cpu_threads);
  if (!shard.ok()) return shard.status();
  absl::StatusOr<int64_t> ring = RingBytes(problem, rank, backend);
  if (!ring.ok()) return ring.status();
  RankMemoryPlan plan;
  plan.rank = rank;
  plan.shard = *shard;
  plan.ring_bytes = *ring;
  if (plan.shard.total_bytes() < 0 || plan.ring_bytes > kMax - plan.shard.total_bytes()) {
    return Overflow("the rank's total");
  }
  return plan;
}

absl::StatusOr<RankMemoryPlan> PlanLargestRankMemory(const RankProblem& problem,
                                                     BackendKind backend, int cpu_threads) {
  if (problem.ranks == 1) return PlanRankMemory(problem, 0, backend, cpu_threads);
  if (absl::Status s = CheckProblem(problem); !s.ok()) return s;
  // The shard part is the same on every rank; only the exchange buffers differ. The groups and
  // their schedules are the ring's, not a rank's, and each group's members' buffers are counted
  // in one pass for all ranks (ring::RingBufferBytesOfEveryRank): what RingBytes gives rank by
  // rank (PlanRankMemory).
  absl::StatusOr<MemoryPlan> shard = PlanShard(problem, backend, cpu_threads);
  if (!shard.ok()) return shard.status();
  if (shard->total_bytes() < 0) return Overflow("the rank's total");
  ring::RingShape shape{problem.batch, problem.seq_len, problem.num_heads, problem.head_dim,
                        problem.ranks};
  absl::StatusOr<ring::RingGeometry> geo =
      ring::RingGeometry::Create(problem.spec, shape, 0, problem.dtype);
  if (!geo.ok()) return geo.status();
  const ring::PlanOptions options = RingPlanOptions(backend);
  const std::vector<int64_t> forward = ring::RingBufferBytesOfEveryRank(
      *geo, /*backward=*/false, ring::ScheduledGroups(*geo, /*backward=*/false, options));
  std::vector<int64_t> backward;
  if (problem.backward) {
    backward = ring::RingBufferBytesOfEveryRank(
        *geo, /*backward=*/true, ring::ScheduledGroups(*geo, /*backward=*/true, options));
  }
  RankMemoryPlan best;
  best.shard = *shard;
  for (int r = 0; r < problem.ranks; ++r) {
    const int64_t ring = RankRingBytes(problem, forward[r], problem.backward ? backward[r] : 0);
    if (r == 0 || ring > best.ring_bytes) {  // The lowest of the largest ranks.
      if (ring > kMax - best.shard.total_bytes()) return Overflow("the rank's total");
      best.ring_bytes = ring;
      best.rank = r;
    }
  }
  return best;
}

}  // namespace dattn
