#include "worker/pieces.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace dattn {
namespace worker {

absl::Status ForEachPiece(
    int64_t bytes, int64_t piece_bytes, int threads,
    const std::function<absl::Status(int64_t offset, int64_t length, int thread)>& fn) {
  if (bytes <= 0) return absl::OkStatus();
  const int64_t pieces = (bytes + piece_bytes - 1) / piece_bytes;
  const int n = static_cast<int>(std::min<int64_t>(std::max(threads, 1), pieces));
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first;
  auto run = [&](int t) {
    for (int64_t p = t; p < pieces && !failed.load(); p += n) {
      const int64_t offset = p * piece_bytes;
      absl::Status s = fn(offset, std::min(piece_bytes, bytes - offset), t);
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = s;
        failed = true;
      }
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<size_t>(n - 1));
  for (int t = 1; t < n; ++t) helpers.emplace_back(run, t);
  run(0);
  for (std::thread& h : helpers) h.join();
  return first;
}

}  // namespace worker
}  // namespace dattn
