// What our own Hopper forward kernel takes (host-only checks; no GPU needed, runs in CI). Its
// numerics are checked on the GPU against the oracle (cuda_backend_test: OwnHopperKernelTest).
#include "engine/cuda/hopper_attention.h"

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
  EXPECT_EQ(LaunchHopperForward(a, {}, &counter, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchHopperForward(ValidArgs(64), {}, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace cuda
}  // namespace dattn
