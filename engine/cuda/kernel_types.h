// Plain types shared by the CUDA backend's kernel launchers and their C++ callers (no absl, no CUDA
// headers beyond the runtime API, so that nvcc and the host compiler both include it).
#ifndef DATTN_ENGINE_CUDA_KERNEL_TYPES_H_
#define DATTN_ENGINE_CUDA_KERNEL_TYPES_H_

#include <cstdint>

namespace dattn {
namespace cuda {

// Element type of the (B, N, H, D) tensors a kernel reads and writes; accumulation is always fp32.
enum class ElemType : int { kF16 = 0, kBF16 = 1, kF32 = 2 };

// A strided [count, heads, rows, D] view: element (j, k, s, d) is at
// ptr + j * fold + k * head + s * seq + d * chan (element units, not bytes).
struct KernelTensor {
  void* ptr = nullptr;
  int64_t fold = 0;
  int64_t head = 0;
  int64_t seq = 0;
  int64_t chan = 1;
};

// The rows of one batched call in the (B, N, H) row space: block j, head k, row s is flat position
// first_flat + j * block_step + s * rate (flat = b * N + p; a block never crosses a batch item) and
// head head0 + k * head_step. Its row index is flat * H + head; its lse index (b * H + head) * N +
// p.
struct CallRows {
  int64_t first_flat = 0;
  int64_t block_step = 0;
  int64_t rate = 1;
  int64_t head0 = 0;
  int64_t head_step = 1;
  int64_t count = 0;
  int64_t heads = 0;
  int64_t rows = 0;
};

// Which heads a fill touches and which offset each uses in one pattern (w, r).
struct HeadRule {
  enum Kind : int { kFixed = 0, kModulo = 1, kBlocked = 2 };
  Kind kind = kFixed;
  int64_t head_begin = 0;  // heads [head_begin, head_end)
  int64_t head_end = 0;
  int64_t fixed_offset = 0;  // kFixed: every head's offset
  int64_t segment = 1;       // w
  int64_t rate = 1;          // r
  int64_t block = 1;         // kBlocked: ceil(H / r)
};

// Floats of the scratch our Hopper backward (hopper_backward.h) needs for `count` x `heads`
// attentions of `rows` rows: the log-sum-exp and the row sum of dout * o of every row, each
// (block, head) padded to a multiple of 128 rows (whole streamed tiles).
inline int64_t HopperRowTermsFloats(int64_t count, int64_t heads, int64_t rows) {
  return 2 * count * heads * ((rows + 127) / 128 * 128);
}

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_KERNEL_TYPES_H_
