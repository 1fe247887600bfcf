// The GPU device of dattn-worker-gpu: inputs generated on the GPU against the host generator.
// Skips, saying why, where there is no usable GPU (CI).
#include "worker/cuda_device.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "gtest/gtest.h"
#include "worker/random_inputs.h"

namespace dattn {
namespace worker {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TaskDevice>> made = NewCudaDevice({});
    if (!made.ok()) GTEST_SKIP() << "no usable GPU: " << made.status();
    device_ = *std::move(made);
  }
  std::unique_ptr<TaskDevice> device_;
};

// The shard [begin, end) of a (B, N, H, D) input, generated on the GPU and on the host.
struct Filled {
  std::vector<char> gpu, host;
};

Filled FillBoth(TaskDevice* device, DType dtype, uint64_t seed, InputTensor tensor,
                const FullShape& full, PositionRange positions) {
  const std::vector<int64_t> shape = {full.batch, positions.size(), full.num_heads, full.head_dim};
  const int64_t bytes = full.batch * positions.size() * full.num_heads * full.head_dim *
                        static_cast<int64_t>(DTypeSize(dtype));
  Filled f;
  f.gpu.resize(static_cast<size_t>(bytes));
  f.host.resize(static_cast<size_t>(bytes));
  absl::StatusOr<DeviceBuffer> buffer = device->Allocate(bytes, "test input");
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return f;
  const TensorView on_gpu = TensorView::Contiguous(buffer->get(), dtype, shape, Device::kCuda, 0);
  absl::Status filled = device->FillInput(seed, tensor, full, positions, on_gpu, 1);
  EXPECT_TRUE(filled.ok()) << filled;
  EXPECT_TRUE(device->CopyToHost(f.gpu.data(), buffer->get(), bytes).ok());
  const TensorView on_host = TensorView::Contiguous(f.host.data(), dtype, shape);
  EXPECT_TRUE(FillStandardNormal(seed, tensor, full, positions, on_host, 4).ok());
  return f;
}

TEST_F(CudaDeviceTest, SixteenBitInputsMatchTheHostBitForBit) {
  const FullShape full{2, 1000, 3, 24};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (PositionRange positions : {PositionRange{0, 1000}, PositionRange{250, 750}}) {
      const Filled f = FillBoth(device_.get(), dtype, 77, InputTensor::kV, full, positions);
      ASSERT_EQ(f.gpu.size(), f.host.size());
      EXPECT_EQ(std::memcmp(f.gpu.data(), f.host.data(), f.gpu.size()), 0)
          << DTypeName(dtype) << " positions [" << positions.begin << ", " << positions.end << ")";
    }
  }
}

TEST_F(CudaDeviceTest, Fp32InputsMatchTheHostWithinAnUlp) {
  const FullShape full{1, 4096, 4, 64};  // 2^20 elements
  const Filled f = FillBoth(device_.get(), DType::kFloat32, 5, InputTensor::kQ, full, {0, 4096});
  const size_t n = f.gpu.size() / 4;
  ASSERT_GT(n, 0u);
  int64_t differing = 0;
  for (size_t i = 0; i < n; ++i) {
    int32_t a = 0, b = 0;
    std::memcpy(&a, f.gpu.data() + 4 * i, 4);
    std::memcpy(&b, f.host.data() + 4 * i, 4);
    if (a == b) continue;
    ++differing;
    EXPECT_LE(std::abs(static_cast<int64_t>(a) - b), 1) << "element " << i;
  }
  // log and cos differ from glibc's by an ulp or two of fp64: a handful of 2^20 elements may round
  // the other way; a systematic difference would show up as thousands.
  EXPECT_LE(differing, 8);
}

TEST_F(CudaDeviceTest, FillInputRejectsWhatItCannotWrite) {
  const FullShape full{1, 64, 2, 8};
  absl::StatusOr<DeviceBuffer> buffer = device_->Allocate(64 * 2 * 8 * 8, "test input");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const TensorView wrong_shape =
      TensorView::Contiguous(buffer->get(), DType::kBFloat16, {1, 32, 2, 8}, Device::kCuda, 0);
  absl::Status s = device_->FillInput(1, InputTensor::kQ, full, {0, 64}, wrong_shape, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const TensorView fp64 =
      TensorView::Contiguous(buffer->get(), DType::kFloat64, {1, 64, 2, 8}, Device::kCuda, 0);
  s = device_->FillInput(1, InputTensor::kQ, full, {0, 64}, fp64, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("fp64"), std::string::npos) << s;
  const TensorView ok =
      TensorView::Contiguous(buffer->get(), DType::kBFloat16, {1, 64, 2, 8}, Device::kCuda, 0);
  s = device_->FillInput(1, InputTensor::kQ, full, {10, 74}, ok, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace worker
}  // namespace dattn
