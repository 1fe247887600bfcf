// The float64 oracle: the function of docs/ENGINE.md written out loop by loop.
//
// Every backend test (CPU, CUDA, and the ring's CPU and CUDA kernels) compares its results against
// these functions, with the tolerances of docs/ENGINE.md "Oracle and tolerances". They are written
// for clarity, not speed: O(B * H * N * w * D) time per pattern, and the backward pass builds each
// segment's explicit probability matrix (O(w^2) memory). Use them on small shapes only (a few
// thousand positions).
//
// The oracle is independent of the engine on purpose: it takes the AttentionSpec struct and nothing
// else from engine/, and re-derives the geometry (segments, selected rows, head groups, offsets)
// from the spec, so that a mistake in the engine's dilation helpers cannot hide in both.
//
// Layouts: q, k, v, out, dout, dq, dk, dv are std::vector<double> in row-major (B, N, H, D); lse is
// row-major (B, H, N). A test of a backend converts its tensors with testutil::ToDoubles (the
// inputs the backend actually saw, after rounding to its dtype) and feeds those to the oracle.
//
// Functions are pure and thread-safe. Errors: INVALID_ARGUMENT when the spec or the sizes are
// outside what the spec defines (empty or unequal lists, w_i < 1, r_i < 1, H < G in grouped mode, a
// dimension < 1, a vector of the wrong size); the oracle does not reproduce validate.h's messages.
// head_offsets is ignored in grouped mode (validation rejects blocked there; the oracle need not).
#ifndef DATTN_ENGINE_TESTING_ORACLE_H_
#define DATTN_ENGINE_TESTING_ORACLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/attention_spec.h"

namespace dattn {
namespace oracle {

struct Shape {
  int64_t batch = 1;
  int64_t seq_len = 1;
  int64_t num_heads = 1;
  int64_t head_dim = 1;

  int64_t NumElements() const { return batch * seq_len * num_heads * head_dim; }
  int64_t NumLseElements() const { return batch * num_heads * seq_len; }
  std::vector<int64_t> Dims() const { return {batch, seq_len, num_heads, head_dim}; }
  std::vector<int64_t> LseDims() const { return {batch, num_heads, seq_len}; }
  // Flat index of element (b, p, h, d) of a (B, N, H, D) tensor.
  int64_t Index(int64_t b, int64_t p, int64_t h, int64_t d) const {
    return ((b * seq_len + p) * num_heads + h) * head_dim + d;
  }
  // Flat index of row (b, h, p) of a (B, H, N) lse tensor.
  int64_t LseIndex(int64_t b, int64_t h, int64_t p) const {
    return (b * num_heads + h) * seq_len + p;
  }
};

struct ForwardResult {
  std::vector<double> out;  // (B, N, H, D)
  std::vector<double> lse;  // (B, H, N); -inf at rows no pattern selects.
};

struct Gradients {
  std::vector<double> dq, dk, dv;  // (B, N, H, D) each.
};

// out and lse of dilated attention under `spec` (both modes).
absl::StatusOr<ForwardResult> Forward(const AttentionSpec& spec, const Shape& shape,
                                      const std::vector<double>& q, const std::vector<double>& k,
                                      const std::vector<double>& v);

// Gradients of sum(out * dout) with respect to q, k and v (the forward pass is recomputed).
absl::StatusOr<Gradients> Backward(const AttentionSpec& spec, const Shape& shape,
                                   const std::vector<double>& q, const std::vector<double>& k,
                                   const std::vector<double>& v, const std::vector<double>& dout);

// ---------------------------------------------------------------------------------------------------
// The pieces, exposed for tests that check one step at a time (e.g. a ring's per-pattern partials).
// They assume arguments that Forward would accept.

// The scale the spec uses for head dimension D: spec.scale if set, else 1 / sqrt(D).
double Scale(const AttentionSpec& spec, int64_t head_dim);

// Offset of each of the `num_heads` heads in pattern `pattern`, or -1 for a head that does not use
// the pattern (grouped mode: the heads outside group `pattern`).
std::vector<int64_t> PatternOffsets(const AttentionSpec& spec, int pattern, int64_t num_heads);

// The positions a pattern (segment length w, rate r, offset o) selects in a sequence of seq_len
// positions: one list per segment, in index order; a list is empty when the offset falls outside a
// (partial) segment.
std::vector<std::vector<int64_t>> SelectedRows(int64_t seq_len, int64_t w, int64_t r, int64_t o);

// One pattern's attention, before the 1/G of grouped mode and before mixing.
struct PatternResult {
  std::vector<double> out;     // (B, N, H, D): A at rows the pattern selects, 0 elsewhere.
  std::vector<double> lse;     // (B, H, N): the row's log-sum-exp, -inf where not selected.
  std::vector<char> selected;  // (B, H, N): 1 where the pattern selects the row.
};
PatternResult PatternForward(const Shape& shape, const std::vector<double>& q,
                             const std::vector<double>& k, const std::vector<double>& v, int64_t w,
                             int64_t r, const std::vector<int64_t>& head_offsets, bool causal,
                             double scale);

// Adds one pattern's contribution to dq, dk, dv (each (B, N, H, D), already sized), given the
// gradient of the loss with respect to the pattern's output rows (g_out, (B, N, H, D)) and its
// log-sum-exp rows (g_lse, (B, H, N)). Only selected rows of g_out and g_lse are read.
void PatternBackward(const Shape& shape, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, int64_t w, int64_t r,
                     const std::vector<int64_t>& head_offsets, bool causal, double scale,
                     const std::vector<double>& g_out, const std::vector<double>& g_lse,
                     std::vector<double>* dq, std::vector<double>* dk, std::vector<double>* dv);

}  // namespace oracle
}  // namespace dattn

#endif  // DATTN_ENGINE_TESTING_ORACLE_H_
