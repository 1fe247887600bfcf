#include "engine/ring/ring_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {
namespace ring {

const char* ExchangeModeName(ExchangeMode mode) {
  switch (mode) {
    case ExchangeMode::kAuto:
      return "auto";
    case ExchangeMode::kRing:
      return "ring";
    case ExchangeMode::kAllGather:
      return "allgather";
  }
  return "unknown";
}

const char* ScheduleName(Schedule schedule) {
  switch (schedule) {
    case Schedule::kRing:
      return "ring";
    case Schedule::kShift:
      return "shift";
    case Schedule::kAllGather:
      return "allgather";
  }
  return "unknown";
}

CostModel CostModel::ForCpu() {
  CostModel c;
  // Measured on the 2-core dev machine (docs/RING.md): a small Gloo exchange over loopback takes
  // 35-60 us when the machine is quiet, 16 MiB moves at 1.2-1.9 GB/s, and one fp32 block of
  // 1024 x 1024 rows (D = 64) runs at 19 GFLOP/s on one core.
  c.latency_s = 60e-6;
  c.bandwidth_bytes_per_s = 1.5e9;
  c.flops_per_s = 20e9;
  return c;
}

CostModel CostModel::ForCuda() {
  CostModel c;
  // Estimates for H100 SXM over NVLink, not yet measured here: NCCL p2p launch and handshake,
  // the one-direction bandwidth NCCL p2p reaches, bf16 fused attention (docs/RING.md).
  c.latency_s = 15e-6;
  c.bandwidth_bytes_per_s = 150e9;
  c.flops_per_s = 300e12;
  c.allgather_memory_limit = int64_t{2} << 30;
  return c;
}

int64_t ElementBytes(const RingGeometry& geo, BufferKind kind) {
  return static_cast<int64_t>(DTypeSize(kind == BufferKind::kKv ? geo.dtype() : geo.dkv_dtype()));
}

namespace {

// BlockElements of `rank`, a member of `g` (FindGroups keeps them beside the members).
int64_t MemberElements(const Group& g, int rank) {
  const auto it = std::lower_bound(g.members.begin(), g.members.end(), rank);
  return g.block_elements[static_cast<size_t>(it - g.members.begin())];
}

// Every group of the call: the segments crossing a shard boundary whose selected rows lie in two or
// more shards. Each boundary is crossed by at most one segment per pattern.
std::vector<Group> FindGroups(const RingGeometry& geo) {
  std::vector<Group> groups;
  const int64_t l = geo.shard_len();
  for (int i = 0; i < geo.num_patterns(); ++i) {
    const int64_t w = geo.pattern(i).w;
    int64_t last = -1;
    for (int b = 1; b < geo.ranks(); ++b) {
      const int64_t boundary = b * l;
      if (boundary % w == 0) continue;  // A segment starts here: nothing crosses.
      const int64_t m = boundary / w;
      if (m == last) continue;  // Spans several boundaries: already listed.
      last = m;
      Group g;
      g.pattern = i;
      g.segment = m;
      g.members = geo.Members(i, m);
      if (g.members.size() < 2) continue;
      for (int q : g.members) {
        g.block_elements.push_back(geo.BlockElements(i, m, q));
        g.max_block_elements = std::max(g.max_block_elements, g.block_elements.back());
      }
      groups.push_back(std::move(g));
    }
  }
  return groups;
}

void ChooseSchedule(const RingGeometry& geo, bool backward, const PlanOptions& options, Group* g) {
  const CostModel& c = options.cost;
  const RingGeometry::Pattern& p = geo.pattern(g->pattern);
  const bool causal = geo.spec().causal;
  int64_t rows = 0;  // Most rows one head has in one chunk.
  for (int q : g->members) rows = std::max(rows, geo.MaxHeadRows(g->pattern, g->segment, q));
  const double n = static_cast<double>(g->members.size());
  double block_flops =
      4.0 * geo.shape().batch * p.heads.size() * double(rows) * double(rows) * geo.shape().head_dim;
  if (backward) block_flops *= 2.5;
  const double compute = block_flops / c.flops_per_s;
  const double diagonal = causal ? compute / 2 : compute;
  const double kv_bytes = double(g->max_block_elements) * ElementBytes(geo, BufferKind::kKv);
  const double dkv_bytes =
      backward ? double(g->max_block_elements) * ElementBytes(geo, BufferKind::kDkv) : 0.0;
  const double per_step =
      c.latency_s * (backward ? 2 : 1) + (kv_bytes + dkv_bytes) / c.bandwidth_bytes_per_s;
  g->ring_seconds = diagonal + (n - 1) * std::max(compute, per_step);
  g->allgather_seconds =
      std::max(diagonal, c.latency_s + (n - 1) * kv_bytes / c.bandwidth_bytes_per_s) +
      (n - 1) * compute +
      (backward ? c.latency_s + (n - 1) * dkv_bytes / c.bandwidth_bytes_per_s : 0.0);
  const double allgather_memory = (n - 1) * (kv_bytes + 2 * dkv_bytes);
  bool allgather = false;
  switch (options.mode) {
    case ExchangeMode::kRing:
      allgather = false;
      break;
    case ExchangeMode::kAllGather:
      allgather = true;
      break;
    case ExchangeMode::kAuto:
      allgather = g->allgather_seconds < g->ring_seconds &&
                  allgather_memory <= static_cast<double>(c.allgather_memory_limit);
      break;
  }
  g->schedule = allgather ? Schedule::kAllGather : causal ? Schedule::kShift : Schedule::kRing;
}

// Builds one rank's part of each group into `plan`: with `record`, its packs, buffers, transfers,
// computes and adds; without, only the bytes of its buffers are counted (buffer_bytes(); `plan` may
// be null): what the memory planner needs (RingBufferBytes), at a fraction of the cost, from the
// same code.
class Builder {
 public:
  Builder(const RingGeometry& geo, const std::vector<Group>& groups, RingPlan* plan, bool record)
      : geo_(geo), groups_(groups), plan_(plan), record_(record) {}

  // Bytes of the buffers made so far.
  int64_t buffer_bytes() const { return buffer_bytes_; }
  void ResetBufferBytes() { buffer_bytes_ = 0; }

  Phase& At(size_t s) {
    if (plan_->phases.size() <= s) plan_->phases.resize(s + 1);
    return plan_->phases[s];
  }

  // The new buffer's index in the plan (-1 without `record`).
  int NewBuffer(BufferKind kind, int64_t elements, int group) {
    buffer_bytes_ += elements * ElementBytes(geo_, kind);
    if (!record_) return -1;
    plan_->buffers.push_back({kind, elements, group});
    return static_cast<int>(plan_->buffers.size()) - 1;
  }

  void Move(size_t phase, bool send, int peer, int buffer, BufferKind kind, int group, int origin) {
    if (!record_) return;
    const Group& g = groups_[group];
    Transfer t;
    t.send = send;
    t.peer = peer;
    t.buffer = buffer;
    t.kind = kind;
    t.group = group;
    t.origin = origin;
    t.elements = MemberElements(g, origin);
    At(phase).transfers.push_back(t);
  }

  void Compute(size_t phase, int group, int origin, int kv, int dkv, bool zero) {
    if (!record_) return;
    const Group& g = groups_[group];
    ComputeStep c;
    c.group = group;
    c.pattern = g.pattern;
    c.segment_begin = g.segment;
    c.segment_end = g.segment + 1;
    c.origin = origin;
    c.kv_buffer = kv;
    c.dkv_buffer = dkv;
    c.zero_dkv = zero;
    At(phase).computes.push_back(c);
  }

  void Add(size_t phase, int group, int dst, int src, int origin) {
    if (!record_) return;
    At(phase).adds.push_back({group, dst, src, origin});
  }

  // The part of one group of its member `self` (a rank of the ring; the geometry's own rank when
  // building a plan), member index a of n.
  void AddGroup(int gi, bool backward, int self) {
    const Group& g = groups_[gi];
    const std::vector<int>& m = g.members;
    const int n = static_cast<int>(m.size());
    const int a = static_cast<int>(std::lower_bound(m.begin(), m.end(), self) - m.begin());
    const int64_t own_elements = g.block_elements[a];
    auto member = [&](int i) { return m[((i % n) + n) % n]; };
    const bool causal = geo_.spec().causal;
    const BufferKind kKv = BufferKind::kKv, kDkv = BufferKind::kDkv;

    // Only members that have someone to send to need their block packed.
    const bool sends_own = !causal || a + 1 < n;
    int own = -1;
    if (sends_own) {
      own = NewBuffer(kKv, own_elements, gi);
      if (record_) plan_->packs.push_back({gi, own});
    }

    if (g.schedule == Schedule::kAllGather) {
      for (int j = 0; j < n; ++j) {
        if (j == a) continue;
        if (!causal || j > a) {
          Move(0, true, m[j], own, kKv, gi, self);
          if (backward) {
            const int back = NewBuffer(kDkv, own_elements, gi);
            Move(2, false, m[j], back, kDkv, gi, self);
            Add(2, gi, -1, back, self);
          }
        }
      }
      for (int j = 0; j < n; ++j) {
        if (j == a || (causal && j > a)) continue;
        const int64_t e = g.block_elements[j];
        const int kv = NewBuffer(kKv, e, gi);
        Move(0, false, m[j], kv, kKv, gi, m[j]);
        if (backward) {
          const int part = NewBuffer(kDkv, e, gi);
          Compute(1, gi, m[j], kv, part, true);
          Move(2, true, m[j], part, kDkv, gi, m[j]);
        } else {
          Compute(1, gi, m[j], kv, -1, false);
        }
      }
      Compute(0, gi, self, -1, -1, false);
      return;
    }

    const int64_t slot_elements = g.max_block_elements;
    const int kv[2] = {NewBuffer(kKv, slot_elements, gi), NewBuffer(kKv, slot_elements, gi)};
    Compute(0, gi, self, -1, -1, false);

    if (g.schedule == Schedule::kRing) {
      for (int s = 0; s + 1 < n; ++s) {
        Move(s, true, member(a + 1), s == 0 ? own : kv[(s - 1) % 2], kKv, gi, member(a - s));
        Move(s, false, member(a - 1), kv[s % 2], kKv, gi, member(a - s - 1));
      }
      if (!backward) {
        for (int s = 1; s < n; ++s) Compute(s, gi, member(a - s), kv[(s - 1) % 2], -1, false);
        return;
      }
      const int acc[2] = {NewBuffer(kDkv, slot_elements, gi), NewBuffer(kDkv, slot_elements, gi)};
      const int partial = n > 2 ? NewBuffer(kDkv, slot_elements, gi) : -1;
      for (int s = 1; s < n; ++s) {
        // The first holder starts the accumulator; later ones add to what arrives this phase.
        if (s == 1) {
          Compute(s, gi, member(a - s), kv[(s - 1) % 2], acc[1], true);
        } else {
          Compute(s, gi, member(a - s), kv[(s - 1) % 2], partial, true);
          Add(s, gi, acc[s % 2], partial, member(a - s));
        }
      }
      for (int s = 2; s <= n; ++s) {
        Move(s, true, member(a + 1), acc[(s - 1) % 2], kDkv, gi, member(a - s + 1));
        Move(s, false, member(a - 1), acc[s % 2], kDkv, gi, member(a - s));
      }
      Add(n, gi, -1, acc[n % 2], self);
      return;
    }

    // kShift (causal).
    for (int s = 0; s + 1 < n; ++s) {
      if (a + s + 1 < n) Move(s, true, m[a + s + 1], own, kKv, gi, self);
      if (a - s - 1 >= 0) Move(s, false, m[a - s - 1], kv[s % 2], kKv, gi, m[a - s - 1]);
    }
    int part[2] = {-1, -1};
    int back = -1;
    if (backward) {
      if (a >= 1) part[1] = NewBuffer(kDkv, slot_elements, gi);
      if (a >= 2) part[0] = NewBuffer(kDkv, slot_elements, gi);
      if (a + 1 < n) back = NewBuffer(kDkv, slot_elements, gi);
    }
    for (int s = 1; s <= a; ++s) {
      Compute(s, gi, m[a - s], kv[(s - 1) % 2], backward ? part[s % 2] : -1, backward);
    }
    if (!backward) return;
    for (int s = 2; s <= n; ++s) {
      // The partial for m[a - s + 1], computed last phase, goes home; ours comes from m[a + s - 1].
      if (a - (s - 1) >= 0) Move(s, true, m[a - s + 1], part[(s - 1) % 2], kDkv, gi, m[a - s + 1]);
      if (a + s - 1 < n) {
        Move(s, false, m[a + s - 1], back, kDkv, gi, self);
        Add(s, gi, -1, back, self);
      }
    }
  }

 private:
  const RingGeometry& geo_;
  const std::vector<Group>& groups_;
  RingPlan* plan_;
  const bool record_;
  int64_t buffer_bytes_ = 0;
};

// Whether this rank is a member of `g` (members ascending).
bool IsMember(const Group& g, int rank) {
  return std::binary_search(g.members.begin(), g.members.end(), rank);
}

// Segments this rank computes alone: those inside its shard, and those whose selected rows all lie
// here. Only the first and last segment touching the shard can straddle a boundary, so the local
// segments form one run [begin, end) per pattern.
std::pair<int, int64_t> Key(const Group& g) { return {g.pattern, g.segment}; }
std::pair<int, int64_t> Key(const std::pair<int, int64_t>& k) { return k; }

void AddLocalWork(const RingGeometry& geo, RingPlan* plan) {
  const int self = geo.rank();
  // A segment is this rank's alone when it lies inside its shard, or when it is not a group (at
  // most one member: FindGroups lists the others, ordered by pattern and segment) and this rank
  // has rows of it. Not Members(): that is O(P) for a spanning segment, O(P^2) over a ring.
  auto is_group = [&](int i, int64_t m) {
    return std::binary_search(plan->groups.begin(), plan->groups.end(), std::make_pair(i, m),
                              [](const auto& x, const auto& y) { return Key(x) < Key(y); });
  };
  auto local = [&](int i, int64_t m) {
    if (geo.InsideOneShard(i, m)) return true;
    return !is_group(i, m) && geo.ChunkRows(i, m, self) > 0;
  };
  for (int i = 0; i < geo.num_patterns(); ++i) {
    const int64_t first = geo.FirstSegmentOf(i, self);
    const int64_t last = geo.LastSegmentOf(i, self);
    const int64_t begin = local(i, first) ? first : first + 1;
    const int64_t end =
        first == last ? begin + (begin == first ? 1 : 0) : (local(i, last) ? last + 1 : last);
    if (begin >= end) continue;
    ComputeStep c;
    c.pattern = i;
    c.segment_begin = begin;
    c.segment_end = end;
    c.origin = self;
    plan->phases[0].computes.push_back(c);
  }
}

}  // namespace

std::vector<Group> ScheduledGroups(const RingGeometry& geo, bool backward,
                                   const PlanOptions& options) {
  std::vector<Group> groups = FindGroups(geo);
  for (Group& g : groups) ChooseSchedule(geo, backward, options, &g);
  return groups;
}

RingPlan PlanRing(const RingGeometry& geo, bool backward, const PlanOptions& options) {
  return PlanRing(geo, backward, options, ScheduledGroups(geo, backward, options));
}

RingPlan PlanRing(const RingGeometry& geo, bool backward, const PlanOptions&,
                  std::vector<Group> groups) {
  RingPlan plan;
  plan.backward = backward;
  plan.groups = std::move(groups);
  plan.phases.resize(1);
  AddLocalWork(geo, &plan);
  Builder builder(geo, plan.groups, &plan, /*record=*/true);
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    if (IsMember(plan.groups[gi], geo.rank())) {
      builder.AddGroup(static_cast<int>(gi), backward, geo.rank());
    }
  }
  plan.bytes_sent_to.assign(geo.ranks(), 0);
  plan.bytes_received_from.assign(geo.ranks(), 0);
  for (const Phase& ph : plan.phases) {
    for (const Transfer& t : ph.transfers) {
      const int64_t bytes = t.elements * ElementBytes(geo, t.kind);
      (t.send ? plan.bytes_sent : plan.bytes_received) += bytes;
      (t.send ? plan.bytes_sent_to : plan.bytes_received_from)[t.peer] += bytes;
    }
  }
  for (const BufferSpec& b : plan.buffers)
    plan.buffer_bytes += b.elements * ElementBytes(geo, b.kind);
  return plan;
}

int64_t RingBufferBytes(const RingGeometry& geo, bool backward, const std::vector<Group>& groups) {
  Builder builder(geo, groups, /*plan=*/nullptr, /*record=*/false);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    if (IsMember(groups[gi], geo.rank())) {
      builder.AddGroup(static_cast<int>(gi), backward, geo.rank());
    }
  }
  return builder.buffer_bytes();
}

std::vector<int64_t> RingBufferBytesOfEveryRank(const RingGeometry& geo, bool backward,
                                                const std::vector<Group>& groups) {
  std::vector<int64_t> bytes(static_cast<size_t>(geo.ranks()), 0);
  Builder builder(geo, groups, /*plan=*/nullptr, /*record=*/false);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (const int member : groups[gi].members) {
      builder.ResetBufferBytes();
      builder.AddGroup(static_cast<int>(gi), backward, member);
      bytes[static_cast<size_t>(member)] += builder.buffer_bytes();
    }
  }
  return bytes;
}

std::string RingPlan::DebugString() const {
  std::string out =
      absl::StrCat(backward ? "backward" : "forward", " plan: ", groups.size(), " groups, ",
                   phases.size(), " phases, sends ", bytes_sent, " B, receives ", bytes_received,
                   " B, buffers ", buffer_bytes, " B\n");
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    absl::StrAppend(&out, "  group ", i, ": pattern ", g.pattern, " segment ", g.segment,
                    " members [", absl::StrJoin(g.members, ","), "] ", ScheduleName(g.schedule),
                    " (ring ", g.ring_seconds * 1e6, " us, allgather ", g.allgather_seconds * 1e6,
                    " us)\n");
  }
  for (size_t s = 0; s < phases.size(); ++s) {
    const Phase& ph = phases[s];
    absl::StrAppend(&out, "  phase ", s, ":");
    for (const Transfer& t : ph.transfers) {
      absl::StrAppend(&out, " ", t.send ? "send" : "recv", "(g", t.group, " ",
                      t.kind == BufferKind::kKv ? "kv" : "dkv", " of ", t.origin,
                      t.send ? " to " : " from ", t.peer, ", buf ", t.buffer, ")");
    }
    for (const ComputeStep& c : ph.computes) {
      absl::StrAppend(&out, " compute(p", c.pattern, " seg ", c.segment_begin, "..", c.segment_end,
                      " kv of ", c.origin, c.kv_buffer < 0 ? " local" : "",
                      c.dkv_buffer >= 0 ? absl::StrCat(" -> buf ", c.dkv_buffer) : "", ")");
    }
    for (const AddStep& a : ph.adds) {
      absl::StrAppend(&out, " add(buf ", a.src_buffer, " -> ",
                      a.dst_buffer < 0 ? std::string("own") : absl::StrCat("buf ", a.dst_buffer),
                      ")");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace ring
}  // namespace dattn
