// Sequence-parallel dilated attention: P ranks, each holding a contiguous shard of N/P positions of
// q, k, v, compute together the attention that one device would compute on the whole sequence; each
// rank ends with exactly its shard of out and lse (forward) and of dq, dk, dv (backward), equal to
// the single-device result on those positions within docs/ENGINE.md's tolerances.
//
// Per call the driver plans the exchange (ring_plan.h), packs this rank's blocks, and runs the plan
// phase by phase: post the phase's sends and receives on the communicator (they progress on the
// communicator's own stream or threads), compute the phase's blocks on the kernels' stream, wait
// for the transfers, fold in arrived dK/dV partial sums. Memory beyond the caller's shards is the
// plan's buffers: a few packed blocks of (N/P)/r_i rows per spanning segment
// (RingPlan::buffer_bytes).
//
// Collective contract: every rank of the communicator calls Forward (or Backward) with the same
// spec, the same global N and same-shaped shards, in the same order, and with options that lead to
// the same schedules (RingOptions::cost under kAuto). With check_agreement (the default) a small
// all-gather of a fingerprint of the call (the schedules chosen included) turns a disagreement into
// FAILED_PRECONDITION on every rank instead of a hang or a wrong answer.
//
// Errors: INVALID_ARGUMENT for the shapes and values of validate.h (on the shard) and for N not
// equal to P times the shard length (naming N and P); FAILED_PRECONDITION when the communicator's
// device and the kernels' differ or ranks disagree; the communicator's errors (UNAVAILABLE,
// DEADLINE_EXCEEDED, ABORTED, naming the peer) prefixed with the call, rank and phase. After a
// communicator error the outputs are unspecified and the communicator is broken (communicator.h);
// the caller decides whether to shrink the ring.
//
// Thread-safety: one call at a time per instance; the communicator and kernels are borrowed and
// must outlive it.
#ifndef DATTN_ENGINE_RING_RING_ATTENTION_H_
#define DATTN_ENGINE_RING_RING_ATTENTION_H_

#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/attention.h"
#include "engine/comm/communicator.h"
#include "engine/ring/block_kernels.h"
#include "engine/ring/ring_plan.h"

namespace dattn {
namespace ring {

struct RingOptions {
  ExchangeMode mode = ExchangeMode::kAuto;
  // Unset: CostModel::ForCpu() or ForCuda() after the kernels' device.
  std::optional<CostModel> cost;
  bool check_agreement = true;
  // Testing seam: called after each phase's transfers are posted, before its compute (fault tests
  // kill the process here, with transfers of its peers in flight).
  std::function<void(int phase)> phase_hook;
};

class RingAttention {
 public:
  RingAttention(comm::Communicator* comm, BlockKernels* kernels, RingOptions options = {});

  // `shard` holds this rank's (B, N/P, H, D) shards and (B, H, N/P) lse; `seq_len` is the global N.
  absl::Status Forward(const AttentionSpec& spec, int64_t seq_len, const ForwardArgs& shard);
  absl::Status Backward(const AttentionSpec& spec, int64_t seq_len, const BackwardArgs& shard);

  // The plan this rank would run for a call with these arguments (for tests, logs and the memory
  // planner). Same argument errors as the calls.
  absl::StatusOr<RingPlan> Plan(const AttentionSpec& spec, int64_t seq_len, const TensorView& q,
                                bool backward) const;

 private:
  absl::StatusOr<RingGeometry> Geometry(const AttentionSpec& spec, int64_t seq_len,
                                        const TensorView& q) const;
  PlanOptions PlanOptionsFor() const;
  absl::Status CheckAgreement(const RingGeometry& geo, bool backward);
  // Runs the plan; `compute` runs one phase's tasks, `add_own`/`add` fold partial sums.
  absl::Status Run(const RingGeometry& geo, const RingPlan& plan, const TensorView& k,
                   const TensorView& v,
                   const std::function<absl::Status(absl::Span<const BlockTask>)>& compute,
                   const BackwardArgs* backward_args);

  comm::Communicator* const comm_;
  BlockKernels* const kernels_;
  const RingOptions options_;
};

}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_RING_ATTENTION_H_
