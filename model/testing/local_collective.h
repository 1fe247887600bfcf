// A TrainerCollective (model/collective.h) that communicates nothing, for tests that watch what a
// trainer or the collective's base class asks of a collective: every rank's values are this
// process's (the all-gathers return their argument), the reductions leave the buffers alone, the
// barrier returns at once. rank() is 0, world() the given one (the base class checks shards
// against it). Tests derive from it and override what they record (reduces_ranges_early,
// ReduceGradientRange, FinishGradientRanges, ReduceScatterGradients). Not thread-safe, like the
// interface.
#ifndef DATTN_MODEL_TESTING_LOCAL_COLLECTIVE_H_
#define DATTN_MODEL_TESTING_LOCAL_COLLECTIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/collective.h"

namespace dattn {
namespace model {
namespace testing {

class LocalCollective : public TrainerCollective {
 public:
  explicit LocalCollective(int world = 1) : world_(world) {}

  int rank() const override { return 0; }
  int world() const override { return world_; }
  absl::Status ReduceScatterGradients(float*, int64_t, absl::Span<const ShardRange>) override {
    return absl::OkStatus();
  }
  absl::Status AllGatherParameters(float*, int64_t, absl::Span<const ShardRange>) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<double>> AllGather(absl::Span<const double> values) override {
    return std::vector<double>(values.begin(), values.end());
  }
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes) override {
    return std::vector<std::string>{bytes};
  }
  absl::Status Barrier() override { return absl::OkStatus(); }

 private:
  const int world_;
};

}  // namespace testing
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TESTING_LOCAL_COLLECTIVE_H_
