#include "engine/cuda/stream_scratch.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_status.h"

namespace dattn {
namespace cuda {

absl::StatusOr<cudaMemPool_t> NewScratchPool(int device) {
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  DATTN_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&pool, &props));
  // Keep freed scratch for the next call instead of returning it at every synchronization.
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  const cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  if (e != cudaSuccess) {
    cudaMemPoolDestroy(pool);
    DATTN_CUDA_RETURN_IF_ERROR(e);
  }
  return pool;
}

StreamScratch::~StreamScratch() {
  for (void* p : ptrs_) cudaFreeAsync(p, stream_);
}

absl::StatusOr<char*> StreamScratch::Take(int64_t bytes) {
  void* p = nullptr;
  const cudaError_t e =
      cudaMallocFromPoolAsync(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), pool_, stream_);
  if (e != cudaSuccess) {
    if (e == cudaErrorMemoryAllocation) cudaGetLastError();  // not sticky: clear it
    // Out of memory is RESOURCE_EXHAUSTED (what the recovery acts on); a device error keeps its own
    // code, so that it is not mistaken for a full device.
    const absl::Status s = CudaErrorStatus(e, "cudaMallocFromPoolAsync", __FILE__, __LINE__);
    return absl::Status(
        s.code(), absl::StrCat("cannot take ", bytes, " bytes of device scratch: ", s.message()));
  }
  ptrs_.push_back(p);
  taken_ += bytes;
  return static_cast<char*>(p);
}

}  // namespace cuda
}  // namespace dattn
