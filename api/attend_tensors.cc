#include "api/attend_tensors.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {
namespace api {
namespace {

absl::Status Invalid(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

bool NameCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

std::string TensorName(int t) { return AttendTensorName(static_cast<v1::AttendTensor>(t)); }

}  // namespace

const char* AttendTensorName(v1::AttendTensor tensor) {
  switch (tensor) {
    case v1::ATTEND_TENSOR_Q:
      return "q";
    case v1::ATTEND_TENSOR_K:
      return "k";
    case v1::ATTEND_TENSOR_V:
      return "v";
    case v1::ATTEND_TENSOR_DOUT:
      return "dout";
    case v1::ATTEND_TENSOR_OUT:
      return "out";
    case v1::ATTEND_TENSOR_DQ:
      return "dq";
    case v1::ATTEND_TENSOR_DK:
      return "dk";
    case v1::ATTEND_TENSOR_DV:
      return "dv";
    default:
      return "unspecified";
  }
}

absl::Status CheckSharedMemoryName(absl::string_view name, const std::string& path) {
  const std::string shown =
      absl::StrCat("\"", name.substr(0, 64), name.size() > 64 ? "..." : "", "\"");
  if (name.substr(0, kSharedMemoryPrefix.size()) != kSharedMemoryPrefix) {
    return Invalid(path,
                   absl::StrCat("must start with \"", kSharedMemoryPrefix, "\", got ", shown));
  }
  const absl::string_view suffix = name.substr(kSharedMemoryPrefix.size());
  if (suffix.empty() || suffix.size() > static_cast<size_t>(kMaxSharedMemoryNameSuffix)) {
    return Invalid(path,
                   absl::StrCat("needs 1 .. ", kMaxSharedMemoryNameSuffix, " characters after \"",
                                kSharedMemoryPrefix, "\", got ", suffix.size()));
  }
  for (char c : suffix) {
    if (!NameCharacter(c)) {
      return Invalid(path, absl::StrCat("may hold only [A-Za-z0-9_.-] after \"",
                                        kSharedMemoryPrefix, "\", got ", shown));
    }
  }
  if (suffix == "." || suffix == "..") return Invalid(path, absl::StrCat("got ", shown));
  return absl::OkStatus();
}

absl::StatusOr<SharedMemoryLayout> CheckSharedMemory(const v1::SharedMemoryRegion& region,
                                                     int64_t tensor_bytes, bool backward,
                                                     const std::string& path) {
  if (absl::Status s = CheckSharedMemoryName(region.name(), path + ".name"); !s.ok()) return s;
  SharedMemoryLayout layout;
  layout.name = region.name();
  if (region.byte_size() < 1 || region.byte_size() > static_cast<uint64_t>(kMaxSharedMemoryBytes)) {
    return Invalid(path + ".byte_size", absl::StrCat("must be 1 .. ", kMaxSharedMemoryBytes,
                                                     " (1 TiB), got ", region.byte_size()));
  }
  layout.byte_size = static_cast<int64_t>(region.byte_size());
  layout.offset.fill(-1);
  std::vector<int> used = {v1::ATTEND_TENSOR_Q, v1::ATTEND_TENSOR_K, v1::ATTEND_TENSOR_V,
                           v1::ATTEND_TENSOR_OUT};
  if (backward) {
    used.insert(used.end(), {v1::ATTEND_TENSOR_DOUT, v1::ATTEND_TENSOR_DQ, v1::ATTEND_TENSOR_DK,
                             v1::ATTEND_TENSOR_DV});
  }
  for (int i = 0; i < region.tensors_size(); ++i) {
    const v1::SharedMemoryTensor& t = region.tensors(i);
    const std::string at = absl::StrCat(path, ".tensors[", i, "]");
    const int id = static_cast<int>(t.tensor());
    if (std::find(used.begin(), used.end(), id) == used.end()) {
      return Invalid(at + ".tensor",
                     absl::StrCat(v1::AttendTensor_IsValid(id) ? TensorName(id) : absl::StrCat(id),
                                  " is not a tensor of this call (",
                                  backward ? "q, k, v, dout, "
                                             "out, dq, dk, dv"
                                           : "q, k, v, out: no backward",
                                  ")"));
    }
    if (layout.offset[static_cast<size_t>(id)] >= 0) {
      return Invalid(at + ".tensor", absl::StrCat(TensorName(id), " is placed twice"));
    }
    if (t.offset() > region.byte_size() ||
        static_cast<uint64_t>(tensor_bytes) > region.byte_size() - t.offset()) {
      return Invalid(at + ".offset",
                     absl::StrCat(TensorName(id), " at offset ", t.offset(), " with its ",
                                  tensor_bytes, " bytes ends past byte_size ", region.byte_size()));
    }
    layout.offset[static_cast<size_t>(id)] = static_cast<int64_t>(t.offset());
  }
  std::vector<std::string> missing;
  for (int id : used) {
    if (layout.offset[static_cast<size_t>(id)] < 0) missing.push_back(TensorName(id));
  }
  if (!missing.empty()) {
    return Invalid(path + ".tensors",
                   absl::StrCat("no place for ", absl::StrJoin(missing, ", "), " (the call needs ",
                                backward ? "q, k, v, dout, out, dq, dk, dv" : "q, k, v, out", ")"));
  }
  std::sort(used.begin(), used.end(), [&](int a, int b) {
    return layout.offset[static_cast<size_t>(a)] < layout.offset[static_cast<size_t>(b)];
  });
  for (size_t i = 1; i < used.size(); ++i) {
    const int64_t prev = layout.offset[static_cast<size_t>(used[i - 1])];
    const int64_t here = layout.offset[static_cast<size_t>(used[i])];
    if (here < prev + tensor_bytes) {
      return Invalid(
          path + ".tensors",
          absl::StrCat(TensorName(used[i - 1]), " at ", prev, " and ", TensorName(used[i]), " at ",
                       here, " overlap (each is ", tensor_bytes, " bytes)"));
    }
  }
  return layout;
}

}  // namespace api
}  // namespace dattn
