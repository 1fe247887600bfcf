// A tensor written as a NumPy .npy file (format version 1.0), streamed chunk by chunk: the header
// from the tensor's dtype and shape, then its row-major little-endian data, so that
// `numpy.load(path)` gives the array with its shape and dtype.
//
// dtypes: fp64 '<f8', fp32 '<f4', fp16 '<f2'. NumPy has no bfloat16, so bf16 is written as '<f4',
// each value converted exactly (a bf16 is the top 16 bits of an fp32).
//
// The file appears only complete: data goes to PATH.part, which Finish() fsyncs and renames to
// PATH; a writer dropped before Finish() removes the part file. Not thread-safe.
#ifndef DATTN_CLIENT_NPY_H_
#define DATTN_CLIENT_NPY_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dattn/v1/attention.pb.h"

namespace dattn {
namespace client {

// The .npy header (magic, version, length, the dict padded to a multiple of 64 bytes) for a tensor
// of `header`'s dtype and shape. INVALID_ARGUMENT for an unknown dtype.
absl::StatusOr<std::string> NpyHeader(const v1::TensorHeader& header);

class NpyWriter {
 public:
  // Starts PATH.part with the header. INVALID_ARGUMENT for an unknown dtype; UNAVAILABLE naming the
  // file when it cannot be created.
  static absl::StatusOr<std::unique_ptr<NpyWriter>> Open(const std::string& path,
                                                         const v1::TensorHeader& header);
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  // The tensor's next bytes (in the tensor's own dtype). FAILED_PRECONDITION when they run past the
  // header's total_bytes or split an element; UNAVAILABLE for a failed write.
  absl::Status Append(const std::string& data);
  // FAILED_PRECONDITION when fewer than total_bytes arrived; UNAVAILABLE for a failed fsync or
  // rename. Then PATH holds the array.
  absl::Status Finish();

 private:
  NpyWriter(std::string path, std::FILE* file, v1::TensorHeader header)
      : path_(std::move(path)), file_(file), header_(std::move(header)) {}
  std::string path_;
  std::FILE* file_;
  v1::TensorHeader header_;
  int64_t written_ = 0;  // Bytes of the tensor (in its own dtype) taken so far.
  bool finished_ = false;
};

// A .npy file read a chunk at a time (format versions 1.0, 2.0 and 3.0): its dtype and shape
// from the header, then its row-major little-endian data. dtypes: '<f8' fp64, '<f4' fp32, '<f2'
// fp16 (also '=' and, for one-byte-order-free reads, '|'). Not thread-safe.
class NpyReader {
 public:
  // INVALID_ARGUMENT naming the file when it is not a .npy file, holds a Fortran-order array, a
  // dtype other than those above, or fewer or more data bytes than its shape says; UNAVAILABLE
  // when it cannot be opened or read.
  static absl::StatusOr<std::unique_ptr<NpyReader>> Open(const std::string& path);
  ~NpyReader();
  NpyReader(const NpyReader&) = delete;
  NpyReader& operator=(const NpyReader&) = delete;

  // The array's dtype, shape and data size.
  const v1::TensorHeader& header() const { return header_; }
  // The next up to `max_bytes` bytes of the data into *data (empty at the end). UNAVAILABLE for a
  // failed read, DATA_LOSS when the file ends early.
  absl::Status Read(int64_t max_bytes, std::string* data);

 private:
  NpyReader(std::string path, std::FILE* file, v1::TensorHeader header)
      : path_(std::move(path)), file_(file), header_(std::move(header)) {}
  std::string path_;
  std::FILE* file_;
  v1::TensorHeader header_;
  int64_t read_ = 0;
};

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_NPY_H_
