// Pieces shared by our Hopper (sm_90a) attention kernels, forward (hopper_attention.cu) and
// backward (hopper_backward.cu): PTX wrappers for mbarriers, TMA and wgmma, the element-type
// dispatch of the tensor-core operations, and the host-side tensor maps of strided views. Include
// only from .cu files; everything is inline.
#ifndef DATTN_ENGINE_CUDA_HOPPER_PTX_CUH_
#define DATTN_ENGINE_CUDA_HOPPER_PTX_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "engine/cuda/kernel_types.h"

namespace dattn {
namespace cuda {
namespace hopper {

constexpr int kSwizzleCols = 64;  // 16-bit columns per 128-byte swizzled row: TMA box width

// PTX wrappers. Only the sm_90a pass of nvcc compiles them (the compute_90 PTX has no wgmma; the
// kernel bodies trap there).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void BarrierInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void BarrierExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void BarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void BarrierWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// A box of 64 columns x 128 rows of a 4-D tensor map {D, rows, heads, count} into shared memory;
// completion is counted in bytes on `bar`.
__device__ __forceinline__ void TmaLoad(const CUtensorMap* map, uint32_t dst, uint32_t bar, int c0,
                                        int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into shared
// memory; completion is counted in bytes on `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most `kPending` committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins registers that an in-flight wgmma reads or writes: the compiler neither moves their uses
// across this point nor reuses them (it knows nothing of wgmma's asynchrony). Emits no instruction.
template <int N>
__device__ __forceinline__ void FenceRegs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int M>
__device__ __forceinline__ void FenceRegs(uint32_t (&r)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int x = 0; x < 4; ++x) asm volatile("" : "+r"(r[i][x])::"memory");
  }
}

// Named barriers 1 and 2 (0 is __syncthreads) over the 256 consumer threads: one warpgroup waits
// on its own, the other arrives on it.
__device__ __forceinline__ void NamedSync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void NamedArrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// 2^x on the special-function unit (flush-to-zero; -inf gives 0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (16-byte units). K-major operands: 8-row core groups 1024 bytes apart (stride), the
// leading offset unused. N-major (v): 8-key groups 1024 bytes apart, 64-column blocks `lead` bytes
// apart.
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lead) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lead >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (uint64_t{1} << 62);
}

// d (+)= a b^T for TYPE (bf16 or f16): a (64 x 16) and b (128 x 16) K-major in shared memory
// (descriptors); accumulate == 0 overwrites d.
#define DATTN_WGMMA_SS_M64N128K16(TYPE)                                                            \
  __device__ __forceinline__ void WgmmaSS_m64n128k16_##TYPE(float(&d)[64], uint64_t a, uint64_t b, \
                                                            int accumulate) {                      \
    asm volatile(                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                               \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TYPE "." #TYPE                             \
        " "                                                                                        \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "    \
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "    \
        "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"    \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),            \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),            \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),            \
          "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),            \
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),            \
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),            \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),            \
          "+f"(d[62]), "+f"(d[63])                                                                 \
        : "l"(a), "l"(b), "r"(accumulate));                                                        \
  }

// d (+)= a b^T for TYPE (bf16 or f16): a (64 x 16) and b (64 x 16) K-major in shared memory
// (descriptors); accumulate == 0 overwrites d.
#define DATTN_WGMMA_SS_M64N64K16(TYPE)                                                             \
  __device__ __forceinline__ void WgmmaSS_m64n64k16_##TYPE(float(&d)[32], uint64_t a, uint64_t b,  \
                                                           int accumulate) {                       \
    asm volatile(                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                               \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TYPE "." #TYPE                              \
        " "                                                                                        \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, " \
        "0;\n}\n"                                                                                  \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),            \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])             \
        : "l"(a), "l"(b), "r"(accumulate));                                                        \
  }

// d += a b for TYPE (bf16 or f16), N = 64: a (64 x 16) in registers (the accumulator layout of
// the scores, packed), b (16 x 64) N-major in shared memory.
#define DATTN_WGMMA_RS_M64N64K16(TYPE)                                                             \
  __device__ __forceinline__ void WgmmaRS_m64n64k16_##TYPE(float(&d)[32], const uint32_t(&a)[4],   \
                                                           uint64_t b) {                           \
    asm volatile(                                                                                  \
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                                 \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TYPE "." #TYPE                              \
        " "                                                                                        \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, " \
        "%36, p, 1, 1, 1;\n}\n"                                                                    \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),            \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])             \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                     \
  }

// d += a b for TYPE (bf16 or f16), N = 128: a (64 x 16) in registers (the accumulator layout of
// the scores, packed), b (16 x 128) N-major in shared memory.
#define DATTN_WGMMA_RS_M64N128K16(TYPE)                                                           \
  __device__ __forceinline__ void WgmmaRS_m64n128k16_##TYPE(float(&d)[64], const uint32_t(&a)[4], \
                                                            uint64_t b) {                         \
    asm volatile(                                                                                 \
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                                \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TYPE "." #TYPE                            \
        " "                                                                                       \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "   \
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "   \
        "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, "  \
        "1, 1, 1;\n}\n"                                                                           \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),     \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),           \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),           \
          "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),           \
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),           \
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),           \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),           \
          "+f"(d[62]), "+f"(d[63])                                                                \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                    \
  }

DATTN_WGMMA_SS_M64N128K16(bf16)
DATTN_WGMMA_SS_M64N128K16(f16)
DATTN_WGMMA_SS_M64N64K16(bf16)
DATTN_WGMMA_SS_M64N64K16(f16)
DATTN_WGMMA_RS_M64N64K16(bf16)
DATTN_WGMMA_RS_M64N64K16(f16)
DATTN_WGMMA_RS_M64N128K16(bf16)
DATTN_WGMMA_RS_M64N128K16(f16)
#undef DATTN_WGMMA_SS_M64N128K16
#undef DATTN_WGMMA_SS_M64N64K16
#undef DATTN_WGMMA_RS_M64N64K16
#undef DATTN_WGMMA_RS_M64N128K16

// The tensor-core operations of one element type: S = q k^T (m64n128k16, both from shared
// memory), O += P v (m64nDk16, P from registers), and the packing of two floats into the A operand.
template <typename T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void S(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    WgmmaSS_m64n128k16_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void S(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    WgmmaSS_m64n64k16_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void PV(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    WgmmaRS_m64n64k16_bf16(d, a, b);
  }
  static __device__ __forceinline__ void PV(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    WgmmaRS_m64n128k16_bf16(d, a, b);
  }
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <>
struct Mma<__half> {
  static __device__ __forceinline__ void S(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    WgmmaSS_m64n128k16_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void S(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    WgmmaSS_m64n64k16_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void PV(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    WgmmaRS_m64n64k16_f16(d, a, b);
  }
  static __device__ __forceinline__ void PV(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    WgmmaRS_m64n128k16_f16(d, a, b);
  }
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
// The next work item of a persistent kernel's CTA from the global counter, or `items` (the end
// mark) once none is left. Past the last item the counter keeps counting (once per CTA): compared
// unsigned, so that it cannot wrap into a valid item.
__device__ __forceinline__ int NextItem(unsigned* counter, int items) {
  const unsigned drawn = atomicAdd(counter, 1u);
  return drawn < static_cast<unsigned>(items) ? static_cast<int>(drawn) : items;
}

// The producer's claim of its CTA's next work item into the item's fixed buffer: the item comes
// from `counter` (NextItem); once the consumers have released the buffer (`buffers` of them used
// in turn, `items` claimed before this one) its index goes into `slot`, which the consumers read
// after `bar_full` completes. Returns the item, or the end mark `end`, which is published with an
// arrival that carries no bytes so that the consumers stop too.
__device__ __forceinline__ int ClaimItem(unsigned* counter, int end, int items, int buffers,
                                         int* slot, uint32_t bar_empty, uint32_t bar_full) {
  const int w = NextItem(counter, end);
  if (items >= buffers) BarrierWait(bar_empty, ((items / buffers) - 1) & 1);
  *slot = w;
  if (w == end) BarrierArrive(bar_full);
  return w;
}

// A buffer this warp no longer reads goes back to the producer: one arrival per warp (its wgmma
// reads are complete once the warp has passed the wait of their group).
__device__ __forceinline__ void ReleaseFromWarp(uint32_t bar, int lane) {
  __syncwarp();
  if (lane == 0) BarrierArrive(bar);
}

// Warps 1-3 of a producer warpgroup (kZeroWarpThreads threads): they follow the items the
// producer publishes in `slots` (buffer items % buffers, its `full` barrier as the consumers wait
// for it), release each slot like a consumer warp (the `empty` barrier counts them: 8 consumer
// warps + kZeroWarps) once read, and call zero(item) for every item before the end mark `end`.
constexpr int kZeroWarps = 3;
constexpr int kZeroWarpThreads = 32 * kZeroWarps;
template <typename FullBar, typename EmptyBar, typename ZeroItem>
__device__ __forceinline__ void ZeroWarpsLoop(const int* slots, int buffers, int end, int lane,
                                              FullBar full, EmptyBar empty, ZeroItem zero) {
  for (int items = 0;; ++items) {
    const int b = items % buffers;
    BarrierWait(full(b), (items / buffers) & 1);
    const int w = slots[b];
    ReleaseFromWarp(empty(b), lane);  // the slot is read; the buffer's tiles are not ours
    if (w == end) return;
    zero(w);
  }
}

// Grouped mode's zeros around the selected rows [row0, row0 + 128) (clipped to `rows`) of one
// (block, head) of a 16-bit view (UnselectedRows, hopper_attention.h): the rate - 1 positions
// after each selected row that lie within the segment (`span` positions from the first selected
// row on), and for the first tile the `lead` positions before the first selected row. `first`:
// the view's element (row 0, column 0) of the block and head; pos: its element stride between
// consecutive positions. Written by `Threads` threads (tid in [0, Threads), a multiple of D / 8),
// 16-byte stores, D / 8 per row; a thread keeps one 16-byte column and walks rows `step` apart (no
// division per store: the gap index advances by carries).
template <int D, int Threads, typename T>
__device__ __forceinline__ void ZeroUnselectedRows(T* first, int rate, int lead, int span,
                                                   int64_t pos, int row0, int rows, int tid) {
  constexpr int kVecs = D / 8;
  static_assert(Threads % kVecs == 0, "every thread keeps one 16-byte column");
  constexpr int kStep = Threads / kVecs;
  const int r1 = rate - 1;
  const int gaps = (min(row0 + 128, rows) - row0) * r1;
  const int slot = tid / kVecs;
  first += (tid % kVecs) * 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int s_step = kStep / r1, k_step = kStep % r1;
  int s = row0 + slot / r1, k = slot % r1;  // gap row: position s * rate + 1 + k
  for (int rv = slot; rv < gaps; rv += kStep) {
    const int q = s * rate + 1 + k;  // relative to the block's first selected row
    if (q < span) *reinterpret_cast<uint4*>(first + q * pos) = zero;
    s += s_step;
    k += k_step;
    if (k >= r1) {
      k -= r1;
      ++s;
    }
  }
  if (row0 == 0) {
    for (int i = slot; i < lead; i += kStep) {
      *reinterpret_cast<uint4*>(first + (i - lead) * pos) = zero;
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// cuTensorMapEncodeTiled from the driver, found once through the runtime (no -lcuda link).
inline PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 4-D map {D, rows, heads, count} of a strided view, boxes of 64 columns x box_rows rows,
// 128-byte swizzle; rows past `rows` read as zeros. A dimension of extent 1 gets a harmless stride.
inline bool EncodeView(CUtensorMap* map, const KernelTensor& t, ElemType type, int64_t count,
                       int64_t heads, int64_t rows, int64_t dim, int box_rows) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeTiled();
  if (encode == nullptr) return false;
  const int64_t row_bytes = t.seq * 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(count)};
  const cuuint64_t strides[3] = {
      static_cast<cuuint64_t>(row_bytes),
      static_cast<cuuint64_t>(heads > 1 ? t.head * 2 : row_bytes * rows),
      static_cast<cuuint64_t>(count > 1 ? t.fold * 2 : row_bytes * rows)};
  const cuuint32_t box[4] = {kSwizzleCols, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(
      map,
      type == ElemType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, t.ptr, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace hopper
}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_HOPPER_PTX_CUH_
