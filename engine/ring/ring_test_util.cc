#include "engine/ring/ring_test_util.h"

#include "absl/strings/str_cat.h"

namespace dattn {
namespace ring {
namespace testing {

std::string RingCase::Describe() const {
  return absl::StrCat(name, ": ", spec.DebugString(), " B=", batch, " N=", seq_len(), " H=", heads,
                      " D=", head_dim, " P=", ranks, " ", DTypeName(dtype));
}

absl::StatusOr<FullProblem> MakeProblem(const RingCase& c, uint64_t seed) {
  const oracle::Shape shape = c.FullShape();
  const int64_t n = shape.NumElements();
  FullProblem p;
  auto rounded = [&](uint64_t s) {
    std::vector<double> x = testutil::RandomValues(n, s);
    for (double& e : x) e = testutil::RoundToDType(e, c.dtype);
    return x;
  };
  p.q = rounded(seed * 4 + 1);
  p.k = rounded(seed * 4 + 2);
  p.v = rounded(seed * 4 + 3);
  p.dout = rounded(seed * 4 + 4);
  absl::StatusOr<oracle::ForwardResult> fwd = oracle::Forward(c.spec, shape, p.q, p.k, p.v);
  if (!fwd.ok()) return fwd.status();
  p.forward = std::move(*fwd);
  absl::StatusOr<oracle::Gradients> grads = oracle::Backward(c.spec, shape, p.q, p.k, p.v, p.dout);
  if (!grads.ok()) return grads.status();
  p.grads = std::move(*grads);
  return p;
}

std::vector<double> ShardOf(const RingCase& c, const std::vector<double>& full, int rank) {
  std::vector<double> out;
  out.reserve(c.batch * c.shard_len * c.heads * c.head_dim);
  const int64_t row = c.heads * c.head_dim;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t first = (b * c.seq_len() + rank * c.shard_len) * row;
    out.insert(out.end(), full.begin() + first, full.begin() + first + c.shard_len * row);
  }
  return out;
}

std::vector<double> LseShardOf(const RingCase& c, const std::vector<double>& full, int rank) {
  std::vector<double> out;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t first = (b * c.heads + h) * c.seq_len() + rank * c.shard_len;
      out.insert(out.end(), full.begin() + first, full.begin() + first + c.shard_len);
    }
  }
  return out;
}

std::vector<RingCase> StandardCases(int ranks) {
  struct Pattern {
    const char* name;
    std::vector<int64_t> w, r;
  };
  const std::vector<Pattern> patterns = {
      {"local+spanning", {8, 32, 64}, {1, 2, 4}},
      {"straddling", {24, 40}, {3, 1}},
      {"sparse", {12, 1000}, {5, 20}},
  };
  std::vector<RingCase> cases;
  for (const Pattern& p : patterns) {
    for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
      for (bool causal : {false, true}) {
        for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
          RingCase c;
          c.name = p.name;
          c.spec.segment_lengths = p.w;
          c.spec.dilation_rates = p.r;
          c.spec.mode = mode;
          c.spec.causal = causal;
          c.ranks = ranks;
          c.dtype = dtype;
          // Grouped mode with H % G != 0 for the three-pattern case (H = 4, G = 3).
          c.heads = 4;
          c.batch = 2;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

std::string CountedBytesMatchPlan(const RingAttention& ring, const RingCase& c, const TensorView& q,
                                  int ranks, const comm::CommStats& before,
                                  const comm::CommStats& mid, const comm::CommStats& after) {
  std::string failures;
  for (bool backward : {false, true}) {
    absl::StatusOr<RingPlan> plan = ring.Plan(c.spec, c.seq_len(), q, backward);
    if (!plan.ok()) return plan.status().ToString();
    const comm::CommStats& a = backward ? mid : before;
    const comm::CommStats& b = backward ? after : mid;
    const char* pass = backward ? "backward" : "forward";
    if (b.p2p_bytes_sent - a.p2p_bytes_sent != plan->bytes_sent ||
        b.p2p_bytes_received - a.p2p_bytes_received != plan->bytes_received) {
      absl::StrAppend(&failures, "  ", pass, ": counted ", b.p2p_bytes_sent - a.p2p_bytes_sent,
                      " sent / ", b.p2p_bytes_received - a.p2p_bytes_received,
                      " received bytes, plan says ", plan->bytes_sent, " / ", plan->bytes_received,
                      "\n");
    }
    for (int peer = 0; peer < ranks; ++peer) {
      if (b.p2p_bytes_sent_to[peer] - a.p2p_bytes_sent_to[peer] != plan->bytes_sent_to[peer] ||
          b.p2p_bytes_received_from[peer] - a.p2p_bytes_received_from[peer] !=
              plan->bytes_received_from[peer]) {
        absl::StrAppend(&failures, "  ", pass, ": bytes with peer ", peer, " differ from plan\n");
      }
    }
  }
  return failures;
}

}  // namespace testing
}  // namespace ring
}  // namespace dattn
