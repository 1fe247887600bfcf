#include "worker/random_inputs.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/tensor.h"
#include "gtest/gtest.h"
#include "worker/half_float.h"

namespace dattn {
namespace worker {
namespace {

template <typename T>
std::vector<T> Generate(uint64_t seed, InputTensor tensor, const FullShape& full,
                        PositionRange positions, DType dtype, int threads) {
  std::vector<T> data(
      static_cast<size_t>(full.batch * positions.size() * full.num_heads * full.head_dim),
      std::nan(""));
  TensorView view = TensorView::Contiguous(
      data.data(), dtype, {full.batch, positions.size(), full.num_heads, full.head_dim});
  absl::Status status = FillStandardNormal(seed, tensor, full, positions, view, threads);
  EXPECT_TRUE(status.ok()) << status;
  return data;
}

TEST(RandomInputsTest, SameArgumentsGiveSameValuesAndThreadCountDoesNotMatter) {
  const FullShape full{2, 37, 3, 5};
  const PositionRange all{0, full.seq_len};
  std::vector<double> a = Generate<double>(7, InputTensor::kQ, full, all, DType::kFloat64, 1);
  std::vector<double> b = Generate<double>(7, InputTensor::kQ, full, all, DType::kFloat64, 1);
  std::vector<double> c = Generate<double>(7, InputTensor::kQ, full, all, DType::kFloat64, 4);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(double)));
  EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(double)));
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i], StandardNormalAt(7, InputTensor::kQ, i)) << "element " << i;
  }
}

TEST(RandomInputsTest, SeedAndTensorChangeTheStream) {
  const FullShape full{1, 16, 2, 4};
  const PositionRange all{0, full.seq_len};
  std::vector<double> q = Generate<double>(1, InputTensor::kQ, full, all, DType::kFloat64, 1);
  std::vector<double> k = Generate<double>(1, InputTensor::kK, full, all, DType::kFloat64, 1);
  std::vector<double> q2 = Generate<double>(2, InputTensor::kQ, full, all, DType::kFloat64, 1);
  int same_k = 0, same_seed = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    same_k += q[i] == k[i];
    same_seed += q[i] == q2[i];
  }
  EXPECT_EQ(same_k, 0);
  EXPECT_EQ(same_seed, 0);
}

TEST(RandomInputsTest, ShardsEqualSlicesOfTheFullTensor) {
  const FullShape full{3, 24, 4, 6};
  const PositionRange all{0, full.seq_len};
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    std::vector<double> whole64;
    std::vector<float> whole32;
    if (dtype == DType::kFloat64) {
      whole64 = Generate<double>(99, InputTensor::kV, full, all, dtype, 2);
    } else {
      whole32 = Generate<float>(99, InputTensor::kV, full, all, dtype, 2);
    }
    for (int ranks : {1, 2, 3, 4, 5}) {  // 5 does not divide 24: uneven shards still match.
      int64_t covered = 0;
      for (int r = 0; r < ranks; ++r) {
        const PositionRange pos = RankPositions(full.seq_len, r, ranks);
        EXPECT_EQ(pos.begin, r * full.seq_len / ranks);
        covered += pos.size();
        const int64_t row = full.num_heads * full.head_dim;
        std::vector<double> shard64;
        std::vector<float> shard32;
        if (dtype == DType::kFloat64) {
          shard64 = Generate<double>(99, InputTensor::kV, full, pos, dtype, 3);
        } else {
          shard32 = Generate<float>(99, InputTensor::kV, full, pos, dtype, 3);
        }
        for (int64_t b = 0; b < full.batch; ++b) {
          for (int64_t n = 0; n < pos.size(); ++n) {
            const int64_t local = (b * pos.size() + n) * row;
            const int64_t global = (b * full.seq_len + pos.begin + n) * row;
            const bool same =
                dtype == DType::kFloat64
                    ? std::memcmp(&shard64[local], &whole64[global], row * sizeof(double)) == 0
                    : std::memcmp(&shard32[local], &whole32[global], row * sizeof(float)) == 0;
            ASSERT_TRUE(same) << DTypeName(dtype) << " ranks " << ranks << " rank " << r << " b "
                              << b << " n " << n;
          }
        }
      }
      EXPECT_EQ(covered, full.seq_len);
    }
  }
}

TEST(RandomInputsTest, Fp32IsTheRoundedFp64Value) {
  const FullShape full{1, 8, 2, 8};
  const PositionRange all{0, full.seq_len};
  std::vector<double> d = Generate<double>(5, InputTensor::kDout, full, all, DType::kFloat64, 1);
  std::vector<float> f = Generate<float>(5, InputTensor::kDout, full, all, DType::kFloat32, 1);
  for (size_t i = 0; i < d.size(); ++i) ASSERT_EQ(f[i], static_cast<float>(d[i]));
}

TEST(RandomInputsTest, MomentsAreThoseOfAStandardNormal) {
  const int64_t n = 1 << 18;
  double sum = 0, sum2 = 0, sum3 = 0, sum4 = 0;
  int64_t beyond2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = StandardNormalAt(12345, InputTensor::kK, static_cast<uint64_t>(i));
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sum2 += x * x;
    sum3 += x * x * x;
    sum4 += x * x * x * x;
    beyond2 += std::fabs(x) > 2.0;
  }
  const double mean = sum / n;
  const double var = sum2 / n - mean * mean;
  // Standard errors at n = 2^18: mean 0.002, variance 0.003, skew 0.005, kurtosis 0.01.
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.015);
  EXPECT_NEAR(sum3 / n, 0.0, 0.03);
  EXPECT_NEAR(sum4 / n, 3.0, 0.06);
  EXPECT_NEAR(static_cast<double>(beyond2) / n, 0.0455, 0.003);
}

TEST(RandomInputsTest, RejectsBadViews) {
  const FullShape full{1, 8, 2, 4};
  std::vector<double> data(64);
  TensorView wrong_shape = TensorView::Contiguous(data.data(), DType::kFloat64, {1, 4, 2, 4});
  EXPECT_EQ(FillStandardNormal(1, InputTensor::kQ, full, {0, 8}, wrong_shape).code(),
            absl::StatusCode::kInvalidArgument);
  TensorView ok = TensorView::Contiguous(data.data(), DType::kFloat64, {1, 8, 2, 4});
  EXPECT_EQ(FillStandardNormal(1, InputTensor::kQ, full, {4, 12}, ok).code(),
            absl::StatusCode::kInvalidArgument);
  TensorView null = TensorView::Contiguous(nullptr, DType::kFloat64, {1, 8, 2, 4});
  EXPECT_EQ(FillStandardNormal(1, InputTensor::kQ, full, {0, 8}, null).code(),
            absl::StatusCode::kInvalidArgument);
}

// 16-bit shards hold the double values rounded once: the same numbers as the fp64 shard, narrowed.
TEST(RandomInputsTest, SixteenBitShardsAreTheDoublesRoundedOnce) {
  const FullShape full{2, 12, 3, 4};
  const PositionRange positions{4, 10};
  const int64_t n = full.batch * positions.size() * full.num_heads * full.head_dim;
  const std::vector<int64_t> shape = {full.batch, positions.size(), full.num_heads, full.head_dim};
  std::vector<double> wide(n);
  ASSERT_TRUE(FillStandardNormal(9, InputTensor::kV, full, positions,
                                 TensorView::Contiguous(wide.data(), DType::kFloat64, shape))
                  .ok());
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> narrow(n, 0xffff);
    ASSERT_TRUE(FillStandardNormal(9, InputTensor::kV, full, positions,
                                   TensorView::Contiguous(narrow.data(), dtype, shape), 3)
                    .ok());
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want =
          dtype == DType::kFloat16 ? DoubleToHalfBits(wide[i]) : DoubleToBFloat16Bits(wide[i]);
      ASSERT_EQ(narrow[i], want) << DTypeName(dtype) << " element " << i;
    }
  }
}

// Golden values pin the generator's definition (random_inputs.h): a change to the hash, the uniform
// mapping or Box-Muller changes every job's inputs and must be deliberate. The values come from an
// independent Python transcription of the header's definition (same libm); 1e-15 allows for a libm
// that differs in the last ulp.
TEST(RandomInputsTest, GoldenValues) {
  EXPECT_NEAR(StandardNormalAt(0, InputTensor::kQ, 0), -0.2788749225862045, 1e-15);
  EXPECT_NEAR(StandardNormalAt(0, InputTensor::kQ, 1), -0.7642228620191814, 1e-15);
  EXPECT_NEAR(StandardNormalAt(42, InputTensor::kK, 12345), 2.353467092001057, 1e-15);
  EXPECT_NEAR(StandardNormalAt(~uint64_t{0}, InputTensor::kDout, 1000000000000ull),
              1.8221539856635915, 1e-15);
}

}  // namespace
}  // namespace worker
}  // namespace dattn
