// The model's view of attention: dilated attention over the positions a rank holds.
//
// The model hands over q, k, v (already rotated: rotary positions are the model's, computed from
// absolute positions) for its rows, (B, n, H, D), together with where those rows sit in the whole
// sequence: positions [offset, offset + n) of `total` (engine/attention.h's layouts otherwise).
// One device holding the whole sequence has offset 0 and n = total (NewLocalAttention). A
// sequence-parallel rank of the ring engine (engine/ring/ring_attention.h) holds a contiguous
// shard, offset = rank * total / P, n = total / P, and implements this interface by calling
// RingAttention::Forward/Backward(spec, total, args) after checking that the offset is its own:
// the model code does not change.
//
// Errors: the backend's (INVALID_ARGUMENT from engine/validate.h before anything is written), and
// INVALID_ARGUMENT naming the values when the positions do not fit this implementation.
// Thread-safety: one call at a time per instance.
#ifndef DATTN_MODEL_SEQUENCE_ATTENTION_H_
#define DATTN_MODEL_SEQUENCE_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "engine/attention.h"

namespace dattn {
namespace model {

// Where a call's rows lie in the whole sequence.
struct SequencePositions {
  int64_t offset = 0;  // Absolute position of row 0.
  int64_t total = 0;   // Length of the whole sequence, every rank together.
};

class SequenceAttention {
 public:
  virtual ~SequenceAttention() = default;

  virtual Device device() const = 0;

  // out, lse := this rank's rows of dilated attention over the whole sequence.
  virtual absl::Status Forward(const AttentionSpec& spec, const SequencePositions& positions,
                               const ForwardArgs& args) = 0;
  // dq, dk, dv := this rank's rows of the gradients.
  virtual absl::Status Backward(const AttentionSpec& spec, const SequencePositions& positions,
                                const BackwardArgs& args) = 0;
};

// Attention on one device that holds the whole sequence, through `backend` (borrowed; it must
// outlive the result). With causal attention it also takes the first n < total positions of a
// longer sequence (a prompt whose rotary positions are planned for the context it will grow to:
// decoder.h), since no row of a causal prefix sees a later one. Other calls with offset != 0 or
// n != total are INVALID_ARGUMENT naming them.
std::unique_ptr<SequenceAttention> NewLocalAttention(AttentionBackend* backend);

// The same, owning a CPU backend (engine/cpu_backend.h) with `num_threads` threads (0: all cores).
std::unique_ptr<SequenceAttention> NewCpuLocalAttention(int num_threads);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_SEQUENCE_ATTENTION_H_
