#include "engine/ring/ring_attention.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/validate.h"

namespace dattn {
namespace ring {
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

absl::Status WithContext(const absl::Status& s, const std::string& where) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

}  // namespace

RingAttention::RingAttention(comm::Communicator* comm, BlockKernels* kernels, RingOptions options)
    : comm_(comm), kernels_(kernels), options_(std::move(options)) {}

PlanOptions RingAttention::PlanOptionsFor() const {
  PlanOptions p;
  p.mode = options_.mode;
  p.cost = options_.cost.has_value()                  ? *options_.cost
           : kernels_->caps().device == Device::kCuda ? CostModel::ForCuda()
                                                      : CostModel::ForCpu();
  return p;
}

absl::StatusOr<RingGeometry> RingAttention::Geometry(const AttentionSpec& spec, int64_t seq_len,
                                                     const TensorView& q) const {
  if (comm_->device() != kernels_->caps().device) {
    return absl::FailedPreconditionError(
        absl::StrCat("ring: the ", comm_->name(), " communicator works on ",
                     DeviceName(comm_->device()), " memory but the ", kernels_->caps().name,
                     " kernels on ", DeviceName(kernels_->caps().device)));
  }
  const int p = comm_->size();
  if (q.rank() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring: q must be (B, N/P, H, D), got ", q.DebugString()));
  }
  if (seq_len < 1 || seq_len % p != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ring: sequence length N = ", seq_len,
                                                   " is not divisible by the ring size P = ", p));
  }
  if (q.shape[1] != seq_len / p) {
    return absl::InvalidArgumentError(absl::StrCat("ring: the shard holds ", q.shape[1],
                                                   " positions but N / P = ", seq_len, " / ", p,
                                                   " = ", seq_len / p));
  }
  RingShape shape{q.shape[0], seq_len, q.shape[2], q.shape[3], p};
  return RingGeometry::Create(spec, shape, comm_->rank(), q.dtype);
}

absl::StatusOr<RingPlan> RingAttention::Plan(const AttentionSpec& spec, int64_t seq_len,
                                             const TensorView& q, bool backward) const {
  absl::StatusOr<RingGeometry> geo = Geometry(spec, seq_len, q);
  if (!geo.ok()) return geo.status();
  return PlanRing(*geo, backward, PlanOptionsFor());
}

absl::Status RingAttention::CheckAgreement(const RingGeometry& geo, bool backward) {
  const AttentionSpec& spec = geo.spec();
  const RingShape& s = geo.shape();
  const double scale = spec.ScaleFor(s.head_dim);
  uint64_t scale_bits = 0;
  std::memcpy(&scale_bits, &scale, sizeof(scale));
  // The schedule of every group, not the mode: under kAuto it follows from each rank's own cost
  // model, and ranks that choose differently post sends and receives that never match. The plan is
  // rank-independent in its groups and schedules, so any difference here is a configuration one.
  const RingPlan plan = PlanRing(geo, backward, PlanOptionsFor());
  std::vector<const char*> schedules;
  schedules.reserve(plan.groups.size());
  for (const Group& g : plan.groups) schedules.push_back(ScheduleName(g.schedule));
  const std::string call = absl::StrCat(
      backward ? "bwd" : "fwd", "|", AttentionModeName(spec.mode), "|",
      HeadOffsetsName(spec.head_offsets), "|", spec.causal, "|", scale_bits, "|",
      absl::StrJoin(spec.segment_lengths, ","), "|", absl::StrJoin(spec.dilation_rates, ","), "|",
      s.batch, ",", s.seq_len, ",", s.num_heads, ",", s.head_dim, "|", DTypeName(geo.dtype()), "|",
      ExchangeModeName(options_.mode), "|schedules ", absl::StrJoin(schedules, ","));
  const uint64_t mine = Fnv1a(call);
  const int p = comm_->size();
  const int64_t bytes = 8 * (p + 1);
  absl::StatusOr<void*> dev = kernels_->Allocate(bytes);
  if (!dev.ok()) return dev.status();
  auto release = absl::MakeCleanup([&] { kernels_->Free(*dev); });
  char* base = static_cast<char*>(*dev);
  if (absl::Status st = kernels_->Upload(base, &mine, 8); !st.ok()) return st;
  if (absl::Status st = comm_->AllGather(base, base + 8, 1, DType::kFloat64, kernels_->stream());
      !st.ok()) {
    return st;
  }
  // The communicator waits for the all-gather (NCCL: with its deadline, breaking itself if a peer
  // is gone, so that the survivors can shrink) before the kernels copy the result back.
  if (absl::Status st = comm_->Synchronize(kernels_->stream()); !st.ok()) return st;
  std::vector<uint64_t> all(p);
  if (absl::Status st = kernels_->Download(all.data(), base + 8, 8 * p); !st.ok()) return st;
  for (int r = 0; r < p; ++r) {
    if (all[r] != mine) {
      return absl::FailedPreconditionError(
          absl::StrCat("ring: rank ", r, " called with different arguments than rank ",
                       comm_->rank(), " (this rank: ", call, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status RingAttention::Run(
    const RingGeometry& geo, const RingPlan& plan, const TensorView& k, const TensorView& v,
    const std::function<absl::Status(absl::Span<const BlockTask>)>& compute,
    const BackwardArgs* backward_args) {
  std::vector<void*> buffers(plan.buffers.size(), nullptr);
  auto release = absl::MakeCleanup([&] {
    for (void* b : buffers) kernels_->Free(b);
  });
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    absl::StatusOr<void*> b =
        kernels_->Allocate(plan.buffers[i].elements * ElementBytes(geo, plan.buffers[i].kind));
    if (!b.ok()) return b.status();
    buffers[i] = *b;
  }
  for (const PackStep& pack : plan.packs) {
    const Group& g = plan.groups[pack.group];
    if (absl::Status s = kernels_->PackKv(geo, g.pattern, g.segment, k, v, buffers[pack.buffer]);
        !s.ok()) {
      return s;
    }
  }
  const DType kv_type = geo.dtype(), dkv_type = geo.dkv_dtype();
  std::vector<comm::P2POp> ops;
  std::vector<BlockTask> tasks;
  for (size_t s = 0; s < plan.phases.size(); ++s) {
    const Phase& phase = plan.phases[s];
    const std::string where =
        absl::StrCat("ring ", plan.backward ? "backward" : "forward", " on rank ", geo.rank(),
                     " of ", geo.ranks(), ", phase ", s, " of ", plan.phases.size());
    ops.clear();
    for (const Transfer& t : phase.transfers) {
      const DType type = t.kind == BufferKind::kKv ? kv_type : dkv_type;
      ops.push_back(t.send ? comm::P2POp::Send(t.peer, buffers[t.buffer], t.elements, type)
                           : comm::P2POp::Recv(t.peer, buffers[t.buffer], t.elements, type));
    }
    std::unique_ptr<comm::Work> work;
    if (!ops.empty()) {
      absl::StatusOr<std::unique_ptr<comm::Work>> w = comm_->StartGroup(ops, kernels_->stream());
      if (!w.ok()) return WithContext(w.status(), where);
      work = std::move(*w);
    }
    if (options_.phase_hook) options_.phase_hook(static_cast<int>(s));
    tasks.clear();
    for (const ComputeStep& c : phase.computes) {
      BlockTask t;
      t.pattern = c.pattern;
      t.segment_begin = c.segment_begin;
      t.segment_end = c.segment_end;
      t.origin = c.origin;
      t.kv = c.kv_buffer < 0 ? nullptr : buffers[c.kv_buffer];
      t.dkv = c.dkv_buffer < 0 ? nullptr : buffers[c.dkv_buffer];
      t.zero_dkv = c.zero_dkv;
      tasks.push_back(t);
    }
    // The transfers progress while the phase's blocks are computed; both finish before the next
    // phase reuses any buffer.
    const absl::Status computed = tasks.empty() ? absl::OkStatus() : compute(tasks);
    const absl::Status moved = work ? work->Wait(kernels_->stream()) : absl::OkStatus();
    if (!moved.ok()) return WithContext(moved, where);
    if (!computed.ok()) return WithContext(computed, where);
    if (backward_args == nullptr) continue;
    for (const AddStep& a : phase.adds) {
      const Group& g = plan.groups[a.group];
      absl::Status st =
          a.dst_buffer < 0
              ? kernels_->AddPackedToOwn(geo, g.pattern, g.segment, buffers[a.src_buffer],
                                         *backward_args)
              : kernels_->AddPacked(buffers[a.dst_buffer], buffers[a.src_buffer],
                                    geo.BlockElements(g.pattern, g.segment, a.origin), geo);
      if (!st.ok()) return WithContext(st, where);
    }
  }
  return absl::OkStatus();
}

absl::Status RingAttention::Forward(const AttentionSpec& spec, int64_t seq_len,
                                    const ForwardArgs& shard) {
  if (absl::Status s = ValidateForward(spec, shard, kernels_->caps()); !s.ok()) return s;
  absl::StatusOr<RingGeometry> geo = Geometry(spec, seq_len, shard.q);
  if (!geo.ok()) return geo.status();
  if (options_.check_agreement) {
    if (absl::Status s = CheckAgreement(*geo, false); !s.ok()) {
      return WithContext(s, absl::StrCat("ring forward on rank ", geo->rank(), " of ", geo->ranks(),
                                         ", agreement check"));
    }
  }
  const RingPlan plan = PlanRing(*geo, false, PlanOptionsFor());
  if (absl::Status s = kernels_->BeginForward(*geo, shard); !s.ok()) return s;
  absl::Status s = Run(
      *geo, plan, shard.k, shard.v,
      [&](absl::Span<const BlockTask> tasks) { return kernels_->Forward(*geo, shard, tasks); },
      nullptr);
  if (s.ok()) s = kernels_->EndForward(*geo, shard);
  const absl::Status synced = comm_->Synchronize(kernels_->stream());
  return s.ok() ? WithContext(synced, "ring forward") : s;
}

absl::Status RingAttention::Backward(const AttentionSpec& spec, int64_t seq_len,
                                     const BackwardArgs& shard) {
  if (absl::Status s = ValidateBackward(spec, shard, kernels_->caps()); !s.ok()) return s;
  absl::StatusOr<RingGeometry> geo = Geometry(spec, seq_len, shard.q);
  if (!geo.ok()) return geo.status();
  if (options_.check_agreement) {
    if (absl::Status s = CheckAgreement(*geo, true); !s.ok()) {
      return WithContext(s, absl::StrCat("ring backward on rank ", geo->rank(), " of ",
                                         geo->ranks(), ", agreement check"));
    }
  }
  const RingPlan plan = PlanRing(*geo, true, PlanOptionsFor());
  if (absl::Status s = kernels_->BeginBackward(*geo, shard); !s.ok()) return s;
  absl::Status s = Run(
      *geo, plan, shard.k, shard.v,
      [&](absl::Span<const BlockTask> tasks) { return kernels_->Backward(*geo, shard, tasks); },
      &shard);
  const absl::Status synced = comm_->Synchronize(kernels_->stream());
  return s.ok() ? WithContext(synced, "ring backward") : s;
}

}  // namespace ring
}  // namespace dattn
