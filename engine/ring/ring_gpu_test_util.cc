#include "engine/ring/ring_gpu_test_util.h"

#include <cuda_runtime_api.h>

#include "engine/testing/test_util.h"

namespace dattn {
namespace ring {
namespace testing {

DeviceBuffer::DeviceBuffer(int64_t bytes) {
  if (cudaMalloc(&ptr_, static_cast<size_t>(bytes > 0 ? bytes : 1)) != cudaSuccess) {
    cudaGetLastError();
    ptr_ = nullptr;
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

namespace {

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

DeviceTensor ToDevice(DType dtype, const std::vector<int64_t>& shape,
                      const std::vector<double>& values, int device) {
  testutil::HostTensor host = testutil::HostTensor::FromValues(dtype, shape, values);
  const int64_t bytes = Elements(shape) * static_cast<int64_t>(DTypeSize(dtype));
  DeviceTensor t;
  t.buffer = std::make_unique<DeviceBuffer>(bytes);
  if (t.buffer->ok()) {
    cudaMemcpy(t.buffer->get(), host.view().data, static_cast<size_t>(bytes),
               cudaMemcpyHostToDevice);
  }
  t.view = TensorView::Contiguous(t.buffer->get(), dtype, shape, Device::kCuda, device);
  return t;
}

DeviceTensor PoisonedTensor(DType dtype, const std::vector<int64_t>& shape, int device) {
  const int64_t bytes = Elements(shape) * static_cast<int64_t>(DTypeSize(dtype));
  DeviceTensor t;
  t.buffer = std::make_unique<DeviceBuffer>(bytes);
  if (t.buffer->ok()) cudaMemset(t.buffer->get(), 0xFF, static_cast<size_t>(bytes));
  cudaDeviceSynchronize();
  t.view = TensorView::Contiguous(t.buffer->get(), dtype, shape, Device::kCuda, device);
  return t;
}

std::vector<double> FromDevice(const DeviceTensor& t) {
  testutil::HostTensor host(t.view.dtype, t.view.shape);
  cudaDeviceSynchronize();
  cudaMemcpy(host.view().data, t.view.data,
             static_cast<size_t>(Elements(t.view.shape)) * DTypeSize(t.view.dtype),
             cudaMemcpyDeviceToHost);
  return host.ToDoubles();
}

std::vector<RingCase> GpuStandardCases(int ranks) {
  std::vector<RingCase> cases;
  for (RingCase c : StandardCases(ranks)) {
    if (c.dtype != DType::kFloat32) continue;
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      c.dtype = dtype;
      cases.push_back(c);
    }
  }
  return cases;
}

std::vector<RingCase> GpuWideCases(int ranks) {
  struct Pattern {
    const char* name;
    std::vector<int64_t> w, r;
    int64_t shard_len;
  };
  // "spanning": two local patterns (folded over segments and batch items) and one whose only
  // segment covers every shard. "ragged": rates that divide nothing and segments that straddle
  // shards unevenly, so a rank's query rows and a peer's key rows of a chunk differ in number.
  const std::vector<Pattern> patterns = {
      {"spanning", {64, 256, int64_t{1} << 30}, {1, 2, 8}, 512},
      {"ragged", {96, 700}, {3, 7}, 300},
  };
  std::vector<RingCase> cases;
  for (const Pattern& p : patterns) {
    for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
      for (bool causal : {false, true}) {
        RingCase c;
        c.name = p.name;
        c.spec.segment_lengths = p.w;
        c.spec.dilation_rates = p.r;
        c.spec.mode = mode;
        c.spec.causal = causal;
        c.ranks = ranks;
        c.batch = 2;
        c.heads = 4;
        c.head_dim = 64;
        c.shard_len = p.shard_len;
        c.dtype = mode == AttentionMode::kGrouped ? DType::kBFloat16 : DType::kFloat16;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

}  // namespace testing
}  // namespace ring
}  // namespace dattn
