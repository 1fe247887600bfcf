// Shared pieces of the ring's GPU tests (cuda_block_kernels_test, ring_attention_gpu_test): device
// tensors made from host values, poisoned outputs, the spec's tolerances per dtype, and the GPU
// cases (ring_test_util.h's standard cases in fp32 / fp16 / bf16, plus larger bf16 / fp16 ones
// whose blocks are wide enough for cuDNN's batched and padded calls). Testing only.
#ifndef DATTN_ENGINE_RING_RING_GPU_TEST_UTIL_H_
#define DATTN_ENGINE_RING_RING_GPU_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ring/ring_test_util.h"
#include "engine/tensor.h"

namespace dattn {
namespace ring {
namespace testing {

// Device memory on the current device, freed with the object.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  bool ok() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
};

// A contiguous tensor on cuda:`device` (the current device).
struct DeviceTensor {
  std::unique_ptr<DeviceBuffer> buffer;
  TensorView view;
};

// `values` (row-major over `shape`) rounded to `dtype`, on the device.
DeviceTensor ToDevice(DType dtype, const std::vector<int64_t>& shape,
                      const std::vector<double>& values, int device);
// Every byte 0xFF: NaN in fp16, bf16 and fp32.
DeviceTensor PoisonedTensor(DType dtype, const std::vector<int64_t>& shape, int device);
// The tensor's values (synchronizes the device).
std::vector<double> FromDevice(const DeviceTensor& t);

// StandardCases(ranks) with fp32, fp16 and bf16 in place of fp64 / fp32 (D = 8).
std::vector<RingCase> GpuStandardCases(int ranks);
// Larger 16-bit cases (D = 64): local segments folded into batched cuDNN calls, a pattern spanning
// every rank, and ragged chunks (rates dividing nothing, so query and key chunks differ and the
// query tiles are padded or cut).
std::vector<RingCase> GpuWideCases(int ranks);

}  // namespace testing
}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_RING_GPU_TEST_UTIL_H_
