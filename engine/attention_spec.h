// The attention spec: which dilated attention to compute (docs/ENGINE.md is the contract).
//
// A spec is a plain value with no device state; every backend (CPU, CUDA, ring) takes the same spec
// and computes the same function. Validation of a spec together with tensor shapes lives in
// validate.h.
#ifndef DATTN_ENGINE_ATTENTION_SPEC_H_
#define DATTN_ENGINE_ATTENTION_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dattn {

enum class AttentionMode {
  // Heads split into G contiguous groups; group i uses pattern i only, with offset i mod r_i;
  // outputs are divided by G.
  kGrouped,
  // LongNet (arXiv 2307.02486): every head computes every pattern; patterns combined by their
  // softmax denominators (log-sum-exp weights).
  kMixture,
};

// Mixture mode only: which offset head h uses in pattern i.
enum class HeadOffsets {
  kModulo,   // h mod r_i (the paper's rule; default).
  kBlocked,  // floor(h / ceil(H / r_i)) (microsoft/torchscale's dense_to_sparse).
};

struct AttentionSpec {
  std::vector<int64_t> segment_lengths;  // w_i >= 1, one per pattern.
  std::vector<int64_t> dilation_rates;   // r_i >= 1, same length as segment_lengths.
  std::optional<double> scale;           // Unset: 1 / sqrt(D).
  bool causal = false;                   // Causal in index order inside each dilated segment.
  AttentionMode mode = AttentionMode::kGrouped;
  HeadOffsets head_offsets = HeadOffsets::kModulo;

  int num_patterns() const { return static_cast<int>(segment_lengths.size()); }
  double ScaleFor(int64_t head_dim) const;
  // "grouped w=[2048,4096] r=[1,2] causal scale=0.125" for logs and errors.
  std::string DebugString() const;
};

const char* AttentionModeName(AttentionMode mode);  // "grouped" | "mixture"
absl::StatusOr<AttentionMode> ParseAttentionMode(const std::string& name);
const char* HeadOffsetsName(HeadOffsets offsets);  // "modulo" | "blocked"
absl::StatusOr<HeadOffsets> ParseHeadOffsets(const std::string& name);

// The geometry every backend shares. All functions assume a spec that passed validation.
namespace dilation {

// Number of segments of length w covering n positions (the last may be partial). Written without
// n + w - 1 so that any w >= 1 (even INT64_MAX) is safe.
inline int64_t NumSegments(int64_t n, int64_t w) { return n / w + (n % w != 0 ? 1 : 0); }

// Selected rows of a segment of `len` positions with offset `o` and rate `r`: positions o, o+r, ...
inline int64_t SelectedCount(int64_t len, int64_t o, int64_t r) {
  return len > o ? (len - o) / r + ((len - o) % r != 0 ? 1 : 0) : 0;
}

// Grouped mode: heads [begin, end) of group i (H/G each, one more for the first H%G groups).
struct HeadRange {
  int64_t begin;
  int64_t end;
};
HeadRange GroupHeads(int64_t num_heads, int num_groups, int group);

// Offset of head h in pattern i under the spec's mode (grouped: i mod r_i for every head of
// group i).
int64_t PatternOffset(const AttentionSpec& spec, int pattern, int64_t head, int64_t num_heads);

// Whether head h takes part in pattern i (always in mixture mode; in grouped mode, only pattern i
// of its group i).
bool HeadUsesPattern(const AttentionSpec& spec, int pattern, int64_t head, int64_t num_heads);

// Nominal FLOPs of the attended blocks of one forward pass, the figure benchmarks and metrics
// report: sum over patterns i of 4 * B * heads_i * N * D * w_i / r_i^2 (QK^T and PV, 2 FLOPs per
// multiply-add), heads_i being the heads that use pattern i (its group in grouped mode, all H in
// mixture mode); halved when causal. A segment longer than the sequence attends only N positions,
// so w_i counts as min(w_i, N). Forward plus backward is 3.5x this.
double NominalForwardFlops(const AttentionSpec& spec, int64_t batch, int64_t seq_len,
                           int64_t num_heads, int64_t head_dim);

}  // namespace dilation
}  // namespace dattn

#endif  // DATTN_ENGINE_ATTENTION_SPEC_H_
