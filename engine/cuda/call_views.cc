#include "engine/cuda/call_views.h"

namespace dattn {
namespace cuda {

KernelTensor ViewTensor(const TensorView& t, const BlockCall& call, int64_t seq_len) {
  const CallView v = ViewOf(call, seq_len, t.strides[0], t.strides[1], t.strides[2]);
  KernelTensor k;
  k.ptr = static_cast<char*>(t.data) + v.base * static_cast<int64_t>(DTypeSize(t.dtype));
  k.fold = v.fold;
  k.head = v.head;
  k.seq = v.seq;
  k.chan = t.strides[3];
  return k;
}

KernelTensor PackedTensor(void* ptr, int64_t heads, int64_t rows, int64_t dim) {
  KernelTensor k;
  k.ptr = ptr;
  k.seq = dim;
  k.head = rows * dim;
  k.fold = heads * rows * dim;
  k.chan = 1;
  return k;
}

bool CudnnReadable(const KernelTensor& t) {
  constexpr int64_t kElems16 = 8;  // 16 bytes of a 16-bit type
  return t.chan == 1 && t.fold >= 0 && t.head >= 0 && t.seq >= 0 && t.fold % kElems16 == 0 &&
         t.head % kElems16 == 0 && t.seq % kElems16 == 0 &&
         reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0;
}

SdpaStrides StridesOf(const KernelTensor& t) { return {t.fold, t.head, t.seq}; }

SdpaForwardArgs SdpaForwardOn(const SdpaShape& shape, const KernelTensor& q, const KernelTensor& k,
                              const KernelTensor& v, const KernelTensor& o, float scale) {
  SdpaForwardArgs a;
  a.shape = shape;
  a.q_strides = StridesOf(q);
  a.k_strides = StridesOf(k);
  a.v_strides = StridesOf(v);
  a.o_strides = StridesOf(o);
  a.q = q.ptr;
  a.k = k.ptr;
  a.v = v.ptr;
  a.o = o.ptr;
  a.scale = scale;
  return a;
}

CallRows CallRowsOf(const BlockCall& call) {
  CallRows r;
  r.first_flat = call.first_flat;
  r.block_step = call.block_step;
  r.rate = call.rate;
  r.head0 = call.group.head0;
  r.head_step = call.group.head_step;
  r.count = call.count;
  r.heads = call.group.heads;
  r.rows = call.rows;
  return r;
}

}  // namespace cuda
}  // namespace dattn
