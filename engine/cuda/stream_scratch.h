// Stream-ordered device scratch for the engine's CUDA work (the backend and the ring's CUDA
// kernels): a memory pool that keeps what is freed for the next call, and a scope whose allocations
// go back to that pool on the stream when the scope ends, so that a call never synchronizes the
// device to allocate or free.
#ifndef DATTN_ENGINE_CUDA_STREAM_SCRATCH_H_
#define DATTN_ENGINE_CUDA_STREAM_SCRATCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace dattn {
namespace cuda {

// A pool of device memory on `device` that keeps freed memory (release threshold: never) until
// cudaMemPoolTrimTo. The caller destroys it with cudaMemPoolDestroy. Errors as cuda_status.h maps
// them.
absl::StatusOr<cudaMemPool_t> NewScratchPool(int device);

// Allocations taken from `pool` in stream order on `stream` (neither owned); each is freed on the
// stream when the scope ends, after the work enqueued meanwhile. One thread at a time.
class StreamScratch {
 public:
  StreamScratch(cudaMemPool_t pool, cudaStream_t stream) : pool_(pool), stream_(stream) {}
  ~StreamScratch();
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  // `bytes` (at least 1) of device memory for work enqueued on the stream after this call.
  // RESOURCE_EXHAUSTED naming the size when the pool cannot grow (that CUDA error is cleared);
  // other CUDA errors as cuda_status.h maps them.
  absl::StatusOr<char*> Take(int64_t bytes);
  // What the scope has taken so far.
  int64_t taken_bytes() const { return taken_; }

 private:
  cudaMemPool_t pool_;
  cudaStream_t stream_;
  std::vector<void*> ptrs_;
  int64_t taken_ = 0;
};

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_STREAM_SCRATCH_H_
