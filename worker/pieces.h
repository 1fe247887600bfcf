// Work on a byte range cut into pieces, spread over threads: the copies between an Attend call's
// shared-memory region and a rank's tensors (TaskDevice::FillDevice, DrainDevice).
#ifndef DATTN_WORKER_PIECES_H_
#define DATTN_WORKER_PIECES_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace dattn {
namespace worker {

// Cuts [0, bytes) into pieces of `piece_bytes` (the last may be shorter) and calls
// `fn(offset, length, thread)` for each, on min(threads, pieces) threads (the calling thread is
// thread 0): thread t takes pieces t, t + T, t + 2T, ... in order. After the first error no thread
// starts another piece; returns that error once every thread has ended, else OK. bytes == 0 calls
// nothing. `piece_bytes` and `threads` must be >= 1.
absl::Status ForEachPiece(
    int64_t bytes, int64_t piece_bytes, int threads,
    const std::function<absl::Status(int64_t offset, int64_t length, int thread)>& fn);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_PIECES_H_
