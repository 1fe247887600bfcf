#include "engine/ring/ring_geometry.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "engine/validate.h"

namespace dattn {
namespace ring {
namespace {

// ceil(a / b) for a >= 0, b >= 1.
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

absl::StatusOr<RingGeometry> RingGeometry::Create(const AttentionSpec& spec, const RingShape& shape,
                                                  int rank, DType dtype) {
  if (shape.ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring size P = ", shape.ranks, " is below 1"));
  }
  if (rank < 0 || rank >= shape.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, ", shape.ranks, ")"));
  }
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  if (shape.batch < 1 || shape.seq_len < 1 || shape.num_heads < 1 || shape.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring shape (B, N, H, D) = (", shape.batch, ", ",
                                                   shape.seq_len, ", ", shape.num_heads, ", ",
                                                   shape.head_dim, ") has a dimension below 1"));
  }
  if (shape.seq_len % shape.ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length N = ", shape.seq_len,
                     " is not divisible by the ring size P = ", shape.ranks));
  }
  const int g = spec.num_patterns();
  if (spec.mode == AttentionMode::kGrouped && shape.num_heads < g) {
    return absl::InvalidArgumentError(
        absl::StrCat("grouped mode needs H >= G: H = ", shape.num_heads, ", G = ", g));
  }
  RingGeometry geo;
  geo.spec_ = spec;
  geo.shape_ = shape;
  geo.rank_ = rank;
  geo.shard_len_ = shape.seq_len / shape.ranks;
  geo.dtype_ = dtype;
  for (int i = 0; i < g; ++i) {
    Pattern p;
    p.index = i;
    p.w = std::min(spec.segment_lengths[i], shape.seq_len);
    p.r = spec.dilation_rates[i];
    p.segments = dilation::NumSegments(shape.seq_len, p.w);
    p.factor = spec.mode == AttentionMode::kGrouped ? 1.0 / g : 1.0;
    for (int64_t h = 0; h < shape.num_heads; ++h) {
      if (!dilation::HeadUsesPattern(spec, i, h, shape.num_heads)) continue;
      p.heads.push_back(h);
      p.offsets.push_back(dilation::PatternOffset(spec, i, h, shape.num_heads));
    }
    std::map<int64_t, int64_t> counts;
    for (int64_t offset : p.offsets) ++counts[offset];
    p.heads_below.push_back(0);
    for (const auto& [offset, heads] : counts) {
      p.distinct_offsets.push_back(offset);
      p.heads_below.push_back(p.heads_below.back() + heads);
    }
    geo.patterns_.push_back(std::move(p));
  }
  return geo;
}

PositionRange RingGeometry::Segment(int pattern, int64_t segment) const {
  const Pattern& p = patterns_[pattern];
  const int64_t s0 = segment * p.w;
  return {s0, std::min(s0 + p.w, shape_.seq_len)};  // w <= N, so no overflow.
}

PositionRange RingGeometry::Chunk(int pattern, int64_t segment, int rank) const {
  const PositionRange s = Segment(pattern, segment);
  return {std::max(s.begin, rank * shard_len_), std::min(s.end, (rank + 1) * shard_len_)};
}

int RingGeometry::FirstRank(int pattern, int64_t segment) const {
  return static_cast<int>(Segment(pattern, segment).begin / shard_len_);
}

int RingGeometry::LastRank(int pattern, int64_t segment) const {
  return static_cast<int>((Segment(pattern, segment).end - 1) / shard_len_);
}

namespace {

// The rows j of a chunk [c.begin, c.end) that a head of offset `offset` selects in a segment
// starting at `s0`: j such that s0 + offset + j r lies in the chunk.
RowRange OffsetRows(const PositionRange& c, int64_t s0, int64_t offset, int64_t r) {
  const int64_t base = s0 + offset;
  const int64_t lo = CeilDiv(std::max<int64_t>(c.begin - base, 0), r);
  const int64_t hi = CeilDiv(std::max<int64_t>(c.end - base, 0), r);
  return {lo, std::max(lo, hi)};
}

}  // namespace

RowRange RingGeometry::Rows(int pattern, int64_t segment, int rank, int slot) const {
  const PositionRange c = Chunk(pattern, segment, rank);
  if (c.empty()) return {0, 0};
  const Pattern& p = patterns_[pattern];
  return OffsetRows(c, Segment(pattern, segment).begin, p.offsets[slot], p.r);
}

int64_t RingGeometry::ChunkRows(int pattern, int64_t segment, int rank) const {
  const PositionRange c = Chunk(pattern, segment, rank);
  if (c.empty()) return 0;
  const Pattern& p = patterns_[pattern];
  // A head of offset o < r selects the chunk's positions x = s0 + o + j r; with a = c.begin - s0
  // and b = c.end - s0 (0 <= a < b) it selects (b/r - a/r) + [o < b%r] - [o < a%r] of them
  // (integer division): whole periods, plus the partial period at each end. Summed over heads:
  // (b/r - a/r) H_p + (heads of offset < b%r) - (heads of offset < a%r).
  const int64_t s0 = Segment(pattern, segment).begin;
  const int64_t a = c.begin - s0;
  const int64_t b = c.end - s0;
  auto heads_below = [&p](int64_t x) {
    const auto it = std::lower_bound(p.distinct_offsets.begin(), p.distinct_offsets.end(), x);
    return p.heads_below[static_cast<size_t>(it - p.distinct_offsets.begin())];
  };
  const int64_t heads = static_cast<int64_t>(p.heads.size());
  return (b / p.r - a / p.r) * heads + heads_below(b % p.r) - heads_below(a % p.r);
}

int64_t RingGeometry::MaxHeadRows(int pattern, int64_t segment, int rank) const {
  const PositionRange c = Chunk(pattern, segment, rank);
  const Pattern& p = patterns_[pattern];
  if (c.empty() || p.heads.empty()) return 0;
  // As in ChunkRows: a head of offset o has (b/r - a/r) + [o < rb] - [o < ra] rows, rb = b%r and
  // ra = a%r. The bracket is +1 for o in [ra, rb) when ra < rb, -1 for o in [rb, ra) when ra > rb,
  // 0 otherwise: the most is +1 if some offset lies in [ra, rb), else 0 if some offset lies
  // outside [rb, ra), else -1.
  const int64_t s0 = Segment(pattern, segment).begin;
  const int64_t a = c.begin - s0;
  const int64_t b = c.end - s0;
  const int64_t ra = a % p.r;
  const int64_t rb = b % p.r;
  const std::vector<int64_t>& o = p.distinct_offsets;
  int64_t extra = 0;
  if (ra < rb) {
    const auto it = std::lower_bound(o.begin(), o.end(), ra);
    extra = it != o.end() && *it < rb ? 1 : 0;
  } else if (ra > rb) {
    extra = o.front() < rb || o.back() >= ra ? 0 : -1;
  }
  return b / p.r - a / p.r + extra;
}

int64_t RingGeometry::SlotRowOffset(int pattern, int64_t segment, int rank, int slot) const {
  int64_t rows = 0;
  for (int s = 0; s < slot; ++s) rows += Rows(pattern, segment, rank, s).count();
  return rows;
}

int64_t RingGeometry::BlockElements(int pattern, int64_t segment, int rank) const {
  return 2 * shape_.batch * ChunkRows(pattern, segment, rank) * shape_.head_dim;
}

std::vector<int> RingGeometry::Members(int pattern, int64_t segment) const {
  std::vector<int> members;
  for (int q = FirstRank(pattern, segment); q <= LastRank(pattern, segment); ++q) {
    if (ChunkRows(pattern, segment, q) > 0) members.push_back(q);
  }
  return members;
}

int64_t RingGeometry::FirstSegmentOf(int pattern, int rank) const {
  return rank * shard_len_ / patterns_[pattern].w;
}

int64_t RingGeometry::LastSegmentOf(int pattern, int rank) const {
  return ((rank + 1) * shard_len_ - 1) / patterns_[pattern].w;
}

bool RingGeometry::InsideOneShard(int pattern, int64_t segment) const {
  return FirstRank(pattern, segment) == LastRank(pattern, segment);
}

}  // namespace ring
}  // namespace dattn
