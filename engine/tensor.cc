#include "engine/tensor.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat64:
      return "fp64";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "fp64" || name == "float64") return DType::kFloat64;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "'; accepted: fp16, bf16, fp32, fp64 (or float16, bfloat16, float32, float64)"));
}

const char* DeviceName(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "unknown";
}

TensorView TensorView::Contiguous(void* data, DType dtype, std::vector<int64_t> shape,
                                  Device device, int device_index) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.device_index = device_index;
  view.strides.assign(shape.size(), 1);
  int64_t stride = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    view.strides[i] = stride;
    stride *= shape[i];
  }
  view.shape = std::move(shape);
  return view;
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    n *= d;
  }
  return n;
}

bool TensorView::IsContiguous() const {
  if (strides.size() != shape.size()) return false;
  // A dimension of extent 1 is never stepped over, so its stride does not matter (as in PyTorch).
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string TensorView::DebugString() const {
  std::string s = absl::StrCat("[", absl::StrJoin(shape, ", "), "] ", DTypeName(dtype), " ",
                               DeviceName(device));
  if (device != Device::kCpu) absl::StrAppend(&s, ":", device_index);
  if (!IsContiguous()) absl::StrAppend(&s, " strides [", absl::StrJoin(strides, ", "), "]");
  return s;
}

}  // namespace dattn
