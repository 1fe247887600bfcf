#include "model/rotary.h"

#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {

int64_t SaturatingLcm(const std::vector<int64_t>& values) {
  int64_t l = 1;
  for (int64_t v : values) {
    const int64_t g = std::gcd(l, v);
    int64_t next = 0;
    if (__builtin_mul_overflow(l / g, v, &next)) return INT64_MAX;
    l = next;
  }
  return l;
}

absl::StatusOr<RotaryPlan> RotaryPlan::Make(const LongNetConfig& config, int64_t total_seq_len) {
  if (total_seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotary positions: sequence length ", total_seq_len, " must be >= 1"));
  }
  RotaryPlan plan;
  plan.head_dim_ = config.head_dim();
  plan.xpos_ = config.xpos;
  plan.scale_base_ = config.xpos_scale_base;
  const int64_t lcm = SaturatingLcm(config.segment_lengths);
  plan.block_ = std::min(lcm, total_seq_len);
  const int64_t pairs = plan.head_dim_ / 2;
  const double d = static_cast<double>(plan.head_dim_);
  const double log_theta = std::log(config.rope_theta);
  for (int64_t j = 0; j < pairs; ++j) {
    plan.inv_freq_.push_back(std::exp(-(2.0 * static_cast<double>(j) / d) * log_theta));
    plan.log_zeta_.push_back(std::log((2.0 * static_cast<double>(j) + 0.4 * d) / (1.4 * d)));
  }
  if (plan.xpos_) {
    // |n - c(n)| <= ceil(W / 2); the smallest zeta (j = 0) gives the largest factor.
    const double reach = static_cast<double>(plan.block_ - plan.block_ / 2);
    const double log_factor = reach / plan.scale_base_ * std::fabs(plan.log_zeta_[0]);
    if (!(log_factor <= kMaxXposLogFactor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rotary.xpos: positions that attend to each other lie in blocks of W = min(lcm of "
          "attention.segment_lengths = ",
          lcm, ", sequence length ", total_seq_len, ") = ", plan.block_,
          " positions; with rotary.xpos_scale_base = ", config.xpos_scale_base,
          " the XPOS factors reach e^", log_factor, ", beyond e^", kMaxXposLogFactor,
          " (fp32 would overflow): use segment lengths whose lcm is at most ",
          static_cast<int64_t>(2.0 * kMaxXposLogFactor * plan.scale_base_ /
                               std::fabs(plan.log_zeta_[0])),
          ", a shorter sequence, or a larger xpos_scale_base"));
    }
  }
  return plan;
}

void RotaryPlan::Factors(int64_t n, double* cos, double* sin, double* q_scale,
                         double* k_scale) const {
  const double e = static_cast<double>(n - ReferencePosition(n));
  const int64_t pairs = head_dim_ / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    const double angle = e * inv_freq_[j];
    cos[j] = std::cos(angle);
    sin[j] = std::sin(angle);
    if (xpos_) {
      const double log_scale = e / scale_base_ * log_zeta_[j];
      q_scale[j] = std::exp(log_scale);
      k_scale[j] = std::exp(-log_scale);
    } else {
      q_scale[j] = 1.0;
      k_scale[j] = 1.0;
    }
  }
}

}  // namespace model
}  // namespace dattn
