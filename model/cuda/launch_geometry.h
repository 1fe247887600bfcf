// Launch geometry the model's kernels and its memory plan share (host-only, no CUDA headers): how
// many CTAs a row kernel runs, and so how many partial-sum rows it writes, and how many partial
// sums the cross-entropy writes. Pure inline functions; thread-safe.
#ifndef DATTN_MODEL_CUDA_LAUNCH_GEOMETRY_H_
#define DATTN_MODEL_CUDA_LAUNCH_GEOMETRY_H_

#include <algorithm>
#include <cstdint>

namespace dattn {
namespace model {
namespace cuda {

// The widest row the row kernels take (8 columns x 4 chunks x 512 threads).
inline constexpr int64_t kMaxRowWidth = 16384;
// The most threads of one row group (the kernels' launch bound, which leaves them 128 registers).
inline constexpr int kMaxRowThreads = 512;

struct RowLaunch {
  int vec = 1;       // 8-column chunks per thread: 1, 2 or 4
  int group = 32;    // threads of one row group (a multiple of 32)
  int groups = 1;    // row groups per CTA (CTAs of about 256 threads)
  int64_t ctas = 1;  // CTAs of the grid (and rows of a backward kernel's partial sums)
};

// Rows of n columns (n a multiple of 8 in [8, kMaxRowWidth], rows >= 1) on a device of num_sms
// multiprocessors. ctas is at most ctas_per_sm x num_sms: 4 for the backward kernels, so that
// their partial sums do not grow with the rows; the forward kernels, which write none, take 8.
inline RowLaunch RowLaunchFor(int64_t rows, int64_t n, int num_sms, int ctas_per_sm = 4) {
  RowLaunch l;
  const int64_t chunks = (n + 7) / 8;
  while ((chunks + l.vec - 1) / l.vec > kMaxRowThreads && l.vec < 4) l.vec *= 2;
  const int64_t per_group = (chunks + l.vec - 1) / l.vec;
  l.group = static_cast<int>((per_group + 31) / 32 * 32);
  l.groups = std::max(1, 256 / l.group);
  const int64_t needed = (rows + l.groups - 1) / l.groups;
  l.ctas =
      std::max<int64_t>(1, std::min<int64_t>(needed, static_cast<int64_t>(ctas_per_sm) * num_sms));
  return l;
}

// Cross-entropy: 8 rows (warps) per CTA, at most 1024 CTAs; one fp64 partial sum per CTA.
inline constexpr int kCrossEntropyWarps = 8;
inline int64_t CrossEntropyPartials(int64_t m) {
  return std::max<int64_t>(
      1, std::min<int64_t>((m + kCrossEntropyWarps - 1) / kCrossEntropyWarps, 1024));
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_LAUNCH_GEOMETRY_H_
