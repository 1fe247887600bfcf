// Fuzzes the safetensors reader (model/safetensors.h) on bytes in memory: the header's length, its
// JSON, the tensor entries and their tiling of the data section. A file that opens is read back:
// every tensor's bytes, its lookup by name, and the fp32 conversion of the float tensors.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dattn::model::SafeDtype;
  absl::StatusOr<dattn::model::SafetensorsFile> file = dattn::model::SafetensorsFile::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
  if (!file.ok()) {
    Check(file.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  std::vector<float> out;
  for (const dattn::model::SafeTensorInfo& t : file->tensors()) {
    const absl::string_view bytes = file->Data(t);
    Check(static_cast<int64_t>(bytes.size()) == t.end - t.begin);
    Check(static_cast<int64_t>(bytes.size()) == t.numel * dattn::model::SafeDtypeSize(t.dtype));
    uint8_t sum = 0;
    for (char c : bytes) sum = static_cast<uint8_t>(sum + static_cast<uint8_t>(c));
    (void)sum;
    absl::StatusOr<const dattn::model::SafeTensorInfo*> found = file->Find(t.name);
    Check(found.ok() && (*found)->begin == t.begin);
    // The tensors lie inside the input: numel is at most its size.
    out.assign(static_cast<size_t>(t.numel), 0.0f);
    const absl::Status read = file->ReadAsFloat32(t.name, t.shape, absl::MakeSpan(out));
    const bool float_type = t.dtype == SafeDtype::kF32 || t.dtype == SafeDtype::kF64 ||
                            t.dtype == SafeDtype::kF16 || t.dtype == SafeDtype::kBF16;
    Check(read.ok() == float_type);
  }
  return 0;
}
