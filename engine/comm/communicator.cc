#include "engine/comm/communicator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace comm {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

absl::Status ValidateP2POps(absl::Span<const P2POp> ops, int rank, int size) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const char* kind = op.kind == P2POp::Kind::kSend ? "send" : "recv";
    if (op.peer < 0 || op.peer >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", i, " (", kind, "): peer ", op.peer, " is outside [0, ", size, ")"));
    }
    if (op.peer == rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", i, " (", kind, "): peer ", op.peer, " is this rank itself"));
    }
    if (op.count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", i, " (", kind, "): count ", op.count, " is negative"));
    }
    if (op.count > 0 && op.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", i, " (", kind, "): null buffer for ", op.count, " elements"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ShrunkRank(absl::Span<const int> exclude, int rank, int size) {
  std::vector<int> sorted(exclude.begin(), exclude.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink: excluded rank ", sorted[i], " is outside [0, ", size, ")"));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink: excluded rank ", sorted[i], " is listed twice"));
    }
  }
  if (std::binary_search(sorted.begin(), sorted.end(), rank)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shrink: rank ", rank, " is itself in the exclude list"));
  }
  const int below =
      static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), rank) - sorted.begin());
  return rank - below;
}

}  // namespace comm
}  // namespace dattn
