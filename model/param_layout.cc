#include "model/param_layout.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {
namespace model {

absl::Status ParamLayout::Add(const std::string& name, std::vector<int64_t> shape) {
  if (name.empty()) return absl::InvalidArgumentError("parameter name: required");
  if (index_.contains(name)) {
    return absl::InvalidArgumentError(absl::StrCat("parameter \"", name, "\" added twice"));
  }
  if (shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter \"", name, "\": empty shape"));
  }
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(absl::StrCat("parameter \"", name, "\": shape [",
                                                     absl::StrJoin(shape, ", "),
                                                     "] has a dimension < 1"));
    }
    if (__builtin_mul_overflow(numel, d, &numel)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", name, "\": shape [", absl::StrJoin(shape, ", "), "] overflows int64"));
    }
  }
  int64_t end = 0;
  if (__builtin_add_overflow(total_, numel, &end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter \"", name, "\": the layout's size overflows int64"));
  }
  index_[name] = entries_.size();
  entries_.push_back(ParamEntry{name, std::move(shape), total_, numel});
  total_ = end;
  return absl::OkStatus();
}

absl::StatusOr<const ParamEntry*> ParamLayout::Find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("no parameter named \"", name, "\""));
  }
  return &entries_[it->second];
}

}  // namespace model
}  // namespace dattn
