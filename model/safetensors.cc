#include "model/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace model {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

constexpr char kMetadataKey[] = "__metadata__";

struct DtypeRow {
  SafeDtype dtype;
  const char* name;
  int64_t size;
};
constexpr DtypeRow kDtypes[] = {
    {SafeDtype::kBool, "BOOL", 1}, {SafeDtype::kU8, "U8", 1},   {SafeDtype::kI8, "I8", 1},
    {SafeDtype::kI16, "I16", 2},   {SafeDtype::kU16, "U16", 2}, {SafeDtype::kF16, "F16", 2},
    {SafeDtype::kBF16, "BF16", 2}, {SafeDtype::kI32, "I32", 4}, {SafeDtype::kU32, "U32", 4},
    {SafeDtype::kF32, "F32", 4},   {SafeDtype::kF64, "F64", 8}, {SafeDtype::kI64, "I64", 8},
    {SafeDtype::kU64, "U64", 8},
};

// Elements of `shape`, or -1 when a dimension is negative or the product overflows.
int64_t Numel(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

// Checks the tensors and builds the padded header; `ends` receives each tensor's end offset.
absl::StatusOr<std::string> BuildHeader(absl::Span<const TensorToWrite> tensors,
                                        const SafetensorsMetadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  int64_t offset = 0;
  std::set<std::string> names;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("safetensors: a tensor has no name");
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError("safetensors: \"__metadata__\" is reserved");
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor \"", t.name, "\" given twice"));
    }
    const int64_t numel = Numel(t.shape);
    if (numel < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor \"", t.name, "\" has shape ", ShapeString(t.shape)));
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(numel, SafeDtypeSize(t.dtype), &bytes) ||
        bytes != static_cast<int64_t>(t.bytes.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor \"", t.name, "\" of shape ", ShapeString(t.shape),
                       " and dtype ", SafeDtypeName(t.dtype), " needs ", numel, " * ",
                       SafeDtypeSize(t.dtype), " bytes, given ", t.bytes.size()));
    }
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = SafeDtypeName(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    header[t.name] = std::move(entry);
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: a name or metadata string is not UTF-8 (", e.what(), ")"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (static_cast<int64_t>(text.size()) > kMaxSafetensorsHeader) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: the header would be ", text.size(),
                                                   " bytes, over the limit of ",
                                                   kMaxSafetensorsHeader));
  }
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  out += text;
  return out;
}

// A header is three levels deep (the object, a tensor's entry, its shape). nlohmann parses without
// recursion, but dump() and comparisons recurse: a header nested deeper than this is refused.
constexpr int kMaxHeaderDepth = 64;

// Parses JSON, refusing duplicate keys in any object and nesting deeper than kMaxHeaderDepth.
// Throws nothing: errors become a message.
absl::StatusOr<nlohmann::json> ParseJsonStrict(absl::string_view text, std::string* error) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  bool too_deep = false;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth > kMaxHeaderDepth) too_deep = true;
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    *error = absl::StrCat("not valid JSON (", e.what(), ")");
    return absl::InvalidArgumentError(*error);
  }
  if (!duplicate.empty()) {
    *error = absl::StrCat("duplicate key \"", duplicate, "\"");
    return absl::InvalidArgumentError(*error);
  }
  if (too_deep) {
    *error = absl::StrCat("nested more than ", kMaxHeaderDepth, " levels deep");
    return absl::InvalidArgumentError(*error);
  }
  return value;
}

// A non-negative integer that fits int64, or -1.
int64_t AsCount(const nlohmann::json& v) {
  if (!v.is_number_unsigned()) return -1;
  const uint64_t u = v.get<uint64_t>();
  return u > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(u);
}

}  // namespace

const char* SafeDtypeName(SafeDtype dtype) {
  for (const DtypeRow& row : kDtypes) {
    if (row.dtype == dtype) return row.name;
  }
  return "?";
}

int64_t SafeDtypeSize(SafeDtype dtype) {
  for (const DtypeRow& row : kDtypes) {
    if (row.dtype == dtype) return row.size;
  }
  return 0;
}

bool IsFloatDtype(SafeDtype dtype) {
  return dtype == SafeDtype::kF32 || dtype == SafeDtype::kF64 || dtype == SafeDtype::kF16 ||
         dtype == SafeDtype::kBF16;
}

absl::StatusOr<SafeDtype> ParseSafeDtype(absl::string_view name) {
  for (const DtypeRow& row : kDtypes) {
    if (name == row.name) return row.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown safetensors dtype \"", name, "\""));
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

TensorToWrite TensorToWrite::F32(std::string name, std::vector<int64_t> shape,
                                 absl::Span<const float> values) {
  TensorToWrite t;
  t.name = std::move(name);
  t.dtype = SafeDtype::kF32;
  t.shape = std::move(shape);
  t.bytes = absl::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  return t;
}

absl::StatusOr<std::string> SerializeSafetensors(absl::Span<const TensorToWrite> tensors,
                                                 const SafetensorsMetadata& metadata) {
  absl::StatusOr<std::string> out = BuildHeader(tensors, metadata);
  if (!out.ok()) return out.status();
  for (const TensorToWrite& t : tensors) out->append(t.bytes.data(), t.bytes.size());
  return out;
}

absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorToWrite> tensors,
                              const SafetensorsMetadata& metadata, bool sync) {
  absl::StatusOr<std::string> header = BuildHeader(tensors, metadata);
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(path, ": ", header.status().message()));
  }
  absl::StatusOr<OutputFile> file = OutputFile::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Append(*header); !s.ok()) return s;
  for (const TensorToWrite& t : tensors) {
    if (absl::Status s = file->Append(t.bytes); !s.ok()) return s;
  }
  return file->Close(sync);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<MappedFile> map = MappedFile::Open(path);
  if (!map.ok()) return map.status();
  SafetensorsFile file;
  file.name_ = path;
  file.map_ = std::make_shared<const MappedFile>(std::move(*map));
  file.bytes_ = file.map_->bytes();
  return Check(std::move(file));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes,
                                                           const std::string& name) {
  SafetensorsFile file;
  file.name_ = name;
  file.owned_ = std::make_shared<const std::string>(std::move(bytes));
  file.bytes_ = *file.owned_;
  return Check(std::move(file));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Check(SafetensorsFile file) {
  const std::string& name = file.name_;
  auto bad = [&name](auto&&... parts) {
    return absl::DataLossError(absl::StrCat(name, ": not a valid safetensors file: ", parts...));
  };
  const int64_t size = static_cast<int64_t>(file.bytes_.size());
  if (size < 8) return bad(size, " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, file.bytes_.data(), 8);
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeader)) {
    return bad("header length ", n, " is over the limit of ", kMaxSafetensorsHeader);
  }
  if (static_cast<int64_t>(n) > size - 8) {
    return bad("header length ", n, " runs past the end of the file (", size, " bytes)");
  }
  const absl::string_view text = file.bytes_.substr(8, n);
  if (text.empty() || text[0] != '{') return bad("the header does not start with '{'");
  std::string error;
  absl::StatusOr<nlohmann::json> header = ParseJsonStrict(text, &error);
  if (!header.ok()) return bad("header: ", error);
  if (!header->is_object()) return bad("the header is not a JSON object");
  file.data_start_ = 8 + static_cast<int64_t>(n);
  const int64_t data_bytes = size - file.data_start_;

  for (auto it = header->begin(); it != header->end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& value = it.value();
    if (key == kMetadataKey) {
      if (!value.is_object()) return bad("__metadata__ is not an object");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) return bad("__metadata__[\"", m.key(), "\"] is not a string");
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!value.is_object()) return bad("tensor \"", key, "\": its entry is not an object");
    SafeTensorInfo info;
    info.name = key;
    auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) return bad("tensor \"", key, "\": no dtype");
    absl::StatusOr<SafeDtype> parsed = ParseSafeDtype(dtype->get<std::string>());
    if (!parsed.ok()) return bad("tensor \"", key, "\": ", parsed.status().message());
    info.dtype = *parsed;
    auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) return bad("tensor \"", key, "\": no shape");
    for (const nlohmann::json& d : *shape) {
      const int64_t dim = AsCount(d);
      if (dim < 0) {
        // The offending entry, not the whole shape (which may be as long as the header).
        return bad("tensor \"", key, "\": shape entry ", info.shape.size(), " (",
                   d.is_array()    ? "a list"
                   : d.is_object() ? "an object"
                                   : d.dump(),
                   ") is not a count: the shape is not counts");
      }
      info.shape.push_back(dim);
    }
    auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        AsCount((*offsets)[0]) < 0 || AsCount((*offsets)[1]) < 0) {
      return bad("tensor \"", key, "\": data_offsets must be [begin, end]");
    }
    info.begin = AsCount((*offsets)[0]);
    info.end = AsCount((*offsets)[1]);
    if (info.begin > info.end) {
      return bad("tensor \"", key, "\": data_offsets [", info.begin, ", ", info.end,
                 "] end before they begin");
    }
    info.numel = Numel(info.shape);
    int64_t bytes = 0;
    if (info.numel < 0 || __builtin_mul_overflow(info.numel, SafeDtypeSize(info.dtype), &bytes)) {
      return bad("tensor \"", key, "\": shape ", ShapeString(info.shape), " overflows");
    }
    if (bytes != info.end - info.begin) {
      return bad("tensor \"", key, "\": shape ", ShapeString(info.shape), " of ",
                 SafeDtypeName(info.dtype), " needs ", bytes, " bytes, data_offsets [", info.begin,
                 ", ", info.end, "] hold ", info.end - info.begin);
    }
    file.tensors_.push_back(std::move(info));
  }
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const SafeTensorInfo& a, const SafeTensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  int64_t expected = 0;
  for (const SafeTensorInfo& t : file.tensors_) {
    if (t.begin != expected) {
      return bad("tensor \"", t.name, "\" starts at data offset ", t.begin, ", expected ", expected,
                 t.begin < expected ? " (it overlaps the previous tensor)" : " (a gap)");
    }
    expected = t.end;
  }
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
  if (expected != data_bytes) {
    return bad("the tensors cover ", expected, " bytes of data, the file holds ", data_bytes,
               expected > data_bytes ? " (truncated)" : " (extra bytes at the end)");
  }
  return file;
}

absl::StatusOr<const SafeTensorInfo*> SafetensorsFile::Find(const std::string& tensor) const {
  auto it = index_.find(tensor);
  if (it != index_.end()) return &tensors_[it->second];
  return absl::NotFoundError(absl::StrCat(name_, ": no tensor \"", tensor, "\""));
}

absl::string_view SafetensorsFile::Data(const SafeTensorInfo& info) const {
  return bytes_.substr(static_cast<size_t>(data_start_ + info.begin),
                       static_cast<size_t>(info.end - info.begin));
}

absl::Status SafetensorsFile::ReadAsFloat32(const std::string& tensor,
                                            absl::Span<const int64_t> shape,
                                            absl::Span<float> out) const {
  absl::StatusOr<const SafeTensorInfo*> found = Find(tensor);
  if (!found.ok()) return found.status();
  const SafeTensorInfo& info = **found;
  if (!std::equal(info.shape.begin(), info.shape.end(), shape.begin(), shape.end())) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": tensor \"", tensor, "\" has shape ",
                                                      ShapeString(info.shape), ", expected ",
                                                      ShapeString(shape)));
  }
  if (!IsFloatDtype(info.dtype)) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": tensor \"", tensor, "\" is ",
                                                      SafeDtypeName(info.dtype),
                                                      ", not a floating-point dtype"));
  }
  if (static_cast<int64_t>(out.size()) != info.numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": tensor \"", tensor, "\" has ", info.numel, " elements, the output ", out.size()));
  }
  const char* p = Data(info).data();
  const int64_t n = info.numel;
  switch (info.dtype) {
    case SafeDtype::kF32:
      std::memcpy(out.data(), p, static_cast<size_t>(n) * 4);
      return absl::OkStatus();
    case SafeDtype::kF64:
      for (int64_t i = 0; i < n; ++i) {
        double x;
        std::memcpy(&x, p + 8 * i, 8);
        out[i] = static_cast<float>(x);
      }
      return absl::OkStatus();
    case SafeDtype::kBF16:
    case SafeDtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t x;
        std::memcpy(&x, p + 2 * i, 2);
        out[i] = info.dtype == SafeDtype::kBF16 ? Bf16ToFloat(x) : HalfToFloat(x);
      }
      return absl::OkStatus();
    default:
      return absl::InternalError("unreachable dtype");
  }
}

uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // Zero or subnormal.
    return sign != 0 ? -magnitude : magnitude;
  } else if (exponent == 31) {
    bits = sign | 0x7f800000 | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

}  // namespace model
}  // namespace dattn
