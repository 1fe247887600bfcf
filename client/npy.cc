#include "client/npy.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {
namespace client {
namespace {

const char* Descr(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP64:
      return "<f8";
    case v1::DTYPE_FP32:
    case v1::DTYPE_BF16:  // Widened: NumPy has no bfloat16.
      return "<f4";
    case v1::DTYPE_FP16:
      return "<f2";
    default:
      return nullptr;
  }
}

int64_t ElementBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP64:
      return 8;
    case v1::DTYPE_FP32:
      return 4;
    default:
      return 2;
  }
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::string> NpyHeader(const v1::TensorHeader& header) {
  const char* descr = Descr(header.dtype());
  if (descr == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write dtype ", v1::DType_Name(header.dtype()), " as .npy"));
  }
  std::string shape = absl::StrJoin(header.shape(), ", ");
  if (header.shape_size() == 1) shape += ",";  // A 1-tuple in Python.
  std::string dict =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", shape, "), }");
  // magic (6) + version (2) + header length (2) + dict + padding + '\n' is a multiple of 64.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>((dict.size() >> 8) & 0xff));
  return out + dict;
}

absl::StatusOr<std::unique_ptr<NpyWriter>> NpyWriter::Open(const std::string& path,
                                                           const v1::TensorHeader& header) {
  absl::StatusOr<std::string> head = NpyHeader(header);
  if (!head.ok()) return head.status();
  const std::string part = path + ".part";
  std::FILE* file = std::fopen(part.c_str(), "wb");
  if (file == nullptr) return Errno("cannot create", part);
  std::unique_ptr<NpyWriter> writer(new NpyWriter(path, file, header));
  if (std::fwrite(head->data(), 1, head->size(), file) != head->size()) {
    return Errno("cannot write", part);
  }
  return writer;
}

NpyWriter::~NpyWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!finished_) std::remove((path_ + ".part").c_str());
}

absl::Status NpyWriter::Append(const std::string& data) {
  const int64_t element = ElementBytes(header_.dtype());
  if (written_ + static_cast<int64_t>(data.size()) > header_.total_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat("the stream carried more than the tensor's ",
                                                      header_.total_bytes(), " bytes"));
  }
  if (data.size() % element != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("a chunk of ", data.size(), " bytes splits a ", element, "-byte element"));
  }
  if (header_.dtype() == v1::DTYPE_BF16) {
    std::vector<uint32_t> widened(data.size() / 2);
    for (size_t i = 0; i < widened.size(); ++i) {
      const uint32_t lo = static_cast<unsigned char>(data[2 * i]);
      const uint32_t hi = static_cast<unsigned char>(data[2 * i + 1]);
      widened[i] = (lo | (hi << 8)) << 16;
    }
    if (std::fwrite(widened.data(), 4, widened.size(), file_) != widened.size()) {
      return Errno("cannot write", path_ + ".part");
    }
  } else if (std::fwrite(data.data(), 1, data.size(), file_) != data.size()) {
    return Errno("cannot write", path_ + ".part");
  }
  written_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::Status NpyWriter::Finish() {
  if (written_ != header_.total_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the stream ended after ", written_, " of the tensor's ", header_.total_bytes(), " bytes"));
  }
  const std::string part = path_ + ".part";
  if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0) return Errno("cannot sync", part);
  std::fclose(file_);
  file_ = nullptr;
  if (std::rename(part.c_str(), path_.c_str()) != 0) return Errno("cannot rename", part);
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace client
}  // namespace dattn
