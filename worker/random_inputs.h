// Reproducible job inputs: the standard-normal tensors q, k, v and dout of an attention job.
//
// Every element is a pure function of (seed, tensor, global flat index), so any rank of a
// sequence-parallel ring can generate exactly its shard of the single-rank inputs without talking
// to the others, and a job rerun anywhere sees the same numbers (AttentionJobSpec.seed's promise).
//
// The generator, written down so that another implementation (a Python checker, a GPU kernel) can
// reproduce it bit for bit given the same libm:
//   golden   = 0x9E3779B97F4A7C15
//   Mix(z)   = splitmix64's finalizer: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
//              z *= 0x94D049BB133111EB; z ^= z >> 31.
//   key      = Mix(seed + golden * (tensor + 1))                  (tensor: q=0, k=1, v=2, dout=3)
//   z0, z1   = Mix(key + golden * (2*i + 1)), Mix(key + golden * (2*i + 2))
//              i.e. outputs 2i and 2i+1 of a splitmix64 stream whose state starts at `key`, reached
//              directly by counter instead of by stepping.
//   u1       = ((z0 >> 11) + 1) * 2^-53                           in (0, 1]
//   u2       = (z1 >> 11) * 2^-53                                 in [0, 1)
//   x        = sqrt(-2 ln u1) * cos(2 pi u2)                      (Box-Muller, cosine branch only)
// computed in double and rounded once to the tensor's dtype. i is the element's row-major flat
// index in the FULL (B, N, H, D) tensor: ((b * N + n) * H + h) * D + d, whatever shard is being
// generated. Values are bit-identical wherever the same libm is used; across libm versions they
// agree to about an ulp of fp64 (log, cos and sqrt are the only inexact steps). GPU workers run the
// same code (normal_generator.h) with CUDA's log and cos (within 1-2 ulp of fp64): their 16-bit
// inputs match a host fill bit for bit except where the double lands within those ulps of a
// rounding midpoint (about 2^-43 of elements), their fp32 inputs except for about 2^-28 of elements
// (one fp32 ulp apart). Every rank of a ring generates with the same kind of device, so a ring and
// the single-rank job of one kind of device see the same numbers.
//
// All functions are pure and thread-safe.
#ifndef DATTN_WORKER_RANDOM_INPUTS_H_
#define DATTN_WORKER_RANDOM_INPUTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/tensor.h"

namespace dattn {
namespace worker {

// The tensor stream ids of an attention job's inputs; part of the generator's definition above.
enum class InputTensor : uint32_t { kQ = 0, kK = 1, kV = 2, kDout = 3 };

// Element i of `tensor` under `seed`: a standard normal deviate as defined above.
double StandardNormalAt(uint64_t seed, InputTensor tensor, uint64_t index);

// The positions [begin, end) of the sequence that rank `rank` of a ring of `size` holds: rank r of
// P gets [r*N/P, (r+1)*N/P). Requires 0 <= rank < size and N >= 0; P need not divide N here (the
// job validation requires it, this function does not).
struct PositionRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
PositionRange RankPositions(int64_t seq_len, int rank, int size);

// Full-tensor geometry of the job: (batch, seq_len, num_heads, head_dim).
struct FullShape {
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
};

// Fills `out` with the elements of `tensor` at positions [positions.begin, positions.end) of the
// full tensor `full`. `out` must be a contiguous host view of shape (B, positions.size(), H, D), of
// any dtype (fp16 and bf16 round once from the double, half_float.h). Work is split over
// `num_threads` threads (<= 1: the calling thread only); the result does not depend on the thread
// count. Errors (nothing written): INVALID_ARGUMENT naming the bad value for a shape or range
// mismatch, a non-contiguous or non-host view, a null pointer.
absl::Status FillStandardNormal(uint64_t seed, InputTensor tensor, const FullShape& full,
                                PositionRange positions, const TensorView& out,
                                int num_threads = 1);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_RANDOM_INPUTS_H_
