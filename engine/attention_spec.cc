#include "engine/attention_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {

double AttentionSpec::ScaleFor(int64_t head_dim) const {
  if (scale.has_value()) return *scale;
  return 1.0 / std::sqrt(static_cast<double>(head_dim));
}

std::string AttentionSpec::DebugString() const {
  std::string s = absl::StrCat(AttentionModeName(mode), " w=[", absl::StrJoin(segment_lengths, ","),
                               "] r=[", absl::StrJoin(dilation_rates, ","), "]");
  if (mode == AttentionMode::kMixture || head_offsets != HeadOffsets::kModulo) {
    absl::StrAppend(&s, " head_offsets=", HeadOffsetsName(head_offsets));
  }
  if (causal) absl::StrAppend(&s, " causal");
  if (scale.has_value()) absl::StrAppend(&s, " scale=", *scale);
  return s;
}

const char* AttentionModeName(AttentionMode mode) {
  switch (mode) {
    case AttentionMode::kGrouped:
      return "grouped";
    case AttentionMode::kMixture:
      return "mixture";
  }
  return "unknown";
}

absl::StatusOr<AttentionMode> ParseAttentionMode(const std::string& name) {
  if (name == "grouped") return AttentionMode::kGrouped;
  if (name == "mixture") return AttentionMode::kMixture;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown attention mode '", name, "'; accepted: grouped, mixture"));
}

const char* HeadOffsetsName(HeadOffsets offsets) {
  switch (offsets) {
    case HeadOffsets::kModulo:
      return "modulo";
    case HeadOffsets::kBlocked:
      return "blocked";
  }
  return "unknown";
}

absl::StatusOr<HeadOffsets> ParseHeadOffsets(const std::string& name) {
  if (name == "modulo") return HeadOffsets::kModulo;
  if (name == "blocked") return HeadOffsets::kBlocked;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown head_offsets '", name, "'; accepted: modulo, blocked"));
}

namespace dilation {

HeadRange GroupHeads(int64_t num_heads, int num_groups, int group) {
  const int64_t base = num_heads / num_groups;
  const int64_t extra = num_heads % num_groups;
  const int64_t begin = group * base + std::min<int64_t>(group, extra);
  const int64_t end = begin + base + (group < extra ? 1 : 0);
  return {begin, end};
}

int64_t PatternOffset(const AttentionSpec& spec, int pattern, int64_t head, int64_t num_heads) {
  const int64_t r = spec.dilation_rates[pattern];
  if (spec.mode == AttentionMode::kGrouped) return pattern % r;
  if (spec.head_offsets == HeadOffsets::kBlocked) {
    // ceil(H / r) heads per block; the quotient is < r because ceil(H / r) * r >= H > head.
    const int64_t block = num_heads / r + (num_heads % r != 0 ? 1 : 0);
    return head / block;
  }
  return head % r;
}

bool HeadUsesPattern(const AttentionSpec& spec, int pattern, int64_t head, int64_t num_heads) {
  if (spec.mode == AttentionMode::kMixture) return true;
  const HeadRange range = GroupHeads(num_heads, spec.num_patterns(), pattern);
  return head >= range.begin && head < range.end;
}

double NominalForwardFlops(const AttentionSpec& spec, int64_t batch, int64_t seq_len,
                           int64_t num_heads, int64_t head_dim) {
  double total = 0;
  const int g = spec.num_patterns();
  for (int i = 0; i < g; ++i) {
    int64_t heads = num_heads;
    if (spec.mode == AttentionMode::kGrouped) {
      const HeadRange range = GroupHeads(num_heads, g, i);
      heads = range.end - range.begin;
    }
    const double w = static_cast<double>(std::min(spec.segment_lengths[i], seq_len));
    const double r = static_cast<double>(spec.dilation_rates[i]);
    total += 4.0 * static_cast<double>(batch) * static_cast<double>(heads) *
             static_cast<double>(seq_len) * static_cast<double>(head_dim) * w / (r * r);
  }
  return spec.causal ? total / 2 : total;
}

}  // namespace dilation
}  // namespace dattn
