// The gradient reduction handed over range by range (collective.h: BeginGradientReduction,
// GradientsFinal, FinishGradientReduction), the part every collective shares: which ranges an
// implementation that reduces early is asked to reduce and when, the whole-buffer reduce-scatter
// for one that does not, and the errors. The GPU implementation's arithmetic is checked on GPUs
// (cuda/cuda_distributed_test.cc); ShardRanges and CheckShardArguments here too.
#include "model/collective.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/testing/local_collective.h"

namespace dattn {
namespace model {
namespace {

// A collective of `world` ranks that only records what it is asked to do.
class RecordingCollective final : public testing::LocalCollective {
 public:
  RecordingCollective(int world, bool early) : LocalCollective(world), early_(early) {}
  bool reduces_ranges_early() const override { return early_; }
  absl::Status ReduceScatterGradients(float*, int64_t n, absl::Span<const ShardRange>) override {
    log.push_back(absl::StrCat("all [0, ", n, ")"));
    return absl::OkStatus();
  }

  std::vector<std::string> log;
  absl::Status fail_next_range = absl::OkStatus();

 protected:
  absl::Status ReduceGradientRange(float*, int64_t begin, int64_t end,
                                   absl::Span<const ShardRange> shards) override {
    if (!fail_next_range.ok()) return fail_next_range;
    log.push_back(absl::StrCat("range [", begin, ", ", end, ") of ", shards.size(), " shards"));
    return absl::OkStatus();
  }
  absl::Status FinishGradientRanges() override {
    log.push_back("finish");
    return absl::OkStatus();
  }

 private:
  const bool early_;
};

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& fragment) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(fragment), absl::string_view::npos)
      << "\"" << s.message() << "\" does not say \"" << fragment << "\"";
}

TEST(GradientReductionTest, EarlyRangesThenTheRestInAscendingOrder) {
  RecordingCollective c(3, /*early=*/true);
  std::vector<float> g(20);
  const std::vector<ShardRange> shards = ShardRanges(20, 3);
  ASSERT_TRUE(c.BeginGradientReduction(g.data(), 20, shards).ok());
  ASSERT_TRUE(c.GradientsFinal(12, 20).ok());
  ASSERT_TRUE(c.GradientsFinal(5, 8).ok());
  ASSERT_TRUE(c.FinishGradientReduction().ok());
  EXPECT_EQ(c.log, (std::vector<std::string>{"range [12, 20) of 3 shards",
                                             "range [5, 8) of 3 shards", "range [0, 5) of 3 shards",
                                             "range [8, 12) of 3 shards", "finish"}));

  // Every element handed: Finish only completes. None handed: one range, the whole buffer.
  c.log.clear();
  ASSERT_TRUE(c.BeginGradientReduction(g.data(), 20, shards).ok());
  ASSERT_TRUE(c.GradientsFinal(10, 20).ok());
  ASSERT_TRUE(c.GradientsFinal(0, 10).ok());
  ASSERT_TRUE(c.FinishGradientReduction().ok());
  ASSERT_TRUE(c.BeginGradientReduction(g.data(), 20, shards).ok());
  ASSERT_TRUE(c.FinishGradientReduction().ok());
  EXPECT_EQ(c.log,
            (std::vector<std::string>{"range [10, 20) of 3 shards", "range [0, 10) of 3 shards",
                                      "finish", "range [0, 20) of 3 shards", "finish"}));
}

TEST(GradientReductionTest, WithoutEarlyRangesFinishIsTheReduceScatter) {
  RecordingCollective c(2, /*early=*/false);
  std::vector<float> g(9);
  ASSERT_TRUE(c.BeginGradientReduction(g.data(), 9, ShardRanges(9, 2)).ok());
  ASSERT_TRUE(c.GradientsFinal(4, 9).ok());  // Checked, recorded, not reduced.
  EXPECT_TRUE(c.log.empty());
  ASSERT_TRUE(c.FinishGradientReduction().ok());
  EXPECT_EQ(c.log, (std::vector<std::string>{"all [0, 9)"}));

  // The single process: nothing to reduce, the calls succeed.
  std::unique_ptr<TrainerCollective> one = NewSingleProcessCollective();
  EXPECT_FALSE(one->reduces_ranges_early());
  ASSERT_TRUE(one->BeginGradientReduction(g.data(), 9, ShardRanges(9, 1)).ok());
  ASSERT_TRUE(one->GradientsFinal(0, 9).ok());
  EXPECT_TRUE(one->FinishGradientReduction().ok());
}

TEST(GradientReductionTest, ErrorsNameTheRange) {
  RecordingCollective c(2, /*early=*/true);
  std::vector<float> g(10);
  const std::vector<ShardRange> shards = ShardRanges(10, 2);
  ExpectError(c.GradientsFinal(0, 3), absl::StatusCode::kFailedPrecondition,
              "no gradient reduction is open");
  ExpectError(c.FinishGradientReduction(), absl::StatusCode::kFailedPrecondition,
              "BeginGradientReduction first");
  ExpectError(c.BeginGradientReduction(g.data(), 10, ShardRanges(10, 3)),
              absl::StatusCode::kInvalidArgument, "BeginGradientReduction: 3 shards for 2 ranks");
  ExpectError(c.BeginGradientReduction(nullptr, 10, shards), absl::StatusCode::kInvalidArgument,
              "a buffer of 10 elements at null");

  ASSERT_TRUE(c.BeginGradientReduction(g.data(), 10, shards).ok());
  ASSERT_TRUE(c.GradientsFinal(4, 7).ok());
  ExpectError(c.GradientsFinal(6, 9), absl::StatusCode::kInvalidArgument,
              "[6, 9) overlaps [4, 7), handed before");
  ExpectError(c.GradientsFinal(0, 5), absl::StatusCode::kInvalidArgument, "[0, 5) overlaps [4, 7)");
  ExpectError(c.GradientsFinal(3, 3), absl::StatusCode::kInvalidArgument,
              "[3, 3) is empty or leaves [0, 10)");
  ExpectError(c.GradientsFinal(8, 11), absl::StatusCode::kInvalidArgument, "[8, 11)");
  ExpectError(c.GradientsFinal(-1, 2), absl::StatusCode::kInvalidArgument, "[-1, 2)");
  ASSERT_TRUE(c.GradientsFinal(7, 10).ok());  // Adjacent ranges are fine.
  ASSERT_TRUE(c.GradientsFinal(0, 4).ok());
  // The refused ranges were not reduced.
  EXPECT_EQ(c.log,
            (std::vector<std::string>{"range [4, 7) of 2 shards", "range [7, 10) of 2 shards",
                                      "range [0, 4) of 2 shards"}));

  // A transport error is GradientsFinal's; Begin discards the open reduction (a failed step).
  c.fail_next_range = absl::UnavailableError("peer 1 is gone");
  ASSERT_TRUE(c.BeginGradientReduction(g.data(), 10, shards).ok());
  ExpectError(c.GradientsFinal(0, 5), absl::StatusCode::kUnavailable, "peer 1 is gone");
  c.fail_next_range = absl::OkStatus();
  c.log.clear();
  ASSERT_TRUE(c.BeginGradientReduction(g.data(), 10, shards).ok());
  ASSERT_TRUE(c.GradientsFinal(0, 5).ok());  // Not refused as handed before: a new reduction.
  ASSERT_TRUE(c.FinishGradientReduction().ok());
  ExpectError(c.FinishGradientReduction(), absl::StatusCode::kFailedPrecondition,
              "no gradient reduction is open");
  EXPECT_EQ(c.log, (std::vector<std::string>{"range [0, 5) of 2 shards",
                                             "range [5, 10) of 2 shards", "finish"}));
}

TEST(ShardRangesTest, TileTheBufferInNearlyEqualShards) {
  const std::vector<ShardRange> s = ShardRanges(10, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].begin, 0);
  EXPECT_EQ(s[0].end, 3);
  EXPECT_EQ(s[1].end, 6);
  EXPECT_EQ(s[2].end, 10);
  std::vector<float> g(10);
  EXPECT_TRUE(CheckShardArguments("x", g.data(), 10, s, 3).ok());
  ExpectError(CheckShardArguments("x", g.data(), 11, s, 3), absl::StatusCode::kInvalidArgument,
              "x: the shards end at 10, the buffer has 11 elements");
}

}  // namespace
}  // namespace model
}  // namespace dattn
