// safetensors files, read and written from the published format (github.com/huggingface/
// safetensors, "Format"), so that the Python `safetensors` library and PyTorch
// (safetensors.torch.load_file) load what we write, and we load what they write:
//
//   bytes 0..7      N, the JSON header's length, unsigned 64-bit little-endian
//   bytes 8..8+N    the header: a UTF-8 JSON object
//                     {"__metadata__": {"key": "value", ...},            (optional, strings only)
//                      "<tensor name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
//                      ...}
//                   possibly padded at its end with spaces (we pad to a multiple of 8 bytes, as the
//                   reference writer does, so the data is 8-byte aligned in the file)
//   the rest        the data section; tensor t's bytes are [b, e) of it, row-major, little-endian
//
// What Open checks (each failure is DATA_LOSS naming the file and what is wrong): the file holds
// the 8-byte length; N <= 100,000,000 (the reference implementation's limit: a corrupt length
// cannot make us parse gigabytes) and 8 + N <= file size; the header is JSON (no duplicate keys at
// any level) and an object; each tensor entry has a known dtype, a shape of non-negative integers
// (rank 0 is a scalar, a zero dimension an empty tensor), and data_offsets [b, e] with b <= e and
// e - b = product(shape) * dtype size; __metadata__ maps strings to strings; sorted by offset, the
// tensors tile the data section exactly: the first starts at 0, each starts where the previous
// ended, the last ends at the end of the file (no gap, no overlap, nothing truncated, nothing
// extra). Unknown keys inside a tensor entry are ignored, as the reference reader does.
//
// Dtypes: BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64.
//
// Threads: a SafetensorsFile is immutable after Open; any number of threads may read it.
#ifndef DATTN_MODEL_SAFETENSORS_H_
#define DATTN_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/file_io.h"

namespace dattn {
namespace model {

enum class SafeDtype {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64
};

// "F32", "BF16", ...
const char* SafeDtypeName(SafeDtype dtype);
// Bytes per element.
int64_t SafeDtypeSize(SafeDtype dtype);
// The floating-point dtypes, those SafetensorsFile::ReadAsFloat32 reads: F32, F64, F16, BF16.
bool IsFloatDtype(SafeDtype dtype);
// INVALID_ARGUMENT naming the text for an unknown dtype.
absl::StatusOr<SafeDtype> ParseSafeDtype(absl::string_view name);

inline constexpr int64_t kMaxSafetensorsHeader = 100000000;

// One tensor to write: `bytes` must hold product(shape) * SafeDtypeSize(dtype) bytes, row-major,
// little-endian. The bytes are not copied: they must stay valid until the write returns.
struct TensorToWrite {
  std::string name;
  SafeDtype dtype = SafeDtype::kF32;
  std::vector<int64_t> shape;
  absl::string_view bytes;

  static TensorToWrite F32(std::string name, std::vector<int64_t> shape,
                           absl::Span<const float> values);
};

using SafetensorsMetadata = std::map<std::string, std::string>;

// The whole file as bytes: the header (metadata first, then the tensors in the order given), then
// the data in that order. INVALID_ARGUMENT naming the tensor for an empty, duplicate or reserved
// ("__metadata__") name, a negative dimension, or bytes of the wrong length.
absl::StatusOr<std::string> SerializeSafetensors(absl::Span<const TensorToWrite> tensors,
                                                 const SafetensorsMetadata& metadata = {});

// The same, streamed to `path` (created or truncated; no copy of the data is made), fsynced when
// `sync`. Not atomic by itself: the checkpoint code writes into a temporary folder and renames.
absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorToWrite> tensors,
                              const SafetensorsMetadata& metadata = {}, bool sync = false);

// A tensor described by a header.
struct SafeTensorInfo {
  std::string name;
  SafeDtype dtype = SafeDtype::kF32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t begin = 0;  // data_offsets, relative to the data section.
  int64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` and checks it (see above).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // Checks bytes held in memory; `name` stands for the file in error messages.
  static absl::StatusOr<SafetensorsFile> FromBytes(std::string bytes, const std::string& name);

  const std::string& name() const { return name_; }
  // In order of data offset.
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  // NOT_FOUND naming the tensor and the file.
  absl::StatusOr<const SafeTensorInfo*> Find(const std::string& tensor) const;
  // The tensor's bytes, inside the mapping.
  absl::string_view Data(const SafeTensorInfo& info) const;

  // Copies tensor `tensor` into `out` as fp32, converting from F32, F64, F16 or BF16. Checks that
  // its shape is `shape` (FAILED_PRECONDITION naming the tensor, the file and both shapes),
  // that its dtype is one of those four (FAILED_PRECONDITION), and that out has numel elements
  // (INVALID_ARGUMENT); NOT_FOUND when there is no such tensor.
  absl::Status ReadAsFloat32(const std::string& tensor, absl::Span<const int64_t> shape,
                             absl::Span<float> out) const;

 private:
  static absl::StatusOr<SafetensorsFile> Check(SafetensorsFile file);
  std::string name_;
  std::shared_ptr<const MappedFile> map_;     // Either the mapping...
  std::shared_ptr<const std::string> owned_;  // ...or bytes in memory.
  absl::string_view bytes_;
  int64_t data_start_ = 0;
  std::vector<SafeTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;  // Name -> position in tensors_.
  SafetensorsMetadata metadata_;
};

// bf16 and fp16 conversions (round to nearest even; NaN stays NaN).
uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t bits);
float HalfToFloat(uint16_t bits);

// "[2, 3]".
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_SAFETENSORS_H_
