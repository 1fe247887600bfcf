#include "model/collective.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {
namespace {

class SingleProcessCollective : public TrainerCollective {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  absl::Status ReduceScatterGradients(float*, int64_t, absl::Span<const ShardRange>) override {
    return absl::OkStatus();  // The sum over one rank is its own gradient.
  }
  absl::Status AllGatherParameters(float*, int64_t, absl::Span<const ShardRange>) override {
    return absl::OkStatus();  // The only shard is already in place.
  }
  absl::StatusOr<std::vector<double>> AllGather(absl::Span<const double> values) override {
    return std::vector<double>(values.begin(), values.end());
  }
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes) override {
    return std::vector<std::string>{bytes};
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

}  // namespace

std::vector<ShardRange> ShardRanges(int64_t total, int world) {
  std::vector<ShardRange> shards;
  shards.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    // total * r may pass int64 for huge totals; __int128 keeps it exact.
    const int64_t begin = static_cast<int64_t>(static_cast<__int128>(total) * r / world);
    const int64_t end = static_cast<int64_t>(static_cast<__int128>(total) * (r + 1) / world);
    shards.push_back({begin, end});
  }
  return shards;
}

absl::Status CheckShardArguments(const char* call, const float* buffer, int64_t n,
                                 absl::Span<const ShardRange> shards, int world) {
  if (buffer == nullptr || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": a buffer of ", n, " elements at ",
                                                   buffer == nullptr ? "null" : "a pointer"));
  }
  if (static_cast<int64_t>(shards.size()) != world) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": ", shards.size(), " shards for ", world, " ranks"));
  }
  int64_t next = 0;
  for (size_t r = 0; r < shards.size(); ++r) {
    if (shards[r].begin != next || shards[r].end < shards[r].begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          call, ": shard ", r, " is [", shards[r].begin, ", ", shards[r].end,
          "); the shards must tile [0, ", n, ") in rank order (the previous ended at ", next, ")"));
    }
    next = shards[r].end;
  }
  if (next != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": the shards end at ", next, ", the buffer has ", n, " elements"));
  }
  return absl::OkStatus();
}

absl::Status TrainerCollective::BeginGradientReduction(float* grads, int64_t n,
                                                       absl::Span<const ShardRange> shards) {
  constexpr char kCall[] = "BeginGradientReduction";
  reduction_open_ = false;
  if (absl::Status s = CheckShardArguments(kCall, grads, n, shards, world()); !s.ok()) return s;
  reduction_open_ = true;
  reduction_grads_ = grads;
  reduction_n_ = n;
  reduction_shards_.assign(shards.begin(), shards.end());
  handed_.clear();
  return absl::OkStatus();
}

absl::Status TrainerCollective::GradientsFinal(int64_t begin, int64_t end) {
  constexpr char kCall[] = "GradientsFinal";
  if (!reduction_open_) {
    return absl::FailedPreconditionError(
        absl::StrCat(kCall, ": no gradient reduction is open (BeginGradientReduction first)"));
  }
  if (begin < 0 || end > reduction_n_ || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat(kCall, ": the range [", begin, ", ", end,
                                                   ") is empty or leaves [0, ", reduction_n_, ")"));
  }
  // The first handed range that ends after `begin`; it must start at or after `end`.
  auto next = std::upper_bound(handed_.begin(), handed_.end(), begin,
                               [](int64_t b, const ElementRange& r) { return b < r.end; });
  if (next != handed_.end() && next->begin < end) {
    return absl::InvalidArgumentError(absl::StrCat(kCall, ": the range [", begin, ", ", end,
                                                   ") overlaps [", next->begin, ", ", next->end,
                                                   "), handed before"));
  }
  handed_.insert(next, ElementRange{begin, end});
  if (!reduces_ranges_early()) return absl::OkStatus();
  return ReduceGradientRange(reduction_grads_, begin, end, reduction_shards_);
}

absl::Status TrainerCollective::FinishGradientReduction() {
  constexpr char kCall[] = "FinishGradientReduction";
  if (!reduction_open_) {
    return absl::FailedPreconditionError(
        absl::StrCat(kCall, ": no gradient reduction is open (BeginGradientReduction first)"));
  }
  reduction_open_ = false;
  if (!reduces_ranges_early()) {
    return ReduceScatterGradients(reduction_grads_, reduction_n_, reduction_shards_);
  }
  // The ranges never handed, in ascending order.
  int64_t at = 0;
  for (const ElementRange& r : handed_) {
    if (r.begin > at) {
      if (absl::Status s = ReduceGradientRange(reduction_grads_, at, r.begin, reduction_shards_);
          !s.ok()) {
        return s;
      }
    }
    at = r.end;
  }
  if (at < reduction_n_) {
    if (absl::Status s = ReduceGradientRange(reduction_grads_, at, reduction_n_, reduction_shards_);
        !s.ok()) {
      return s;
    }
  }
  return FinishGradientRanges();
}

absl::Status TrainerCollective::ReduceGradientRange(float*, int64_t, int64_t,
                                                    absl::Span<const ShardRange>) {
  return absl::UnimplementedError(
      "ReduceGradientRange: this collective reduces the gradients in FinishGradientReduction");
}

absl::Status TrainerCollective::FinishGradientRanges() { return absl::OkStatus(); }

std::unique_ptr<TrainerCollective> NewSingleProcessCollective() {
  return std::make_unique<SingleProcessCollective>();
}

}  // namespace model
}  // namespace dattn
