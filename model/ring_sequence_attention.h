// Sequence-parallel attention for the model (sequence_attention.h) over the ring engine
// (engine/ring/ring_attention.h): the S ranks of a sequence-parallel group each hold a contiguous
// slice of N/S positions of every row, and together compute exactly the dilated attention of the
// whole sequence (docs/RING.md). The model code does not change: a rank's LongNetLM runs Forward
// on its slice with TokenBatch::positions = {offset, N}, and its attention calls land here.
//
// Each call checks that the positions are this rank's shard of the ring, offset == rank * N / S
// and n * S == N (n: the rows of q), and then calls RingAttention::Forward / Backward(spec, N,
// args); INVALID_ARGUMENT naming the values otherwise (nothing is communicated then, so a rank
// that refuses leaves its peers waiting until the communicator's timeout: every rank of the group
// must call with its own shard). With causal attention the ranks may also hold the first n * S <
// N positions of a longer sequence (offset == rank * n): a prompt whose rotary positions are
// planned for the context it will grow to (decoder.h). The ring then runs over those n * S
// positions, which gives exactly their rows of the whole sequence's attention (no causal row sees
// a later one, and the prefix's segments start where the sequence's do).
//
// Collective contract (ring_attention.h): every rank of `sp` calls Forward (or Backward) with the
// same spec, the same N and same-shaped slices, in the same order. A model on a sequence-parallel
// rank is therefore driven in lockstep with its group: the trainer (trainer.h) does so.
//
// Ownership: `sp` and `kernels` are borrowed and must outlive the result; `sp` carries only the
// ring's traffic while a call runs (the trainer's data-parallel collective uses another
// communicator). Errors: the ring's (ring_attention.h): INVALID_ARGUMENT for shapes, FAILED_
// PRECONDITION for a device mismatch or ranks that disagree, the communicator's errors (sticky).
// Thread-safety: one call at a time.
#ifndef DATTN_MODEL_RING_SEQUENCE_ATTENTION_H_
#define DATTN_MODEL_RING_SEQUENCE_ATTENTION_H_

#include <memory>

#include "engine/comm/communicator.h"
#include "engine/ring/block_kernels.h"
#include "engine/ring/ring_attention.h"
#include "model/sequence_attention.h"

namespace dattn {
namespace model {

std::unique_ptr<SequenceAttention> NewRingSequenceAttention(comm::Communicator* sp,
                                                            ring::BlockKernels* kernels,
                                                            ring::RingOptions options = {});

// The same, owning CPU block kernels (engine/ring/cpu_block_kernels.h) with `num_threads` threads
// (0: all cores): what a CPU training rank uses.
std::unique_ptr<SequenceAttention> NewCpuRingSequenceAttention(comm::Communicator* sp,
                                                               int num_threads,
                                                               ring::RingOptions options = {});

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_RING_SEQUENCE_ATTENTION_H_
