// Rotary positions (RoPE) with the optional XPOS decay, computed relative to a reference position
// so that neither overflows nor underflows at millions of positions.
//
// Definition (Su et al., RoFormer; Sun et al., XPOS / "A Length-Extrapolatable Transformer", as
// torchscale implements it). Head dim D, pairs of adjacent channels (2j, 2j+1), j = 0 .. D/2 - 1:
//   theta_j = rope_theta^(-2j/D),  zeta_j = (2j + 0.4 D) / (1.4 D)  (in (0.28, 1)),
//   rot_n(x)_(2j)   = x_(2j) cos(n theta_j) - x_(2j+1) sin(n theta_j)
//   rot_n(x)_(2j+1) = x_(2j+1) cos(n theta_j) + x_(2j) sin(n theta_j)
//   q'_n = zeta^(n / scale_base) * rot_n(q_n),  k'_n = zeta^(-n / scale_base) * rot_n(k_n)
// (per pair; without XPOS the zeta factors are 1). Then q'_m . k'_n depends only on m - n:
//   sum_j zeta_j^((m - n)/scale_base) [rot_(m-n) applied to the pair] , the decay of XPOS.
//
// Applied naively, zeta_0^(n/512) with zeta_0 = 2/7 is 10^(-n/940): below fp32's smallest normal
// at n = 36K (zero at 42K) and below fp64's at n = 290K, while its inverse on k overflows to inf,
// so that q'.k' is 0 * inf = NaN. Only
// m - n matters, and attention only ever pairs positions of the same dilated segment; so both the
// rotation and the decay use n - c(n) in place of n, with a reference position c(n) shared by every
// pair of positions that can attend to each other:
//   W = min(lcm(segment_lengths), N)     (N: the whole sequence's length, all ranks together)
//   c(n) = floor(n / W) * W + floor(W / 2)
// Every segment of every pattern lies inside one block [bW, (b+1)W) (W is a multiple of each w_i,
// or the whole sequence), so c cancels exactly: q'_m . k'_n is the definition's value for every
// pair that attention computes, and |n - c(n)| <= W/2 whatever n is (4M or 4G). The largest factor
// is then zeta_0^(-W / (2 scale_base)); Make refuses (INVALID_ARGUMENT) a plan whose factors would
// pass e^60 (1.1e26, which leaves fp32 a margin of 10^12 below its overflow): W <= 49,042 at
// scale_base 512, so LongNet's segments up to 32,768 (lcm 32,768) work at any N. Angles and
// factors are computed in fp64 and rounded once to the compute type.
//
// Plans are plain values, thread-safe to read.
#ifndef DATTN_MODEL_ROTARY_H_
#define DATTN_MODEL_ROTARY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"

namespace dattn {
namespace model {

// The largest natural log of an XPOS factor a plan accepts (see above).
inline constexpr double kMaxXposLogFactor = 60.0;

class RotaryPlan {
 public:
  // The plan for a sequence of `total_seq_len` positions (all ranks together) under a valid
  // config. INVALID_ARGUMENT for total_seq_len < 1 or, with XPOS, a block W whose factors pass
  // e^kMaxXposLogFactor (the message names W, the lcm, N and xpos_scale_base).
  static absl::StatusOr<RotaryPlan> Make(const LongNetConfig& config, int64_t total_seq_len);

  int64_t head_dim() const { return head_dim_; }
  bool xpos() const { return xpos_; }
  // W above.
  int64_t block() const { return block_; }
  // c(n) above.
  int64_t ReferencePosition(int64_t n) const { return n / block_ * block_ + block_ / 2; }

  // The factors of absolute position n, D/2 of each: cos and sin of (n - c(n)) theta_j, and the
  // XPOS scales of q and k (1 without XPOS). 2 sincos + 2 exp per pair.
  void Factors(int64_t n, double* cos, double* sin, double* q_scale, double* k_scale) const;

  // The plan's constants, for a device implementation that computes Factors itself: theta_j and
  // log(zeta_j) for j < head_dim / 2, and xpos_scale_base.
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  const std::vector<double>& log_zeta() const { return log_zeta_; }
  double scale_base() const { return scale_base_; }

 private:
  int64_t head_dim_ = 0;
  bool xpos_ = false;
  double scale_base_ = 1;
  int64_t block_ = 1;
  std::vector<double> inv_freq_;  // theta_j
  std::vector<double> log_zeta_;  // log(zeta_j)
};

// lcm of the values, or INT64_MAX if it passes int64 (values >= 1).
int64_t SaturatingLcm(const std::vector<int64_t>& values);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_ROTARY_H_
