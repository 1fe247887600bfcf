// Shared pieces of the ring tests: a case (spec + global shape + ring size + dtype), its full
// inputs drawn from a seed (so every rank process derives the same tensors), the float64 oracle's
// answer, and slicing of full tensors into one rank's shard. Testing only.
#ifndef DATTN_ENGINE_RING_RING_TEST_UTIL_H_
#define DATTN_ENGINE_RING_RING_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/attention_spec.h"
#include "engine/comm/communicator.h"
#include "engine/ring/ring_attention.h"
#include "engine/tensor.h"
#include "engine/testing/oracle.h"
#include "engine/testing/test_util.h"

namespace dattn {
namespace ring {
namespace testing {

struct RingCase {
  std::string name;
  AttentionSpec spec;
  int64_t batch = 2;
  int64_t shard_len = 16;  // L = N / P.
  int64_t heads = 4;
  int64_t head_dim = 8;
  int ranks = 1;
  DType dtype = DType::kFloat64;

  int64_t seq_len() const { return shard_len * ranks; }
  oracle::Shape FullShape() const { return {batch, seq_len(), heads, head_dim}; }
  std::vector<int64_t> ShardDims() const { return {batch, shard_len, heads, head_dim}; }
  std::vector<int64_t> ShardLseDims() const { return {batch, heads, shard_len}; }
  double Tolerance() const { return testutil::SpecTolerance(dtype); }
  std::string Describe() const;  // name, spec, shape, P, dtype
};

// The full problem: inputs already rounded to the case's dtype, and the oracle's results on them.
struct FullProblem {
  std::vector<double> q, k, v, dout;
  oracle::ForwardResult forward;
  oracle::Gradients grads;
};

// Inputs from `seed` (the same on every process), then the oracle's forward and backward. The
// oracle errors (never expected) abort the test binary's child with a message; in-process tests
// check ok().
absl::StatusOr<FullProblem> MakeProblem(const RingCase& c, uint64_t seed);

// Rank `rank`'s slice of a full (B, N, H, D) tensor, or of a (B, H, N) lse.
std::vector<double> ShardOf(const RingCase& c, const std::vector<double>& full, int rank);
std::vector<double> LseShardOf(const RingCase& c, const std::vector<double>& full, int rank);

// The cases every ring test runs for ranks = P (shard length 16 unless said): local and spanning
// patterns (w = [8, 32, 64], r = [1, 2, 4]), overlapping straddling segments (w = 24), rates that
// divide no segment, a segment longer than N, chunks without selected rows (r >= L), partial last
// segments (P = 3), both modes, causal and not, fp64 and fp32.
std::vector<RingCase> StandardCases(int ranks);

// The bytes the communicator counted from `before` to `mid` (the forward) and from `mid` to `after`
// (the backward) against `ring`'s plan of each pass, in total and per peer of `ranks`: "" when they
// agree, else one line per difference (or the plan's error).
std::string CountedBytesMatchPlan(const RingAttention& ring, const RingCase& c, const TensorView& q,
                                  int ranks, const comm::CommStats& before,
                                  const comm::CommStats& mid, const comm::CommStats& after);

}  // namespace testing
}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_RING_TEST_UTIL_H_
