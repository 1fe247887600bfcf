#include "model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {
namespace {

bool Finite(double x) { return std::isfinite(x); }

// The fp32 factors one update shares, computed in fp64 and rounded once.
struct Factors {
  float decay_keep;  // 1 - lr * weight_decay
  float step_size;   // lr / (1 - beta1^t)
  float bc2_sqrt;    // sqrt(1 - beta2^t)
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float epsilon;
  float grad_scale;
};

// The loop the update runs over one run of equal decay. Written so that each line is one fp32
// operation of the documented formula.
template <bool kDecay>
void UpdateRun(const Factors& f, int64_t n, float* p, const float* grad, float* m, float* v) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * f.grad_scale;
    float w = p[i];
    if (kDecay) w = w * f.decay_keep;
    const float mi = f.beta1 * m[i] + f.one_minus_beta1 * g;
    const float vi = f.beta2 * v[i] + f.one_minus_beta2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / f.bc2_sqrt + f.epsilon;
    p[i] = w - f.step_size * (mi / denom);
  }
}

}  // namespace

absl::Status ValidateAdamWConfig(const AdamWConfig& c) {
  if (!(c.beta1 >= 0 && c.beta1 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW beta1 = ", c.beta1, ": need [0, 1)"));
  }
  if (!(c.beta2 >= 0 && c.beta2 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW beta2 = ", c.beta2, ": need [0, 1)"));
  }
  if (!(c.epsilon > 0 && Finite(c.epsilon))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW epsilon = ", c.epsilon, ": need a finite value > 0"));
  }
  if (!(c.weight_decay >= 0 && Finite(c.weight_decay))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW weight_decay = ", c.weight_decay, ": need a finite value >= 0"));
  }
  return absl::OkStatus();
}

bool DecayByConvention(const ParamEntry& entry) {
  return entry.shape.size() >= 2 && entry.name.find("embed") == std::string::npos;
}

absl::StatusOr<AdamW> AdamW::Create(const ParamLayout& layout, const AdamWConfig& config,
                                    const DecayPredicate& decay) {
  if (absl::Status s = ValidateAdamWConfig(config); !s.ok()) return s;
  if (layout.total() <= 0) {
    return absl::InvalidArgumentError("AdamW: the parameter layout has no elements");
  }
  AdamW opt;
  opt.config_ = config;
  opt.total_ = layout.total();
  for (const ParamEntry& e : layout.entries()) {
    const bool d = decay ? decay(e) : DecayByConvention(e);
    if (d) opt.decayed_names_.push_back(e.name);
    if (!opt.segments_.empty() && opt.segments_.back().decay == d) {
      opt.segments_.back().end = e.offset + e.numel;
    } else {
      opt.segments_.push_back(Segment{e.offset, e.offset + e.numel, d});
    }
  }
  return opt;
}

AdamWState AdamW::NewState() const {
  AdamWState state;
  state.m.assign(static_cast<size_t>(total_), 0.0f);
  state.v.assign(static_cast<size_t>(total_), 0.0f);
  return state;
}

bool AdamW::Decays(int64_t index) const {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), index,
                             [](int64_t i, const Segment& s) { return i < s.end; });
  return it != segments_.end() && index >= it->begin && it->decay;
}

absl::Status AdamW::Update(const AdamWStepArgs& args, int64_t begin, int64_t end,
                           absl::Span<float> params, absl::Span<const float> grads,
                           absl::Span<float> m, absl::Span<float> v) const {
  if (begin < 0 || end < begin || end > total_) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW update range [", begin, ", ", end,
                                                   ") is not inside [0, ", total_, ")"));
  }
  const int64_t n = end - begin;
  const struct {
    const char* name;
    size_t size;
  } spans[] = {
      {"params", params.size()}, {"grads", grads.size()}, {"m", m.size()}, {"v", v.size()}};
  for (const auto& s : spans) {
    if (static_cast<int64_t>(s.size) != n) {
      return absl::InvalidArgumentError(absl::StrCat("AdamW update of [", begin, ", ", end,
                                                     "): ", s.name, " has ", s.size,
                                                     " elements, need ", n));
    }
  }
  if (args.t < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW step number t = ", args.t, ": need >= 1"));
  }
  if (!(args.lr >= 0 && Finite(args.lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW learning rate ", args.lr, ": need a finite value >= 0"));
  }
  if (!(args.grad_scale > 0 && Finite(args.grad_scale))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW grad_scale ", args.grad_scale, ": need a finite value > 0"));
  }
  const double t = static_cast<double>(args.t);
  Factors f;
  f.decay_keep = static_cast<float>(1.0 - args.lr * config_.weight_decay);
  f.step_size = static_cast<float>(args.lr / (1.0 - std::pow(config_.beta1, t)));
  f.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(config_.beta2, t)));
  f.beta1 = static_cast<float>(config_.beta1);
  f.one_minus_beta1 = static_cast<float>(1.0 - config_.beta1);
  f.beta2 = static_cast<float>(config_.beta2);
  f.one_minus_beta2 = static_cast<float>(1.0 - config_.beta2);
  f.epsilon = static_cast<float>(config_.epsilon);
  f.grad_scale = static_cast<float>(args.grad_scale);
  // beta1 = 0 and t = 1 make 1 - beta1^t = 1; beta close to 1 with tiny t can round the bias
  // correction to 0 in fp32 only for beta2 (bc2_sqrt = 0 would divide by zero): refuse it.
  if (!(f.bc2_sqrt > 0) || !Finite(f.step_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW bias correction underflows at t = ", args.t,
                     " with beta1 = ", config_.beta1, ", beta2 = ", config_.beta2));
  }

  for (const Segment& seg : segments_) {
    const int64_t lo = std::max(seg.begin, begin);
    const int64_t hi = std::min(seg.end, end);
    if (lo >= hi) continue;
    const int64_t k = lo - begin;
    if (seg.decay && config_.weight_decay != 0) {
      UpdateRun<true>(f, hi - lo, params.data() + k, grads.data() + k, m.data() + k, v.data() + k);
    } else {
      UpdateRun<false>(f, hi - lo, params.data() + k, grads.data() + k, m.data() + k, v.data() + k);
    }
  }
  return absl::OkStatus();
}

absl::Status AdamW::Step(AdamWState* state, double lr, double grad_scale, absl::Span<float> params,
                         absl::Span<const float> grads) const {
  if (state == nullptr) return absl::InvalidArgumentError("AdamW::Step: null state");
  if (state->step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW state step = ", state->step, ": need >= 0"));
  }
  AdamWStepArgs args;
  args.t = state->step + 1;
  args.lr = lr;
  args.grad_scale = grad_scale;
  absl::Status s =
      Update(args, 0, total_, params, grads, absl::MakeSpan(state->m), absl::MakeSpan(state->v));
  if (s.ok()) ++state->step;
  return s;
}

double LrSchedule::At(int64_t t) const {
  if (t < 1) t = 1;
  if (t <= warmup_steps) {
    return peak_lr * static_cast<double>(t) / static_cast<double>(warmup_steps);
  }
  if (t > total_steps) return min_lr;
  const double q =
      static_cast<double>(t - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + (peak_lr - min_lr) * (1.0 + std::cos(M_PI * q)) / 2.0;
}

absl::Status ValidateLrSchedule(const LrSchedule& s) {
  if (!(s.peak_lr > 0 && Finite(s.peak_lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("peak_lr = ", s.peak_lr, ": need a finite value > 0"));
  }
  if (!(s.min_lr >= 0 && s.min_lr <= s.peak_lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_lr = ", s.min_lr, ": need 0 <= min_lr <= peak_lr (", s.peak_lr, ")"));
  }
  if (s.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_steps = ", s.warmup_steps, ": need >= 0"));
  }
  if (s.total_steps < 1 || s.total_steps < s.warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "total_steps = ", s.total_steps, ": need >= 1 and >= warmup_steps (", s.warmup_steps, ")"));
  }
  return absl::OkStatus();
}

double SumOfSquares(absl::Span<const float> grads) {
  double sum = 0;
  for (float g : grads) {
    const double x = static_cast<double>(g);
    sum += x * x;
  }
  return sum;
}

double GlobalNorm(absl::Span<const double> partial_sums_of_squares) {
  double sum = 0;
  for (double s : partial_sums_of_squares) sum += s;
  return std::sqrt(sum);
}

absl::StatusOr<double> ClipScale(double global_norm, double max_norm) {
  if (!(max_norm > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max gradient norm ", max_norm, ": need > 0 (+inf disables clipping)"));
  }
  if (!Finite(global_norm)) {
    return absl::OutOfRangeError(absl::StrCat("gradient norm is ", global_norm,
                                              ": skip this step (its update would be non-finite)"));
  }
  if (std::isinf(max_norm)) return 1.0;
  const double scale = max_norm / (global_norm + 1e-6);
  return scale < 1.0 ? scale : 1.0;
}

}  // namespace model
}  // namespace dattn
