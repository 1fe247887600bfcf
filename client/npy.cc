#include "client/npy.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

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

absl::StatusOr<std::unique_ptr<NpyReader>> NpyReader::Open(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return Errno("cannot open", path);
  auto bad = [&](const std::string& why) {
    std::fclose(file);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a usable .npy file: ", why));
  };
  unsigned char magic[10];
  if (std::fread(magic, 1, 8, file) != 8 || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
    return bad("no .npy magic (\\x93NUMPY) at its start");
  }
  const int major = magic[6];
  size_t length_bytes = major == 1 ? 2 : 4;
  if (major < 1 || major > 3) return bad(absl::StrCat("format version ", major, " is unknown"));
  unsigned char len[4] = {0, 0, 0, 0};
  if (std::fread(len, 1, length_bytes, file) != length_bytes) return bad("its header is cut");
  const size_t dict_length = static_cast<size_t>(len[0]) | static_cast<size_t>(len[1]) << 8 |
                             static_cast<size_t>(len[2]) << 16 | static_cast<size_t>(len[3]) << 24;
  if (dict_length > (1 << 20)) return bad(absl::StrCat("a header of ", dict_length, " bytes"));
  std::string dict(dict_length, '\0');
  if (std::fread(dict.data(), 1, dict_length, file) != dict_length) {
    return bad("its header is cut");
  }
  // {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
  auto value_of = [&dict](const std::string& key) -> std::string {
    const size_t at = dict.find("'" + key + "'");
    if (at == std::string::npos) return "";
    const size_t colon = dict.find(':', at);
    if (colon == std::string::npos) return "";
    size_t begin = dict.find_first_not_of(' ', colon + 1);
    if (begin == std::string::npos) return "";
    size_t end = begin;
    if (dict[begin] == '(') {
      end = dict.find(')', begin);
      return end == std::string::npos ? "" : dict.substr(begin + 1, end - begin - 1);
    }
    if (dict[begin] == '\'') {
      end = dict.find('\'', begin + 1);
      return end == std::string::npos ? "" : dict.substr(begin + 1, end - begin - 1);
    }
    end = dict.find_first_of(",}", begin);
    return end == std::string::npos ? "" : dict.substr(begin, end - begin);
  };
  const std::string descr = value_of("descr");
  v1::TensorHeader header;
  if (descr == "<f8" || descr == "=f8") {
    header.set_dtype(v1::DTYPE_FP64);
  } else if (descr == "<f4" || descr == "=f4") {
    header.set_dtype(v1::DTYPE_FP32);
  } else if (descr == "<f2" || descr == "=f2") {
    header.set_dtype(v1::DTYPE_FP16);
  } else {
    return bad(absl::StrCat("dtype '", descr.substr(0, 32),
                            "'; dattn reads little-endian float64 (<f8), float32 (<f4) and "
                            "float16 (<f2)"));
  }
  if (value_of("fortran_order") != "False") {
    return bad("a Fortran-order array; save it C-contiguous (numpy.ascontiguousarray)");
  }
  int64_t elements = 1;
  const std::string shape_text = value_of("shape");
  for (absl::string_view dim : absl::StrSplit(shape_text, ',')) {
    const std::string trimmed(absl::StripAsciiWhitespace(dim));
    if (trimmed.empty()) continue;
    int64_t d = 0;
    if (!absl::SimpleAtoi(trimmed, &d) || d < 0 || (d > 0 && elements > (int64_t{1} << 50) / d)) {
      return bad(absl::StrCat("shape entry '", trimmed.substr(0, 32), "'"));
    }
    header.add_shape(d);
    elements *= d;
  }
  header.set_total_bytes(elements * ElementBytes(header.dtype()));
  const long data_start = std::ftell(file);
  if (data_start < 0 || std::fseek(file, 0, SEEK_END) != 0) return Errno("cannot read", path);
  const long end = std::ftell(file);
  if (end - data_start != header.total_bytes()) {
    return bad(absl::StrCat("its shape says ", header.total_bytes(), " data bytes, it has ",
                            end - data_start));
  }
  std::fseek(file, data_start, SEEK_SET);
  return std::unique_ptr<NpyReader>(new NpyReader(path, file, std::move(header)));
}

NpyReader::~NpyReader() { std::fclose(file_); }

absl::Status NpyReader::Read(int64_t max_bytes, std::string* data) {
  const int64_t n = std::min(max_bytes, header_.total_bytes() - read_);
  data->resize(static_cast<size_t>(std::max<int64_t>(0, n)));
  if (n <= 0) return absl::OkStatus();
  if (std::fread(data->data(), 1, data->size(), file_) != data->size()) {
    return std::ferror(file_) ? Errno("cannot read", path_)
                              : absl::DataLossError(absl::StrCat(path_, " ended early"));
  }
  read_ += n;
  return absl::OkStatus();
}

}  // namespace client
}  // namespace dattn
