// Where the dilated rows of each segment live when a sequence of N positions is cut into P
// contiguous shards of L = N/P positions (rank q holds positions [q L, (q+1) L)).
//
// Vocabulary (docs/RING.md has pictures):
//   chunk    the part of segment m of pattern i that lies in rank q's shard: positions
//            [max(m w, q L), min((m+1) w, N, (q+1) L)); empty when the segment misses the shard.
//   rows     the selected (dilated) positions of a chunk for one head: s0 + o + j r, with j in a
//            range [j_lo, j_hi) of the segment's selected indices. Causality compares these j.
//   block    all selected rows of one chunk, for every batch item and every head that uses the
//            pattern: what one rank needs from another. Packed layout (K section, then V section):
//            for b in [0, B), for head slot s in [0, heads of the pattern): that head's rows, D
//            channels each, contiguous. About B * heads * (L / r) * D elements per section.
//   member   a rank whose chunk of a segment has at least one selected row (for some head); only
//            members take part in the segment's exchange.
//
// A RingGeometry is an immutable value computed from the spec, the global shape and this rank;
// every function is pure arithmetic (no allocation beyond the object), thread-safe, and agrees on
// every rank, which is what lets ranks plan the same exchange without talking.
#ifndef DATTN_ENGINE_RING_RING_GEOMETRY_H_
#define DATTN_ENGINE_RING_RING_GEOMETRY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/attention_spec.h"
#include "engine/tensor.h"

namespace dattn {
namespace ring {

// The global problem: the whole sequence, not one shard.
struct RingShape {
  int64_t batch = 0;
  int64_t seq_len = 0;  // N, all ranks together.
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int ranks = 1;  // P.
};

struct RowRange {
  int64_t begin = 0;  // Selected index j of the first row (within the segment).
  int64_t end = 0;
  int64_t count() const { return end > begin ? end - begin : 0; }
};

struct PositionRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool empty() const { return end <= begin; }
};

class RingGeometry {
 public:
  struct Pattern {
    int index = 0;
    int64_t w = 0;         // Segment length, capped at N.
    int64_t r = 1;         // Dilation rate.
    int64_t segments = 0;  // ceil(N / w).
    std::vector<int64_t>
        heads;  // Heads that use the pattern, ascending; a head's slot is its index.
    std::vector<int64_t> offsets;  // Offset of each slot's head.
    // The distinct offsets, ascending (every offset is below r), and heads_below[i] = how many of
    // the pattern's heads have an offset below distinct_offsets[i] (one more entry: all of them).
    // ChunkRows counts a chunk's rows from these in O(log distinct offsets) instead of a loop
    // over heads, which made planning a ring of P ranks and H heads cost P^2 H (docs/FUZZING.md).
    std::vector<int64_t> distinct_offsets;
    std::vector<int64_t> heads_below;
    double factor = 1;  // Output factor: 1/G in grouped mode, 1 in mixture mode.
  };

  // INVALID_ARGUMENT when P < 1, P does not divide N, a dimension is < 1, `rank` is outside [0, P),
  // or the spec is invalid for H (validate.h's checks).
  static absl::StatusOr<RingGeometry> Create(const AttentionSpec& spec, const RingShape& shape,
                                             int rank, DType dtype);

  const AttentionSpec& spec() const { return spec_; }
  const RingShape& shape() const { return shape_; }
  int rank() const { return rank_; }
  int ranks() const { return shape_.ranks; }
  int64_t shard_len() const { return shard_len_; }  // L
  DType dtype() const { return dtype_; }
  // Element type of packed dK/dV partial sums: fp64 for fp64 inputs, fp32 otherwise.
  DType dkv_dtype() const { return dtype_ == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }
  int num_patterns() const { return static_cast<int>(patterns_.size()); }
  const Pattern& pattern(int i) const { return patterns_[i]; }

  PositionRange Segment(int pattern, int64_t segment) const;
  PositionRange Chunk(int pattern, int64_t segment, int rank) const;
  // Ranks whose shards the segment touches: [first, last].
  int FirstRank(int pattern, int64_t segment) const;
  int LastRank(int pattern, int64_t segment) const;
  // Selected indices of rank q's chunk for the head in `slot`.
  RowRange Rows(int pattern, int64_t segment, int rank, int slot) const;
  // Sum over slots of Rows(...).count(): rows of the chunk for one batch item.
  int64_t ChunkRows(int pattern, int64_t segment, int rank) const;
  // Max over slots of Rows(...).count(): the most rows one head has in the chunk. O(log offsets).
  int64_t MaxHeadRows(int pattern, int64_t segment, int rank) const;
  // Rows before `slot` in a packed block (one batch item).
  int64_t SlotRowOffset(int pattern, int64_t segment, int rank, int slot) const;
  // Elements of a packed K+V block of rank q's chunk: 2 * B * ChunkRows * D.
  int64_t BlockElements(int pattern, int64_t segment, int rank) const;
  // Ranks of the segment with ChunkRows > 0, ascending.
  std::vector<int> Members(int pattern, int64_t segment) const;
  // Segments of pattern i that touch rank q's shard: [first, last] (first > last if none).
  int64_t FirstSegmentOf(int pattern, int rank) const;
  int64_t LastSegmentOf(int pattern, int rank) const;
  // Whether segment m lies entirely inside one shard.
  bool InsideOneShard(int pattern, int64_t segment) const;

 private:
  RingGeometry() = default;

  AttentionSpec spec_;
  RingShape shape_;
  int rank_ = 0;
  int64_t shard_len_ = 0;
  DType dtype_ = DType::kFloat32;
  std::vector<Pattern> patterns_;
};

}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_RING_GEOMETRY_H_
