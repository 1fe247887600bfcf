#include "engine/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

using ::testing::HasSubstr;

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_STREQ(DTypeName(DType::kFloat16), "fp16");
  EXPECT_STREQ(DTypeName(DType::kBFloat16), "bf16");
  EXPECT_STREQ(DTypeName(DType::kFloat32), "fp32");
  EXPECT_STREQ(DTypeName(DType::kFloat64), "fp64");
  EXPECT_STREQ(DeviceName(Device::kCpu), "cpu");
}

TEST(DTypeTest, ParseAcceptsShortAndLongNames) {
  const std::vector<std::pair<std::string, DType>> names = {
      {"fp16", DType::kFloat16},      {"float16", DType::kFloat16}, {"bf16", DType::kBFloat16},
      {"bfloat16", DType::kBFloat16}, {"fp32", DType::kFloat32},    {"float32", DType::kFloat32},
      {"fp64", DType::kFloat64},      {"float64", DType::kFloat64},
  };
  for (const auto& [name, dtype] : names) {
    auto parsed = ParseDType(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_EQ(*parsed, dtype) << name;
  }
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    EXPECT_EQ(*ParseDType(DTypeName(dtype)), dtype);
  }
}

TEST(DTypeTest, ParseRejectsOtherNamesNamingThemAndTheAcceptedOnes) {
  for (const std::string& bad : {std::string("fp8"), std::string(""), std::string("FP32x"),
                                 std::string("int32"), std::string("float")}) {
    auto parsed = ParseDType(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("'" + bad + "'"))
        << "the message should quote the rejected name";
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("bf16"));
  }
}

TEST(TensorViewTest, ContiguousStridesAndCounts) {
  float data[2 * 3 * 4 * 5];
  const TensorView v = TensorView::Contiguous(data, DType::kFloat32, {2, 3, 4, 5});
  EXPECT_EQ(v.data, data);
  EXPECT_EQ(v.device, Device::kCpu);
  EXPECT_EQ(v.rank(), 4);
  EXPECT_EQ(v.strides, (std::vector<int64_t>{60, 20, 5, 1}));
  EXPECT_EQ(v.NumElements(), 120);
  EXPECT_TRUE(v.IsContiguous());

  TensorView transposed = v;
  std::swap(transposed.shape[1], transposed.shape[2]);
  std::swap(transposed.strides[1], transposed.strides[2]);
  EXPECT_FALSE(transposed.IsContiguous());
  EXPECT_EQ(transposed.NumElements(), 120);

  TensorView padded = v;
  padded.strides = {72, 24, 6, 1};
  EXPECT_FALSE(padded.IsContiguous());

  const TensorView empty = TensorView::Contiguous(data, DType::kFloat64, {2, 0, 4, 5});
  EXPECT_EQ(empty.NumElements(), 0);

  const TensorView cuda = TensorView::Contiguous(data, DType::kFloat16, {1, 2}, Device::kCuda, 3);
  EXPECT_EQ(cuda.device, Device::kCuda);
  EXPECT_EQ(cuda.device_index, 3);
}

TEST(TensorViewTest, DebugString) {
  float data[1];
  EXPECT_EQ(TensorView::Contiguous(data, DType::kFloat32, {2, 1024, 16, 64}).DebugString(),
            "[2, 1024, 16, 64] fp32 cpu");
}

}  // namespace
}  // namespace dattn
