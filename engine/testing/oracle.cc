#include "engine/testing/oracle.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dattn {
namespace oracle {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// q_i . k_j over the head dimension for rows (b, p1, h) of a and (b, p2, h) of c.
double RowDot(const Shape& s, const std::vector<double>& a, const std::vector<double>& c, int64_t b,
              int64_t p1, int64_t p2, int64_t h) {
  double sum = 0.0;
  for (int64_t d = 0; d < s.head_dim; ++d) sum += a[s.Index(b, p1, h, d)] * c[s.Index(b, p2, h, d)];
  return sum;
}

// One segment of one (batch, head): the selected rows, their softmax probabilities and
// log-sum-exps. probs[j][t] is the weight of selected key t for selected query j (0 for keys a
// causal row does not see); lse[j] = log sum_t exp(scale * q_j . k_t) over the keys row j sees.
struct SegmentSoftmax {
  std::vector<std::vector<double>> probs;
  std::vector<double> lse;
};

SegmentSoftmax ComputeSegmentSoftmax(const Shape& s, const std::vector<double>& q,
                                     const std::vector<double>& k, int64_t b, int64_t h,
                                     const std::vector<int64_t>& rows, bool causal, double scale) {
  const size_t n = rows.size();
  SegmentSoftmax result;
  result.probs.assign(n, std::vector<double>(n, 0.0));
  result.lse.assign(n, kNegInf);
  for (size_t j = 0; j < n; ++j) {
    const size_t seen = causal ? j + 1 : n;  // Keys 0 .. seen-1 of this segment's selection.
    std::vector<double> scores(seen);
    for (size_t t = 0; t < seen; ++t) scores[t] = scale * RowDot(s, q, k, b, rows[j], rows[t], h);
    const double max_score = *std::max_element(scores.begin(), scores.end());
    double sum = 0.0;
    for (size_t t = 0; t < seen; ++t) sum += std::exp(scores[t] - max_score);
    const double lse = max_score + std::log(sum);
    result.lse[j] = lse;
    for (size_t t = 0; t < seen; ++t) result.probs[j][t] = std::exp(scores[t] - lse);
  }
  return result;
}

absl::Status CheckArguments(const AttentionSpec& spec, const Shape& shape,
                            const std::vector<const std::vector<double>*>& tensors) {
  const int g = spec.num_patterns();
  if (g < 1) return absl::InvalidArgumentError("oracle: no patterns");
  if (spec.dilation_rates.size() != spec.segment_lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("oracle: ", spec.segment_lengths.size(),
                                                   " segment lengths, ", spec.dilation_rates.size(),
                                                   " rates"));
  }
  for (int i = 0; i < g; ++i) {
    if (spec.segment_lengths[i] < 1 || spec.dilation_rates[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("oracle: pattern ", i,
                                                     " has w=", spec.segment_lengths[i],
                                                     " r=", spec.dilation_rates[i]));
    }
  }
  if (shape.batch < 1 || shape.seq_len < 1 || shape.num_heads < 1 || shape.head_dim < 1) {
    return absl::InvalidArgumentError("oracle: every dimension must be >= 1");
  }
  if (spec.mode == AttentionMode::kGrouped && shape.num_heads < g) {
    return absl::InvalidArgumentError(
        absl::StrCat("oracle: grouped mode needs H >= G, got H=", shape.num_heads, " G=", g));
  }
  for (const std::vector<double>* t : tensors) {
    if (static_cast<int64_t>(t->size()) != shape.NumElements()) {
      return absl::InvalidArgumentError(absl::StrCat("oracle: a tensor has ", t->size(),
                                                     " elements, want ", shape.NumElements()));
    }
  }
  return absl::OkStatus();
}

std::vector<PatternResult> AllPatterns(const AttentionSpec& spec, const Shape& shape,
                                       const std::vector<double>& q, const std::vector<double>& k,
                                       const std::vector<double>& v) {
  const double scale = Scale(spec, shape.head_dim);
  std::vector<PatternResult> results;
  for (int i = 0; i < spec.num_patterns(); ++i) {
    results.push_back(PatternForward(shape, q, k, v, spec.segment_lengths[i],
                                     spec.dilation_rates[i],
                                     PatternOffsets(spec, i, shape.num_heads), spec.causal, scale));
  }
  return results;
}

// Mixture mode: out = sum_{i in S} a_i O_i with a_i = exp(l_i - lse), lse = log sum_{i in S}
// exp(l_i), S the patterns selecting the row (computed with the max subtracted, as the spec says).
ForwardResult CombineMixture(const Shape& s, const std::vector<PatternResult>& patterns) {
  ForwardResult result;
  result.out.assign(s.NumElements(), 0.0);
  result.lse.assign(s.NumLseElements(), kNegInf);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      for (int64_t p = 0; p < s.seq_len; ++p) {
        const int64_t row = s.LseIndex(b, h, p);
        double max_lse = kNegInf;
        bool any = false;
        for (const PatternResult& pr : patterns) {
          if (!pr.selected[row]) continue;
          max_lse = any ? std::max(max_lse, pr.lse[row]) : pr.lse[row];
          any = true;
        }
        if (!any) continue;  // S empty: out stays 0, lse -inf.
        double denominator = 0.0;
        for (const PatternResult& pr : patterns) {
          if (pr.selected[row]) denominator += std::exp(pr.lse[row] - max_lse);
        }
        for (const PatternResult& pr : patterns) {
          if (!pr.selected[row]) continue;
          const double weight = std::exp(pr.lse[row] - max_lse) / denominator;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            result.out[s.Index(b, p, h, d)] += weight * pr.out[s.Index(b, p, h, d)];
          }
        }
        result.lse[row] = max_lse + std::log(denominator);
      }
    }
  }
  return result;
}

}  // namespace

double Scale(const AttentionSpec& spec, int64_t head_dim) {
  return spec.scale.has_value() ? *spec.scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

std::vector<int64_t> PatternOffsets(const AttentionSpec& spec, int pattern, int64_t num_heads) {
  const int64_t r = spec.dilation_rates[pattern];
  std::vector<int64_t> offsets(num_heads, -1);
  if (spec.mode == AttentionMode::kGrouped) {
    // Groups are contiguous: H/G heads each, one more for each of the first H%G groups.
    const int64_t g = spec.num_patterns();
    int64_t begin = 0;
    for (int64_t group = 0; group < pattern; ++group) {
      begin += num_heads / g + (group < num_heads % g ? 1 : 0);
    }
    const int64_t size = num_heads / g + (pattern < num_heads % g ? 1 : 0);
    for (int64_t h = begin; h < begin + size; ++h) offsets[h] = pattern % r;
    return offsets;
  }
  for (int64_t h = 0; h < num_heads; ++h) {
    if (spec.head_offsets == HeadOffsets::kModulo) {
      offsets[h] = h % r;
    } else {
      const int64_t block = (num_heads + r - 1) / r;  // ceil(H / r)
      offsets[h] = h / block;
    }
  }
  return offsets;
}

std::vector<std::vector<int64_t>> SelectedRows(int64_t seq_len, int64_t w, int64_t r, int64_t o) {
  std::vector<std::vector<int64_t>> segments;
  for (int64_t start = 0; start < seq_len; start += w) {
    const int64_t end = std::min(start + w, seq_len);
    std::vector<int64_t> rows;
    for (int64_t p = start + o; p < end; p += r) rows.push_back(p);
    segments.push_back(rows);
  }
  return segments;
}

PatternResult PatternForward(const Shape& s, const std::vector<double>& q,
                             const std::vector<double>& k, const std::vector<double>& v, int64_t w,
                             int64_t r, const std::vector<int64_t>& head_offsets, bool causal,
                             double scale) {
  PatternResult result;
  result.out.assign(s.NumElements(), 0.0);
  result.lse.assign(s.NumLseElements(), kNegInf);
  result.selected.assign(s.NumLseElements(), 0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      if (head_offsets[h] < 0) continue;
      for (const std::vector<int64_t>& rows : SelectedRows(s.seq_len, w, r, head_offsets[h])) {
        const SegmentSoftmax sm = ComputeSegmentSoftmax(s, q, k, b, h, rows, causal, scale);
        for (size_t j = 0; j < rows.size(); ++j) {
          for (int64_t d = 0; d < s.head_dim; ++d) {
            double sum = 0.0;
            for (size_t t = 0; t < rows.size(); ++t) {
              sum += sm.probs[j][t] * v[s.Index(b, rows[t], h, d)];
            }
            result.out[s.Index(b, rows[j], h, d)] = sum;
          }
          result.lse[s.LseIndex(b, h, rows[j])] = sm.lse[j];
          result.selected[s.LseIndex(b, h, rows[j])] = 1;
        }
      }
    }
  }
  return result;
}

void PatternBackward(const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, int64_t w, int64_t r,
                     const std::vector<int64_t>& head_offsets, bool causal, double scale,
                     const std::vector<double>& g_out, const std::vector<double>& g_lse,
                     std::vector<double>* dq, std::vector<double>* dk, std::vector<double>* dv) {
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      if (head_offsets[h] < 0) continue;
      for (const std::vector<int64_t>& rows : SelectedRows(s.seq_len, w, r, head_offsets[h])) {
        const size_t n = rows.size();
        const SegmentSoftmax sm = ComputeSegmentSoftmax(s, q, k, b, h, rows, causal, scale);
        for (size_t j = 0; j < n; ++j) {
          const int64_t pj = rows[j];
          // O_j = sum_t P_jt v_t and delta_j = g_out_j . O_j = sum_t P_jt (g_out_j . v_t).
          double delta = 0.0;
          for (size_t t = 0; t < n; ++t) {
            delta += sm.probs[j][t] * RowDot(s, g_out, v, b, pj, rows[t], h);
          }
          const double g_l = g_lse[s.LseIndex(b, h, pj)];
          for (size_t t = 0; t < n; ++t) {
            const double p = sm.probs[j][t];
            if (p == 0.0) continue;  // A key this causal row does not see (or exp underflow).
            const int64_t pt = rows[t];
            // Through O_j: dO/dS_jt = P_jt (v_t - O_j); through l_j: dl/dS_jt = P_jt.
            const double d_score = p * (RowDot(s, g_out, v, b, pj, pt, h) - delta + g_l);
            for (int64_t d = 0; d < s.head_dim; ++d) {
              (*dq)[s.Index(b, pj, h, d)] += scale * d_score * k[s.Index(b, pt, h, d)];
              (*dk)[s.Index(b, pt, h, d)] += scale * d_score * q[s.Index(b, pj, h, d)];
              (*dv)[s.Index(b, pt, h, d)] += p * g_out[s.Index(b, pj, h, d)];
            }
          }
        }
      }
    }
  }
}

absl::StatusOr<ForwardResult> Forward(const AttentionSpec& spec, const Shape& shape,
                                      const std::vector<double>& q, const std::vector<double>& k,
                                      const std::vector<double>& v) {
  absl::Status status = CheckArguments(spec, shape, {&q, &k, &v});
  if (!status.ok()) return status;
  const std::vector<PatternResult> patterns = AllPatterns(spec, shape, q, k, v);
  if (spec.mode == AttentionMode::kMixture) return CombineMixture(shape, patterns);

  // Grouped: the groups partition the heads, so each row takes its own group's pattern, divided by
  // G.
  const double g = spec.num_patterns();
  ForwardResult result;
  result.out.assign(shape.NumElements(), 0.0);
  result.lse.assign(shape.NumLseElements(), kNegInf);
  for (const PatternResult& pr : patterns) {
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t h = 0; h < shape.num_heads; ++h) {
        for (int64_t p = 0; p < shape.seq_len; ++p) {
          if (!pr.selected[shape.LseIndex(b, h, p)]) continue;
          result.lse[shape.LseIndex(b, h, p)] = pr.lse[shape.LseIndex(b, h, p)];
          for (int64_t d = 0; d < shape.head_dim; ++d) {
            result.out[shape.Index(b, p, h, d)] = pr.out[shape.Index(b, p, h, d)] / g;
          }
        }
      }
    }
  }
  return result;
}

absl::StatusOr<Gradients> Backward(const AttentionSpec& spec, const Shape& shape,
                                   const std::vector<double>& q, const std::vector<double>& k,
                                   const std::vector<double>& v, const std::vector<double>& dout) {
  absl::Status status = CheckArguments(spec, shape, {&q, &k, &v, &dout});
  if (!status.ok()) return status;
  const double scale = Scale(spec, shape.head_dim);
  Gradients grads;
  grads.dq.assign(shape.NumElements(), 0.0);
  grads.dk.assign(shape.NumElements(), 0.0);
  grads.dv.assign(shape.NumElements(), 0.0);

  if (spec.mode == AttentionMode::kGrouped) {
    // out = A_i / G on group i's selected rows: dL/dA_i = dout / G; the lse is not part of the
    // loss.
    const double g = spec.num_patterns();
    std::vector<double> g_out(dout.size());
    for (size_t e = 0; e < dout.size(); ++e) g_out[e] = dout[e] / g;
    const std::vector<double> g_lse(shape.NumLseElements(), 0.0);
    for (int i = 0; i < spec.num_patterns(); ++i) {
      PatternBackward(shape, q, k, v, spec.segment_lengths[i], spec.dilation_rates[i],
                      PatternOffsets(spec, i, shape.num_heads), spec.causal, scale, g_out, g_lse,
                      &grads.dq, &grads.dk, &grads.dv);
    }
    return grads;
  }

  // Mixture: out = sum_i a_i O_i, a_i = exp(l_i - lse). Then dout/dO_i = a_i and, since
  // da_m/dl_i = a_m (delta_mi - a_i), dout/dl_i = a_i (O_i - out). So pattern i's output rows get
  // gradient a_i dout and its lse rows a_i dout . (O_i - out).
  const std::vector<PatternResult> patterns = AllPatterns(spec, shape, q, k, v);
  const ForwardResult mixed = CombineMixture(shape, patterns);
  for (int i = 0; i < spec.num_patterns(); ++i) {
    const PatternResult& pr = patterns[i];
    std::vector<double> g_out(shape.NumElements(), 0.0);
    std::vector<double> g_lse(shape.NumLseElements(), 0.0);
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t h = 0; h < shape.num_heads; ++h) {
        for (int64_t p = 0; p < shape.seq_len; ++p) {
          const int64_t row = shape.LseIndex(b, h, p);
          if (!pr.selected[row]) continue;
          const double a = std::exp(pr.lse[row] - mixed.lse[row]);
          double dot = 0.0;
          for (int64_t d = 0; d < shape.head_dim; ++d) {
            const int64_t e = shape.Index(b, p, h, d);
            g_out[e] = a * dout[e];
            dot += dout[e] * (pr.out[e] - mixed.out[e]);
          }
          g_lse[row] = a * dot;
        }
      }
    }
    PatternBackward(shape, q, k, v, spec.segment_lengths[i], spec.dilation_rates[i],
                    PatternOffsets(spec, i, shape.num_heads), spec.causal, scale, g_out, g_lse,
                    &grads.dq, &grads.dk, &grads.dv);
  }
  return grads;
}

}  // namespace oracle
}  // namespace dattn
