#include "model/collective.h"

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

std::unique_ptr<TrainerCollective> NewSingleProcessCollective() {
  return std::make_unique<SingleProcessCollective>();
}

}  // namespace model
}  // namespace dattn
