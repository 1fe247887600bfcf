#include "worker/random_inputs.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/half_float.h"
#include "worker/normal_generator.h"

namespace dattn {
namespace worker {
namespace {

using normal_generator::NormalFromKey;

uint64_t StreamKey(uint64_t seed, InputTensor tensor) {
  return normal_generator::StreamKey(seed, static_cast<uint32_t>(tensor));
}

// Element storage of each dtype, rounded once from the double.
struct ToFloat {
  float operator()(double x) const { return static_cast<float>(x); }
};
struct ToDouble {
  double operator()(double x) const { return x; }
};
struct ToHalf {
  uint16_t operator()(double x) const { return DoubleToHalfBits(x); }
};
struct ToBFloat16 {
  uint16_t operator()(double x) const { return DoubleToBFloat16Bits(x); }
};

// Fills rows [row_begin, row_end) of the shard; a row is one (b, local position) pair of H*D
// elements.
template <typename T, typename Convert>
void FillRows(uint64_t key, const FullShape& full, PositionRange positions, T* out,
              int64_t row_begin, int64_t row_end, Convert convert) {
  const int64_t row_elems = full.num_heads * full.head_dim;
  const int64_t local_n = positions.size();
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / local_n;
    const int64_t n = positions.begin + row % local_n;
    const uint64_t global = static_cast<uint64_t>((b * full.seq_len + n) * row_elems);
    T* dst = out + row * row_elems;
    for (int64_t e = 0; e < row_elems; ++e) {
      dst[e] = convert(NormalFromKey(key, global + static_cast<uint64_t>(e)));
    }
  }
}

}  // namespace

double StandardNormalAt(uint64_t seed, InputTensor tensor, uint64_t index) {
  return NormalFromKey(StreamKey(seed, tensor), index);
}

PositionRange RankPositions(int64_t seq_len, int rank, int size) {
  PositionRange range;
  // 128-bit products: r * N can pass 2^63 only for absurd N, but the cost is nil.
  range.begin = static_cast<int64_t>(static_cast<__int128>(rank) * seq_len / size);
  range.end = static_cast<int64_t>(static_cast<__int128>(rank + 1) * seq_len / size);
  return range;
}

absl::Status FillStandardNormal(uint64_t seed, InputTensor tensor, const FullShape& full,
                                PositionRange positions, const TensorView& out, int num_threads) {
  if (full.batch < 1 || full.seq_len < 1 || full.num_heads < 1 || full.head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("random inputs: full shape must be positive, got (", full.batch, ", ",
                     full.seq_len, ", ", full.num_heads, ", ", full.head_dim, ")"));
  }
  if (positions.begin < 0 || positions.end > full.seq_len || positions.begin > positions.end) {
    return absl::InvalidArgumentError(absl::StrCat("random inputs: positions [", positions.begin,
                                                   ", ", positions.end, ") outside [0, ",
                                                   full.seq_len, ")"));
  }
  const std::vector<int64_t> want = {full.batch, positions.size(), full.num_heads, full.head_dim};
  if (out.shape != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "random inputs: output view ", out.DebugString(), " should have shape [", full.batch, ", ",
        positions.size(), ", ", full.num_heads, ", ", full.head_dim, "]"));
  }
  if (out.device != Device::kCpu || !out.IsContiguous() || out.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("random inputs: output view ", out.DebugString(),
                                                   " must be contiguous, non-null host memory"));
  }
  const int64_t rows = full.batch * positions.size();
  if (rows == 0) return absl::OkStatus();
  const uint64_t key = StreamKey(seed, tensor);
  auto fill = [&](int64_t begin, int64_t end) {
    switch (out.dtype) {
      case DType::kFloat32:
        FillRows(key, full, positions, static_cast<float*>(out.data), begin, end, ToFloat());
        break;
      case DType::kFloat64:
        FillRows(key, full, positions, static_cast<double*>(out.data), begin, end, ToDouble());
        break;
      case DType::kFloat16:
        FillRows(key, full, positions, static_cast<uint16_t*>(out.data), begin, end, ToHalf());
        break;
      case DType::kBFloat16:
        FillRows(key, full, positions, static_cast<uint16_t*>(out.data), begin, end, ToBFloat16());
        break;
    }
  };
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(num_threads, rows));
  if (threads == 1) {
    fill(0, rows);
    return absl::OkStatus();
  }
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int64_t t = 1; t < threads; ++t) {
    pool.emplace_back(fill, rows * t / threads, rows * (t + 1) / threads);
  }
  fill(0, rows / threads);
  for (std::thread& th : pool) th.join();
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace dattn
