// The ring plan, checked without any arithmetic on tensors: the plans of all P ranks are run
// together symbolically (buffers hold "which block" and "whose contributions", transfers are
// matched between ranks in posting order as a communicator matches them), and the end state must be
// exactly what the spec requires: every rank computes every block its queries need once, sees the
// right block in the buffer it reads, every partial dK/dV reaches its owner once, no buffer is
// written while it is in use, and the bytes each rank sends are the bytes its peers receive.
#include "engine/ring/ring_plan.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/attention_spec.h"
#include "gtest/gtest.h"

namespace dattn {
namespace ring {
namespace {

struct Case {
  std::vector<int64_t> w, r;
  int64_t l = 16;  // Shard length.
  int p = 4;
  int64_t heads = 4;
  AttentionMode mode = AttentionMode::kGrouped;
  bool causal = false;
};

std::string Name(const Case& c) {
  return absl::StrCat("P=", c.p, " L=", c.l, " w=[", absl::StrJoin(c.w, ","), "] r=[",
                      absl::StrJoin(c.r, ","), "] H=", c.heads, " ", AttentionModeName(c.mode),
                      c.causal ? " causal" : "");
}

AttentionSpec SpecOf(const Case& c) {
  AttentionSpec spec;
  spec.segment_lengths = c.w;
  spec.dilation_rates = c.r;
  spec.mode = c.mode;
  spec.causal = c.causal;
  return spec;
}

RingGeometry Geo(const Case& c, int rank, DType dtype = DType::kFloat32) {
  RingShape shape{2, c.l * c.p, c.heads, 8, c.p};
  absl::StatusOr<RingGeometry> g = RingGeometry::Create(SpecOf(c), shape, rank, dtype);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

// What a buffer holds during the simulation.
struct Content {
  bool valid = false;
  BufferKind kind = BufferKind::kKv;
  int group = -1;
  int origin = -1;
  std::multiset<int> contributors;  // dK/dV: ranks whose queries added to these partial sums.
};

// Simulates every rank's plan; returns failures as text (empty = all good).
std::string Simulate(const Case& c, bool backward, ExchangeMode mode) {
  const int p = c.p;
  std::vector<RingGeometry> geos;
  std::vector<RingPlan> plans;
  PlanOptions options;
  options.mode = mode;
  for (int r = 0; r < p; ++r) {
    geos.push_back(Geo(c, r));
    plans.push_back(PlanRing(geos.back(), backward, options));
  }
  std::string errors;
  auto fail = [&](const std::string& e) {
    if (errors.size() < 4000) absl::StrAppend(&errors, e, "\n");
  };
  // Every rank agrees on the groups.
  for (int r = 1; r < p; ++r) {
    if (plans[r].groups.size() != plans[0].groups.size()) fail("ranks disagree on the groups");
    for (size_t g = 0; g < std::min(plans[r].groups.size(), plans[0].groups.size()); ++g) {
      const Group& a = plans[0].groups[g];
      const Group& b = plans[r].groups[g];
      if (a.pattern != b.pattern || a.segment != b.segment || a.members != b.members ||
          a.schedule != b.schedule) {
        fail(absl::StrCat("ranks 0 and ", r, " disagree on group ", g));
      }
    }
  }
  const std::vector<Group>& groups = plans[0].groups;
  std::vector<std::vector<Content>> buffers(p);
  for (int r = 0; r < p; ++r) buffers[r].resize(plans[r].buffers.size());
  // (group, rank) -> contributions folded into the rank's own dK/dV rows of that segment.
  std::map<std::pair<int, int>, std::multiset<int>> own;
  // (group, rank) -> origins computed.
  std::map<std::pair<int, int>, std::multiset<int>> computed;
  for (int r = 0; r < p; ++r) {
    for (const PackStep& pk : plans[r].packs) {
      Content& ct = buffers[r][pk.buffer];
      ct.valid = true;
      ct.kind = BufferKind::kKv;
      ct.group = pk.group;
      ct.origin = r;
    }
  }
  size_t phases = 0;
  for (const RingPlan& pl : plans) phases = std::max(phases, pl.phases.size());
  for (size_t s = 0; s < phases; ++s) {
    // Sends read the buffers as they are when the phase starts.
    std::map<std::pair<int, int>, std::deque<std::pair<Transfer, Content>>> wire;
    for (int r = 0; r < p; ++r) {
      if (s >= plans[r].phases.size()) continue;
      const Phase& ph = plans[r].phases[s];
      std::set<int> written, read;
      for (const Transfer& t : ph.transfers) {
        if (t.send) {
          const Content& ct = buffers[r][t.buffer];
          if (!ct.valid || ct.kind != t.kind || ct.group != t.group || ct.origin != t.origin) {
            fail(absl::StrCat("phase ", s, " rank ", r, ": sends buffer ", t.buffer,
                              " which does not hold the declared block of ", t.origin));
          }
          wire[{r, t.peer}].push_back({t, ct});
          read.insert(t.buffer);
        } else {
          if (!written.insert(t.buffer).second) fail("two receives into one buffer in a phase");
        }
        if (t.elements > plans[r].buffers[t.buffer].elements) {
          fail(absl::StrCat("phase ", s, " rank ", r, ": transfer larger than its buffer"));
        }
      }
      for (const ComputeStep& cs : ph.computes) {
        if (cs.kv_buffer >= 0) read.insert(cs.kv_buffer);
        if (cs.dkv_buffer >= 0 && !written.insert(cs.dkv_buffer).second) {
          fail(absl::StrCat("phase ", s, " rank ", r, ": compute writes a buffer being received"));
        }
      }
      for (int b : read) {
        if (written.count(b)) {
          fail(absl::StrCat("phase ", s, " rank ", r, ": buffer ", b, " read and written"));
        }
      }
    }
    // Computes.
    for (int r = 0; r < p; ++r) {
      if (s >= plans[r].phases.size()) continue;
      for (const ComputeStep& cs : plans[r].phases[s].computes) {
        if (cs.group < 0) continue;
        if (cs.kv_buffer < 0) {
          if (cs.origin != r) fail("local K/V read for another rank's block");
        } else {
          const Content& ct = buffers[r][cs.kv_buffer];
          if (!ct.valid || ct.kind != BufferKind::kKv || ct.group != cs.group ||
              ct.origin != cs.origin) {
            fail(absl::StrCat("phase ", s, " rank ", r, ": computes on buffer ", cs.kv_buffer,
                              " which holds group ", ct.group, " origin ", ct.origin,
                              ", not group ", cs.group, " origin ", cs.origin));
          }
        }
        computed[{cs.group, r}].insert(cs.origin);
        if (!backward) continue;
        if (cs.dkv_buffer < 0) {
          if (cs.origin != r) fail("own dK/dV written for another rank's block");
          own[{cs.group, r}].insert(r);
        } else {
          Content& d = buffers[r][cs.dkv_buffer];
          if (cs.zero_dkv) d = Content();
          if (!cs.zero_dkv && (!d.valid || d.origin != cs.origin)) fail("accumulating into junk");
          d.valid = true;
          d.kind = BufferKind::kDkv;
          d.group = cs.group;
          d.origin = cs.origin;
          d.contributors.insert(r);
        }
      }
    }
    // Receives, matched with sends in posting order.
    for (int r = 0; r < p; ++r) {
      if (s >= plans[r].phases.size()) continue;
      for (const Transfer& t : plans[r].phases[s].transfers) {
        if (t.send) continue;
        auto& q = wire[{t.peer, r}];
        if (q.empty()) {
          fail(absl::StrCat("phase ", s, " rank ", r, ": receive from ", t.peer, " never sent"));
          continue;
        }
        auto [sent, ct] = q.front();
        q.pop_front();
        if (sent.elements != t.elements || sent.kind != t.kind || sent.group != t.group ||
            sent.origin != t.origin) {
          fail(absl::StrCat("phase ", s, ": rank ", t.peer, " -> ", r, " mismatched transfer"));
        }
        buffers[r][t.buffer] = ct;
      }
    }
    for (const auto& [key, q] : wire) {
      if (!q.empty())
        fail(
            absl::StrCat("phase ", s, ": send ", key.first, " -> ", key.second, " never received"));
    }
    // Adds after the phase's transfers.
    for (int r = 0; r < p; ++r) {
      if (s >= plans[r].phases.size()) continue;
      for (const AddStep& a : plans[r].phases[s].adds) {
        const Content src = buffers[r][a.src_buffer];
        if (!src.valid || src.kind != BufferKind::kDkv || src.group != a.group ||
            src.origin != a.origin) {
          fail(absl::StrCat("phase ", s, " rank ", r, ": adds a buffer holding the wrong sums"));
          continue;
        }
        if (a.dst_buffer < 0) {
          if (a.origin != r) fail("own dK/dV receives another rank's sums");
          own[{a.group, r}].insert(src.contributors.begin(), src.contributors.end());
        } else {
          Content& dst = buffers[r][a.dst_buffer];
          if (!dst.valid || dst.origin != src.origin) fail("adding into the wrong accumulator");
          dst.contributors.insert(src.contributors.begin(), src.contributors.end());
        }
      }
    }
  }
  // Every member computed exactly the blocks it needs; every owner got every contribution once.
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int>& m = groups[g].members;
    for (size_t a = 0; a < m.size(); ++a) {
      std::multiset<int> need, from;
      for (size_t j = 0; j < m.size(); ++j) {
        if (!c.causal || j <= a) need.insert(m[j]);
        if (!c.causal || j >= a) from.insert(m[j]);
      }
      const std::pair<int, int> key{static_cast<int>(g), m[a]};
      if (computed[key] != need) {
        fail(absl::StrCat("group ", g, " rank ", m[a], " computed {",
                          absl::StrJoin(computed[key], ","), "}, needs {", absl::StrJoin(need, ","),
                          "}"));
      }
      if (backward && own[key] != from) {
        fail(absl::StrCat("group ", g, " rank ", m[a], " got dK/dV from {",
                          absl::StrJoin(own[key], ","), "}, wants {", absl::StrJoin(from, ","),
                          "}"));
      }
    }
  }
  // Volumes: what r sends to q is what q receives from r.
  for (int r = 0; r < p; ++r) {
    for (int q = 0; q < p; ++q) {
      if (plans[r].bytes_sent_to[q] != plans[q].bytes_received_from[r]) {
        fail(absl::StrCat("bytes ", r, " -> ", q, " disagree"));
      }
    }
  }
  // Local work: each segment with selected rows is computed by exactly one rank alone, or is a
  // group.
  const RingGeometry& g0 = geos[0];
  for (int i = 0; i < g0.num_patterns(); ++i) {
    std::vector<int> count(g0.pattern(i).segments, 0);
    for (int r = 0; r < p; ++r) {
      for (const ComputeStep& cs : plans[r].phases[0].computes) {
        if (cs.group >= 0 || cs.pattern != i) continue;
        for (int64_t m = cs.segment_begin; m < cs.segment_end; ++m) {
          if (m < geos[r].FirstSegmentOf(i, r) || m > geos[r].LastSegmentOf(i, r)) {
            fail("local work outside the shard");
          }
          ++count[m];
        }
      }
    }
    for (const Group& gr : groups) {
      if (gr.pattern == i) count[gr.segment] += 100;
    }
    for (int64_t m = 0; m < g0.pattern(i).segments; ++m) {
      const bool has_rows = !g0.Members(i, m).empty();
      if (has_rows && count[m] != 1 && count[m] != 100) {
        fail(absl::StrCat("pattern ", i, " segment ", m, " covered ", count[m], " times"));
      }
    }
  }
  if (!errors.empty()) {
    for (int r = 0; r < p; ++r) absl::StrAppend(&errors, "rank ", r, " ", plans[r].DebugString());
  }
  return errors;
}

std::vector<Case> Sweep() {
  std::vector<Case> cases;
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> patterns = {
      {{8, 32, 64}, {1, 2, 4}},  // Local, spanning two and four shards.
      {{24}, {1}},               // Segments straddling boundaries: overlapping groups.
      {{8, 24, 64}, {2, 3, 4}},  // Rates that divide no segment.
      {{1000}, {1}},             // One segment longer than N.
      {{64, 48}, {20, 7}},       // Rates near or above the shard: empty chunks.
      {{12, 40}, {5, 3}},
  };
  for (int p : {1, 2, 3, 4, 5}) {
    for (const auto& [w, r] : patterns) {
      for (bool causal : {false, true}) {
        for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
          Case c;
          c.w = w;
          c.r = r;
          c.p = p;
          c.causal = causal;
          c.mode = mode;
          c.l = p == 3 ? 12 : 16;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

TEST(RingPlanTest, EveryScheduleDeliversExactlyWhatTheSpecNeeds) {
  for (const Case& c : Sweep()) {
    for (ExchangeMode mode : {ExchangeMode::kRing, ExchangeMode::kAllGather, ExchangeMode::kAuto}) {
      for (bool backward : {false, true}) {
        const std::string errors = Simulate(c, backward, mode);
        EXPECT_TRUE(errors.empty()) << Name(c) << " " << ExchangeModeName(mode)
                                    << (backward ? " backward" : " forward") << "\n"
                                    << errors;
      }
    }
  }
}

// The memory planner's shortcuts count the same buffers as the plan: every case, exchange mode,
// direction, rank and dtype (the dK/dV buffers' element size differs from the inputs' in bf16),
// rank by rank and for every rank at once (from rank 0's geometry and from the last rank's).
TEST(RingPlanTest, RingBufferBytesIsThePlansBufferBytes) {
  int checked = 0;
  for (const Case& c : Sweep()) {
    for (ExchangeMode mode : {ExchangeMode::kRing, ExchangeMode::kAllGather, ExchangeMode::kAuto}) {
      for (bool backward : {false, true}) {
        for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
          PlanOptions options;
          options.mode = mode;
          const std::vector<Group> groups = ScheduledGroups(Geo(c, 0, dtype), backward, options);
          const std::vector<int64_t> every =
              RingBufferBytesOfEveryRank(Geo(c, 0, dtype), backward, groups);
          ASSERT_EQ(every.size(), static_cast<size_t>(c.p));
          EXPECT_EQ(RingBufferBytesOfEveryRank(Geo(c, c.p - 1, dtype), backward, groups), every);
          for (int r = 0; r < c.p; ++r) {
            const RingGeometry geo = Geo(c, r, dtype);
            const RingPlan plan = PlanRing(geo, backward, options, groups);
            const std::string where =
                absl::StrCat(Name(c), " ", ExchangeModeName(mode),
                             backward ? " backward" : " forward", " rank ", r);
            EXPECT_EQ(RingBufferBytes(geo, backward, groups), plan.buffer_bytes)
                << where << "\n"
                << plan.DebugString();
            EXPECT_EQ(every[r], plan.buffer_bytes) << where;
            checked += plan.buffer_bytes > 0;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 500);  // Most of them exchange something.
}

TEST(RingPlanTest, SchedulesFollowCausalityAndMode) {
  Case c;
  c.w = {64};
  c.r = {1};
  c.p = 4;
  for (bool causal : {false, true}) {
    c.causal = causal;
    PlanOptions o;
    o.mode = ExchangeMode::kRing;
    RingPlan plan = PlanRing(Geo(c, 0), false, o);
    ASSERT_EQ(plan.groups.size(), 1u);
    EXPECT_EQ(plan.groups[0].members, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(plan.groups[0].schedule, causal ? Schedule::kShift : Schedule::kRing);
    o.mode = ExchangeMode::kAllGather;
    EXPECT_EQ(PlanRing(Geo(c, 0), false, o).groups[0].schedule, Schedule::kAllGather);
  }
}

// One segment over all of N, r = 1: non-causal, every rank sends P-1 blocks of B*H*L*D elements of
// K and of V; the backward pass moves as many dK/dV partial sums too. Causal halves it on average
// and the shift schedule spreads it evenly: every rank moves P-1 blocks in total (in + out).
TEST(RingPlanTest, VolumesMatchTheClosedForm) {
  Case c;
  c.w = {64};
  c.r = {1};
  c.p = 4;
  c.heads = 4;
  const int64_t block = 2 * 2 * c.heads * c.l * 8;  // K + V elements of one shard (B = 2, D = 8).
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const int64_t e = DTypeSize(dtype);
    for (int r = 0; r < c.p; ++r) {
      c.causal = false;
      PlanOptions o;
      o.mode = ExchangeMode::kRing;
      const RingPlan fwd = PlanRing(Geo(c, r, dtype), false, o);
      EXPECT_EQ(fwd.bytes_sent, (c.p - 1) * block * e);
      EXPECT_EQ(fwd.bytes_received, (c.p - 1) * block * e);
      EXPECT_EQ(fwd.bytes_sent_to[(r + 1) % c.p], fwd.bytes_sent);  // Neighbours only.
      const RingPlan bwd = PlanRing(Geo(c, r, dtype), true, o);
      EXPECT_EQ(bwd.bytes_sent, 2 * (c.p - 1) * block * e);
      c.causal = true;
      const RingPlan cf = PlanRing(Geo(c, r, dtype), false, o);
      EXPECT_EQ(cf.bytes_sent, (c.p - 1 - r) * block * e);  // To every later rank.
      EXPECT_EQ(cf.bytes_received, r * block * e);          // From every earlier rank.
      EXPECT_EQ(cf.bytes_sent + cf.bytes_received, (c.p - 1) * block * e);
      const RingPlan cb = PlanRing(Geo(c, r, dtype), true, o);
      EXPECT_EQ(cb.bytes_sent + cb.bytes_received, 2 * (c.p - 1) * block * e);
      // Memory: own block plus two receive buffers, whatever P.
      EXPECT_LE(cf.buffer_bytes, 3 * block * e);
    }
  }
}

// docs/ENGINE.md: a spanning segment needs only (N/P)/r selected rows per shard, whatever its
// length.
TEST(RingPlanTest, BlocksHoldOnlyTheDilatedRows) {
  Case c;
  c.w = {256};
  c.r = {4};
  c.p = 4;
  c.l = 64;
  c.heads = 2;
  c.mode = AttentionMode::kMixture;
  const RingGeometry geo = Geo(c, 1);
  for (int q = 0; q < 4; ++q) {
    for (int s = 0; s < 2; ++s) EXPECT_EQ(geo.Rows(0, 0, q, s).count(), 64 / 4);
    EXPECT_EQ(geo.BlockElements(0, 0, q), 2 * 2 * (2 * 16) * 8);
  }
  // The rows of all chunks together are the segment's selected rows, in order.
  for (int s = 0; s < 2; ++s) {
    int64_t next = 0;
    for (int q = 0; q < 4; ++q) {
      const RowRange rr = geo.Rows(0, 0, q, s);
      EXPECT_EQ(rr.begin, next);
      next = rr.end;
    }
    EXPECT_EQ(next, dilation::SelectedCount(256, geo.pattern(0).offsets[s], 4));
  }
}

// ChunkRows and MaxHeadRows count a chunk's rows in closed form; they must equal the sum and the
// max of every head's rows for
// every pattern, segment and rank, in both modes and both head-offset layouts, rates above and
// below H, shards that cut segments anywhere.
TEST(RingPlanTest, ChunkRowsEqualsTheSumOfEveryHeadsRows) {
  int checked = 0;
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    for (HeadOffsets layout : {HeadOffsets::kModulo, HeadOffsets::kBlocked}) {
      for (int64_t heads : {3, 8, 13}) {
        for (int p : {1, 3, 5}) {
          for (int64_t l : {1, 7, 24}) {
            AttentionSpec spec;
            spec.segment_lengths = {5, 12, 40, 1000};
            spec.dilation_rates = {1, 3, 7, 16};
            spec.mode = mode;
            spec.head_offsets = layout;
            if (mode == AttentionMode::kGrouped && (heads < 4 || layout == HeadOffsets::kBlocked)) {
              continue;
            }
            absl::StatusOr<RingGeometry> geo =
                RingGeometry::Create(spec, {1, l * p, heads, 8, p}, 0, DType::kFloat32);
            ASSERT_TRUE(geo.ok()) << geo.status();
            for (int i = 0; i < 4; ++i) {
              for (int64_t m = 0; m < geo->pattern(i).segments; ++m) {
                for (int q = 0; q < p; ++q) {
                  int64_t want = 0, most = 0;
                  for (size_t h = 0; h < geo->pattern(i).heads.size(); ++h) {
                    const int64_t rows = geo->Rows(i, m, q, static_cast<int>(h)).count();
                    want += rows;
                    most = std::max(most, rows);
                  }
                  const std::string where =
                      absl::StrCat(AttentionModeName(mode), " H=", heads, " P=", p, " L=", l,
                                   " pattern ", i, " segment ", m, " rank ", q);
                  ASSERT_EQ(geo->ChunkRows(i, m, q), want) << where;
                  ASSERT_EQ(geo->MaxHeadRows(i, m, q), most) << where;
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(RingPlanTest, CostModelPicksAllGatherForTinyBlocksAndRingForHeavyOnes) {
  Case c;
  c.w = {1 << 20};
  c.r = {1};
  c.p = 4;
  PlanOptions o;
  o.mode = ExchangeMode::kAuto;
  o.cost.latency_s = 1e-3;  // Latency-bound: one exchange beats P-1 of them.
  o.cost.flops_per_s = 1e15;
  EXPECT_EQ(PlanRing(Geo(c, 0), false, o).groups[0].schedule, Schedule::kAllGather);
  o.cost.allgather_memory_limit = 16;  // ... unless its buffers do not fit.
  EXPECT_EQ(PlanRing(Geo(c, 0), false, o).groups[0].schedule, Schedule::kRing);
  o = PlanOptions();
  o.cost.latency_s = 1e-9;  // Compute-bound: the ring hides the exchange behind the blocks.
  o.cost.flops_per_s = 1e3;
  RingPlan plan = PlanRing(Geo(c, 0), false, o);
  EXPECT_EQ(plan.groups[0].schedule, Schedule::kRing);
  EXPECT_LE(plan.groups[0].ring_seconds, plan.groups[0].allgather_seconds);
  // Moving a block takes as long as computing one: the ring overlaps them, all-gather cannot.
  const double block_bytes = double(plan.groups[0].max_block_elements) * 4;
  const double block_flops = 4.0 * 2 * 4 * 16.0 * 16.0 * 8;  // B=2, 4 heads (G=1), 16 rows, D=8.
  o.cost.flops_per_s = 1e9;
  o.cost.bandwidth_bytes_per_s = block_bytes / (block_flops / o.cost.flops_per_s);
  plan = PlanRing(Geo(c, 0), false, o);
  EXPECT_EQ(plan.groups[0].schedule, Schedule::kRing);
  EXPECT_LT(plan.groups[0].ring_seconds, 0.75 * plan.groups[0].allgather_seconds);
}

TEST(RingPlanTest, GeometryRejectsBadShapes) {
  AttentionSpec spec;
  spec.segment_lengths = {8};
  spec.dilation_rates = {1};
  EXPECT_TRUE(absl::IsInvalidArgument(
      RingGeometry::Create(spec, {1, 10, 2, 4, 3}, 0, DType::kFloat32).status()));
  absl::Status s = RingGeometry::Create(spec, {1, 10, 2, 4, 3}, 0, DType::kFloat32).status();
  EXPECT_NE(s.message().find("N = 10"), std::string::npos) << s;
  EXPECT_TRUE(absl::IsInvalidArgument(
      RingGeometry::Create(spec, {1, 12, 2, 4, 3}, 3, DType::kFloat32).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      RingGeometry::Create(spec, {1, 12, 2, 4, 0}, 0, DType::kFloat32).status()));
  spec.segment_lengths = {8, 8, 8};
  spec.dilation_rates = {1, 1, 1};
  EXPECT_TRUE(absl::IsInvalidArgument(
      RingGeometry::Create(spec, {1, 12, 2, 4, 3}, 0, DType::kFloat32).status()));
}

}  // namespace
}  // namespace ring
}  // namespace dattn
