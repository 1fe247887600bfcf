// What our own Hopper forward and backward kernels take (host-only checks; no GPU needed, runs in
// CI). Their numerics are checked on the GPU against the oracle (cuda_backend_test:
// OwnHopperKernelTest).
#include "engine/cuda/hopper_attention.h"

#include "engine/cuda/hopper_backward.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace dattn {
namespace cuda {
namespace {

// A grouped-mode call as the backend makes one: 4 blocks (segments) of 2048 selected rows of 4
// heads, rate 2, in a (1, N, H = 16, D) bf16 tensor; pointers are only checked, never read.
KernelForwardArgs ValidArgs(int64_t dim) {
  alignas(256) static char storage[4096];
  const int64_t heads = 16, rate = 2, segment = 4096;
  KernelTensor view;
  view.ptr = storage;
  view.fold = segment * heads * dim;
  view.head = dim;
  view.seq = rate * heads * dim;
  view.chan = 1;
  KernelForwardArgs a;
  a.type = ElemType::kBF16;
  a.q = a.k = a.v = a.o = view;
  a.stats = reinterpret_cast<float*>(storage);
  a.count = 4;
  a.heads = 4;
  a.rows = 2048;
  a.head_dim = dim;
  a.scale = 0.125f;
  return a;
}

UnselectedRows ValidZeros(int64_t dim) {
  UnselectedRows z;
  z.rate = 2;
  z.lead = 1;
  z.span = 4095;
  z.pos_stride = 16 * dim;
  return z;
}

TEST(HopperAttentionTest, TakesBf16AndFp16AtD64AndD128) {
  for (int64_t dim : {64, 128}) {
    for (ElemType type : {ElemType::kBF16, ElemType::kF16}) {
      KernelForwardArgs a = ValidArgs(dim);
      a.type = type;
      EXPECT_TRUE(HopperForwardSupported(a)) << dim;
      EXPECT_TRUE(HopperForwardSupported(a, ValidZeros(dim))) << dim;
    }
  }
}

TEST(HopperAttentionTest, RefusesWhatTmaOrTheKernelCannotDo) {
  const KernelForwardArgs valid = ValidArgs(64);
  KernelForwardArgs a = valid;
  a.type = ElemType::kF32;
  EXPECT_FALSE(HopperForwardSupported(a)) << "fp32";
  a = valid;
  a.head_dim = 96;
  EXPECT_FALSE(HopperForwardSupported(a)) << "D = 96";
  a = valid;
  a.q.chan = 2;
  EXPECT_FALSE(HopperForwardSupported(a)) << "channel stride";
  a = valid;
  a.k.ptr = static_cast<char*>(a.k.ptr) + 8;
  EXPECT_FALSE(HopperForwardSupported(a)) << "k not 16-byte aligned";
  a = valid;
  a.v.seq += 4;  // 8 bytes more: not a multiple of 16 bytes
  EXPECT_FALSE(HopperForwardSupported(a)) << "row stride";
  a = valid;
  a.q.head = 0;  // several heads at one address
  EXPECT_FALSE(HopperForwardSupported(a)) << "zero head stride";
  a = valid;
  a.stats = nullptr;
  EXPECT_FALSE(HopperForwardSupported(a)) << "no stats";
  a = valid;
  a.o.seq += 1;
  EXPECT_FALSE(HopperForwardSupported(a)) << "odd output stride";
  a = valid;
  a.rows = 0;
  EXPECT_FALSE(HopperForwardSupported(a)) << "no rows";
  a = valid;
  a.heads = 70000;
  EXPECT_FALSE(HopperForwardSupported(a)) << "heads past the grid";
}

TEST(HopperAttentionTest, RefusesZeroRowsItCannotWrite) {
  const KernelForwardArgs a = ValidArgs(64);
  UnselectedRows z = ValidZeros(64);
  z.rate = 1;
  EXPECT_FALSE(HopperForwardSupported(a, z)) << "rate 1 has no unselected rows";
  z = ValidZeros(64);
  z.lead = 2;
  EXPECT_FALSE(HopperForwardSupported(a, z)) << "lead >= rate";
  z = ValidZeros(64);
  z.pos_stride = 4;  // 8 bytes
  EXPECT_FALSE(HopperForwardSupported(a, z)) << "16-byte stores";
  KernelForwardArgs b = a;
  b.o.ptr = static_cast<char*>(b.o.ptr) + 4;
  EXPECT_TRUE(HopperForwardSupported(b)) << "4-byte aligned o is enough without zeros";
  EXPECT_FALSE(HopperForwardSupported(b, ValidZeros(64))) << "zeros need 16-byte aligned o";
}

TEST(HopperAttentionTest, LaunchRefusesBeforeTouchingTheDevice) {
  KernelForwardArgs a = ValidArgs(64);
  a.head_dim = 96;
  unsigned counter = 0;
  EXPECT_EQ(LaunchHopperForward(a, false, {}, &counter, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchHopperForward(ValidArgs(64), false, {}, nullptr, nullptr), cudaErrorInvalidValue);
  // Zeros belong to grouped mode's direct calls; a call that merges into the output has none.
  KernelForwardArgs z = ValidArgs(64);
  ASSERT_TRUE(HopperForwardSupported(z, ValidZeros(64)));
  EXPECT_EQ(LaunchHopperForward(z, true, ValidZeros(64), &counter, nullptr), cudaErrorInvalidValue);
}

// The backward call matching ValidArgs: dq, dk, dv and dout through the same views, the gathered
// lse and the row terms in 256-byte aligned scratch.
KernelBackwardArgs ValidBackwardArgs(int64_t dim) {
  const KernelForwardArgs f = ValidArgs(dim);
  KernelBackwardArgs a;
  a.type = f.type;
  a.q = a.k = a.v = a.o = a.dout = a.dq = a.dk = a.dv = f.q;
  a.stats = f.stats;
  a.delta = f.stats;
  a.count = f.count;
  a.heads = f.heads;
  a.rows = f.rows;
  a.head_dim = dim;
  a.scale = f.scale;
  a.delta_scale = 4.0f;
  return a;
}

TEST(HopperBackwardTest, TakesBf16AndFp16AtD64AndD128) {
  for (int64_t dim : {64, 128}) {
    for (ElemType type : {ElemType::kBF16, ElemType::kF16}) {
      KernelBackwardArgs a = ValidBackwardArgs(dim);
      a.type = type;
      EXPECT_TRUE(HopperBackwardSupported(a)) << dim;
    }
  }
}

TEST(HopperBackwardTest, RefusesWhatTmaOrTheKernelsCannotDo) {
  const KernelBackwardArgs valid = ValidBackwardArgs(64);
  KernelBackwardArgs a = valid;
  a.type = ElemType::kF32;
  EXPECT_FALSE(HopperBackwardSupported(a)) << "fp32";
  a = valid;
  a.head_dim = 96;
  EXPECT_FALSE(HopperBackwardSupported(a)) << "D = 96";
  a = valid;
  a.dout.ptr = static_cast<char*>(a.dout.ptr) + 8;
  EXPECT_FALSE(HopperBackwardSupported(a)) << "dout not 16-byte aligned";
  a = valid;
  a.q.seq += 4;  // 8 bytes more: not a multiple of 16 bytes
  EXPECT_FALSE(HopperBackwardSupported(a)) << "row stride";
  a = valid;
  a.dk.seq += 1;
  EXPECT_FALSE(HopperBackwardSupported(a)) << "odd gradient stride";
  a = valid;
  a.dv.chan = 2;
  EXPECT_FALSE(HopperBackwardSupported(a)) << "gradient channel stride";
  a = valid;
  a.delta = nullptr;
  EXPECT_FALSE(HopperBackwardSupported(a)) << "no row-term scratch";
  a = valid;
  a.delta = reinterpret_cast<float*>(static_cast<char*>(a.o.ptr) + 4);
  EXPECT_FALSE(HopperBackwardSupported(a)) << "row terms not 16-byte aligned";
  a = valid;
  a.stats = nullptr;
  EXPECT_FALSE(HopperBackwardSupported(a)) << "no lse";
  a = valid;
  a.heads = 70000;
  EXPECT_FALSE(HopperBackwardSupported(a)) << "heads past the grid";
  unsigned counter = 0;
  a = valid;
  a.head_dim = 96;
  EXPECT_EQ(LaunchHopperBackward(a, false, {}, &counter, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchHopperBackward(valid, false, {}, nullptr, nullptr), cudaErrorInvalidValue);
  // Zeros belong to grouped mode's direct calls; a call that adds into the gradients has none.
  EXPECT_EQ(LaunchHopperBackward(valid, true, ValidZeros(64), &counter, nullptr),
            cudaErrorInvalidValue);
}

TEST(HopperBackwardTest, WritesZeroRowsOnlyWhereItCanStoreWholeRows) {
  const KernelBackwardArgs valid = ValidBackwardArgs(64);
  EXPECT_TRUE(HopperBackwardSupported(valid, ValidZeros(64)));
  UnselectedRows z = ValidZeros(64);
  z.rate = 1;
  EXPECT_FALSE(HopperBackwardSupported(valid, z)) << "rate 1 has no unselected rows";
  z = ValidZeros(64);
  z.rate = 3;  // the views' row stride is 2 positions
  EXPECT_FALSE(HopperBackwardSupported(valid, z)) << "row stride not a whole number of positions";
  KernelBackwardArgs a = valid;
  a.dk.ptr = static_cast<char*>(a.dk.ptr) + 4;
  EXPECT_TRUE(HopperBackwardSupported(a)) << "4-byte aligned dk is enough without zeros";
  EXPECT_FALSE(HopperBackwardSupported(a, ValidZeros(64))) << "zeros need 16-byte aligned dk";
}

TEST(HopperBackwardTest, RowTermsArePaddedToWholeStreamedTiles) {
  EXPECT_EQ(HopperRowTermsFloats(1, 1, 1), 2 * 128);
  EXPECT_EQ(HopperRowTermsFloats(4, 3, 2048), 2 * 4 * 3 * 2048);
  EXPECT_EQ(HopperRowTermsFloats(2, 5, 700), 2 * 2 * 5 * 768);
}

}  // namespace
}  // namespace cuda
}  // namespace dattn
