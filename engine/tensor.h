// Tensor views: the engine's only way of seeing memory it does not own.
//
// A TensorView names memory owned by the caller: a base pointer, an element type, a device, a shape and
// per-dimension strides counted in elements (not bytes). The engine never allocates, frees or keeps a
// view beyond the call it was passed to. Views are plain values: copying one copies the description,
// not the data. Nothing here is thread-safe or unsafe: a view has no state beyond its fields.
#ifndef DATTN_ENGINE_TENSOR_H_
#define DATTN_ENGINE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dattn {

enum class DType { kFloat16, kBFloat16, kFloat32, kFloat64 };

enum class Device { kCpu, kCuda };

// Size of one element in bytes.
size_t DTypeSize(DType dtype);

// "fp16", "bf16", "fp32", "fp64": the names used by the CLI, the API and error messages.
const char* DTypeName(DType dtype);

// Inverse of DTypeName; also accepts "float16", "bfloat16", "float32", "float64". Returns
// INVALID_ARGUMENT naming the value and the accepted names otherwise.
absl::StatusOr<DType> ParseDType(const std::string& name);

const char* DeviceName(Device device);

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
  int device_index = 0;             // CUDA ordinal; 0 for CPU.
  std::vector<int64_t> shape;       // Any rank; the attention API requires what it documents.
  std::vector<int64_t> strides;     // Elements, one per dimension.

  // A row-major contiguous view of `shape` at `data`.
  static TensorView Contiguous(void* data, DType dtype, std::vector<int64_t> shape,
                               Device device = Device::kCpu, int device_index = 0);

  int rank() const { return static_cast<int>(shape.size()); }
  // Product of the shape; 0 if any dimension is 0. Undefined if the product overflows int64
  // (validation rejects such shapes before anything else uses them).
  int64_t NumElements() const;
  bool IsContiguous() const;
  // "[2, 1024, 16, 64] fp32 cpu" for error messages and logs.
  std::string DebugString() const;
};

}  // namespace dattn

#endif  // DATTN_ENGINE_TENSOR_H_
