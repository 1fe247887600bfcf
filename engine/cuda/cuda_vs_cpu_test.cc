// The CUDA backend against the CPU backend in fp64 on shapes too large for the loop-by-loop oracle
// (docs/ENGINE.md, "Oracle and tolerances"): the benchmark's pattern list
// scaled down to N = 8192 (4 x the largest segment) and an N that is not a multiple of it, both
// modes, causal and not, forward and backward, bf16 and fp16. Fresh random inputs; poisoned
// outputs.
//
// Without a GPU every test skips with the reason.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/attention_spec.h"
#include "engine/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

using testutil::HostTensor;

struct Device {
  void* ptr = nullptr;
  explicit Device(size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~Device() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

std::vector<double> Fetch(const void* ptr, DType dtype, std::vector<int64_t> shape) {
  HostTensor host(dtype, shape);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  cudaMemcpy(host.view().data, ptr, n * DTypeSize(dtype), cudaMemcpyDeviceToHost);
  return host.ToDoubles();
}

using Param = std::tuple<DType, AttentionMode, bool /*causal*/, int64_t /*N*/>;

class CudaVsCpuTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> made = NewCudaBackend();
    if (!made.ok()) GTEST_SKIP() << made.status().message();
    cuda_ = std::move(*made);
  }
  std::unique_ptr<CudaAttentionBackend> cuda_;
};

TEST_P(CudaVsCpuTest, ForwardAndBackwardMatchCpuFp64) {
  const auto [dtype, mode, causal, n] = GetParam();
  SCOPED_TRACE(testutil::ReproduceHint());
  AttentionSpec spec;
  spec.segment_lengths = {256, 512, 1024, 2048};
  spec.dilation_rates = {1, 2, 4, 8};
  spec.mode = mode;
  spec.causal = causal;
  const int64_t b = 1, h = 8, d = 64;
  const std::vector<int64_t> dims = {b, n, h, d}, lse_dims = {b, h, n};
  const int64_t elems = b * n * h * d;
  const char* names[4] = {"q", "k", "v", "dout"};
  std::vector<HostTensor> inputs;  // rounded to dtype
  std::vector<HostTensor> wide;    // the same values in fp64 for the CPU backend
  std::vector<std::unique_ptr<Device>> dev;
  for (const char* name : names) {
    inputs.push_back(HostTensor::FromValues(
        dtype, dims, testutil::RandomValues(elems, testutil::CheckSeed(name))));
    wide.push_back(HostTensor::FromValues(DType::kFloat64, dims, inputs.back().ToDoubles()));
    dev.push_back(std::make_unique<Device>(elems * DTypeSize(dtype)));
    ASSERT_NE(dev.back()->ptr, nullptr);
    cudaMemcpy(dev.back()->ptr, inputs.back().view().data, elems * DTypeSize(dtype),
               cudaMemcpyHostToDevice);
  }
  // out, dq, dk, dv (dtype) and lse (fp32), poisoned.
  std::vector<std::unique_ptr<Device>> outs;
  for (int i = 0; i < 4; ++i) outs.push_back(std::make_unique<Device>(elems * DTypeSize(dtype)));
  Device lse(b * h * n * 4);
  for (const auto& o : outs) cudaMemset(o->ptr, 0xFF, elems * DTypeSize(dtype));
  cudaMemset(lse.ptr, 0xFF, b * h * n * 4);
  cudaDeviceSynchronize();
  auto view = [&, dtype = dtype](void* p) {
    return TensorView::Contiguous(p, dtype, dims, dattn::Device::kCuda);
  };
  const TensorView lse_view =
      TensorView::Contiguous(lse.ptr, DType::kFloat32, lse_dims, dattn::Device::kCuda);
  ASSERT_TRUE(cuda_
                  ->Forward(spec, {view(dev[0]->ptr), view(dev[1]->ptr), view(dev[2]->ptr),
                                   view(outs[0]->ptr), lse_view})
                  .ok());
  absl::Status s = cuda_->Backward(
      spec, {view(dev[0]->ptr), view(dev[1]->ptr), view(dev[2]->ptr), view(outs[0]->ptr), lse_view,
             view(dev[3]->ptr), view(outs[1]->ptr), view(outs[2]->ptr), view(outs[3]->ptr)});
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(cuda_->Synchronize().ok());

  std::unique_ptr<AttentionBackend> cpu = NewCpuBackend();
  HostTensor out(DType::kFloat64, dims), lse_ref(DType::kFloat64, lse_dims);
  HostTensor dq(DType::kFloat64, dims), dk(DType::kFloat64, dims), dv(DType::kFloat64, dims);
  s = cpu->Forward(spec,
                   {wide[0].view(), wide[1].view(), wide[2].view(), out.view(), lse_ref.view()});
  ASSERT_TRUE(s.ok()) << s;
  s = cpu->Backward(spec, {wide[0].view(), wide[1].view(), wide[2].view(), out.view(),
                           lse_ref.view(), wide[3].view(), dq.view(), dk.view(), dv.view()});
  ASSERT_TRUE(s.ok()) << s;

  const double tol = testutil::SpecTolerance(dtype);
  EXPECT_TRUE(
      testutil::RelativelyNear("out", Fetch(outs[0]->ptr, dtype, dims), out.ToDoubles(), tol));
  EXPECT_TRUE(testutil::LseNear("lse", Fetch(lse.ptr, DType::kFloat32, lse_dims),
                                lse_ref.ToDoubles(), 1e-4));
  EXPECT_TRUE(
      testutil::RelativelyNear("dq", Fetch(outs[1]->ptr, dtype, dims), dq.ToDoubles(), tol));
  EXPECT_TRUE(
      testutil::RelativelyNear("dk", Fetch(outs[2]->ptr, dtype, dims), dk.ToDoubles(), tol));
  EXPECT_TRUE(
      testutil::RelativelyNear("dv", Fetch(outs[3]->ptr, dtype, dims), dv.ToDoubles(), tol));
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dtype, mode, causal, n] = info.param;
  return std::string(DTypeName(dtype)) + "_" + AttentionModeName(mode) + (causal ? "_causal" : "") +
         "_n" + std::to_string(n);
}

INSTANTIATE_TEST_SUITE_P(
    LargerShapes, CudaVsCpuTest,
    ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                       ::testing::Values(AttentionMode::kGrouped, AttentionMode::kMixture),
                       ::testing::Bool(), ::testing::Values(int64_t{8192}, int64_t{7000})),
    Name);

}  // namespace
}  // namespace dattn
